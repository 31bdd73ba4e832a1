/*
 * Notices: the guest errors that fail a program's call, told to the person
 * running the program even when the program silences ggml's logger.
 *
 * apir's log lines go through ggml's logger (frontend_reg.c), and many
 * programs replace that logger with one that drops everything (llama-bench)
 * or keeps it behind -v (llama-server).  Their users then saw only
 * "failed to decode generation batch, res = -3" when the host died, or
 * "failed to load model" when a quota refused a buffer.  A notice is said
 * once per cause per process, with what to do about it: through the log
 * when the log reaches the user (ggml's own default logger, or
 * APIR_LOG_FILE), else straight to stderr.
 */
#ifndef APIR_NOTICE_H
#define APIR_NOTICE_H

#include <stdbool.h>

enum apir_notice_cause {
    APIR_NOTICE_HOST_GONE,    /* the host died or hung up */
    APIR_NOTICE_LIMIT,        /* a per-guest quota refused a command */
    APIR_NOTICE_REFUSED,      /* the host refused a command (bad request, unsupported) */
    APIR_NOTICE_NO_DEVICE,    /* APIR_HOST named a host that could not be used */
    APIR_NOTICE_CAUSE_COUNT
};

/* Whether log lines reach the user as they are (the frontend asks ggml);
 * NULL: they do (tools and tests log to stderr). */
typedef bool (*apir_notice_log_visible_fn)(void);
void apir_notice_set_log_visible(apir_notice_log_visible_fn fn);

/* Says `what` and `remedy` once per cause (thread-safe). */
void apir_notice(enum apir_notice_cause cause, const char *what, const char *remedy);

#endif
