/*
 * Logging for every apir component: one line per event, to stderr or to the
 * file named by APIR_LOG_FILE (APIR_LLAMA_CPP_LOG_TO_FILE is honoured too, for
 * the reference's users).  APIR_LOG_LEVEL=error|warn|info|debug.
 *
 * A line:  2025-01-31T12:00:00.123Z apir host: info: guest#1(pid 42) connected
 * The timestamp is UTC with milliseconds.  APIR_LOG_TIMESTAMPS=0 leaves it
 * out (=1 forces it); it is left out by default when stderr is systemd's
 * journal (JOURNAL_STREAM names stderr's device and inode), which stamps
 * every line itself; there each line starts with its priority as sd-daemon(3)
 * writes it (<3> error, <4> warn, <6> info, <7> debug), so that journald files
 * it under that priority (journalctl -p).  Each line is one write(2).
 * The log file can be reopened (apir_log_reopen: apir-host on SIGHUP, for
 * logrotate) without losing or splitting a line.
 *
 * A sink (apir_log_set_sink) takes the lines instead of stderr: the guest
 * library hands them to ggml's logger, so that programs capturing ggml's log
 * (ggml_log_set, llama_log_set) capture apir's too.  APIR_LOG_FILE, when
 * set, still wins.
 */
#ifndef APIR_LOG_H
#define APIR_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum apir_log_level { APIR_LOG_ERROR = 0, APIR_LOG_WARN = 1, APIR_LOG_INFO = 2, APIR_LOG_DEBUG = 3 };

/* Takes one whole line ("apir COMPONENT: LEVEL: text\n", no timestamp);
 * called with the level already filtered, from any thread. */
typedef void (*apir_log_sink_fn)(enum apir_log_level level, const char *line);

void apir_log_set_level(enum apir_log_level level);
/* The environment's log settings are usable: APIR_LOG_LEVEL a level,
 * APIR_LOG_TIMESTAMPS 0/1 (off/on, no/yes), APIR_LOG_FILE a file that opens.
 * False with the setting and the reason in err (a program refuses to start,
 * as with a bad option; the guest library goes on with the defaults). */
bool apir_log_check_env(char *err, size_t err_len);
/* Lines go to this file from now on (appended; created 0640), stamped.
 * False with the reason in err; the log stays where it was. */
bool apir_log_set_file(const char *path, char *err, size_t err_len);
/* Opens the log file again by its path (after logrotate moved it): 1 done,
 * 0 no log file (stderr), -1 with the reason in err (the old file is kept). */
int apir_log_reopen(char *err, size_t err_len);
/* The log file's path, or NULL when lines go to stderr. */
const char *apir_log_file_path(void);
/* Lines to stderr, unstamped and without <N>: a process whose stderr another
 * reads and logs again with its own stamp (an apir-host worker). */
void apir_log_set_plain_stderr(void);
int  apir_log_level_from_string(const char *s, enum apir_log_level *out);
enum apir_log_level apir_log_get_level(void);
/* NULL: back to stderr. */
void apir_log_set_sink(apir_log_sink_fn sink);
void apir_log(enum apir_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Text a guest chose (a TLS key identity, a certificate subject, a process
 * name, a cgroup path, a tensor name...) on its way into a log line: every
 * byte outside printable ASCII, and the quote and backslash, becomes \xNN,
 * so that a guest can neither end the line nor forge the next one, nor
 * reach the terminal that shows the log.  in_len SIZE_MAX: up to its NUL.
 * Cut to fit out (ending "..."); returns out.  apir_log itself also turns
 * any control byte left in a line into \xNN, but only this keeps a quoted
 * field unambiguous.
 */
const char *apir_log_escape(const char *in, size_t in_len, char *out, size_t out_len);
/* The same, the quote and the backslash kept: a whole line another process
 * wrote (an apir-host worker's stderr), relayed after a prefix of ours, so
 * that what that process escaped itself reads the same. */
const char *apir_log_escape_line(const char *in, size_t in_len, char *out, size_t out_len);
/* Room for n guest bytes escaped, the NUL included. */
#define APIR_LOG_ESCAPED_SIZE(n) ((n) * 4 + 1)

/*
 * A guest's share of the log: a token bucket of lines, per guest.  Lines
 * logged on a thread while it works for a guest (apir_log_budget_enter) -
 * warn, info and error lines its input caused - take a token each; without
 * one the line is dropped and counted; a line that gets through a second
 * or more after the last summary, or apir_log_budget_flush, first says how
 * many were dropped ("N log lines suppressed").  Debug lines, which the
 * operator asked for, and lines logged outside a guest's budget (the
 * host's own) are never dropped.
 * A budget is used by one thread at a time, as the guest it belongs to.
 */
struct apir_log_budget {
    uint32_t per_s, burst;     /* lines a second, and at once; per_s 0: no limit */
    double tokens;
    uint64_t refill_ns;
    uint64_t suppressed;       /* dropped since the last summary */
    uint64_t summary_ns;       /* when the last summary was logged */
    uint64_t suppressed_total;
    char who[64];              /* whose lines, for the summary ("guest#3(pid 42)") */
};
void apir_log_budget_init(struct apir_log_budget *b, const char *who, uint32_t per_s, uint32_t burst);
/* Lines of this thread take b's tokens from now on (NULL: none's);
 * returns the budget they took before, for apir_log_budget_leave. */
struct apir_log_budget *apir_log_budget_enter(struct apir_log_budget *b);
void apir_log_budget_leave(struct apir_log_budget *previous);
/* The "suppressed" summary now, if lines were dropped since the last. */
void apir_log_budget_flush(struct apir_log_budget *b);

/*
 * Another library's log (ggml's, through ggml_log_set) in our format: text
 * comes in pieces that may not end a line; each whole line is logged under
 * component at level (filtered, and charged to the thread's budget, like
 * ours).  With apir_log_relay_demote_info(true), info lines count as debug
 * (an apir-host worker: the daemon said the same when it started).
 */
void apir_log_relay(enum apir_log_level level, const char *component, const char *text);
void apir_log_relay_demote_info(bool demote);

#define APIR_ERROR(comp, ...) apir_log(APIR_LOG_ERROR, comp, __VA_ARGS__)
#define APIR_WARN(comp, ...)  apir_log(APIR_LOG_WARN, comp, __VA_ARGS__)
#define APIR_INFO(comp, ...)  apir_log(APIR_LOG_INFO, comp, __VA_ARGS__)
#define APIR_DEBUG(comp, ...) do { if (apir_log_get_level() >= APIR_LOG_DEBUG) apir_log(APIR_LOG_DEBUG, comp, __VA_ARGS__); } while (0)

#endif
