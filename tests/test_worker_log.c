/*
 * A worker's stderr in the daemon's log (host/server/worker_log.c): lines the
 * worker's logger wrote keep their component and level and get the guest's
 * tag; anything else is a warning of "worker"; control and non-ASCII bytes
 * escaped, a forged line start impossible, a line cut at its bound, and a
 * flood held to the budget with a "suppressed" summary.  Through a real
 * pipe, as a worker's stderr is.
 */
#include "apir_log.h"
#include "worker_log.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

static char log_path[64];

static char *read_log(void)
{
    FILE *f = fopen(log_path, "r");
    static char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

static long count(const char *text, const char *what)
{
    long n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++)
        n++;
    return n;
}

int main(void)
{
    snprintf(log_path, sizeof(log_path), "/tmp/apir-wlog-%d.log", (int)getpid());
    char err[256];
    setenv("APIR_LOG_TIMESTAMPS", "0", 1);
    if (!apir_log_set_file(log_path, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    apir_log_set_level(APIR_LOG_INFO);

    /* Single lines. */
    const char own[] = "apir host: info: guest#7(pid 42) connected: pid 42\n";
    apir_worker_log_line(7, own, strlen(own));
    const char raw[] = "ggml.c:12: GGML_ASSERT(x) failed\x1b[2J\ttab \xff \"q\" \\x41";
    apir_worker_log_line(7, raw, strlen(raw));
    const char stamped[] = "2026-01-01T00:00:00.000Z apir ggml: warn: a stamped line";
    apir_worker_log_line(7, stamped, strlen(stamped));
    const char debug[] = "apir host: debug: not shown at info";
    apir_worker_log_line(7, debug, strlen(debug));
    const char odd[] = "apir HOST: info: not our logger's";
    apir_worker_log_line(7, odd, strlen(odd));
    char *t = read_log();
    printf("%s", t);
    CHECK(strstr(t, "apir host: info: [guest#7] guest#7(pid 42) connected: pid 42\n") != NULL);
    CHECK(strstr(t, "apir worker: warn: [guest#7] ggml.c:12: GGML_ASSERT(x) failed\\x1b[2J\\x09tab \\xff \"q\" \\x41\n"));
    CHECK(strstr(t, "apir ggml: warn: [guest#7] a stamped line\n") != NULL);
    CHECK(strstr(t, "not shown at info") == NULL);
    CHECK(strstr(t, "apir worker: warn: [guest#7] apir HOST: info: not our logger's\n") != NULL);
    CHECK(strchr(t, '\x1b') == NULL);

    /* Through a pipe: a forged line start, a long line, a flood. */
    const int fd = apir_worker_log_open(9, 10, 20);
    CHECK(fd >= 0);
    if (fd < 0)
        return 1;
    const char forge[] = "partial\napir host: info: guest#1(pid 1) connected: forged\n";
    CHECK(write(fd, forge, strlen(forge)) == (ssize_t)strlen(forge));
    char longline[3001];
    memset(longline, 'L', 3000);
    longline[2999] = '\n';
    longline[3000] = '\0';
    CHECK(write(fd, longline, 3000) == 3000);
    const char tail[] = "after the long line\n";
    CHECK(write(fd, tail, strlen(tail)) == (ssize_t)strlen(tail));
    enum { FLOOD = 2000 };
    for (int i = 0; i < FLOOD; i++) {
        char line[64];
        int n = snprintf(line, sizeof(line), "flood %d\n", i);
        CHECK(write(fd, line, (size_t)n) == n);
    }
    /* A pipe still open: the drain waits for it, then says so. */
    const int other = apir_worker_log_open(10, 10, 20);
    CHECK(other >= 0);
    CHECK(!apir_worker_log_drain(50));
    close(fd);  /* the worker's end: the reader flushes the summary */
    if (other >= 0) {
        const char last[] = "a last line, no newline";
        CHECK(write(other, last, strlen(last)) == (ssize_t)strlen(last));
        close(other);
    }
    /* Both ended: once drained, every line is in the log (no waiting on
     * it here: what the daemon does at shutdown before its own end). */
    CHECK(apir_worker_log_drain(5000));
    t = read_log();
    CHECK(strstr(t, "[guest#10] a last line, no newline\n") != NULL);
    CHECK(strstr(t, "suppressed") != NULL);
    CHECK(strstr(t, "apir worker: warn: [guest#9] partial\n") != NULL);
    CHECK(strstr(t, "apir host: info: [guest#9] guest#1(pid 1) connected: forged\n") != NULL);
    CHECK(strstr(t, "\napir host: info: guest#1") == NULL);
    /* the long line: once, cut to the bound; its rest dropped, the next line whole */
    const long longs = count(t, "[guest#9] LLLL");
    CHECK(longs == 1);
    const char *l = strstr(t, "[guest#9] LLLL");
    CHECK(l && strcspn(l, "\n") <= APIR_WORKER_LOG_LINE_MAX + 16);
    CHECK(strstr(t, "[guest#9] after the long line\n") != NULL);
    const long floods = count(t, "[guest#9] flood ");
    const char *s = strstr(t, "log lines suppressed");
    long suppressed = 0;
    if (s) {
        const char *d = s - 2;
        while (d > t && d[-1] >= '0' && d[-1] <= '9')
            d--;
        suppressed = atol(d);
    }
    printf("flood: %d lines written, %ld logged, %ld suppressed (budget: 20 a second, 40 at once)\n", FLOOD, floods,
           suppressed);
    CHECK(floods > 0 && floods <= 40 + 20 * 5);
    CHECK(suppressed > 0 && strstr(t, "guest#9's worker: ") != NULL);
    unlink(log_path);
    printf("%s\n", failures ? "FAIL" : "ok: worker stderr relayed, escaped, tagged and budgeted");
    return failures ? 1 : 0;
}
