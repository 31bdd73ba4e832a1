/*
 * libapir-alloc-trace.so: an LD_PRELOAD shim for tests/run_token_heap.sh,
 * which checks the brief's rule "no per-call heap churn on the token path
 * once warmed up" on both sides of a guest's session.
 *
 * Every allocation (malloc, calloc, realloc, posix_memalign, aligned_alloc,
 * memalign) is attributed to the innermost frame of its stack that is not
 * plumbing: libc, libstdc++, libgcc, libm, the loader, libgomp and ggml's
 * base library (ggml_init, ggml_new_graph...) are looked through, so that
 * what apir asks of them counts as apir's.  An allocation whose frame is
 * apir's own code (libggml-apir.so, apir-host, libapir-virgl.so) is written
 * as "apir", with a CLOCK_MONOTONIC time stamp and its frames as
 * OBJECT+OFFSET (for addr2line), to APIR_ALLOC_TRACE_DIR/alloc.PID.  GnuTLS
 * (and nettle) allocate for every record they seal or open, whatever the
 * caller does: theirs are written as "tls" where apir's code called them.
 * Anything else (llama.cpp's C++, a ggml backend computing a graph) is the
 * program's or the backend's own and is not written: natively it would
 * allocate the same.
 *
 * Test code only: never built into anything apir ships.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

#define MAX_FRAMES 24

static bool armed;                 /* APIR_ALLOC_TRACE_DIR set */
static char out_dir[512];
static int out_fd = -1;
static pid_t out_pid;              /* the process out_fd was opened for (a fork opens its own) */
static __thread int in_hook;       /* backtrace and dladdr may allocate: not traced */

/* Objects looked through: a frame of theirs is somebody else's request. */
static bool plumbing(const char *base)
{
    static const char *const names[] = {
        "libc.so", "libc-", "libstdc++", "libgcc_s", "libm.so", "ld-linux", "libpthread", "libdl.so",
        "libggml-base", "libapir-alloc-trace", "libgomp", "libseccomp",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strncmp(base, names[i], strlen(names[i])) == 0)
            return true;
    return false;
}

static bool apir_object(const char *base)
{
    return strncmp(base, "libggml-apir.so", 15) == 0 || strcmp(base, "apir-host") == 0 ||
           strncmp(base, "libapir-virgl.so", 16) == 0;
}

static bool tls_library(const char *base)
{
    static const char *const names[] = { "libgnutls", "libnettle", "libhogweed", "libgmp", "libp11-kit", "libtasn1",
                                         "libidn2", "libunistring" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strncmp(base, names[i], strlen(names[i])) == 0)
            return true;
    return false;
}

static const char *base_name(const char *path)
{
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path ? path : "?";
}

static void put(char *line, size_t cap, size_t *at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *line, size_t cap, size_t *at, const char *fmt, ...)
{
    if (*at >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(line + *at, cap - *at, fmt, ap);
    va_end(ap);
    *at = n < 0 ? cap : *at + (size_t)n < cap ? *at + (size_t)n : cap;
}

static void note(const char *kind, size_t size)
{
    if (!armed || in_hook)
        return;
    in_hook = 1;
    const int saved_errno = errno;
    void *frames[MAX_FRAMES];
    const int n = backtrace(frames, MAX_FRAMES);
    const char *whose = NULL;  /* "apir", "tls" or not written */
    bool in_tls = false;
    for (int i = 1; i < n; i++) {
        Dl_info di;
        if (!dladdr(frames[i], &di))
            break;  /* unknown code: not apir's */
        const char *base = base_name(di.dli_fname);
        if (plumbing(base))
            continue;
        if (tls_library(base)) {
            in_tls = true;  /* GnuTLS's own: written if apir called it */
            continue;
        }
        if (apir_object(base))
            whose = in_tls ? "tls" : "apir";
        break;
    }
    if (whose) {
        if (out_fd < 0 || out_pid != getpid()) {
            char path[640];
            out_pid = getpid();
            snprintf(path, sizeof(path), "%s/alloc.%d", out_dir, (int)out_pid);
            out_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        char line[2048];
        size_t at = 0;
        put(line, sizeof(line) - 1, &at, "%lld %s %s %zu", (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec, whose, kind,
            size);
        for (int i = 1; i < n; i++) {
            Dl_info di;
            if (dladdr(frames[i], &di))
                put(line, sizeof(line) - 1, &at, " %s+0x%lx", base_name(di.dli_fname),
                    (unsigned long)((uintptr_t)frames[i] - (uintptr_t)di.dli_fbase));
        }
        line[at++] = '\n';
        if (out_fd >= 0 && write(out_fd, line, at) < 0) {
            /* nothing to do: the test then finds fewer lines */
        }
    }
    errno = saved_errno;
    in_hook = 0;
}

void *malloc(size_t n)
{
    note("malloc", n);
    return __libc_malloc(n);
}

void *calloc(size_t a, size_t b)
{
    note("calloc", a * b);
    return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
    note("realloc", n);
    return __libc_realloc(p, n);
}

void *memalign(size_t align, size_t n)
{
    note("memalign", n);
    return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    note("aligned_alloc", n);
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    note("posix_memalign", n);
    if (align < sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

__attribute__((constructor)) static void alloc_trace_init(void)
{
    const char *dir = getenv("APIR_ALLOC_TRACE_DIR");
    if (!dir || !*dir || strlen(dir) >= sizeof(out_dir))
        return;
    strcpy(out_dir, dir);
    /* backtrace loads libgcc_s on its first call, which allocates: once
     * here, not inside the first traced allocation. */
    void *f[2];
    in_hook = 1;
    backtrace(f, 2);
    in_hook = 0;
    armed = true;
}
