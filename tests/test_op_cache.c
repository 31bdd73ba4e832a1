/*
 * The guest's answers without a round trip (issue 26): the op-question
 * cache, the questions it asks ahead in series (DEVICE_ASK_OPS), and the
 * small uploads that wait for the graph (BACKEND_GRAPH_COMPUTE_INPUTS),
 * through libggml-apir.so against a real apir-host on the CPU backend:
 *  - a cached answer is the host's (here: the CPU backend's own answer);
 *    asking again costs nothing; a question differing in anything the answer
 *    depends on (a source's type, an op parameter, a shape) is asked again;
 *  - a question growing by a row each time (the same step twice) is asked
 *    with the next ones: the following 30 cost nothing, and each answer is
 *    the host's;
 *  - alloc sizes likewise (the buffer type set to ask, as a GPU host's is);
 *  - a small upload waits for the graph and goes with it; anything else
 *    that touches device memory (a read, a larger upload, a memset) sends
 *    it first, so every result is what the uploads in order make.
 * The guest's counters are read from its device (APIR_PROFILE=1).
 *
 * usage: test_op_cache APIR_HOST_BINARY LIBGGML_APIR GGML_BIN_DIR
 */
#include "frontend.h"
#include "test_host.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "test_util.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static char sock_dir[64], sock[128], endpoint[160];
static pid_t host_pid;
static ggml_backend_t apir, cpu;
static ggml_backend_dev_t apir_dev, cpu_dev;
static struct apir_device *dev;

/* Round trips so far of the commands that answer op questions. */
static uint64_t questions(void)
{
    const struct apir_remote *r = &dev->remote;
    return r->cmd_count[APIR_CMD_DEVICE_ASK_OPS] + r->cmd_count[APIR_CMD_DEVICE_SUPPORTS_OP_L] +
           r->cmd_count[APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE_L];
}

static uint64_t sent(enum apir_command cmd) { return dev->remote.cmd_count[cmd]; }

static struct ggml_context *new_ctx(void)
{
    struct ggml_init_params p = { .mem_size = 256 * ggml_tensor_overhead() + ggml_graph_overhead(), .no_alloc = true };
    return ggml_init(p);
}

/* Asks APIR0 about op and checks the answer is the CPU backend's own (the
 * host computes with it) and the number of round trips it took. */
static void ask(const struct ggml_tensor *op, uint64_t trips, const char *what)
{
    const uint64_t before = questions();
    const bool got = ggml_backend_dev_supports_op(apir_dev, op);
    const bool want = ggml_backend_dev_supports_op(cpu_dev, op);
    CHECK_MSG(got == want, "%s: APIR0 says %d, the CPU backend %d", what, got, want);
    CHECK_MSG(questions() - before == trips, "%s: %llu round trips, expected %llu", what,
              (unsigned long long)(questions() - before), (unsigned long long)trips);
}

static void test_cached_answers(void)
{
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 8);
    struct ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 3);
    struct ggml_tensor *b16 = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 3);
    struct ggml_tensor *mm = ggml_mul_mat(ctx, a, b);
    ask(mm, 1, "a new question");
    ask(mm, 0, "the same question again");
    ask(ggml_mul_mat(ctx, a, b), 0, "the same question about another tensor");
    /* The CPU backend takes no f16 src1 against an f32 src0: the answer differs. */
    struct ggml_tensor *mm16 = ggml_mul_mat(ctx, a, b16);
    CHECK(!ggml_backend_dev_supports_op(cpu_dev, mm16));
    ask(mm16, 1, "a source's type changed");
    ask(mm16, 0, "that again");
    /* The words of a source's record that the cache's key keeps
     * (frontend_device.c, question_key): its strides and flags too. */
    struct ggml_tensor *wide = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 6);
    ask(ggml_mul_mat(ctx, a, ggml_view_2d(ctx, wide, 64, 3, 2 * wide->nb[1], 0)), 1, "a source's strides changed");
    struct ggml_tensor *b_input = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 3);
    ggml_set_input(b_input);
    ask(ggml_mul_mat(ctx, a, b_input), 1, "a source's flags changed");
    ask(ggml_mul_mat(ctx, a, b), 0, "the first question again");
    ask(ggml_scale(ctx, a, 2.0f), 1, "another op");
    ask(ggml_scale(ctx, a, 3.0f), 1, "an op parameter changed");
    ask(ggml_scale(ctx, a, 2.0f), 0, "the first parameter again");
    ask(ggml_scale(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 9), 2.0f), 1, "a shape changed");
    /* An empty tensor (a dimension of 0) is a question like any other: once
     * the guest asked none about it and said "no" (test-backend-ops' SET_ROWS
     * with one row of a view). */
    ask(ggml_scale(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 0), 2.0f), 1, "an empty tensor");
    ask(ggml_scale(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 0), 2.0f), 0, "that again");
    ggml_free(ctx);
}

/* K^T q with a K one row longer each step, as a decode step's attention. */
static struct ggml_tensor *step_op(struct ggml_context *ctx, int n_kv)
{
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, 64, n_kv, 6);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 1, 6);
    return ggml_mul_mat(ctx, k, q);
}

static void test_series(void)
{
    struct ggml_context *ctx = new_ctx();
    ask(step_op(ctx, 10), 1, "the first step");
    ask(step_op(ctx, 11), 1, "the second step: a step seen once");
    ask(step_op(ctx, 12), 1, "the same step again: asked with the next ones");
    for (int n = 13; n < 12 + APIR_ASK_SERIES; n++) {
        char what[64];
        snprintf(what, sizeof(what), "step n_kv=%d", n);
        ask(step_op(ctx, n), 0, what);
    }
    ask(step_op(ctx, 12 + APIR_ASK_SERIES), 1, "past the series: the next series");
    ask(step_op(ctx, 13 + APIR_ASK_SERIES), 0, "in it");
    /* A question of the family off the series is asked, not taken from it;
     * nor is one a step of another size further. */
    ask(step_op(ctx, 1000), 1, "off the series");
    ask(step_op(ctx, 1003), 1, "another step");
    ask(step_op(ctx, 1004), 1, "a third step, seen once");
    ggml_free(ctx);
}

/* Alloc sizes, with the buffer type made to ask as a GPU host's does. */
static void test_alloc_sizes(void)
{
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(apir_dev);
    const enum apir_alloc_rule rule = dev->buft_ctx.alloc_rule;
    dev->buft_ctx.alloc_rule = APIR_ALLOC_ASK;
    struct ggml_context *ctx = new_ctx();
    for (int n = 20; n < 26; n++) {
        struct ggml_tensor *t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, n);
        const uint64_t before = questions();
        CHECK(ggml_backend_buft_get_alloc_size(buft, t) == ggml_nbytes(t));
        CHECK_MSG(questions() - before == (n < 23 ? 1u : 0u), "n=%d: %llu round trips", n,
                  (unsigned long long)(questions() - before));
    }
    struct ggml_tensor *h = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 25);
    uint64_t before = questions();
    CHECK(ggml_backend_buft_get_alloc_size(buft, h) == ggml_nbytes(h));
    CHECK(questions() - before == 1);  /* another type: another question */
    ggml_free(ctx);
    dev->buft_ctx.alloc_rule = rule;
}

static void get(struct ggml_tensor *t, float *out, size_t n) { ggml_backend_tensor_get(t, out, 0, n * sizeof(float)); }

/* Small uploads wait for the graph; reads and other writes send them first. */
static void test_inputs(void)
{
    enum { N = 256 };
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N);
    struct ggml_tensor *big = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 32 << 10);  /* 128 KiB: sent at once */
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, apir);
    CHECK(buf != NULL && !dev->zero_copy);
    if (!buf)
        return;
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_COMPUTE);
    float v[N], out[N];
    for (int i = 0; i < N; i++)
        v[i] = (float)i;
    uint64_t sets = sent(APIR_CMD_BUFFER_SET_TENSOR);
    ggml_backend_tensor_set(x, v, 0, sizeof(v));
    CHECK(sent(APIR_CMD_BUFFER_SET_TENSOR) == sets && dev->remote.inputs_waiting == 1);
    get(x, out, N);  /* the read sends it first */
    CHECK(sent(APIR_CMD_BUFFER_SET_TENSOR) == sets + 1 && dev->remote.inputs_waiting == 0);
    CHECK(out[0] == 0.0f && out[N - 1] == (float)(N - 1));

    /* In order: a small write, then a large one over it, then a small one into part of it. */
    static float large[32 << 10];
    for (int i = 0; i < (32 << 10); i++)
        large[i] = -1.0f;
    ggml_backend_tensor_set(big, v, 0, sizeof(v));
    ggml_backend_tensor_set(big, large, 0, sizeof(large));
    const float seven = 7.0f;
    ggml_backend_tensor_set(big, &seven, 4 * sizeof(float), sizeof(seven));
    get(big, out, N);
    CHECK(out[0] == -1.0f && out[4] == 7.0f && out[5] == -1.0f);
    /* A memset after a small write: the memset wins. */
    ggml_backend_tensor_set(x, v, 0, sizeof(v));
    ggml_backend_tensor_memset(x, 0, 0, ggml_nbytes(x));
    get(x, out, N);
    CHECK(out[0] == 0.0f && out[N - 1] == 0.0f);

    /* A graph carries the uploads its inputs waited with: y = x * 2, three steps. */
    for (int step = 0; step < 3; step++) {
        struct ggml_context *gctx = new_ctx();
        struct ggml_cgraph *gf = ggml_new_graph(gctx);
        struct ggml_tensor *y = ggml_scale(gctx, x, 2.0f);
        ggml_set_output(y);
        ggml_build_forward_expand(gf, y);
        ggml_backend_sched_t sched = ggml_backend_sched_new((ggml_backend_t[]){ apir, cpu }, NULL, 2, 64, false, true);
        CHECK(ggml_backend_sched_alloc_graph(sched, gf));
        for (int i = 0; i < N; i++)
            v[i] = (float)(i + step);
        ggml_backend_tensor_set(x, v, 0, sizeof(v));
        sets = sent(APIR_CMD_BUFFER_SET_TENSOR);
        const uint64_t carried = sent(APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS);
        CHECK(ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS);
        CHECK_MSG(sent(APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS) == carried + 1 && sent(APIR_CMD_BUFFER_SET_TENSOR) == sets,
                  "step %d: the upload did not go with the graph", step);
        get(y, out, N);
        CHECK_MSG(out[0] == 2.0f * step && out[N - 1] == 2.0f * (N - 1 + step), "step %d: y[0] %g", step, out[0]);
        ggml_backend_sched_free(sched);
        ggml_free(gctx);
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s APIR_HOST_BINARY LIBGGML_APIR GGML_BIN_DIR\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/apir-opcache-XXXXXX");
    if (!mkdtemp(sock_dir))
        return 1;
    snprintf(sock, sizeof(sock), "%s/h.sock", sock_dir);
    snprintf(endpoint, sizeof(endpoint), "unix:%s", sock);
    const char *host_argv[] = { argv[1], "--listen", endpoint, "--threads", "1", "--log-level", "error", NULL };
    host_pid = host_spawn(host_argv, NULL);
    if (!wait_for_path(sock, 5000)) {
        fprintf(stderr, "the host did not start\n");
        host_reap(host_pid, SIGKILL);
        return 1;
    }
    char cpu_lib[512];
    snprintf(cpu_lib, sizeof(cpu_lib), "%s/libggml-cpu.so", argv[3]);
    ggml_backend_load(cpu_lib);
    /* Uploads cross the connection, as with a GPU host; the counters on. */
    setenv("APIR_HOST", endpoint, 1);
    setenv("APIR_ZERO_COPY", "0", 1);
    setenv("APIR_PROFILE", "1", 1);
    CHECK(ggml_backend_load(argv[2]) != NULL);
    apir_dev = ggml_backend_dev_by_name("APIR0");
    cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    apir = apir_dev ? ggml_backend_dev_init(apir_dev, NULL) : NULL;
    if (!apir || !cpu) {
        fprintf(stderr, "no APIR0 or CPU backend\n");
        host_reap(host_pid, SIGKILL);
        return 1;
    }
    cpu_dev = ggml_backend_get_device(cpu);
    dev = apir_dev->context;
    CHECK(dev->remote.minor >= 8);
    static const struct test_case cases[] = {
        TEST(test_cached_answers),
        TEST(test_series),
        TEST(test_alloc_sizes),
        TEST(test_inputs),
    };
    int rc = test_run("op_cache", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    ggml_backend_free(apir);
    ggml_backend_free(cpu);
    host_reap(host_pid, SIGKILL);
    unlink(sock);
    rmdir(sock_dir);
    return rc;
}
