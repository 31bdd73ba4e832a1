/*
 * Logging for every apir component: one line per event, to stderr or to the
 * file named by APIR_LOG_FILE (APIR_LLAMA_CPP_LOG_TO_FILE is honoured too, for
 * the reference's users).  APIR_LOG_LEVEL=error|warn|info|debug.
 *
 * A line:  2025-01-31T12:00:00.123Z apir host: info: guest#1(pid 42) connected
 * The timestamp is UTC with milliseconds.  APIR_LOG_TIMESTAMPS=0 leaves it
 * out (=1 forces it); it is left out by default when stderr is systemd's
 * journal (JOURNAL_STREAM), which stamps every line itself.
 *
 * A sink (apir_log_set_sink) takes the lines instead of stderr: the guest
 * library hands them to ggml's logger, so that programs capturing ggml's log
 * (ggml_log_set, llama_log_set) capture apir's too.  APIR_LOG_FILE, when
 * set, still wins.
 */
#ifndef APIR_LOG_H
#define APIR_LOG_H

#include <stdbool.h>

enum apir_log_level { APIR_LOG_ERROR = 0, APIR_LOG_WARN = 1, APIR_LOG_INFO = 2, APIR_LOG_DEBUG = 3 };

/* Takes one whole line ("apir COMPONENT: LEVEL: text\n", no timestamp);
 * called with the level already filtered, from any thread. */
typedef void (*apir_log_sink_fn)(enum apir_log_level level, const char *line);

void apir_log_set_level(enum apir_log_level level);
int  apir_log_level_from_string(const char *s, enum apir_log_level *out);
enum apir_log_level apir_log_get_level(void);
/* Overrides APIR_LOG_TIMESTAMPS and the journal's default. */
void apir_log_set_timestamps(bool on);
/* NULL: back to stderr. */
void apir_log_set_sink(apir_log_sink_fn sink);
void apir_log(enum apir_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define APIR_ERROR(comp, ...) apir_log(APIR_LOG_ERROR, comp, __VA_ARGS__)
#define APIR_WARN(comp, ...)  apir_log(APIR_LOG_WARN, comp, __VA_ARGS__)
#define APIR_INFO(comp, ...)  apir_log(APIR_LOG_INFO, comp, __VA_ARGS__)
#define APIR_DEBUG(comp, ...) do { if (apir_log_get_level() >= APIR_LOG_DEBUG) apir_log(APIR_LOG_DEBUG, comp, __VA_ARGS__); } while (0)

#endif
