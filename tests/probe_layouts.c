/*
 * Kernels' operands placed off 16 bytes: what a device does with them (a
 * rig for op_device.c's placement rules, for the ops whose kernels need
 * shapes fuzz_op's random ones never make).
 *
 * ggml-cuda's flash-attention kernels load Q, K, V and the mask 16 bytes at
 * a time, and its MUL_MAT kernels for a batch (mmq, cuBLAS) read weights in
 * tiles; ggml's views may sit at any offset with any row stride.  Each case
 * is llama.cpp's node with one operand moved: its address by 2 to 34 bytes,
 * or its rows further apart.
 *   flash attention (--op flash_attn, the default): a cache of 256 cells,
 *     8 query heads over 2 KV heads of 64 or 128, one token or 16, an F16
 *     and a Q8_0 cache;
 *   MUL_MAT (--op mul_mat): 64 rows of 256 weights (F16, Q4_0, Q8_0,
 *     Q4_K) times 1, 16 or 512 columns (mmvq/mmvf, mmq, cuBLAS).
 * Each case is computed on the device and on the CPU and the results
 * compared: natively each in a child process of its own (a CUDA error ends
 * the process), through a host all in this process.
 *
 *   apir-probe-layouts [--op flash_attn|mul_mat] [--backends DIR] [--device NAME] [--expect-refused]
 *
 * --backends: where ggml's backend libraries are (ggml_backend_load_all_from_path;
 *   GGML_BACKEND_PATH is loaded too).  --device: the device probed (default
 *   the first GPU, else the CPU); APIR0 through an apir-host.
 * --expect-refused: through a host that applies the CUDA rules (a CUDA host,
 *   or a CPU host with APIR_TEST_KERNEL_RULES=cuda): no case may end the
 *   process or compute other than the CPU; a flash attention off 16 bytes
 *   must be refused (its compute fails, or, where the question carries the
 *   strides, the device does not support it) and every other computed; a
 *   MUL_MAT either (its rules are the fuzz runs'; this rig's native run says
 *   whether they suffice at a batch's kernels).  Exit 1 otherwise.  Without
 *   it the rig prints what each case did (bench/h200.sh faprobe: natively
 *   on CUDA) and exits 0.
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

enum probe_op { PROBE_FLASH_ATTN, PROBE_MUL_MAT };
/* The operands: a flash attention's Q, K, V and mask; a MUL_MAT's weights
 * and its src1 (X). */
enum { Q, K, V, MASK, N_OPERANDS };
enum { W = 0, X = 1 };
static const char *const fa_operand_names[N_OPERANDS] = { "Q", "K", "V", "mask" };
static const char *const mm_operand_names[2] = { "W", "x" };

#define CELLS 256
#define HEADS 8
#define KV_HEADS 2
#define MM_K 256
#define MM_ROWS 64
#define MAX_RESULT (1 << 16)

struct probe_case {
    enum probe_op op;
    int operand;        /* the one moved */
    size_t addr_move;   /* bytes added to its address */
    size_t row_move;    /* bytes added to its row stride (and so to the strides above) */
    int tokens;         /* a flash attention's tokens; a MUL_MAT's columns */
    int head_size;
    enum ggml_type kv;  /* a flash attention's cache; a MUL_MAT's weights */
};

/* Whether the CUDA rules refuse a flash attention c (op_device.c): an
 * address off 16 bytes; a float operand's rows off a multiple of 16 apart
 * (not the mask's). */
static bool off_16(const struct probe_case *c)
{
    const bool quantized = ggml_is_quantized(c->kv) && (c->operand == K || c->operand == V);
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

/* Fills a base tensor: small floats (F32, F16; a quantized block's scales
 * and quants from the same bytes), or, for a mask (mask_view), 0 for the
 * first 200 cells and -inf past them, where the view's rows are. */
static void fill(struct ggml_tensor *base, int which, const struct ggml_tensor *mask_view)
{
    const size_t n = ggml_nbytes(base);
    uint8_t *bytes = calloc(1, n);
    if (!bytes)
        return;
    uint32_t seed = 7u + (uint32_t)which;
    for (size_t j = 0; !mask_view && j + 4 <= n; j += (base->type == GGML_TYPE_F32 ? 4 : 2)) {
        seed = seed * 1664525u + 1013904223u;
        const float f = (float)((int)(seed >> 16) % 2000 - 1000) / 1000.0f;
        if (base->type == GGML_TYPE_F32) {
            memcpy(bytes + j, &f, 4);
        } else {
            const ggml_fp16_t h = ggml_fp32_to_fp16(f);
            memcpy(bytes + j, &h, 2);
        }
    }
    if (mask_view) {
        const ggml_fp16_t hidden = ggml_fp32_to_fp16(-INFINITY);
        for (int64_t t = 0; t < mask_view->ne[1]; t++)
            for (int64_t j = 200; j < CELLS; j++)
                memcpy(bytes + mask_view->view_offs + (size_t)t * mask_view->nb[1] + (size_t)j * 2, &hidden, 2);
    }
    ggml_backend_tensor_set(base, bytes, 0, n);
    free(bytes);
}

enum outcome { COMPUTED, UNSUPPORTED, COMPUTE_FAILED, NO_MEMORY };

/* c's node in ctx, its operands' base tensors in base[] (n_operands). */
static struct ggml_tensor *build_case(const struct probe_case *c, struct ggml_context *ctx,
                                      struct ggml_tensor *base[N_OPERANDS], struct ggml_tensor *t[N_OPERANDS],
                                      int *n_operands)
{
    size_t move[N_OPERANDS] = { 0 }, pad[N_OPERANDS] = { 0 };
    move[c->operand] = c->addr_move;
    pad[c->operand] = c->row_move;
    if (c->op == PROBE_MUL_MAT) {
        *n_operands = 2;
        t[W] = placed(ctx, c->kv, MM_K, MM_ROWS, 1, move[W], pad[W], &base[W]);
        t[X] = placed(ctx, GGML_TYPE_F32, MM_K, c->tokens, 1, move[X], pad[X], &base[X]);
        return ggml_mul_mat(ctx, t[W], t[X]);
    }
    const int D = c->head_size;
    *n_operands = N_OPERANDS;
    t[Q] = placed(ctx, GGML_TYPE_F32, D, c->tokens, HEADS, move[Q], pad[Q], &base[Q]);
    t[K] = placed(ctx, c->kv, D, CELLS, KV_HEADS, move[K], pad[K], &base[K]);
    t[V] = placed(ctx, c->kv, D, CELLS, KV_HEADS, move[V], pad[V], &base[V]);
    t[MASK] = placed(ctx, GGML_TYPE_F16, CELLS, c->tokens, 1, move[MASK], 0, &base[MASK]);
    struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, t[Q], t[K], t[V], t[MASK], 1.0f / sqrtf((float)D), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(fa, GGML_PREC_F32);
    return fa;
}

/* c on backend; its result's floats in result[0..*n_result). */
static enum outcome run_case(const struct probe_case *c, ggml_backend_t backend, float *result, size_t *n_result)
{
    struct ggml_init_params ip = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *ctx = ggml_init(ip);
    if (!ctx)
        return NO_MEMORY;
    struct ggml_tensor *base[N_OPERANDS] = { NULL }, *t[N_OPERANDS] = { NULL };
    int n_operands = 0;
    struct ggml_tensor *node = build_case(c, ctx, base, t, &n_operands);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, node);
    enum outcome out = UNSUPPORTED;
    if (ggml_backend_supports_op(backend, node) && ggml_nelements(node) <= MAX_RESULT) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        out = NO_MEMORY;
        if (buf) {
            for (int i = 0; i < n_operands; i++)
                fill(base[i], i, c->op == PROBE_FLASH_ATTN && i == MASK ? t[MASK] : NULL);
            out = COMPUTE_FAILED;
            if (ggml_backend_graph_compute(backend, graph) == GGML_STATUS_SUCCESS) {
                ggml_backend_tensor_get(node, result, 0, ggml_nbytes(node));
                *n_result = (size_t)ggml_nelements(node);
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
    double max_diff, max_value;  /* of |device - CPU|, of |CPU| */
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
    size_t n_got = 0, n_want = 0;
    *r = (struct child_report){ COMPUTE_FAILED, COMPUTE_FAILED, -1, 0, "" };
    snprintf(r->device_name, sizeof(r->device_name), "%s", rig->device_name);
    r->device = run_case(c, rig->device, got, &n_got);
    r->cpu = run_case(c, rig->cpu, want, &n_want);
    if (r->device == COMPUTED && r->cpu == COMPUTED && n_got == n_want) {
        r->max_diff = 0;
        for (size_t j = 0; j < n_want; j++) {
            const double d = fabs((double)got[j] - (double)want[j]);
            r->max_diff = isnan(d) ? INFINITY : d > r->max_diff ? d : r->max_diff;
            r->max_value = fabs((double)want[j]) > r->max_value ? fabs((double)want[j]) : r->max_value;
        }
    }
}

/* A case natively, in a child process of its own (a CUDA error ends the
 * process, and the device's context with it): the report through fd. */
static void child(const struct probe_case *c, const char *backends, const char *device_name, int fd)
{
    struct rig rig;
    struct child_report r = { COMPUTE_FAILED, COMPUTE_FAILED, -1, 0, "" };
    if (rig_open(&rig, backends, device_name))
        probe(c, &rig, &r);
    if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(3);
    _exit(0);
}

/* llama.cpp's attention with one operand moved (the file's top). */
static int flash_attn_cases(struct probe_case *cases)
{
    int n = 0;
    const int head_sizes[] = { 64, 128 }, token_counts[] = { 1, 16 };
    for (int h = 0; h < 2; h++)
        for (int tk = 0; tk < 2; tk++)
            for (int q8 = 0; q8 < 2; q8++) {
                const struct probe_case plain = { PROBE_FLASH_ATTN, K, 0, 0, token_counts[tk], head_sizes[h],
                                                  q8 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16 };
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
    return n;
}

/* A MUL_MAT of each weight type by 1, 16 and 512 columns, the weights or
 * the columns moved: by an element or a block, 4, 8 and 16 bytes; rows a
 * block (or element), 8 and 16 bytes further apart. */
static int mul_mat_cases(struct probe_case *cases)
{
    int n = 0;
    const enum ggml_type types[] = { GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K };
    const int columns[] = { 1, 16, 512 };
    for (int ty = 0; ty < 4; ty++)
        for (int co = 0; co < 3; co++) {
            const struct probe_case plain = { PROBE_MUL_MAT, W, 0, 0, columns[co], 0, types[ty] };
            cases[n++] = plain;
            for (int op = W; op <= X; op++) {
                const enum ggml_type t = op == W ? types[ty] : GGML_TYPE_F32;
                const size_t unit = ggml_type_size(t);
                const size_t moves[] = { 2, 4, 8, 16, unit };
                for (int m = 0; m < 5; m++) {
                    if (moves[m] % 4 && t == GGML_TYPE_F32)
                        continue;
                    if (m == 4 && (unit == 2 || unit == 4 || unit == 8 || unit == 16))
                        continue;  /* already among the moves */
                    struct probe_case c = plain;
                    c.operand = op;
                    c.addr_move = moves[m];
                    cases[n++] = c;
                }
                const size_t row_moves[] = { unit, 8, 16 };
                for (int m = 0; m < 3; m++) {
                    if (m > 0 && row_moves[m] == unit)
                        continue;
                    struct probe_case c = plain;
                    c.operand = op;
                    c.row_move = row_moves[m];
                    cases[n++] = c;
                }
            }
        }
    return n;
}

int main(int argc, char **argv)
{
    const char *backends = ".", *device_name = NULL;
    enum probe_op which = PROBE_FLASH_ATTN;
    bool expect_refused = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backends") && i + 1 < argc)
            backends = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device_name = argv[++i];
        else if (!strcmp(argv[i], "--op") && i + 1 < argc && !strcmp(argv[i + 1], "mul_mat") && ++i)
            which = PROBE_MUL_MAT;
        else if (!strcmp(argv[i], "--op") && i + 1 < argc && !strcmp(argv[i + 1], "flash_attn") && ++i)
            which = PROBE_FLASH_ATTN;
        else if (!strcmp(argv[i], "--expect-refused"))
            expect_refused = true;
        else {
            fprintf(stderr, "usage: %s [--op flash_attn|mul_mat] [--backends DIR] [--device NAME] [--expect-refused]\n",
                    argv[0]);
            return 2;
        }
    }
    static struct probe_case cases[256];
    const int n = which == PROBE_MUL_MAT ? mul_mat_cases(cases) : flash_attn_cases(cases);
    const char *name = which == PROBE_MUL_MAT ? "mul_mat layouts" : "fa layouts";
    /* Through a host every case runs here, on one connection (a refused
     * graph fails its compute; a host does not take a new guest a case). */
    struct rig rig;
    if (expect_refused && !rig_open(&rig, backends, device_name)) {
        fprintf(stderr, "%s: no device %s\n", name, device_name ? device_name : "(GPU)");
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
        /* Natively a device may round otherwise (CUDA quantizes Q, or a
         * MUL_MAT's columns, for quantized operands: those are compared
         * loosely, a flash attention's Q8_0 cache not at all); through a
         * host the device computes as the CPU does. */
        double tolerance = 1e-2;
        if (!expect_refused && c->op == PROBE_FLASH_ATTN && ggml_is_quantized(c->kv))
            tolerance = INFINITY;
        else if (!expect_refused && c->op == PROBE_MUL_MAT)
            tolerance = (ggml_is_quantized(c->kv) ? 0.05 : 0.01) * (1.0 + r.max_value);
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
        const bool taken = r.device == COMPUTED && r.max_diff <= tolerance;
        const bool declined = r.device == COMPUTE_FAILED || r.device == UNSUPPORTED;
        if (expect_refused && c->op == PROBE_FLASH_ATTN)
            as_expected = reported && r.cpu == COMPUTED && (off_16(c) ? declined : taken);
        else if (expect_refused)
            as_expected = reported && r.cpu == COMPUTED && (taken || declined);
        bad += !as_expected;
        if (c->op == PROBE_MUL_MAT)
            printf("%-6s %-4s weights by %3d column(s), %-1s address +%-2zu rows +%-2zu: %s (max diff %g)%s\n",
                   reported ? r.device_name : "?", ggml_type_name(c->kv), c->tokens, mm_operand_names[c->operand],
                   c->addr_move, c->row_move, what, reported ? r.max_diff : -1.0,
                   as_expected ? "" : "  <- neither refused nor computed right");
        else
            printf("%-6s %s%s head %3d, %2d token(s), %-4s address +%-2zu rows +%-2zu: %s (max diff %g)%s\n",
                   reported ? r.device_name : "?", ggml_is_quantized(c->kv) ? "Q8_0 cache, " : "",
                   off_16(c) ? "off 16," : "16-byte,", c->head_size, c->tokens, fa_operand_names[c->operand],
                   c->addr_move, c->row_move, what, reported ? r.max_diff : -1.0,
                   as_expected ? "" : "  <- not as the CUDA rules say");
    }
    if (expect_refused) {
        ggml_backend_free(rig.device);
        ggml_backend_free(rig.cpu);
    }
    printf("%s: %d cases: %d computed, %d refused, %d not supported, %d wrong, %d crashed%s\n", name, n, computed,
           refused, unsupported, wrong, crashed,
           expect_refused ? (bad ? " - NOT as the CUDA rules say" : " - as the CUDA rules say") : "");
    return expect_refused && bad ? 1 : 0;
}
