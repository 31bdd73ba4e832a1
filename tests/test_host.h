/*
 * What the end-to-end tests against a real apir-host share (test_e2e,
 * test_stream, test_hostile, test_stats): starting a host process, waiting
 * for its socket and stopping it; its processes as /proc shows them; guests
 * opened, served and filled up to a host's limit; the tensor records and the
 * graphs (a small one, a long one) they send.  Helpers only: every CHECK stays in the tests, so
 * what each one asserts is written where it is asserted.  Header-only, like
 * test_util.h (each test is one file).
 */
#ifndef APIR_TEST_HOST_H
#define APIR_TEST_HOST_H

#include "apir_codec.h"
#include "apir_tensor.h"
#include "calls.h"
#include "ggml.h"
#include "remote.h"
#include "wait.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A whole text file (a host's log), NUL-terminated; "" when it cannot be
 * read.  The caller frees it. */
static inline char *text_read(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t cap = 65536, len = 0, n;
    char *buf = malloc(cap);
    if (!buf)
        abort();
    while (f && (n = fread(buf + len, 1, cap - 1 - len, f)) > 0) {
        len += n;
        if (len + 1 == cap && !(buf = realloc(buf, cap *= 2)))
            abort();
    }
    if (f)
        fclose(f);
    buf[len] = '\0';
    return buf;
}

/* Occurrences of needle in text, overlapping ones apart. */
static inline long text_count(const char *text, const char *needle)
{
    long n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Occurrences of needle in the file at path (a host's log so far). */
static inline long file_count(const char *path, const char *needle)
{
    char *t = text_read(path);
    const long n = text_count(t, needle);
    free(t);
    return n;
}

static inline double ms_since(uint64_t t0)
{
    return (double)(apir_now_ns() - t0) / 1e6;
}

/* ---- a host process ------------------------------------------------------ */

/* Starts argv[0] with argv (NULL-terminated); with log, its stdout and
 * stderr are appended to that file.  The child's pid, or -1. */
static inline pid_t host_spawn(const char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        int lf = log ? open(log, O_WRONLY | O_CREAT | O_APPEND, 0600) : -1;
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
            close(lf);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Waits up to timeout_ms for path to exist (a host binds its socket, then
 * its control socket, once it is ready to serve). */
static inline bool wait_for_path(const char *path, int timeout_ms)
{
    struct stat st;
    for (int waited = 0; stat(path, &st) != 0; waited += 10) {
        if (waited >= timeout_ms)
            return false;
        usleep(10000);
    }
    return true;
}

/* Sends sig to pid and reaps it: its exit status, or 128 + the signal that
 * ended it; -1 for no process. */
static inline int host_reap(pid_t pid, int sig)
{
    if (pid <= 0)
        return -1;
    int status = 0;
    kill(pid, sig);
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* ---- its processes, from /proc ------------------------------------------- */

/* A /proc/PID/status field's number ("VmRSS:", "PPid:", "Uid:"...), or -1
 * (no such process or field). */
static inline long proc_status_field(int pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    size_t len = strlen(field);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, field, len))
            v = atol(line + len);
    if (f)
        fclose(f);
    return v;
}

/* The children of parent (a daemon's worker processes): how many, the first
 * max of them in pids. */
static inline int proc_children(int parent, int *pids, int max)
{
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid > 0 && pid != parent && proc_status_field(pid, "PPid:") == parent) {
            if (n < max)
                pids[n] = pid;
            n++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* Resident memory (KiB) of pid and its children: a daemon and, with process
 * isolation, its workers. */
static inline long proc_tree_rss_kib(int pid)
{
    int pids[256];
    const int n = proc_children(pid, pids, 256);
    long kib = proc_status_field(pid, "VmRSS:");
    kib = kib > 0 ? kib : 0;
    for (int i = 0; i < n && i < 256; i++) {
        long k = proc_status_field(pids[i], "VmRSS:");
        kib += k > 0 ? k : 0;
    }
    return kib;
}

/* ---- guests ---------------------------------------------------------------- */

/* Opens a guest of endpoint; a failure is said on stderr, and kept in err
 * when one is given (NULL: a buffer here). */
static inline bool guest_open(struct apir_remote *r, const char *endpoint, char *err, size_t err_len)
{
    char own[256];
    if (!err) {
        err = own;
        err_len = sizeof(own);
    }
    const bool ok = apir_remote_open(r, endpoint, 0, err, err_len);
    if (!ok)
        fprintf(stderr, "connect %s: %s\n", endpoint, err);
    return ok;
}

/* A new guest of endpoint is served: it connects (quietly: callers poll
 * with this; why not is in err) and its device count is answered, 1 device. */
static inline bool guest_served(const char *endpoint, char *err, size_t err_len)
{
    struct apir_remote r;
    if (!apir_remote_open(&r, endpoint, 0, err, err_len))
        return false;
    int32_t n = 0;
    const bool ok = apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1;
    apir_remote_close(&r);
    return ok;
}

/* Opens up to n guests of endpoint into r, for a host whose limit is n - 1
 * guests: the guests of earlier cases are freed asynchronously (slowly under
 * the sanitizers), so it tries again, up to 50 times 100 ms, until n - 1
 * open.  How many are open (the caller closes them); err: the last
 * refusal. */
static inline int guests_fill(struct apir_remote *r, int n, const char *endpoint, char *err, size_t err_len)
{
    int opened = 0;
    for (int attempt = 0; attempt < 50; attempt++) {
        opened = 0;
        for (int i = 0; i < n; i++)
            if (apir_remote_open(&r[opened], endpoint, 0, err, err_len))
                opened++;
        if (opened >= n - 1)
            break;
        for (int i = 0; i < opened; i++)
            apir_remote_close(&r[i]);
        usleep(100000);
    }
    return opened;
}

/* A buffer of size bytes of the device's buffer type; 0 when refused. */
static inline uint64_t guest_alloc(struct apir_remote *r, uint64_t size)
{
    uint64_t buft = 0, buf = 0;
    apir_call_DEVICE_GET_BUFFER_TYPE(r, &buft);
    apir_call_BUFFER_TYPE_ALLOC_BUFFER(r, buft, size, &buf);
    return buf;
}

/* An F32 tensor [ne0 x ne1], contiguous, at offset of buffer. */
static inline struct apir_tensor_rec rec_2d(uint64_t id, uint64_t buffer, uint64_t offset, uint32_t ne0, uint32_t ne1)
{
    struct apir_tensor_rec t;
    memset(&t, 0, sizeof(t));
    t.id = id;
    t.type = GGML_TYPE_F32;
    t.buffer = buffer;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = t.ne[3] = 1;
    t.nb[0] = 4; t.nb[1] = 4 * ne0; t.nb[2] = t.nb[3] = 4 * ne0 * ne1;
    t.data = offset;
    return t;
}

static inline struct apir_tensor_rec rec_f32(uint64_t id, uint64_t buffer, uint64_t offset, uint32_t n)
{
    return rec_2d(id, buffer, offset, n, 1);
}

/* The graph c = a + b, three 16-float tensors at 0, 64 and 128 of buf
 * (ids 1, 2, 3), its second source named by id src1: 2 for b; an id the
 * graph does not carry makes a hostile one.  Encoded into out: its size, 0
 * if it does not fit. */
static inline size_t add_graph_src(uint8_t *out, size_t cap, uint64_t buf, uint64_t src1)
{
    struct apir_tensor_rec recs[3] = { rec_f32(1, buf, 0, 16), rec_f32(2, buf, 64, 16), rec_f32(3, buf, 128, 16) };
    recs[2].op = GGML_OP_ADD;
    recs[2].flags = GGML_TENSOR_FLAG_COMPUTE;
    recs[2].src[0] = 1;
    recs[2].src[1] = src1;
    struct apir_encoder e;
    apir_encoder_init(&e, out, cap);
    apir_encode_u32(&e, 1);
    apir_encode_u64(&e, 3);
    apir_encode_tensor_list(&e, 3, recs);
    return e.fatal ? 0 : apir_encoder_used(&e);
}

static inline size_t add_graph(uint8_t *out, size_t cap, uint64_t buf)
{
    return add_graph_src(out, cap, buf, 2);
}

/* A long graph: MM_NODES MUL_MATs of [MM_K x MM_M] by [MM_K x MM_N] (~34
 * GFLOP each) into one result, seconds to minutes of one CPU thread - a
 * command still computing when a case kills or cuts something.  Its tensors
 * take the first MM_BYTES of their buffer. */
enum { MM_K = 4096, MM_M = 4096, MM_N = 1024, MM_NODES = 24 };
#define MM_BYTES (4ull * MM_K * MM_M + 4ull * MM_K * MM_N + 4ull * MM_M * MM_N)

/* The long graph on buf, encoded into out: its size, 0 if it does not fit. */
static inline size_t mul_mat_graph(uint8_t *out, size_t cap, uint64_t buf)
{
    const uint64_t a_size = 4ull * MM_K * MM_M, b_size = 4ull * MM_K * MM_N;
    struct apir_tensor_rec recs[2 + MM_NODES];
    recs[0] = rec_2d(1, buf, 0, MM_K, MM_M);
    recs[1] = rec_2d(2, buf, a_size, MM_K, MM_N);
    struct apir_encoder e;
    apir_encoder_init(&e, out, cap);
    apir_encode_u32(&e, MM_NODES);
    for (int i = 0; i < MM_NODES; i++) {
        recs[2 + i] = rec_2d(10 + (uint64_t)i, buf, a_size + b_size, MM_M, MM_N);
        recs[2 + i].op = GGML_OP_MUL_MAT;
        recs[2 + i].flags = GGML_TENSOR_FLAG_COMPUTE;
        recs[2 + i].src[0] = 1;
        recs[2 + i].src[1] = 2;
        apir_encode_u64(&e, 10 + (uint64_t)i);
    }
    apir_encode_tensor_list(&e, 2 + MM_NODES, recs);
    return e.fatal ? 0 : apir_encoder_used(&e);
}

#endif
