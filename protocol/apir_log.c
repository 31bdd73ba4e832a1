#include "apir_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Process-wide logging configuration: read once from the environment. */
static atomic_int log_level = -1;
static atomic_int log_timestamps = -1;  /* -1: not decided yet */
static _Atomic(apir_log_sink_fn) log_sink;
static FILE *log_file;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/* systemd's JOURNAL_STREAM ("DEV:INODE") names stderr when it is the journal. */
static bool stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    struct stat st;
    if (!js || !*js || fstat(STDERR_FILENO, &st) != 0)
        return false;
    char *end;
    unsigned long long dev = strtoull(js, &end, 10);
    if (*end != ':')
        return false;
    unsigned long long ino = strtoull(end + 1, &end, 10);
    return *end == '\0' && dev == (unsigned long long)st.st_dev && ino == (unsigned long long)st.st_ino;
}

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
    const char *ts = getenv("APIR_LOG_TIMESTAMPS");
    int stamps = 1;
    if (ts && *ts)
        stamps = strcmp(ts, "0") != 0 && strcmp(ts, "off") != 0 && strcmp(ts, "no") != 0;
    else if (!log_file && stderr_is_journal())
        stamps = 0;
    expected = -1;
    atomic_compare_exchange_strong(&log_timestamps, &expected, stamps);
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

void apir_log_set_timestamps(bool on)
{
    pthread_once(&log_once, log_setup);
    atomic_store(&log_timestamps, on ? 1 : 0);
}

void apir_log_set_sink(apir_log_sink_fn sink)
{
    atomic_store(&log_sink, sink);
}

/* "2025-01-31T12:00:00.123Z ": UTC (local time would read the zone file,
 * which a sandboxed worker may not open). */
static void format_timestamp(char *buf, size_t len)
{
    struct timespec now;
    struct tm tm;
    buf[0] = '\0';
    if (clock_gettime(CLOCK_REALTIME, &now) != 0 || !gmtime_r(&now.tv_sec, &tm))
        return;
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    if (n)
        snprintf(buf + n, len - n, ".%03ldZ ", now.tv_nsec / 1000000L);
}

void apir_log(enum apir_log_level level, const char *component, const char *fmt, ...)
{
    if (level > apir_log_get_level())
        return;
    static const char *const tags[] = { "error", "warn", "info", "debug" };
    char line[1100];
    int head = snprintf(line, sizeof(line), "apir %s: %s: ", component, tags[level]);
    if (head < 0 || (size_t)head >= sizeof(line) - 2)
        head = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + head, sizeof(line) - 1 - (size_t)head, fmt, ap);  /* room for the newline */
    va_end(ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    line[n++] = '\n';
    line[n] = '\0';
    apir_log_sink_fn sink = atomic_load(&log_sink);
    if (sink && !log_file) {
        sink(level, line);
        return;
    }
    char stamp[40] = "";
    if (atomic_load(&log_timestamps) > 0)
        format_timestamp(stamp, sizeof(stamp));
    FILE *out = log_file ? log_file : stderr;
    /* One write per line: processes sharing the log do not interleave. */
    fprintf(out, "%s%s", stamp, line);
    fflush(out);
}
