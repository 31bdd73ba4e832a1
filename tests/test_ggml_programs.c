/*
 * What a ggml program meets through libggml-apir.so, with a real apir-host
 * (on the CPU backend) and ggml's own scheduler, as llama.cpp and whisper.cpp
 * use it:
 *  - views of another device's memory that ggml's scheduler leaves among our
 *    nodes (recurrent and encoder-decoder models) are computed;
 *  - an allocation the host refuses comes back as NULL, which ggml's
 *    allocators turn into their own failures, and the program goes on;
 *  - the host dies: graphs and allocations fail with errors, never an abort
 *    (the scheduler still finds a backend for tensors in our buffers);
 *  - the host is restarted: a new allocation reaches it again and a graph on
 *    new buffers computes; graphs on the old buffers fail (their memory was
 *    on the dead host);
 *  - a graph that lists one node several times (ggml_graph_add_node; ggml's
 *    own graphs never do, test-backend-ops' perf mode does) computes it each
 *    time listed, as the CPU backend does, keyed (a uid) or not.
 *
 * usage: test_ggml_programs APIR_HOST_BINARY LIBGGML_APIR GGML_BIN_DIR [process|thread]
 */
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "ggml-impl.h" /* struct ggml_cgraph: a graph's uid */
#include "test_util.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N 1024

static const char *host_bin, *isolation = "thread";
static char sock_dir[64], sock[128], endpoint[160];
static pid_t host_pid;
static ggml_backend_t apir, cpu;
static ggml_backend_dev_t apir_dev;

static void start_host(const char *extra)
{
    unlink(sock);
    host_pid = fork();
    if (host_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  /* a crashed test leaves no host behind */
        if (extra)
            execl(host_bin, host_bin, "--listen", endpoint, "--threads", "1", "--log-level", "error", "--isolation",
                  isolation, extra, "1", !strcmp(isolation, "thread") ? "--insecure-shared-process" : (char *)NULL,
                  (char *)NULL);
        else
            execl(host_bin, host_bin, "--listen", endpoint, "--threads", "1", "--log-level", "error", "--isolation",
                  isolation, !strcmp(isolation, "thread") ? "--insecure-shared-process" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    struct stat st;
    for (int i = 0; i < 500 && stat(sock, &st) != 0; i++)
        usleep(10000);
    CHECK(stat(sock, &st) == 0);
}

static void kill_host(void)
{
    kill(host_pid, SIGKILL);
    waitpid(host_pid, NULL, 0);
}

/* A context of f32 vectors of N elements, not allocated. */
static struct ggml_context *new_ctx(void)
{
    struct ggml_init_params p = { .mem_size = 64 * ggml_tensor_overhead() + ggml_graph_overhead(), .no_alloc = true };
    return ggml_init(p);
}

static void fill(struct ggml_tensor *t, float base)
{
    float v[2 * N];
    const int n = (int)ggml_nelements(t);
    for (int i = 0; i < n && i < 2 * N; i++)
        v[i] = base + (float)i;
    ggml_backend_tensor_set(t, v, 0, ggml_nbytes(t));
}

/* Computes graph gf with a new scheduler over [APIR0, CPU], returned (its
 * buffers hold the results): the caller frees it. */
static ggml_backend_sched_t sched_compute(struct ggml_cgraph *gf, bool *allocated, enum ggml_status *status)
{
    ggml_backend_t backends[2] = { apir, cpu };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, NULL, 2, 256, false, true);
    *status = GGML_STATUS_ALLOC_FAILED;
    *allocated = ggml_backend_sched_alloc_graph(sched, gf);
    if (*allocated)
        *status = ggml_backend_sched_graph_compute(sched, gf);
    return sched;
}

/* y = x + x on APIR0 (x lives there), then a view of a CPU tensor w, which
 * ggml's scheduler leaves in APIR0's split (it follows y in node order),
 * used by a CPU node z = v * v.  Recurrent models' graphs are made so. */
static void test_foreign_views(void)
{
    struct ggml_context *wctx = new_ctx(), *cctx = new_ctx(), *gctx = new_ctx();
    struct ggml_tensor *x = ggml_new_tensor_1d(wctx, GGML_TYPE_F32, N);
    struct ggml_tensor *w = ggml_new_tensor_1d(cctx, GGML_TYPE_F32, 2 * N);
    ggml_backend_buffer_t xb = ggml_backend_alloc_ctx_tensors(wctx, apir);
    ggml_backend_buffer_t wb = ggml_backend_alloc_ctx_tensors(cctx, cpu);
    CHECK(xb && wb);
    if (!xb || !wb)
        return;
    ggml_backend_buffer_set_usage(xb, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    fill(x, 1.0f);
    fill(w, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(gctx);
    struct ggml_tensor *y = ggml_add(gctx, x, x);
    ggml_set_output(y);
    ggml_build_forward_expand(gf, y);
    struct ggml_tensor *v = ggml_view_1d(gctx, w, N, N * sizeof(float));
    struct ggml_tensor *z = ggml_mul(gctx, v, v);
    ggml_set_output(z);
    ggml_build_forward_expand(gf, z);
    bool allocated;
    enum ggml_status st;
    ggml_backend_sched_t sched = sched_compute(gf, &allocated, &st);
    CHECK_MSG(allocated && st == GGML_STATUS_SUCCESS, "allocated %d status %d", allocated, st);
    float out[N];
    ggml_backend_tensor_get(y, out, 0, sizeof(out));
    CHECK(out[0] == 2.0f && out[N - 1] == 2.0f * N);
    ggml_backend_tensor_get(z, out, 0, sizeof(out));
    CHECK(out[0] == (float)N * N && out[N - 1] == (2.0f * N - 1) * (2.0f * N - 1));
    ggml_backend_sched_free(sched);
    ggml_backend_buffer_free(xb);
    ggml_backend_buffer_free(wb);
    ggml_free(wctx);
    ggml_free(cctx);
    ggml_free(gctx);
}

/* A host that refuses an allocation (over its --max-alloc-mib 1) answers
 * as a native backend out of memory: NULL, which ggml's helpers turn into
 * their own failure; the program goes on and smaller buffers still work. */
static void test_refused_allocation(void)
{
    kill_host();
    start_host("--max-alloc-mib");
    struct ggml_context *ctx = new_ctx();
    ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1 << 20);  /* 4 MiB */
    CHECK(ggml_backend_alloc_ctx_tensors(ctx, apir) == NULL);
    CHECK(ggml_backend_buft_alloc_buffer(ggml_backend_get_default_buffer_type(apir), 4 << 20) == NULL);
    struct ggml_context *sctx = new_ctx();
    struct ggml_tensor *x = ggml_new_tensor_1d(sctx, GGML_TYPE_F32, N);
    ggml_backend_buffer_t sb = ggml_backend_alloc_ctx_tensors(sctx, apir);
    CHECK(sb != NULL);
    if (sb) {
        fill(x, 7.0f);
        float back[N];
        ggml_backend_tensor_get(x, back, 0, sizeof(back));
        CHECK(back[0] == 7.0f && back[N - 1] == 7.0f + N - 1);
        ggml_backend_buffer_free(sb);
    }
    ggml_free(ctx);
    ggml_free(sctx);
    kill_host();
    start_host(NULL);
    usleep(1100 * 1000);  /* past the reconnection interval */
}

/* x*2 + 1 on APIR0, through the scheduler; true when computed and right. */
static bool compute_on(struct ggml_tensor *x, float x0, int variant, enum ggml_status *status)
{
    struct ggml_context *gctx = new_ctx();
    struct ggml_cgraph *gf = ggml_new_graph(gctx);
    /* each variant is a graph the device has not been asked about */
    struct ggml_tensor *y = variant == 0   ? ggml_add(gctx, x, x)
                            : variant == 1 ? ggml_scale(gctx, x, 2.0f)
                                           : ggml_add(gctx, ggml_sqr(gctx, x), x);
    ggml_set_output(y);
    ggml_build_forward_expand(gf, y);
    bool allocated;
    ggml_backend_sched_t sched = sched_compute(gf, &allocated, status);
    bool right = false;
    if (*status == GGML_STATUS_SUCCESS) {
        float out[N];
        ggml_backend_tensor_get(y, out, 0, sizeof(out));
        float e0 = variant == 2 ? x0 * x0 + x0 : 2 * x0;
        right = out[0] == e0;
    }
    ggml_backend_sched_free(sched);
    ggml_free(gctx);
    return right;
}

static struct ggml_tensor *weights(struct ggml_context **ctx, ggml_backend_buffer_t *buf, float x0)
{
    *ctx = new_ctx();
    struct ggml_tensor *x = ggml_new_tensor_1d(*ctx, GGML_TYPE_F32, N);
    *buf = ggml_backend_alloc_ctx_tensors(*ctx, apir);
    if (*buf) {
        ggml_backend_buffer_set_usage(*buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        fill(x, x0);
    }
    return x;
}

static void test_host_loss(void)
{
    struct ggml_context *ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor *x = weights(&ctx, &buf, 3.0f);
    CHECK(buf != NULL);
    if (!buf)
        return;
    enum ggml_status st;
    CHECK(compute_on(x, 3.0f, 0, &st));

    kill_host();
    /* a graph the device was never asked about: no abort, an error */
    CHECK(!compute_on(x, 3.0f, 1, &st));
    CHECK_MSG(st != GGML_STATUS_SUCCESS, "status %d", st);
    /* the graph it knew fails too */
    CHECK(!compute_on(x, 3.0f, 0, &st) && st != GGML_STATUS_SUCCESS);
    /* Allocations fail, quickly (one connection attempt a second at most):
     * a buffer stands in, whose uses and graphs fail - what ggml's
     * scheduler survives (a NULL compute buffer it does not). */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 3; i++) {
        struct ggml_context *dctx;
        ggml_backend_buffer_t dbuf;
        struct ggml_tensor *d = weights(&dctx, &dbuf, 1.0f);
        CHECK(dbuf != NULL);
        if (dbuf) {
            float back[N];
            back[0] = 1.0f;
            ggml_backend_tensor_get(d, back, 0, sizeof(back));
            CHECK(back[0] == 0.0f);  /* nothing there: zeros, and an error logged */
            CHECK(!compute_on(d, 1.0f, 0, &st) && st != GGML_STATUS_SUCCESS);
            ggml_backend_buffer_free(dbuf);
        }
        ggml_free(dctx);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK_MSG(ms < 500, "failed allocations took %.0f ms", ms);
    /* queries keep answering */
    size_t free_mem, total;
    ggml_backend_dev_memory(apir_dev, &free_mem, &total);

    start_host(NULL);
    usleep(1100 * 1000);  /* past the reconnection interval */
    struct ggml_context *nctx;
    ggml_backend_buffer_t nbuf;
    struct ggml_tensor *nx = weights(&nctx, &nbuf, 5.0f);
    CHECK_MSG(nbuf != NULL, "no buffer from the restarted host");
    if (nbuf) {
        CHECK(compute_on(nx, 5.0f, 2, &st));
        CHECK(compute_on(nx, 5.0f, 0, &st));
    }
    /* the old buffer's memory was on the dead host: its graphs fail */
    CHECK(!compute_on(x, 3.0f, 0, &st) && st != GGML_STATUS_SUCCESS);
    ggml_backend_buffer_free(buf);
    if (nbuf)
        ggml_backend_buffer_free(nbuf);
    ggml_free(ctx);
    ggml_free(nctx);
}

static void setup(const char *apir_lib, const char *ggml_bin)
{
    char cpu_lib[512];
    snprintf(cpu_lib, sizeof(cpu_lib), "%s/libggml-cpu.so", ggml_bin);
    ggml_backend_load(cpu_lib);
    setenv("APIR_HOST", endpoint, 1);
    ggml_backend_reg_t reg = ggml_backend_load(apir_lib);
    CHECK(reg != NULL);
    apir_dev = ggml_backend_dev_by_name("APIR0");
    CHECK(apir_dev != NULL);
    if (!apir_dev)
        exit(1);
    apir = ggml_backend_dev_init(apir_dev, NULL);
    cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    CHECK(apir && cpu);
    if (!apir || !cpu)
        exit(1);
}

/* acc += x, the node listed three times: each listing adds once more, as
 * natively.  Computed twice on one backend (apir keyed: the second run is a
 * recompute by uid) and once on the CPU backend for the reference. */
static void repeated_node_case(ggml_backend_t backend, bool keyed, int runs, float *out)
{
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *acc = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N);
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N);
    ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors(ctx, backend);
    CHECK(b != NULL);
    if (!b) {
        ggml_free(ctx);
        return;
    }
    fill(acc, 0.0f);
    fill(x, 1.0f);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    struct ggml_tensor *y = ggml_add_inplace(ctx, acc, x);
    ggml_backend_view_init(y);  /* a view made after the allocation, as ggml-alloc inits one */
    ggml_build_forward_expand(gf, y);  /* y once, flagged to compute */
    ggml_graph_add_node(gf, y);
    ggml_graph_add_node(gf, y);
    if (keyed)
        gf->uid = ggml_graph_next_uid();
    for (int r = 0; r < runs; r++)
        CHECK_MSG(ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS, "run %d keyed %d", r, keyed);
    ggml_backend_tensor_get(acc, out, 0, N * sizeof(float));
    ggml_backend_buffer_free(b);
    ggml_free(ctx);
}

static void test_repeated_node(void)
{
    static float want[N], got[N];
    for (int keyed = 0; keyed < 2; keyed++) {
        repeated_node_case(cpu, keyed, 2, want);
        repeated_node_case(apir, keyed, 2, got);
        /* acc starts at i, x is 1 + i: 6 listings add 6 (1 + i). */
        CHECK_MSG(want[5] == 5.0f + 6.0f * 6.0f, "cpu %g", want[5]);
        CHECK_MSG(memcmp(want, got, sizeof(want)) == 0, "keyed %d: apir acc[5] = %g, cpu %g", keyed, got[5],
                  want[5]);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s APIR_HOST_BINARY LIBGGML_APIR GGML_BIN_DIR [process|thread]\n", argv[0]);
        return 2;
    }
    host_bin = argv[1];
    if (argc > 4)
        isolation = argv[4];
    signal(SIGPIPE, SIG_IGN);
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/apir-progs-XXXXXX");
    if (!mkdtemp(sock_dir))
        return 1;
    snprintf(sock, sizeof(sock), "%s/h.sock", sock_dir);
    snprintf(endpoint, sizeof(endpoint), "unix:%s", sock);
    start_host(NULL);
    setup(argv[2], argv[3]);
    static const struct test_case cases[] = {
        TEST(test_foreign_views),
        TEST(test_refused_allocation),
        TEST(test_repeated_node),
        TEST(test_host_loss),
    };
    int rc = test_run("ggml_programs", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    ggml_backend_free(apir);
    ggml_backend_free(cpu);
    kill_host();
    unlink(sock);
    rmdir(sock_dir);
    return rc;
}
