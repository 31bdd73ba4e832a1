/*
 * Flash attention with an operand placed off 16 bytes: what a device does
 * with it (a rig for op_device.c's flash-attention rule).
 *
 * ggml-cuda's flash-attention kernels load Q, K, V and the mask 16 bytes at
 * a time; ggml's views may sit at any offset with any row stride.  Each case
 * here is llama.cpp's attention (a cache of 256 cells, 8 query heads over 2
 * KV heads, one token or 16) with one operand moved: its address by 2, 4, 8
 * or 16 bytes, or its rows by 2 (or 4), 8 or 16 bytes more apart; a Q8_0
 * cache too.  Each case runs in a child process of its own (a CUDA error
 * ends the process) on the device and on the CPU, and their results are
 * compared (natively; through a host, all in this process).
 *
 *   apir-probe-fa-layouts [--backends DIR] [--device NAME] [--expect-refused]
 *
 * --backends: where ggml's backend libraries are (ggml_backend_load_all_from_path;
 *   GGML_BACKEND_PATH is loaded too).  --device: the device probed (default
 *   the first GPU, else the CPU); APIR0 through an apir-host.
 * --expect-refused: through a host that applies the CUDA rules (a CUDA host,
 *   or a CPU host with APIR_TEST_KERNEL_RULES=cuda): every case off 16 bytes
 *   must be refused (its compute fails, or, where the question carries the
 *   strides, the device does not support it), every other compute
 *   what the CPU computes; exit 1 otherwise.  Without it the rig prints what
 *   each case did (bench/h200.sh faprobe: natively on CUDA) and exits 0.
 */
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { Q, K, V, MASK, N_OPERANDS };
static const char *const operand_names[N_OPERANDS] = { "Q", "K", "V", "mask" };

#define CELLS 256
#define HEADS 8
#define KV_HEADS 2
#define MAX_RESULT (1 << 16)

struct probe_case {
    int operand;        /* the one moved */
    size_t addr_move;   /* bytes added to its address */
    size_t row_move;    /* bytes added to its row stride (and so to the strides above) */
    int tokens;
    int head_size;
    bool q8_cache;      /* K and V in Q8_0 */
};

/* Whether the CUDA rules refuse c (op_device.c): an address off 16 bytes;
 * a float operand's rows off a multiple of 16 apart (not the mask's). */
static bool off_16(const struct probe_case *c)
{
    const bool quantized = c->q8_cache && (c->operand == K || c->operand == V);
    return c->addr_move % 16 != 0 || (c->operand != MASK && !quantized && c->row_move % 16 != 0);
}

/* A [n0, n1, n2] view of a fresh tensor of t, at `move` bytes, its rows
 * `pad` bytes more apart than dense. */
static struct ggml_tensor *placed(struct ggml_context *ctx, enum ggml_type t, int64_t n0, int64_t n1, int64_t n2,
                                  size_t move, size_t pad, struct ggml_tensor **base)
{
    const size_t nb1 = ggml_row_size(t, n0) + pad, nb2 = nb1 * (size_t)n1, nb3 = nb2 * (size_t)n2;
    const size_t blocks = (nb3 + move) / ggml_type_size(t) + 1;
    *base = ggml_new_tensor_1d(ctx, t, (int64_t)blocks * ggml_blck_size(t));
    return ggml_view_4d(ctx, *base, n0, n1, n2, 1, nb1, nb2, nb3, move);
}

/* Fills a base tensor: small floats (F32, F16; a Q8_0 block's scale and
 * quants from the same bytes), the mask 0 for the first 200 cells and
 * -inf past them, where the mask view's rows are. */
static void fill(struct ggml_tensor *base, int which, const struct ggml_tensor *mask_view)
{
    const size_t n = ggml_nbytes(base);
    uint8_t *bytes = calloc(1, n);
    if (!bytes)
        return;
    uint32_t seed = 7u + (uint32_t)which;
    for (size_t j = 0; which != MASK && j + 4 <= n; j += (base->type == GGML_TYPE_F32 ? 4 : 2)) {
        seed = seed * 1664525u + 1013904223u;
        const float f = (float)((int)(seed >> 16) % 2000 - 1000) / 1000.0f;
        if (base->type == GGML_TYPE_F32) {
            memcpy(bytes + j, &f, 4);
        } else {
            const ggml_fp16_t h = ggml_fp32_to_fp16(f);
            memcpy(bytes + j, &h, 2);
        }
    }
    if (which == MASK) {
        const ggml_fp16_t hidden = ggml_fp32_to_fp16(-INFINITY);
        for (int64_t t = 0; t < mask_view->ne[1]; t++)
            for (int64_t j = 200; j < CELLS; j++)
                memcpy(bytes + mask_view->view_offs + (size_t)t * mask_view->nb[1] + (size_t)j * 2, &hidden, 2);
    }
    ggml_backend_tensor_set(base, bytes, 0, n);
    free(bytes);
}

enum outcome { COMPUTED, UNSUPPORTED, COMPUTE_FAILED, NO_MEMORY };

static enum outcome run_case(const struct probe_case *c, ggml_backend_t backend, float *result)
{
    struct ggml_init_params ip = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *ctx = ggml_init(ip);
    if (!ctx)
        return NO_MEMORY;
    const enum ggml_type kv = c->q8_cache ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    const int D = c->head_size;
    struct ggml_tensor *base[N_OPERANDS], *t[N_OPERANDS];
    size_t move[N_OPERANDS] = { 0 }, pad[N_OPERANDS] = { 0 };
    move[c->operand] = c->addr_move;
    pad[c->operand] = c->row_move;
    t[Q] = placed(ctx, GGML_TYPE_F32, D, c->tokens, HEADS, move[Q], pad[Q], &base[Q]);
    t[K] = placed(ctx, kv, D, CELLS, KV_HEADS, move[K], pad[K], &base[K]);
    t[V] = placed(ctx, kv, D, CELLS, KV_HEADS, move[V], pad[V], &base[V]);
    t[MASK] = placed(ctx, GGML_TYPE_F16, CELLS, c->tokens, 1, move[MASK], 0, &base[MASK]);
    struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, t[Q], t[K], t[V], t[MASK], 1.0f / sqrtf((float)D), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(fa, GGML_PREC_F32);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, fa);
    enum outcome out = UNSUPPORTED;
    if (ggml_backend_supports_op(backend, fa)) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        out = NO_MEMORY;
        if (buf) {
            for (int i = 0; i < N_OPERANDS; i++)
                fill(base[i], i, t[MASK]);
            out = COMPUTE_FAILED;
            if (ggml_backend_graph_compute(backend, graph) == GGML_STATUS_SUCCESS) {
                ggml_backend_tensor_get(fa, result, 0, ggml_nbytes(fa));
                out = COMPUTED;
            }
            ggml_backend_buffer_free(buf);
        }
    }
    ggml_free(ctx);
    return out;
}

struct child_report {
    enum outcome device, cpu;
    double max_diff;
    char device_name[64];
};

/* The device probed and the CPU, initialised where the cases run. */
struct rig {
    ggml_backend_t device, cpu;
    char device_name[64];
};

static bool rig_open(struct rig *rig, const char *backends, const char *device_name)
{
    ggml_backend_load_all_from_path(backends);
    ggml_backend_dev_t dev = device_name ? ggml_backend_dev_by_name(device_name)
                                         : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev && !device_name)
        dev = cpu_dev;
    rig->device = dev ? ggml_backend_dev_init(dev, NULL) : NULL;
    rig->cpu = cpu_dev ? ggml_backend_dev_init(cpu_dev, NULL) : NULL;
    snprintf(rig->device_name, sizeof(rig->device_name), "%s", dev ? ggml_backend_dev_name(dev) : "none");
    return rig->device && rig->cpu;
}

/* The case on the device and on the CPU. */
static void probe(const struct probe_case *c, const struct rig *rig, struct child_report *r)
{
    static float got[MAX_RESULT], want[MAX_RESULT];
    *r = (struct child_report){ COMPUTE_FAILED, COMPUTE_FAILED, -1, "" };
    snprintf(r->device_name, sizeof(r->device_name), "%s", rig->device_name);
    r->device = run_case(c, rig->device, got);
    r->cpu = run_case(c, rig->cpu, want);
    if (r->device == COMPUTED && r->cpu == COMPUTED) {
        const size_t n = (size_t)c->head_size * HEADS * (size_t)c->tokens;
        r->max_diff = 0;
        for (size_t j = 0; j < n && j < MAX_RESULT; j++) {
            const double d = fabs((double)got[j] - (double)want[j]);
            r->max_diff = isnan(d) ? INFINITY : d > r->max_diff ? d : r->max_diff;
        }
    }
}

/* A case natively, in a child process of its own (a CUDA error ends the
 * process, and the device's context with it): the report through fd. */
static void child(const struct probe_case *c, const char *backends, const char *device_name, int fd)
{
    struct rig rig;
    struct child_report r = { COMPUTE_FAILED, COMPUTE_FAILED, -1, "" };
    if (rig_open(&rig, backends, device_name))
        probe(c, &rig, &r);
    if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(3);
    _exit(0);
}

int main(int argc, char **argv)
{
    const char *backends = ".", *device_name = NULL;
    bool expect_refused = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backends") && i + 1 < argc)
            backends = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device_name = argv[++i];
        else if (!strcmp(argv[i], "--expect-refused"))
            expect_refused = true;
        else {
            fprintf(stderr, "usage: %s [--backends DIR] [--device NAME] [--expect-refused]\n", argv[0]);
            return 2;
        }
    }
    static struct probe_case cases[256];
    int n = 0;
    const int head_sizes[] = { 64, 128 }, token_counts[] = { 1, 16 };
    for (int h = 0; h < 2; h++)
        for (int tk = 0; tk < 2; tk++)
            for (int q8 = 0; q8 < 2; q8++) {
                const struct probe_case plain = { K, 0, 0, token_counts[tk], head_sizes[h], q8 };
                cases[n++] = plain;
                for (int op = 0; op < N_OPERANDS; op++) {
                    const bool quantized = q8 && (op == K || op == V);
                    if (q8 && !quantized)
                        continue;  /* Q and the mask: their cases are the F16 cache's */
                    const size_t elem = op == Q ? 4 : quantized ? 34 : 2;
                    const size_t moves[] = { quantized ? 2 : elem, 4, 8, 16, quantized ? 34 : 32 };
                    for (int m = 0; m < 5; m++) {
                        if (m == 1 && moves[0] == 4)
                            continue;
                        struct probe_case c = plain;
                        c.operand = op;
                        c.addr_move = moves[m];
                        cases[n++] = c;
                    }
                    if (op == MASK)
                        continue;  /* ggml asserts dense mask rows */
                    const size_t row_moves[] = { quantized ? 34 : elem, 8, 16 };
                    for (int m = 0; m < 3; m++) {
                        struct probe_case c = plain;
                        c.operand = op;
                        c.row_move = row_moves[m];
                        cases[n++] = c;
                    }
                }
            }
    /* Through a host every case runs here, on one connection (a refused
     * graph fails its compute; a host does not take a new guest a case). */
    struct rig rig;
    if (expect_refused && !rig_open(&rig, backends, device_name)) {
        fprintf(stderr, "fa layouts: no device %s\n", device_name ? device_name : "(GPU)");
        return 1;
    }
    int bad = 0, crashed = 0, wrong = 0, refused = 0, unsupported = 0, computed = 0;
    for (int i = 0; i < n; i++) {
        const struct probe_case *c = &cases[i];
        struct child_report r;
        bool reported = true;
        if (expect_refused) {
            probe(c, &rig, &r);
        } else {
            int fds[2];
            if (pipe(fds) != 0)
                return 1;
            fflush(stdout);
            const pid_t pid = fork();
            if (pid == 0) {
                close(fds[0]);
                child(c, backends, device_name, fds[1]);
            }
            close(fds[1]);
            reported = pid > 0 && read(fds[0], &r, sizeof(r)) == (ssize_t)sizeof(r);
            close(fds[0]);
            if (pid > 0)
                waitpid(pid, NULL, 0);
        }
        /* Q8_0 caches: CUDA quantizes Q too, so its results are compared
         * only through a host (where the device computes as the CPU does). */
        const double tolerance = c->q8_cache && !expect_refused ? INFINITY : 1e-2;
        const char *what;
        if (!reported) {
            what = "CRASHED (the process ended)";
            crashed++;
        } else if (r.device == UNSUPPORTED) {
            what = "not supported (the strides are in the question: refused there)";
            unsupported++;
        } else if (r.device == NO_MEMORY || r.cpu != COMPUTED) {
            what = "not run (no memory, or the CPU did not compute it)";
        } else if (r.device == COMPUTE_FAILED) {
            what = "refused (compute failed)";
            refused++;
        } else if (!(r.max_diff <= tolerance)) {
            what = "WRONG";
            wrong++;
        } else {
            what = "computed";
            computed++;
        }
        bool as_expected = true;
        if (expect_refused)
            as_expected = reported && r.cpu == COMPUTED &&
                          (off_16(c) ? r.device == COMPUTE_FAILED || r.device == UNSUPPORTED
                                     : r.device == COMPUTED && r.max_diff <= tolerance);
        bad += !as_expected;
        printf("%-6s %s%s head %3d, %2d token(s), %-4s address +%-2zu rows +%-2zu: %s (max diff %g)%s\n",
               reported ? r.device_name : "?", c->q8_cache ? "Q8_0 cache, " : "", off_16(c) ? "off 16," : "16-byte,",
               c->head_size, c->tokens, operand_names[c->operand], c->addr_move, c->row_move, what,
               reported ? r.max_diff : -1.0, as_expected ? "" : "  <- not as the CUDA rules say");
    }
    if (expect_refused) {
        ggml_backend_free(rig.device);
        ggml_backend_free(rig.cpu);
    }
    printf("fa layouts: %d cases: %d computed, %d refused, %d not supported, %d wrong, %d crashed%s\n", n, computed,
           refused, unsupported, wrong, crashed, expect_refused ? (bad ? " - NOT as the CUDA rules say" : " - as the CUDA rules say") : "");
    return expect_refused && bad ? 1 : 0;
}
