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

/* A budget's summary line (never charged). */
static void emit(enum apir_log_level level, const char *line);

static _Thread_local struct apir_log_budget *thread_budget;

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void apir_log_budget_init(struct apir_log_budget *b, const char *who, uint32_t per_s, uint32_t burst)
{
    memset(b, 0, sizeof(*b));
    b->per_s = per_s;
    b->burst = burst ? burst : per_s;
    b->tokens = (double)b->burst;
    b->refill_ns = monotonic_ns();
    snprintf(b->who, sizeof(b->who), "%s", who ? who : "guest");
}

struct apir_log_budget *apir_log_budget_enter(struct apir_log_budget *b)
{
    struct apir_log_budget *previous = thread_budget;
    thread_budget = b;
    return previous;
}

void apir_log_budget_leave(struct apir_log_budget *previous)
{
    thread_budget = previous;
}

static void say_suppressed(struct apir_log_budget *b, const char *component)
{
    char line[256];
    snprintf(line, sizeof(line), "apir %s: warn: %s: %llu log line%s suppressed (more than %u a second, %u at once)\n",
             component, b->who, (unsigned long long)b->suppressed, b->suppressed == 1 ? "" : "s", b->per_s, b->burst);
    b->suppressed = 0;
    emit(APIR_LOG_WARN, line);
}

void apir_log_budget_flush(struct apir_log_budget *b)
{
    if (b && b->suppressed && apir_log_get_level() >= APIR_LOG_WARN)
        say_suppressed(b, "host");
}

/* Whether this thread's guest may log one more line (a token taken). */
static bool budget_allows(enum apir_log_level level, const char *component)
{
    struct apir_log_budget *b = thread_budget;
    if (!b || !b->per_s || level == APIR_LOG_DEBUG)
        return true;
    const uint64_t now = monotonic_ns();
    b->tokens += (double)(now - b->refill_ns) * 1e-9 * b->per_s;
    b->refill_ns = now;
    if (b->tokens > (double)b->burst)
        b->tokens = (double)b->burst;
    if (b->tokens < 1.0) {
        b->suppressed++;
        b->suppressed_total++;
        return false;
    }
    b->tokens -= 1.0;
    /* At most one summary a second: under a steady flood each line that
     * gets through would otherwise bring one, doubling the rate. */
    if (b->suppressed && now - b->summary_ns >= 1000000000ull) {
        b->summary_ns = now;
        say_suppressed(b, component);
    }
    return true;
}

const char *apir_log_escape(const char *in, size_t in_len, char *out, size_t out_len)
{
    static const char hex[] = "0123456789abcdef";
    if (!out_len)
        return out;
    size_t k = 0;
    for (size_t i = 0; in && i < in_len && in[i]; i++) {
        const unsigned char c = (unsigned char)in[i];
        const bool plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
        const size_t need = plain ? 1 : 4;
        /* Room for this byte and, if more follow, "..." and the NUL. */
        const bool last = !(i + 1 < in_len && in[i + 1]);
        if (k + need + (last ? 1 : 4) > out_len) {
            if (k + 4 <= out_len) {
                memcpy(out + k, "...", 3);
                k += 3;
            }
            break;
        }
        if (plain) {
            out[k++] = (char)c;
        } else {
            out[k++] = '\\';
            out[k++] = 'x';
            out[k++] = hex[c >> 4];
            out[k++] = hex[c & 15];
        }
    }
    out[k] = '\0';
    return out;
}

/*
 * The last line of defence: a control byte in a formatted line (a guest's
 * string some caller forgot to escape) becomes \xNN, and so do the C1
 * controls as UTF-8 writes them (0xC2 0x80-0x9F: a terminal may take
 * U+009B for an escape sequence's start).  Lines are short and usually
 * clean: one look at each byte, a copy only when something is found.
 */
static bool needs_escape(const unsigned char *p)
{
    return *p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f);
}

static void escape_controls(char *line, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)line;
    while (*p && !needs_escape(p))
        p++;
    if (!*p)
        return;
    char tmp[2048];
    size_t k = (size_t)(p - (const unsigned char *)line);
    memcpy(tmp, line, k);
    for (; *p && k + 5 < sizeof(tmp); p++) {
        if (needs_escape(p)) {
            tmp[k++] = '\\';
            tmp[k++] = 'x';
            tmp[k++] = hex[*p >> 4];
            tmp[k++] = hex[*p & 15];
        } else {
            tmp[k++] = (char)*p;
        }
    }
    /* Cut to the line's room, as vsnprintf cut the text before. */
    if (k > cap - 1)
        k = cap - 1;
    memcpy(line, tmp, k);
    line[k] = '\0';
}

static void emit(enum apir_log_level level, const char *line)
{
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

void apir_log(enum apir_log_level level, const char *component, const char *fmt, ...)
{
    if (level > apir_log_get_level() || !budget_allows(level, component))
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
    escape_controls(line, sizeof(line) - 1);
    n = strlen(line);
    line[n++] = '\n';
    line[n] = '\0';
    emit(level, line);
}
