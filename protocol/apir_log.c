#include "apir_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Process-wide logging configuration: read once from the environment. */
static atomic_int log_level = -1;
static FILE *log_file;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_setup(void)
{
    enum apir_log_level lvl = APIR_LOG_WARN;
    const char *s = getenv("APIR_LOG_LEVEL");
    if (s)
        apir_log_level_from_string(s, &lvl);
    int expected = -1;
    atomic_compare_exchange_strong(&log_level, &expected, (int)lvl);
    const char *path = getenv("APIR_LOG_FILE");
    if (!path)
        path = getenv("APIR_LLAMA_CPP_LOG_TO_FILE");
    if (path && *path)
        log_file = fopen(path, "a");
}

int apir_log_level_from_string(const char *s, enum apir_log_level *out)
{
    static const char *const names[] = { "error", "warn", "info", "debug" };
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum apir_log_level)i;
            return 0;
        }
    }
    return -1;
}

void apir_log_set_level(enum apir_log_level level)
{
    pthread_once(&log_once, log_setup);
    atomic_store(&log_level, (int)level);
}

enum apir_log_level apir_log_get_level(void)
{
    pthread_once(&log_once, log_setup);
    return (enum apir_log_level)atomic_load(&log_level);
}

void apir_log(enum apir_log_level level, const char *component, const char *fmt, ...)
{
    if (level > apir_log_get_level())
        return;
    static const char *const tags[] = { "error", "warn", "info", "debug" };
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    FILE *out = log_file ? log_file : stderr;
    fprintf(out, "apir %s: %s: %s\n", component, tags[level], line);
    fflush(out);
}
