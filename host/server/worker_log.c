/*
 * Workers' stderr into the daemon's log (worker_log.h says what and why).
 */
#include "worker_log.h"

#include "apir_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

struct worker_pipe {
    int fd;                                  /* the read end */
    uint64_t guest_id;
    struct apir_log_budget budget;
    char line[APIR_WORKER_LOG_LINE_MAX];     /* the line not ended yet */
    size_t len;
    bool cut;                                /* the rest of a line too long is dropped */
};

static int epoll_fd = -1;
static pthread_once_t reader_once = PTHREAD_ONCE_INIT;
/* Pipes not at their end yet; apir_worker_log_drain waits for none. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t open_cond = PTHREAD_COND_INITIALIZER;
static unsigned n_open;

/* "2025-01-31T12:00:00.123Z ": the worker stamps nothing (it logs plain,
 * apir_log_set_plain_stderr), but one may; ours replaces it. */
static size_t timestamp_len(const char *s, size_t len)
{
    static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ ";
    const size_t n = sizeof(shape) - 1;
    if (len < n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (shape[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != shape[i])
            return 0;
    return n;
}

void apir_worker_log_line(uint64_t guest_id, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    const size_t skip = timestamp_len(line, len);
    line += skip;
    len -= skip;
    if (!len)
        return;
    /* "apir COMPONENT: LEVEL: text": the worker's own logger. */
    static const char *const levels[] = { "error", "warn", "info", "debug" };
    enum apir_log_level level = APIR_LOG_WARN;
    char component[17] = "worker";
    size_t c = 5;
    if (len > 5 && !memcmp(line, "apir ", 5)) {
        while (c < len && c - 5 < sizeof(component) - 1 && line[c] >= 'a' && line[c] <= 'z')
            c++;
        if (c > 5 && c + 2 < len && line[c] == ':' && line[c + 1] == ' ') {
            for (int l = 0; l < 4; l++) {
                const size_t ln = strlen(levels[l]);
                if (c + 2 + ln + 2 <= len && !memcmp(line + c + 2, levels[l], ln) && line[c + 2 + ln] == ':' &&
                    line[c + 3 + ln] == ' ') {
                    snprintf(component, sizeof(component), "%.*s", (int)(c - 5), line + 5);
                    level = (enum apir_log_level)l;
                    line += c + 4 + ln;
                    len -= c + 4 + ln;
                    break;
                }
            }
        }
    }
    char text[APIR_LOG_ESCAPED_SIZE(APIR_WORKER_LOG_LINE_MAX)];
    apir_log_escape_line(line, len, text, sizeof(text));
    apir_log(level, component, "[guest#%llu] %s", (unsigned long long)guest_id, text);
}

/* What came on w's pipe: whole lines relayed, the rest kept.  False at its end. */
static bool pipe_read(struct worker_pipe *w)
{
    char buf[4096];
    ssize_t n = read(w->fd, buf, sizeof(buf));
    if (n < 0)
        return errno == EINTR || errno == EAGAIN;
    if (n == 0) {
        if (w->len)
            apir_worker_log_line(w->guest_id, w->line, w->len);
        return false;
    }
    for (const char *p = buf, *end = buf + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const size_t piece = (size_t)((nl ? nl : end) - p);
        if (!w->cut) {
            const size_t room = sizeof(w->line) - w->len;
            const size_t take = piece < room ? piece : room;
            memcpy(w->line + w->len, p, take);
            w->len += take;
            if (take < piece) {
                /* Too long: relayed as far as it fits, the rest dropped. */
                apir_worker_log_line(w->guest_id, w->line, w->len);
                w->len = 0;
                w->cut = true;
            }
        }
        if (nl) {
            if (!w->cut)
                apir_worker_log_line(w->guest_id, w->line, w->len);
            w->len = 0;
            w->cut = false;
        }
        p += piece + (nl ? 1 : 0);
    }
    return true;
}

static void *reader(void *arg)
{
    (void)arg;
    for (;;) {
        struct epoll_event ev[16];
        int n = epoll_wait(epoll_fd, ev, 16, -1);
        for (int i = 0; i < n; i++) {
            struct worker_pipe *w = ev[i].data.ptr;
            /* Lines of this worker take its budget's tokens. */
            struct apir_log_budget *before = apir_log_budget_enter(&w->budget);
            const bool open = pipe_read(w);
            if (!open)
                apir_log_budget_flush(&w->budget);
            apir_log_budget_leave(before);
            if (!open) {
                epoll_ctl(epoll_fd, EPOLL_CTL_DEL, w->fd, NULL);
                close(w->fd);
                free(w);
                pthread_mutex_lock(&open_lock);
                if (--n_open == 0)
                    pthread_cond_broadcast(&open_cond);
                pthread_mutex_unlock(&open_lock);
            }
        }
    }
    return NULL;
}

static void reader_start(void)
{
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    pthread_t t;
    if (epoll_fd >= 0 && pthread_create(&t, NULL, reader, NULL) != 0) {
        close(epoll_fd);
        epoll_fd = -1;
    }
    if (epoll_fd >= 0)
        pthread_detach(t);
    else
        APIR_WARN("host", "workers' stderr is not read by the daemon (%s): it goes to the daemon's stderr as it is",
                  strerror(errno));
}

int apir_worker_log_open(uint64_t guest_id, uint32_t per_s, uint32_t burst)
{
    pthread_once(&reader_once, reader_start);
    if (epoll_fd < 0)
        return -1;
    int p[2];
    struct worker_pipe *w = calloc(1, sizeof(*w));
    if (!w || pipe2(p, O_CLOEXEC) != 0) {
        free(w);
        return -1;
    }
    w->fd = p[0];
    w->guest_id = guest_id;
    char who[32];
    snprintf(who, sizeof(who), "guest#%llu's worker", (unsigned long long)guest_id);
    /* Twice the guest's own: its worker's lines were charged there already. */
    apir_log_budget_init(&w->budget, who, per_s > UINT32_MAX / 2 ? UINT32_MAX : per_s * 2,
                         burst > UINT32_MAX / 2 ? UINT32_MAX : burst * 2);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = w };
    pthread_mutex_lock(&open_lock);
    n_open++;
    pthread_mutex_unlock(&open_lock);
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, p[0], &ev) != 0) {
        close(p[0]);
        close(p[1]);
        free(w);
        pthread_mutex_lock(&open_lock);
        n_open--;
        pthread_mutex_unlock(&open_lock);
        return -1;
    }
    return p[1];
}

bool apir_worker_log_drain(int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&open_lock);
    int rc = 0;
    while (n_open && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&open_cond, &open_lock, &until);
    const bool drained = n_open == 0;
    pthread_mutex_unlock(&open_lock);
    return drained;
}
