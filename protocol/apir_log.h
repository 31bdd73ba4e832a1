/*
 * Logging for every apir component: one line per event, to stderr or to the
 * file named by APIR_LOG_FILE (APIR_LLAMA_CPP_LOG_TO_FILE is honoured too, for
 * the reference's users).  APIR_LOG_LEVEL=error|warn|info|debug.
 */
#ifndef APIR_LOG_H
#define APIR_LOG_H

enum apir_log_level { APIR_LOG_ERROR = 0, APIR_LOG_WARN = 1, APIR_LOG_INFO = 2, APIR_LOG_DEBUG = 3 };

void apir_log_set_level(enum apir_log_level level);
int  apir_log_level_from_string(const char *s, enum apir_log_level *out);
enum apir_log_level apir_log_get_level(void);
void apir_log(enum apir_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define APIR_ERROR(comp, ...) apir_log(APIR_LOG_ERROR, comp, __VA_ARGS__)
#define APIR_WARN(comp, ...)  apir_log(APIR_LOG_WARN, comp, __VA_ARGS__)
#define APIR_INFO(comp, ...)  apir_log(APIR_LOG_INFO, comp, __VA_ARGS__)
#define APIR_DEBUG(comp, ...) do { if (apir_log_get_level() >= APIR_LOG_DEBUG) apir_log(APIR_LOG_DEBUG, comp, __VA_ARGS__); } while (0)

#endif
