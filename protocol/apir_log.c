#include "apir_log.h"

#include <errno.h>
#include <fcntl.h>
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
static atomic_int log_priorities;       /* <N> prefixes: stderr is the journal */
static _Atomic(apir_log_sink_fn) log_sink;
/* The log file's descriptor (-1: stderr).  A reopen puts the new file on
 * this same number (dup3), so a line being written goes whole to one file
 * or the other, and no lock is needed. */
static atomic_int log_fd = -1;
static char log_path[4096];             /* the file to reopen; set before any reopen */
static pthread_mutex_t log_path_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool relay_info_demoted;  /* apir_log_relay: info lines count as debug */
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

static const char *env_log_file(void)
{
    const char *path = getenv("APIR_LOG_FILE");
    if (!path)
        path = getenv("APIR_LLAMA_CPP_LOG_TO_FILE");
    return path && *path ? path : NULL;
}

/* APIR_LOG_TIMESTAMPS: 1 on, 0 off, -1 unset, -2 not a value it takes. */
static int env_timestamps(void)
{
    const char *ts = getenv("APIR_LOG_TIMESTAMPS");
    if (!ts || !*ts)
        return -1;
    static const char *const off[] = { "0", "off", "no", "false" }, *const on[] = { "1", "on", "yes", "true" };
    for (size_t i = 0; i < 4; i++) {
        if (!strcmp(ts, off[i]))
            return 0;
        if (!strcmp(ts, on[i]))
            return 1;
    }
    return -2;
}

static int open_log_file(const char *path)
{
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
}

/* Where lines go and how they look: a file, else stderr - stamped unless
 * the journal stamps them, with <N> prefixes when stderr is the journal. */
static void log_setup(void)
{
    enum apir_log_level lvl = APIR_LOG_WARN;
    const char *s = getenv("APIR_LOG_LEVEL");
    if (s)
        apir_log_level_from_string(s, &lvl);
    int expected = -1;
    atomic_compare_exchange_strong(&log_level, &expected, (int)lvl);
    const char *path = env_log_file();
    int fd = path ? open_log_file(path) : -1;
    if (fd >= 0) {
        snprintf(log_path, sizeof(log_path), "%s", path);
        atomic_store(&log_fd, fd);
    }
    const bool journal = fd < 0 && stderr_is_journal();
    atomic_store(&log_priorities, journal);
    int stamps = env_timestamps();
    if (stamps < 0)
        stamps = !journal;
    expected = -1;
    atomic_compare_exchange_strong(&log_timestamps, &expected, stamps);
}

bool apir_log_check_env(char *err, size_t err_len)
{
    enum apir_log_level l;
    const char *lvl = getenv("APIR_LOG_LEVEL");
    if (lvl && apir_log_level_from_string(lvl, &l) != 0) {
        snprintf(err, err_len, "APIR_LOG_LEVEL=%.64s: use error, warn, info or debug", lvl);
        return false;
    }
    if (env_timestamps() == -2) {
        snprintf(err, err_len, "APIR_LOG_TIMESTAMPS=%.64s: use 1 (on) or 0 (off)", getenv("APIR_LOG_TIMESTAMPS"));
        return false;
    }
    const char *path = env_log_file();
    pthread_once(&log_once, log_setup);
    if (path && atomic_load(&log_fd) < 0) {
        /* log_setup tried: say why it failed. */
        int fd = open_log_file(path);
        if (fd >= 0) {
            close(fd);
        } else {
            snprintf(err, err_len, "%s=%.200s: %s", getenv("APIR_LOG_FILE") ? "APIR_LOG_FILE" : "APIR_LLAMA_CPP_LOG_TO_FILE",
                     path, strerror(errno));
            return false;
        }
    }
    return true;
}

bool apir_log_set_file(const char *path, char *err, size_t err_len)
{
    pthread_once(&log_once, log_setup);
    if (strlen(path) >= sizeof(log_path)) {
        snprintf(err, err_len, "%.64s...: path too long", path);
        return false;
    }
    int fd = open_log_file(path);
    if (fd < 0) {
        snprintf(err, err_len, "%.200s: %s", path, strerror(errno));
        return false;
    }
    pthread_mutex_lock(&log_path_lock);
    snprintf(log_path, sizeof(log_path), "%s", path);
    int old = atomic_load(&log_fd);
    if (old >= 0) {
        dup3(fd, old, O_CLOEXEC);
        close(fd);
    } else {
        atomic_store(&log_fd, fd);
    }
    pthread_mutex_unlock(&log_path_lock);
    /* A file is not the journal: its lines are stamped (unless
     * APIR_LOG_TIMESTAMPS says otherwise) and carry no <N>. */
    atomic_store(&log_priorities, 0);
    const int stamps = env_timestamps();
    atomic_store(&log_timestamps, stamps < 0 ? 1 : stamps);
    return true;
}

int apir_log_reopen(char *err, size_t err_len)
{
    pthread_once(&log_once, log_setup);
    pthread_mutex_lock(&log_path_lock);
    int rc = 0;
    const int cur = atomic_load(&log_fd);
    if (cur >= 0 && log_path[0]) {
        int fd = open_log_file(log_path);
        if (fd < 0 || dup3(fd, cur, O_CLOEXEC) < 0) {
            snprintf(err, err_len, "%.200s: %s", log_path, strerror(errno));
            rc = -1;
        } else {
            rc = 1;
        }
        if (fd >= 0)
            close(fd);
    }
    pthread_mutex_unlock(&log_path_lock);
    return rc;
}

const char *apir_log_file_path(void)
{
    pthread_once(&log_once, log_setup);
    return atomic_load(&log_fd) >= 0 ? log_path : NULL;
}

void apir_log_set_plain_stderr(void)
{
    pthread_once(&log_once, log_setup);
    int fd = atomic_exchange(&log_fd, -1);
    if (fd >= 0)
        close(fd);
    atomic_store(&log_timestamps, 0);
    atomic_store(&log_priorities, 0);
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

/* keep_quotes: the quote and the backslash pass as they are (a whole line
 * relayed, not a quoted field). */
static const char *escape(const char *in, size_t in_len, char *out, size_t out_len, bool keep_quotes)
{
    static const char hex[] = "0123456789abcdef";
    if (!out_len)
        return out;
    size_t k = 0;
    for (size_t i = 0; in && i < in_len && in[i]; i++) {
        const unsigned char c = (unsigned char)in[i];
        const bool plain = c >= 0x20 && c < 0x7f && (keep_quotes || (c != '"' && c != '\\'));
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

const char *apir_log_escape(const char *in, size_t in_len, char *out, size_t out_len)
{
    return escape(in, in_len, out, out_len, false);
}

const char *apir_log_escape_line(const char *in, size_t in_len, char *out, size_t out_len)
{
    return escape(in, in_len, out, out_len, true);
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
    const int file = atomic_load(&log_fd);
    if (sink && file < 0) {
        sink(level, line);
        return;
    }
    /* sd-daemon(3)'s priorities: journald files each line under its own. */
    static const char *const prio[] = { "<3>", "<4>", "<6>", "<7>" };
    char out[1200] = "";
    size_t n = 0;
    if (atomic_load(&log_priorities) > 0)
        n = (size_t)snprintf(out, sizeof(out), "%s", prio[level]);
    if (atomic_load(&log_timestamps) > 0)
        format_timestamp(out + n, sizeof(out) - n);
    n += strlen(out + n);
    n += (size_t)snprintf(out + n, sizeof(out) - n, "%s", line);
    if (n >= sizeof(out))
        n = sizeof(out) - 1;
    /* One write per line: processes sharing the log do not interleave. */
    const int fd = file >= 0 ? file : STDERR_FILENO;
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, out + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
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

void apir_log_relay_demote_info(bool demote)
{
    atomic_store(&relay_info_demoted, demote);
}

/*
 * Another library's messages come in pieces (ggml: a line may be printed in
 * several calls, CONT continuing the last).  Each thread keeps the piece of
 * a line it has not ended yet; a line longer than the buffer is cut there.
 */
static _Thread_local char relay_buf[1024];
static _Thread_local size_t relay_len;
static _Thread_local enum apir_log_level relay_level;

static void relay_flush(const char *component)
{
    if (relay_len)
        apir_log(relay_level, component, "%.*s", (int)relay_len, relay_buf);
    relay_len = 0;
}

void apir_log_relay(enum apir_log_level level, const char *component, const char *text)
{
    if (level == APIR_LOG_INFO && atomic_load(&relay_info_demoted))
        level = APIR_LOG_DEBUG;
    if (level > apir_log_get_level() || !text)
        return;
    if (relay_len && level != relay_level)
        relay_flush(component);
    relay_level = level;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        const size_t piece = nl ? (size_t)(nl - p) : strlen(p);
        size_t take = piece < sizeof(relay_buf) - relay_len ? piece : sizeof(relay_buf) - relay_len;
        memcpy(relay_buf + relay_len, p, take);
        relay_len += take;
        if (nl || relay_len == sizeof(relay_buf))
            relay_flush(component);
        p += piece + (nl ? 1 : 0);
    }
}
