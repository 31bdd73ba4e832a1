/*
 * fuzz_op: one-node graphs for every ggml op, computed by the real host
 * dispatcher on the CPU backend, with guard pages and a byte-exact write
 * oracle around every buffer.
 *
 * Per input: a fresh session; the node's sources are leaves whose types,
 * shapes, strides and places come from the input (contiguous, permuted,
 * gapped, broadcast with a zero stride, overlapping another leaf, flush
 * with a buffer's end); the node is made from them by ggml's own
 * constructor for its op (every op of GGML_OP_COUNT but FLASH_ATTN_BACK,
 * whose constructor always aborts, and the custom ops; every UNARY and GLU
 * sub-op) with constructor arguments from the input - or, for a share of
 * inputs, the constructed node is then mutated in one field, or the node is
 * raw bytes (an op with arbitrary type, shape, strides and op_params: what
 * the host must refuse).  A constructor's assert is caught (abort callback
 * + longjmp) and the input goes on as a raw node.  Index-typed leaves hold
 * mostly small values, so gathers and scatters run with valid and invalid
 * indices alike.
 *
 * Where the memory is, and why the guards work: the guest's buffers are
 * DEVICE_BUFFER_FROM_PTR over blobs this harness maps itself - the CPU
 * backend's buffer from a host pointer, zero copy - so a tensor's data is
 * this harness's memory.  Each blob is a mapping of its own with a
 * PROT_NONE page right before and right after it: a kernel that reads or
 * writes past either end of a buffer faults, even from ggml's prebuilt,
 * uninstrumented CPU kernels that ASan cannot see into.  An input may also
 * place its index leaves in a buffer the host allocates (ALLOC_BUFFER: no
 * guard pages there, but it takes the host's non-shadow index path).
 *
 * Edges inputs (issue 24, item 2: those that start with EDGES_MARK) go
 * further, to see accesses that stay near a tensor but leave it:
 *   - each operand (leaf, node, a view's source) may sit in a mapping of its
 *     own, as a buffer of just its extent flush with the mapping's end or
 *     its start, so that one byte past either edge of the tensor is a guard
 *     page (a buffer shared with other tensors hides reads that land in a
 *     neighbour; the write oracle sees only writes);
 *   - strides, those of size-1 dimensions above all (ggml's contiguity
 *     predicates ignore them and an extent check does not count them), take
 *     values from the whole range a record carries: 0, a few bytes, the
 *     natural one, one element off, the tensor's own extent (the next step
 *     lands just past it), a page, the buffer, past the mapping, up to
 *     4 GiB (stride_value);
 *   - a leaf may be a view of a tensor laid out to hold it, at its source's
 *     start or flush with its end.
 * Every other input reads exactly as it did before the edges existed, so
 * the findings saved before them replay the same node.
 *
 * Oracles, checked in the computing process (a child, as process isolation
 * computes; ggml asserts there are contained, and findings only with
 * FUZZ_OP_STRICT=1, fuzz/run.sh's default: see on_abort):
 *   - no fault (guard pages; any signal is a finding);
 *   - every buffer byte that changed lies inside the extent of a tensor the
 *     node may write (its own; for OPT_STEP_* its parameter and moments),
 *     and nothing changed when the host refused: a kernel that writes past
 *     its result inside the buffer (an unchecked index, strides the kernel
 *     ignores) is caught here;
 *   - an index assert of a CPU kernel (GET_ROWS, SET_ROWS, ADD_ID) firing
 *     after the host accepted the graph is a finding, not a contained
 *     abort: on a backend without that assert it is an access out of
 *     bounds, and the host's index check (op_policy.c) should have refused.
 *   - the compute ends within CHILD_SECONDS (a kernel that loops forever
 *     is a finding; the child cannot outlive the harness).
 * Reads that leave the buffers for other mapped host memory far away (a
 * wild index into the heap) are not caught unless they fault; the bytes a
 * result holds cannot tell where they came from.
 *
 * The device path (FUZZ_BACKEND=CUDA on a GPU machine, or
 * FUZZ_OP_DEVICE_PATH=1 on the CPU to test the path itself): the same nodes
 * on another backend's kernels, whose own asserts the CPU run cannot see
 * (ggml-cuda's MUL_MAT_ID asserted on repeated experts, which the CPU
 * kernel takes).  Every buffer is one the host allocates, filled and read
 * back with BUFFER_SET_TENSOR and BUFFER_GET_TENSOR as a guest would, and
 * the node computes in this process: a device's context does not survive
 * fork(), so an input cannot have a child of its own.  The guard pages are
 * lost (a read past a buffer in device memory shows only as the driver's
 * error, an abort here); the write oracle stays, on the bytes read back.
 * Every abort past the constructors is a finding, and it ends the process:
 * fuzz/dev_driver.c (apir-fuzz-op-dev) runs the inputs in a child it
 * restarts after each, and saves the input that ended it.
 *
 * Seeds: FUZZ_OP_SEEDS=DIR makes the target write, per op, inputs whose
 * node its constructor accepts, and exit (fuzz/run.sh does this).  Known
 * findings not fixed yet are skipped with FUZZ_SKIP_KNOWN (hits_known).
 */
#include "fuzz_host.h"
#include "ggml-impl.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_GUARDED 2
#define GUARDED_SIZE (64u * 1024u)
#define ALLOC_SIZE (64u * 1024u)
#define MSG_RES 3u                 /* the blob graphs and uploads go through */
#define MSG_SIZE (256u * 1024u)
#define GUARDED_RES0 4u
/* Edges inputs: the first byte, and the mappings of one operand each
 * (buffer numbers OWN0.., after the guarded ones and the host-allocated
 * one).  The host's limits (fuzz_host.h: 16 blobs, 32 buffers) hold the
 * message blob, the guarded buffers and these. */
#define EDGES_MARK 0xa5
#define N_OWN 8
#define OWN_SIZE (64u * 1024u)
#define OWN_RES0 (GUARDED_RES0 + N_GUARDED)
#define OWN0 (N_GUARDED + 1)
#define N_BUFS (OWN0 + N_OWN)
#define REGION_MAX (64u * 1024u)   /* the largest of GUARDED_SIZE, ALLOC_SIZE, OWN_SIZE */
#define MAX_TENSORS 48
#define DATA_RES (OWN_RES0 + N_OWN) /* the device path's uploads and read-backs */
#define CONTAINED_ABORT_EXIT 42
#define ORACLE_EXIT 43
/* Nodes here are tiny (dims <= 40): a compute that takes longer than this
 * does not end (a finding), and the child must not outlive the parent. */
#define CHILD_SECONDS 4
/* Chain mode: room for a chain's nodes (the top-k router's longest form
 * has 13) and the key its graph is sent with (any but 0). */
#define CHAIN_MAX 16
#define CHAIN_KEY 0x63686169ull

/* Memory of the buffers: [guard][GUARDED_SIZE][guard] each, and
 * [guard][OWN_SIZE][guard] for each own mapping. */
static uint8_t *guarded[N_GUARDED];
static uint8_t *own_map[N_OWN];
static uint8_t *msg_blob;
static uint8_t snapshot[N_BUFS][REGION_MAX];
static bool verbose;
static bool device_path;        /* see the top: host-allocated buffers, no fork */
static bool chains;             /* FUZZ_OP_CHAINS=1: chain mode (see "chain mode" below) */
static uint8_t stage[N_BUFS][REGION_MAX];  /* the device path's buffer contents */
static uint8_t *data_blob;      /* DATA_RES */
/* What the last input came to, for apir-fuzz-op-dev's counts: 'N' no node
 * built, 'R' refused by the host, 'A' accepted and computed (the device
 * path), 'C' computed in a child (whose verdict this process does not see). */
char fuzz_op_last_outcome;

/* ---- aborts: caught while constructing, contained (or not) in the child --- */

static jmp_buf *construct_trap;
static bool in_child;
static bool strict_aborts;      /* FUZZ_OP_STRICT=1 */
static ggml_abort_callback_t previous_abort;

/* The CPU kernels' asserts on index values: reached only if the host let an
 * out-of-range index through. */
static bool is_index_assert(const char *message)
{
    static const char *const asserts[] = { "i01 >= 0 && i01 < ne01", "i1 >= 0 && i1 < ne1", "i11 >= 0 && i11 < ne11" };
    for (size_t i = 0; i < sizeof(asserts) / sizeof(asserts[0]); i++)
        if (strstr(message, asserts[i]))
            return true;
    return false;
}

static void on_abort(const char *message)
{
    if (construct_trap) {
        jmp_buf *t = construct_trap;
        construct_trap = NULL;
        longjmp(*t, 1);
    }
    if (previous_abort)
        previous_abort(message);  /* op_derive.c's trap, if it was first */
    if (in_child && device_path) {
        /* ggml aborts once this returns: the process ends, and the driver
         * keeps the input. */
        fprintf(stderr, "FUZZ ORACLE: accepted graph reached a ggml abort: %s\n", message);
        return;
    }
    if (in_child) {
        if (is_index_assert(message)) {
            fprintf(stderr, "FUZZ ORACLE: accepted graph hit a kernel index assert: %s\n", message);
            _exit(ORACLE_EXIT);
        }
        /* Past op_derive.c's trap, an abort is a kernel's (or a backend's
         * supports_op's) assert on a node the host let through: contained
         * by process isolation, but a defect all the same (issue 12: a
         * GGML_ASSERT reachable from guest input is removed by a check
         * before the call).  FUZZ_OP_STRICT=1 makes it a finding. */
        if (strict_aborts) {
            fprintf(stderr, "FUZZ ORACLE: accepted graph reached a ggml abort: %s\n", message);
            _exit(ORACLE_EXIT);
        }
        _exit(CONTAINED_ABORT_EXIT);
    }
}

/* ---- the input, and what it builds --------------------------------------- */

/*
 * Chain mode (FUZZ_OP_CHAINS=1; apir-fuzz-op-dev -chains): every input is a
 * chain of 2-13 consecutive nodes of a shape a backend fuses into one kernel
 * (ggml-cuda's ggml_cuda_try_fuse; the CPU backend's RMS_NORM + MUL), sent
 * as one keyed graph with its use counts (BACKEND_GRAPH_COMPUTE_KEYED,
 * APIR_GRAPH_USE_COUNTS_TAG), as a guest sends a model's graph: only then
 * does a backend fuse, and the host decides which chains it may
 * (host/check/op_fusion.c).  A fused kernel assumes more than each of its
 * nodes does alone (the index tensor's layout, the VIEW's shape, sizes
 * taken from nodes nothing compares, a dense result), and the host checks
 * each node alone; so the chains are made by ggml's own constructors, as a
 * model's graph has them (ggml's fusion checks accept those), then changed
 * where a hostile guest could: leaves' and views' strides, views' shapes
 * and offsets, index tensors' lengths and types, a node that no longer
 * reads the one before it, in-place variants, the use counts sent.  The
 * write oracle allows each node's own result (check_writes).  A mode of
 * its own, not a share of the inputs: without it the corpus's inputs keep
 * their meaning.
 */
enum chain_kind {
    CH_ROPE_SET_ROWS,       /* ROPE, VIEW, SET_ROWS: a K cache store */
    CH_NORM_ROPE_SET_ROWS,  /* RMS_NORM, MUL, ROPE, VIEW, SET_ROWS */
    CH_NORM_ROPE,           /* RMS_NORM, MUL, ROPE */
    CH_NORM_MUL,            /* RMS_NORM, MUL (, ADD) */
    CH_UNARY_MUL,           /* SILU, SIGMOID or SOFTPLUS, then MUL */
    CH_TOPK,                /* a MoE router's top-k (topk-moe.cu) */
    CH_MUL_MAT_ADD,         /* MUL_MAT and its bias */
    CH_MUL_MAT_ID_ADD_ID,   /* MUL_MAT_ID and its bias per expert */
    CH_ADDS,                /* ADDs (or MULs) one after another */
    CH_GLU,                 /* a gate and an up product (MUL_MAT or MUL_MAT_ID, with or
                               without biases) and their GLU: an FFN (mmvq/mmvf fused) */
    CH_COUNT
};

/* How many kinds there are, for apir-fuzz-op-dev's own inputs per kind. */
const int fuzz_op_chain_kinds = CH_COUNT;

static const char *const chain_names[CH_COUNT] = {
    "rope-set_rows", "norm-rope-set_rows", "norm-rope", "norm-mul", "unary-mul", "topk",
    "mul_mat-add", "mul_mat_id-add_id", "adds", "glu",
};

/* FUZZ_OP_CHAIN_KINDS=NAME,NAME: only those kinds are built (an input's kind
 * byte picks among them), to spend a device call's minutes on the chains a
 * change touched.  Unset: every kind, and an input's kind byte keeps its
 * meaning (the findings' files are read that way). */
static int chain_kinds_only[CH_COUNT];
static int n_chain_kinds_only;

static void read_chain_kinds(const char *list)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < CH_COUNT && strcmp(chain_names[k], name) != 0)
            k++;
        if (k == CH_COUNT) {
            fprintf(stderr, "fuzz_op: FUZZ_OP_CHAIN_KINDS: no chain kind '%s'\n", name);
            abort();
        }
        chain_kinds_only[n_chain_kinds_only++] = k;
        if (n_chain_kinds_only == CH_COUNT)
            break;
    }
}

struct gen {
    struct fz_reader r;
    struct ggml_context *ctx;
    int64_t dims[4];                 /* the shape leaves mostly share */
    struct ggml_tensor *t[MAX_TENSORS];
    int n;
    uint64_t next[N_GUARDED + 1];    /* bump allocators per buffer */
    int buf_of[MAX_TENSORS];         /* 0..N_GUARDED-1 guarded, N_GUARDED alloc'd, OWN0.. own */
    uint64_t off_of[MAX_TENSORS];    /* in its buffer (the record's data) */
    bool use_alloc;                  /* index leaves in the host-allocated buffer */
    bool constructed;                /* made by a constructor (not raw) */
    bool edges;                      /* the input started with EDGES_MARK */
    int n_own;                       /* own mappings taken */
    uint64_t own_start[N_OWN];       /* where that buffer starts in its mapping */
    uint64_t own_size[N_OWN];
    /* chain mode (FUZZ_OP_CHAINS=1): the nodes in graph order, and the use
     * count sent for each */
    struct ggml_tensor *chain[CHAIN_MAX];
    int n_chain;
    uint32_t uses[CHAIN_MAX];
    int kind;                        /* enum chain_kind */
    uint32_t inplace;                /* bit k: the k-th constructor that has one is in place */
    int n_inplace;                   /* constructors asked so far */
};

static uint32_t rd(struct gen *g, unsigned n) { return (uint32_t)fz_read_le(&g->r, n); }

static int ri(struct gen *g, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(rd(g, 1) % (uint32_t)(hi - lo + 1));
}

static float rf(struct gen *g)
{
    static const float vals[] = { 0.0f, 1.0f, -1.0f, 0.5f, 2.0f, 1e-5f, 1e30f, -1e30f, 10000.0f, 0.125f };
    uint32_t v = rd(g, 1);
    if (v < 200)
        return vals[v % (sizeof(vals) / sizeof(vals[0]))];
    float f;
    uint32_t bits = rd(g, 4);
    memcpy(&f, &bits, 4);
    return f;
}

static enum ggml_type pick_type(struct gen *g)
{
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32,
                                            GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_I32, GGML_TYPE_Q4_0,
                                            GGML_TYPE_Q8_0, GGML_TYPE_I64, GGML_TYPE_I8, GGML_TYPE_I16 };
    return types[rd(g, 1) % (sizeof(types) / sizeof(types[0]))];
}

/* ggml's own stride of dimension k for t's type and shape (ggml_new_tensor's). */
static size_t natural_stride(const struct ggml_tensor *t, int k)
{
    size_t nb = ggml_type_size(t->type);
    for (int j = 0; j < k; j++)
        nb *= (size_t)(j == 0 ? t->ne[0] / ggml_blck_size(t->type) : t->ne[j]);
    return nb;
}

/*
 * Edges inputs: a stride for dimension k of t from the whole range a record
 * carries (32 bits), weighted to the values that matter.  t's extent (what
 * a host counts) is taken before the change: a stride of that many bytes on
 * a size-1 dimension points a kernel that steps it once just past the
 * tensor, onto the guard page when it sits flush with its mapping's end.
 */
static size_t stride_value(struct gen *g, const struct ggml_tensor *t, int k)
{
    const size_t ts = ggml_type_size(t->type), natural = natural_stride(t, k), extent = ggml_nbytes(t);
    uint32_t v = rd(g, 1);
    switch (v % 16) {
    case 0: return 0;
    case 1: return 1 + (v >> 4) % 3;                       /* inside one element */
    case 2: return ts;
    case 3: return natural;
    case 4: return natural + ts;                           /* one element off, either way */
    case 5: return natural > ts ? natural - ts : 0;
    case 6: return extent;                                 /* the next step: just past the tensor */
    case 7: return extent + ts * ((v >> 4) % 4);
    case 8: return (size_t)4096 << ((v >> 4) % 4);         /* pages: past a guard page */
    case 9: return OWN_SIZE + 4096;                        /* past the mapping and its guard */
    case 10: return 0x80000000u;
    case 11: return 0xffffffffu - ts * ((v >> 4) % 4);      /* the largest a record holds */
    case 12: return (size_t)1 << (rd(g, 1) % 32);
    case 13: return natural * (2 + (v >> 4) % 3);
    default: return rd(g, 4);
    }
}

/* Edges inputs: up to three of t's strides from stride_value, each on a
 * size-1 dimension when the input prefers one and t has one. */
static void edge_strides(struct gen *g, struct ggml_tensor *t)
{
    uint32_t how = rd(g, 1);
    for (unsigned c = 0; c < (how & 3); c++) {
        int k = (int)(rd(g, 1) & 3);
        if (how & (4u << c))
            for (int j = 0; j < 4; j++)
                if (t->ne[(k + j) & 3] == 1) {
                    k = (k + j) & 3;
                    break;
                }
        if (k == 0 && ggml_blck_size(t->type) > 1)
            continue;  /* a block type's element stride is its block: a host refuses any other */
        t->nb[k] = stride_value(g, t, k);
    }
}

/*
 * Edges inputs: t (a fresh leaf) as a view, with t's shape and nb[1..3]
 * (its element stride is the type's, as ggml_view_4d makes it), of a plain
 * tensor laid out to hold it, the view at its source's start or flush with
 * its end: a view record's strides reach the kernels as a leaf's do, and
 * its offset is one more number to check.  t itself when that source would
 * not fit a buffer anyway.
 */
static struct ggml_tensor *as_view(struct gen *g, struct ggml_tensor *t)
{
    const size_t ts = ggml_type_size(t->type);
    size_t dense = ggml_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    size_t need = ggml_nbytes(t) > dense ? ggml_nbytes(t) : dense;  /* the constructor asserts the dense size */
    uint32_t how = rd(g, 1);
    size_t blocks = (need + ts * (how & 3) + ts - 1) / ts;
    if (blocks * ts > OWN_SIZE)
        return t;
    struct ggml_tensor *src = ggml_new_tensor_1d(g->ctx, t->type, (int64_t)blocks * ggml_blck_size(t->type));
    size_t offs = how & 4 ? blocks * ts - need : 0;
    struct ggml_tensor *v =
        ggml_view_4d(g->ctx, src, t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nb[1], t->nb[2], t->nb[3], offs);
    return v;
}

static struct ggml_tensor *relayout(struct gen *g, struct ggml_tensor *t);

/* A leaf: shape mostly from the shared dims, layout varied. */
static struct ggml_tensor *leaf_of(struct gen *g, enum ggml_type type)
{
    int64_t ne[4];
    uint32_t how = rd(g, 1);
    for (int k = 0; k < 4; k++)
        ne[k] = (how >> (2 * k)) & 1 ? 1 : g->dims[(k + ((how >> 7) & 1)) & 3];
    if (ggml_blck_size(type) > 1 && ne[0] % ggml_blck_size(type))
        ne[0] = ggml_blck_size(type);
    return relayout(g, ggml_new_tensor(g->ctx, type, 4, ne));
}

/* t's layout varied by the input (the leaves' variants: permuted, gapped,
 * broadcast, odd element strides; edges inputs' strides and views): t, or
 * the view that takes its place. */
static struct ggml_tensor *relayout(struct gen *g, struct ggml_tensor *t)
{
    const enum ggml_type type = t->type;
    uint32_t layout = rd(g, 1);
    switch (layout & 7) {
    case 1: /* permuted: two dims' strides swapped */ {
        int a = 1 + (int)((layout >> 3) % 3);
        size_t x = t->nb[a];
        if (ggml_blck_size(type) == 1) {
            t->nb[a] = t->nb[0];
            t->nb[0] = x;
        }
        break;
    }
    case 2: /* rows with a gap */
        for (int k = 1; k < 4; k++)
            t->nb[k] += (size_t)k * 16 * ((layout >> 3) & 3);
        break;
    case 3: /* broadcast: a zero stride */
        t->nb[1 + (layout >> 3) % 3] = 0;
        break;
    case 4: /* odd element stride */
        if (ggml_blck_size(type) == 1)
            t->nb[0] = ggml_type_size(type) * (1 + ((layout >> 3) & 3));
        break;
    default:
        break;
    }
    if (g->edges) {
        edge_strides(g, t);
        if (rd(g, 1) < 48)
            t = as_view(g, t);
    }
    return t;
}

static struct ggml_tensor *L(struct gen *g) { return leaf_of(g, pick_type(g)); }
static struct ggml_tensor *F(struct gen *g) { return leaf_of(g, rd(g, 1) < 220 ? GGML_TYPE_F32 : pick_type(g)); }
static struct ggml_tensor *I(struct gen *g) { return leaf_of(g, rd(g, 1) < 240 ? GGML_TYPE_I32 : GGML_TYPE_I64); }

/*
 * An attention ggml-cuda has kernels for (its supports_op takes heads of
 * 40 to 576 and F16/BF16/Q8_0/Q4_0 caches, shapes fuzz_op's dims never
 * make): heads of 40, 64, 80 or 128, a cache of 64 to 256 cells in one or
 * two KV heads, 1 to 4 query heads to each, the tokens of the input's
 * second dim, a mask or none, sinks sometimes; each operand's layout varied
 * as a leaf's (relayout) one time in six.  For inputs whose first dim is 5
 * (one in eight): the others keep their meaning.
 */
static struct ggml_tensor *attention(struct gen *g)
{
    static const int64_t heads[] = { 64, 128, 40, 80 };
    static const enum ggml_type caches[] = { GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_BF16 };
    const int64_t d = heads[rd(g, 1) & 3], kv_heads = 1 + (rd(g, 1) & 1), gqa = 1 + (rd(g, 1) & 3);
    int64_t cells = 256 >> (rd(g, 1) % 3), tokens = g->dims[1];
    /* each operand within one of the fuzzer's 64 KiB buffers, with room */
    while (cells > 32 && d * cells * 2 * kv_heads > 40 * 1024)
        cells /= 2;
    while (tokens > 1 && d * tokens * kv_heads * gqa * 4 > 32 * 1024)
        tokens /= 2;
    const enum ggml_type cache = caches[rd(g, 1) & 3];
    struct ggml_tensor *t[4] = {
        ggml_new_tensor_4d(g->ctx, GGML_TYPE_F32, d, tokens, kv_heads * gqa, 1),
        ggml_new_tensor_4d(g->ctx, cache, d, cells, kv_heads, 1),
        ggml_new_tensor_4d(g->ctx, cache, d, cells, kv_heads, 1),
        rd(g, 1) & 3 ? ggml_new_tensor_4d(g->ctx, GGML_TYPE_F16, cells, tokens, 1, 1) : NULL,
    };
    for (int i = 0; i < 4; i++)
        if (t[i] && rd(g, 1) >= 216)
            t[i] = relayout(g, t[i]);
    struct ggml_tensor *r = ggml_flash_attn_ext(g->ctx, t[0], t[1], t[2], t[3], 1.0f / 8, rd(g, 1) & 1 ? 0.0f : 8.0f,
                                                rd(g, 1) & 1 ? 0.0f : 30.0f);
    if ((rd(g, 1) & 3) == 0)
        ggml_flash_attn_ext_add_sinks(r, ggml_new_tensor_1d(g->ctx, GGML_TYPE_F32, kv_heads * gqa));
    if (rd(g, 1) & 1)
        ggml_flash_attn_ext_set_prec(r, GGML_PREC_F32);
    return r;
}

/*
 * RWKV's and GLA's linear attention at a head size ggml-cuda has kernels
 * for (wkv.cu and gla.cu: 64, GLA 128 too, whose state would not fit here;
 * its supports_op takes any, the CUDA rules the rest): 1 or 2 heads, up to
 * 16 tokens of the input's second dim in 1 or 2 sequences, each operand's
 * layout varied as a leaf's one time in six.  For inputs whose first dim
 * is 5, as attention().
 */
static struct ggml_tensor *linear_attention(struct gen *g, enum ggml_op op)
{
    /* a state of s * s * h * seqs floats within one of the fuzzer's 64 KiB buffers, with room */
    const int64_t s = 64, h = 1 + (rd(g, 1) & 1), seqs = h == 1 ? 1 + (rd(g, 1) & 1) : 1;
    const int64_t tokens = (g->dims[1] < 16 ? g->dims[1] : 16) * seqs;
    struct ggml_tensor *t[7];
    const int n = op == GGML_OP_RWKV_WKV7 ? 6 : op == GGML_OP_RWKV_WKV6 ? 5 : 4;
    for (int i = 0; i < n; i++)
        t[i] = ggml_new_tensor_3d(g->ctx, GGML_TYPE_F32, s, h, tokens);
    if (op == GGML_OP_RWKV_WKV6)
        t[3] = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F32, s, h);  /* time_faaaa */
    t[n] = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F32, s * s * h, seqs);
    for (int i = 0; i <= n; i++)
        if (rd(g, 1) >= 216)
            t[i] = relayout(g, t[i]);
    switch (op) {
    case GGML_OP_RWKV_WKV6: return ggml_rwkv_wkv6(g->ctx, t[0], t[1], t[2], t[3], t[4], t[5]);
    case GGML_OP_GATED_LINEAR_ATTN: return ggml_gated_linear_attn(g->ctx, t[0], t[1], t[2], t[3], t[4], 0.125f);
    default: return ggml_rwkv_wkv7(g->ctx, t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
    }
}

/*
 * The node for op, made by its constructor from leaves and arguments the
 * input gives.  NULL: no constructor for it (raw node instead).
 */
static struct ggml_tensor *construct(struct gen *g, enum ggml_op op)
{
    struct ggml_context *c = g->ctx;
    /* One input in eight (its first dim 5) builds the shapes ggml-cuda's
     * attention kernels need instead; no byte is read before this choice,
     * so the other inputs keep their meaning. */
    if (g->dims[0] == 5 && op == GGML_OP_FLASH_ATTN_EXT)
        return attention(g);
    if (g->dims[0] == 5 && (op == GGML_OP_RWKV_WKV6 || op == GGML_OP_GATED_LINEAR_ATTN || op == GGML_OP_RWKV_WKV7))
        return linear_attention(g, op);
    switch (op) {
    case GGML_OP_DUP: return ggml_dup(c, L(g));
    case GGML_OP_ADD: return rd(g, 1) & 1 ? ggml_add(c, F(g), F(g)) : ggml_add_cast(c, F(g), F(g), pick_type(g));
    case GGML_OP_ADD_ID: return ggml_add_id(c, F(g), F(g), I(g));
    case GGML_OP_ADD1: {
        /* ADD1 nodes come only from ggml_add1, deprecated for new graphs */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        struct ggml_tensor *r = ggml_add1(c, F(g), F(g));
#pragma GCC diagnostic pop
        return r;
    }
    case GGML_OP_ACC: {
        struct ggml_tensor *a = F(g), *b = F(g);
        return ggml_acc(c, a, b, (size_t)ri(g, 0, 64) * 4, (size_t)ri(g, 0, 255) * 4, (size_t)ri(g, 0, 255) * 4,
                        (size_t)ri(g, 0, 64) * 4);
    }
    case GGML_OP_SUB: return ggml_sub(c, F(g), F(g));
    case GGML_OP_MUL: return ggml_mul(c, F(g), F(g));
    case GGML_OP_DIV: return ggml_div(c, F(g), F(g));
    case GGML_OP_SQR: return ggml_sqr(c, F(g));
    case GGML_OP_SQRT: return ggml_sqrt(c, F(g));
    case GGML_OP_LOG: return ggml_log(c, F(g));
    case GGML_OP_SIN: return ggml_sin(c, F(g));
    case GGML_OP_COS: return ggml_cos(c, F(g));
    case GGML_OP_SUM: return ggml_sum(c, F(g));
    case GGML_OP_SUM_ROWS: return ggml_sum_rows(c, F(g));
    case GGML_OP_CUMSUM: return ggml_cumsum(c, F(g));
    case GGML_OP_MEAN: return ggml_mean(c, F(g));
    case GGML_OP_ARGMAX: return ggml_argmax(c, F(g));
    case GGML_OP_COUNT_EQUAL: return ggml_count_equal(c, I(g), I(g));
    case GGML_OP_REPEAT: return ggml_repeat(c, F(g), F(g));
    case GGML_OP_REPEAT_BACK: return ggml_repeat_back(c, F(g), F(g));
    case GGML_OP_CONCAT: return ggml_concat(c, F(g), F(g), ri(g, 0, 3));
    case GGML_OP_SILU_BACK: return ggml_silu_back(c, F(g), F(g));
    case GGML_OP_NORM: return ggml_norm(c, F(g), rf(g));
    case GGML_OP_RMS_NORM: return ggml_rms_norm(c, F(g), rf(g));
    case GGML_OP_RMS_NORM_BACK: return ggml_rms_norm_back(c, F(g), F(g), rf(g));
    case GGML_OP_GROUP_NORM: return ggml_group_norm(c, F(g), ri(g, 1, 8), rf(g));
    case GGML_OP_L2_NORM: return ggml_l2_norm(c, F(g), rf(g));
    case GGML_OP_MUL_MAT: return ggml_mul_mat(c, L(g), F(g));
    case GGML_OP_MUL_MAT_ID: return ggml_mul_mat_id(c, L(g), F(g), I(g));
    case GGML_OP_OUT_PROD: return ggml_out_prod(c, F(g), F(g));
    case GGML_OP_SCALE: return ggml_scale_bias(c, F(g), rf(g), rf(g));
    case GGML_OP_SET: {
        struct ggml_tensor *a = F(g), *b = F(g);
        return ggml_set(c, a, b, (size_t)ri(g, 0, 64) * 4, (size_t)ri(g, 0, 255) * 4, (size_t)ri(g, 0, 255) * 4,
                        (size_t)ri(g, 0, 64) * 4);
    }
    case GGML_OP_CPY: return ggml_cpy(c, L(g), L(g));
    case GGML_OP_CONT: return ggml_cont(c, L(g));
    case GGML_OP_RESHAPE: return ggml_reshape(c, L(g), L(g));
    case GGML_OP_VIEW: {
        struct ggml_tensor *a = L(g);
        if (g->edges) {
            /* any strides, an offset at either end of the source */
            struct ggml_tensor *v = ggml_view_4d(c, a, ri(g, 1, 8), ri(g, 1, 4), ri(g, 1, 2), ri(g, 1, 2), 0, 0, 0, 0);
            for (int k = 1; k < 4; k++)
                v->nb[k] = stride_value(g, v, k);
            size_t a_bytes = ggml_nbytes(a), v_bytes = ggml_nbytes(v) < a_bytes ? ggml_nbytes(v) : a_bytes;
            size_t offs = rd(g, 1) & 1 ? 0 : a_bytes - v_bytes;
            v->view_offs = offs;
            memcpy(v->op_params, &offs, sizeof(offs));
            return v;
        }
        return ggml_view_2d(c, a, ri(g, 1, 32), ri(g, 1, 8), (size_t)ri(g, 0, 255), (size_t)ri(g, 0, 255) * 4);
    }
    case GGML_OP_PERMUTE: return ggml_permute(c, L(g), ri(g, 0, 3), ri(g, 0, 3), ri(g, 0, 3), ri(g, 0, 3));
    case GGML_OP_TRANSPOSE: return ggml_transpose(c, L(g));
    case GGML_OP_GET_ROWS: return ggml_get_rows(c, L(g), I(g));
    case GGML_OP_GET_ROWS_BACK: return ggml_get_rows_back(c, F(g), I(g), F(g));
    case GGML_OP_SET_ROWS: {
        struct ggml_tensor *dst = L(g), *src = F(g), *idx = I(g);
        return ggml_set_rows(c, dst, src, idx);
    }
    case GGML_OP_DIAG: return ggml_diag(c, F(g));
    case GGML_OP_DIAG_MASK_INF: return ggml_diag_mask_inf(c, F(g), ri(g, -2, 8));
    case GGML_OP_DIAG_MASK_ZERO: return ggml_diag_mask_zero(c, F(g), ri(g, -2, 8));
    case GGML_OP_SOFT_MAX: {
        struct ggml_tensor *a = F(g), *mask = rd(g, 1) & 1 ? F(g) : NULL;
        struct ggml_tensor *r = ggml_soft_max_ext(c, a, mask, rf(g), rf(g));
        if (rd(g, 1) & 1)
            ggml_soft_max_add_sinks(r, F(g));
        return r;
    }
    case GGML_OP_SOFT_MAX_BACK: return ggml_soft_max_ext_back(c, F(g), F(g), rf(g), rf(g));
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: {
        struct ggml_tensor *a = F(g), *pos = I(g), *ff = rd(g, 1) & 1 ? F(g) : NULL;
        int n_dims = ri(g, 0, 32), mode = (int)rd(g, 1) & 0x2f, n_ctx = ri(g, 0, 64);
        if (op == GGML_OP_ROPE_BACK)
            return ggml_rope_ext_back(c, a, pos, ff, n_dims, mode, n_ctx, rf(g), rf(g), rf(g), rf(g), rf(g), rf(g));
        if (mode & GGML_ROPE_TYPE_MROPE) {
            int sections[GGML_MROPE_SECTIONS] = { ri(g, 0, 8), ri(g, 0, 8), ri(g, 0, 8), ri(g, 0, 8) };
            return ggml_rope_multi(c, a, pos, ff, n_dims, sections, mode, n_ctx, rf(g), rf(g), rf(g), rf(g), rf(g), rf(g));
        }
        return ggml_rope_ext(c, a, pos, ff, n_dims, mode, n_ctx, rf(g), rf(g), rf(g), rf(g), rf(g), rf(g));
    }
    case GGML_OP_CLAMP: return ggml_clamp(c, F(g), rf(g), rf(g));
    case GGML_OP_CONV_TRANSPOSE_1D: return ggml_conv_transpose_1d(c, L(g), F(g), ri(g, 1, 3), 0, 1);
    case GGML_OP_IM2COL:
        return ggml_im2col(c, L(g), F(g), ri(g, 1, 3), ri(g, 1, 3), ri(g, 0, 2), ri(g, 0, 2), ri(g, 1, 2), ri(g, 1, 2),
                           rd(g, 1) & 1, rd(g, 1) & 1 ? GGML_TYPE_F16 : GGML_TYPE_F32);
    case GGML_OP_IM2COL_BACK: {
        struct ggml_tensor *a = L(g), *b = F(g);
        int64_t ne[4] = { ri(g, 1, 16), ri(g, 1, 16), ri(g, 1, 8), ri(g, 1, 4) };
        return ggml_im2col_back(c, a, b, ne, ri(g, 1, 3), ri(g, 1, 3), ri(g, 0, 2), ri(g, 0, 2), ri(g, 1, 2),
                                ri(g, 1, 2), rd(g, 1) & 1);
    }
    case GGML_OP_IM2COL_3D:
        return ggml_im2col_3d(c, L(g), F(g), ri(g, 1, 4), ri(g, 1, 2), ri(g, 1, 2), ri(g, 1, 2), ri(g, 0, 1), ri(g, 0, 1),
                              ri(g, 0, 1), 1, 1, 1, GGML_TYPE_F32);
    case GGML_OP_COL2IM_1D: return ggml_col2im_1d(c, F(g), ri(g, 1, 3), ri(g, 1, 4), ri(g, 0, 2));
    case GGML_OP_CONV_2D:
        return ggml_conv_2d_direct(c, L(g), F(g), ri(g, 1, 3), ri(g, 1, 3), ri(g, 0, 2), ri(g, 0, 2), ri(g, 1, 2),
                                   ri(g, 1, 2));
    case GGML_OP_CONV_3D:
        return ggml_conv_3d_direct(c, L(g), F(g), ri(g, 1, 2), ri(g, 1, 2), ri(g, 1, 2), ri(g, 0, 1), ri(g, 0, 1),
                                   ri(g, 0, 1), 1, 1, 1, ri(g, 1, 4), ri(g, 1, 2), ri(g, 1, 4));
    case GGML_OP_CONV_2D_DW:
        return ggml_conv_2d_dw_direct(c, F(g), F(g), ri(g, 1, 3), ri(g, 1, 3), ri(g, 0, 2), ri(g, 0, 2), ri(g, 1, 2),
                                      ri(g, 1, 2));
    case GGML_OP_CONV_TRANSPOSE_2D: return ggml_conv_transpose_2d_p0(c, L(g), F(g), ri(g, 1, 3));
    case GGML_OP_POOL_1D: return ggml_pool_1d(c, F(g), (enum ggml_op_pool)ri(g, 0, 2), ri(g, 1, 4), ri(g, 1, 4), ri(g, 0, 2));
    case GGML_OP_POOL_2D:
        return ggml_pool_2d(c, F(g), (enum ggml_op_pool)ri(g, 0, 2), ri(g, 1, 4), ri(g, 1, 4), ri(g, 1, 4), ri(g, 1, 4),
                            (float)ri(g, 0, 2), (float)ri(g, 0, 2));
    case GGML_OP_POOL_2D_BACK:
        return ggml_pool_2d_back(c, F(g), F(g), (enum ggml_op_pool)ri(g, 0, 2), ri(g, 1, 4), ri(g, 1, 4), ri(g, 1, 4),
                                 ri(g, 1, 4), (float)ri(g, 0, 2), (float)ri(g, 0, 2));
    case GGML_OP_UPSCALE:
        return ggml_interpolate(c, F(g), ri(g, 1, 16), ri(g, 1, 16), ri(g, 1, 4), ri(g, 1, 4), rd(g, 1) & 0x7);
    case GGML_OP_PAD:
        return ggml_pad_ext(c, F(g), ri(g, 0, 4), ri(g, 0, 4), ri(g, 0, 4), ri(g, 0, 4), ri(g, 0, 2), ri(g, 0, 2),
                            ri(g, 0, 2), ri(g, 0, 2));
    case GGML_OP_PAD_REFLECT_1D: return ggml_pad_reflect_1d(c, F(g), ri(g, 0, 8), ri(g, 0, 8));
    case GGML_OP_ROLL: return ggml_roll(c, F(g), ri(g, -8, 8), ri(g, -8, 8), ri(g, -4, 4), ri(g, -4, 4));
    case GGML_OP_ARANGE: return ggml_arange(c, (float)ri(g, -8, 8), (float)ri(g, -8, 64), rf(g));
    case GGML_OP_TIMESTEP_EMBEDDING: return ggml_timestep_embedding(c, F(g), ri(g, 1, 64), ri(g, 1, 10000));
    case GGML_OP_ARGSORT: return ggml_argsort(c, F(g), (enum ggml_sort_order)ri(g, 0, 1));
    case GGML_OP_TOP_K: return ggml_top_k(c, F(g), ri(g, 1, 32));
    case GGML_OP_LEAKY_RELU: return ggml_leaky_relu(c, F(g), rf(g), false);
    case GGML_OP_TRI: return ggml_tri(c, F(g), (enum ggml_tri_type)ri(g, 0, 3));
    case GGML_OP_FILL: return ggml_fill(c, F(g), rf(g));
    case GGML_OP_FLASH_ATTN_EXT: {
        struct ggml_tensor *q = F(g), *k = L(g), *v = L(g), *mask = rd(g, 1) & 1 ? L(g) : NULL;
        struct ggml_tensor *r = ggml_flash_attn_ext(c, q, k, v, mask, rf(g), rf(g), rf(g));
        if (rd(g, 1) & 1)
            ggml_flash_attn_ext_add_sinks(r, F(g));
        return r;
    }
    case GGML_OP_SSM_CONV: return ggml_ssm_conv(c, F(g), F(g));
    case GGML_OP_SSM_SCAN: {
        struct ggml_tensor *s = F(g), *x = F(g), *dt = F(g), *A = F(g), *B = F(g), *C = F(g), *ids = I(g);
        return ggml_ssm_scan(c, s, x, dt, A, B, C, ids, ri(g, 1, 2));
    }
    case GGML_OP_WIN_PART: return ggml_win_part(c, F(g), ri(g, 1, 8));
    case GGML_OP_WIN_UNPART: return ggml_win_unpart(c, F(g), ri(g, 1, 16), ri(g, 1, 16), ri(g, 1, 8));
    case GGML_OP_GET_REL_POS: return ggml_get_rel_pos(c, L(g), ri(g, 1, 8), ri(g, 1, 8));
    case GGML_OP_ADD_REL_POS: return ggml_add_rel_pos(c, F(g), F(g), F(g));
    case GGML_OP_RWKV_WKV6: return ggml_rwkv_wkv6(c, F(g), F(g), F(g), F(g), F(g), F(g));
    case GGML_OP_GATED_LINEAR_ATTN: return ggml_gated_linear_attn(c, F(g), F(g), F(g), F(g), F(g), rf(g));
    case GGML_OP_RWKV_WKV7: return ggml_rwkv_wkv7(c, F(g), F(g), F(g), F(g), F(g), F(g), F(g));
    case GGML_OP_SOLVE_TRI: return ggml_solve_tri(c, F(g), F(g), true, true, false);
    case GGML_OP_GATED_DELTA_NET: return ggml_gated_delta_net(c, F(g), F(g), F(g), F(g), F(g), F(g), ri(g, 1, 2));
    case GGML_OP_LIGHTNING_INDEXER: return ggml_lightning_indexer(c, F(g), F(g), F(g), F(g));
    case GGML_OP_DSV4_HC_COMB: return ggml_dsv4_hc_comb(c, F(g), F(g), F(g), rf(g), ri(g, 0, 4));
    case GGML_OP_DSV4_HC_PRE: return ggml_dsv4_hc_pre(c, F(g), F(g));
    case GGML_OP_DSV4_HC_POST: return ggml_dsv4_hc_post(c, F(g), F(g), F(g), F(g));
    case GGML_OP_UNARY: {
        enum ggml_unary_op u = (enum ggml_unary_op)ri(g, 0, GGML_UNARY_OP_COUNT - 1);
        if (u == GGML_UNARY_OP_XIELU)
            return ggml_xielu(c, F(g), rf(g), rf(g), rf(g), rf(g));
        return ggml_unary(c, F(g), u);
    }
    case GGML_OP_GLU: {
        enum ggml_glu_op u = (enum ggml_glu_op)ri(g, 0, GGML_GLU_OP_COUNT - 1);
        if (u == GGML_GLU_OP_SWIGLU_OAI)
            return ggml_swiglu_oai(c, F(g), F(g), rf(g), rf(g));
        if (u == GGML_GLU_OP_SWIGLU_CLAMP)
            return ggml_swiglu_clamp(c, F(g), F(g), rf(g));
        if (rd(g, 1) & 1)
            return ggml_glu_split(c, F(g), F(g), u);
        return ggml_glu(c, F(g), u, rd(g, 1) & 1);
    }
    case GGML_OP_CROSS_ENTROPY_LOSS: return ggml_cross_entropy_loss(c, F(g), F(g));
    case GGML_OP_CROSS_ENTROPY_LOSS_BACK: return ggml_cross_entropy_loss_back(c, F(g), F(g), F(g));
    case GGML_OP_OPT_STEP_ADAMW: {
        struct ggml_tensor *a = F(g);
        a->flags |= GGML_TENSOR_FLAG_PARAM;
        return ggml_opt_step_adamw(c, a, F(g), F(g), F(g), F(g));
    }
    case GGML_OP_OPT_STEP_SGD: {
        struct ggml_tensor *a = F(g);
        a->flags |= GGML_TENSOR_FLAG_PARAM;
        return ggml_opt_step_sgd(c, a, F(g), F(g));
    }
    default:
        return NULL;
    }
}

/* A node of arbitrary fields: what the host must refuse or bound. */
static struct ggml_tensor *raw_node(struct gen *g, enum ggml_op op)
{
    int64_t ne[4] = { ri(g, 0, 40), ri(g, 0, 9), ri(g, 0, 4), ri(g, 0, 3) };
    struct ggml_tensor *t = ggml_new_tensor(g->ctx, pick_type(g), 4, ne);
    t->op = op;
    for (int k = 0; k < GGML_MAX_OP_PARAMS / 4; k++)
        t->op_params[k] = rd(g, 1) < 200 ? ri(g, -2, 40) : (int32_t)rd(g, 4);
    int n_src = ri(g, 0, 7);
    for (int k = 0; k < n_src; k++)
        t->src[k] = rd(g, 1) & 1 ? I(g) : L(g);
    return t;
}

/* One field of a constructed node, changed. */
static void mutate(struct gen *g, struct ggml_tensor *t)
{
    switch (rd(g, 1) % 6) {
    case 0: { /* wraps like the guest's u32 fields would, without UB */
        int k = (int)(rd(g, 1) & 3);
        t->ne[k] = (int64_t)((uint64_t)t->ne[k] + (uint64_t)(int64_t)ri(g, -1, 2));
        break;
    }
    case 1: {
        int k = (int)(rd(g, 1) & 3);
        t->nb[k] = g->edges ? stride_value(g, t, k) : (size_t)ri(g, 0, 64) * 4;
        break;
    }
    case 2: t->op_params[rd(g, 1) % (GGML_MAX_OP_PARAMS / 4)] = (int32_t)rd(g, 4); break;
    case 3: t->type = pick_type(g); break;
    case 4: t->src[rd(g, 1) % GGML_MAX_SRC] = L(g); break;
    default: if (t->view_src) t->view_offs += (size_t)ri(g, 1, 64) * 4; break;
    }
}

/* ---- placing and sending ------------------------------------------------- */

static int find_t(const struct gen *g, const struct ggml_tensor *t)
{
    for (int i = 0; i < g->n; i++)
        if (g->t[i] == t)
            return i;
    return -1;
}

/* Buffer b as the host sees it (its size), and the memory around it that
 * the oracle watches (its region: an own mapping is wider than its buffer,
 * which starts own_start into it). */
static uint64_t buf_size_of(const struct gen *g, int b)
{
    return b < N_GUARDED ? GUARDED_SIZE : b == N_GUARDED ? ALLOC_SIZE : g->own_size[b - OWN0];
}
static uint64_t buf_start_of(const struct gen *g, int b) { return b < OWN0 ? 0 : g->own_start[b - OWN0]; }
static uint64_t region_size_of(int b) { return b < N_GUARDED ? GUARDED_SIZE : b == N_GUARDED ? ALLOC_SIZE : OWN_SIZE; }
static int n_bufs_of(const struct gen *g) { return OWN0 + g->n_own; }

/*
 * Edges inputs: t alone in the next own mapping, in a buffer of just its
 * extent (rounded to the 32 bytes a CPU buffer's start needs) flush with the
 * mapping's end, or starting at the mapping's start: t's last byte is then
 * followed, or its first byte preceded, by the guard page.  False when the
 * mappings are taken.
 */
static bool place_own(struct gen *g, int i, bool at_end)
{
    if (g->n_own == N_OWN)
        return false;
    int o = g->n_own++;
    uint64_t n = ggml_nbytes(g->t[i]);
    if (n == 0)
        n = 1;  /* FROM_PTR refuses an empty buffer */
    if (n > OWN_SIZE) {  /* does not fit: the host must refuse it as sent */
        g->own_start[o] = 0;
        g->own_size[o] = OWN_SIZE;
        g->off_of[i] = 0;
    } else if (at_end) {
        g->own_size[o] = (n + 31) & ~(uint64_t)31;
        g->own_start[o] = OWN_SIZE - g->own_size[o];
        g->off_of[i] = g->own_size[o] - n;
    } else {
        g->own_start[o] = 0;
        g->own_size[o] = n;
        g->off_of[i] = 0;
    }
    g->buf_of[i] = OWN0 + o;
    return true;
}

/* Places t and what it reaches; -1 when there are too many. */
static int place(struct gen *g, struct ggml_tensor *t)
{
    int i = find_t(g, t);
    if (i >= 0)
        return i;
    for (int k = 0; k < GGML_MAX_SRC; k++)
        if (t->src[k] && place(g, t->src[k]) < 0)
            return -1;
    if (t->view_src && place(g, t->view_src) < 0)
        return -1;
    if (g->n == MAX_TENSORS)
        return -1;
    i = g->n++;
    g->t[i] = t;
    if (t->view_src) {
        int v = find_t(g, t->view_src);
        g->buf_of[i] = g->buf_of[v];
        g->off_of[i] = g->off_of[v] + t->view_offs;
        return i;
    }
    bool is_index = t->type == GGML_TYPE_I32 || t->type == GGML_TYPE_I64;
    if (g->edges && !(g->use_alloc && is_index)) {
        uint32_t own = rd(g, 1);  /* 5 in 8: a mapping of its own */
        if (own < 160 && place_own(g, i, own & 1))
            return i;
    }
    int b = g->use_alloc && is_index ? N_GUARDED : (int)(rd(g, 1) % N_GUARDED);
    uint64_t size = buf_size_of(g, b), nbytes = ggml_nbytes(t);
    uint32_t where = rd(g, 1);
    uint64_t off;
    if (where < 16 && nbytes <= size)
        off = size - nbytes;                           /* flush with the end */
    else if (where < 32 && i > 0)
        off = g->off_of[i - 1] + (where & 3) * 4;      /* over the previous one */
    else
        off = g->next[b];
    if (nbytes > size || off > size - nbytes)
        off = 0;  /* will not fit: the host must refuse it as sent */
    g->buf_of[i] = b;
    g->off_of[i] = off;
    if (off == g->next[b])
        g->next[b] = (off + nbytes + 31) & ~31ull;
    return i;
}

static struct apir_tensor_rec rec_of(const struct gen *g, int i, const uint64_t *buf_handle)
{
    const struct ggml_tensor *t = g->t[i];
    struct apir_tensor_rec r;
    memset(&r, 0, sizeof(r));
    r.id = (uint64_t)i + 1;
    r.type = (uint32_t)t->type;
    r.buffer = buf_handle[g->buf_of[i]];
    for (int k = 0; k < 4; k++) {
        r.ne[k] = (uint32_t)t->ne[k];
        r.nb[k] = (uint32_t)t->nb[k];
    }
    r.op = (uint32_t)t->op;
    memcpy(r.op_params, t->op_params, sizeof(r.op_params));
    r.flags = t->flags | (t->op != GGML_OP_NONE ? GGML_TENSOR_FLAG_COMPUTE : 0);
    for (int k = 0; k < APIR_TENSOR_MAX_SRC && k < GGML_MAX_SRC; k++)
        r.src[k] = t->src[k] ? (uint64_t)find_t(g, t->src[k]) + 1 : 0;
    r.view_src = t->view_src ? (uint64_t)find_t(g, t->view_src) + 1 : 0;
    r.view_offs = t->view_src ? t->view_offs : 0;
    r.data = g->off_of[i];
    return r;
}

/* Leaf contents: floats, half floats and bytes from a generator seeded by
 * the input; index leaves mostly small (in and out of range). */
static void fill(struct gen *g, uint8_t *const *base)
{
    uint32_t x = rd(g, 4) | 1u;
    for (int b = 0; b < n_bufs_of(g); b++)
        for (uint64_t k = 0; k < region_size_of(b); k += 4) {
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            float f = (float)(int32_t)(x % 2000u - 1000) / 256.0f;
            memcpy(base[b] + k, &f, 4);
        }
    for (int i = 0; i < g->n; i++) {
        struct ggml_tensor *t = g->t[i];
        if (t->op != GGML_OP_NONE || t->view_src || (t->type != GGML_TYPE_I32 && t->type != GGML_TYPE_I64))
            continue;
        uint64_t size = buf_size_of(g, g->buf_of[i]), nbytes = ggml_nbytes(t);
        if (g->off_of[i] > size || nbytes > size - g->off_of[i])
            continue;  /* does not fit: the host refuses it */
        uint8_t *p = base[g->buf_of[i]] + buf_start_of(g, g->buf_of[i]) + g->off_of[i];
        uint64_t n = nbytes / ggml_type_size(t->type);
        uint32_t spread = rd(g, 1);
        for (uint64_t k = 0; k < n; k++) {
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            int64_t v = spread < 230 ? (int64_t)(x % 10u) : spread < 245 ? (int64_t)(x % 64u) - 2 : (int64_t)(int32_t)x;
            if (t->type == GGML_TYPE_I32) {
                int32_t v32 = (int32_t)v;
                memcpy(p + k * 4, &v32, 4);
            } else {
                memcpy(p + k * 8, &v, 8);
            }
        }
    }
}

/*
 * A result's extent as the device's buffer type allocates it, where that is
 * more than its bytes: ggml-cuda writes a FLASH_ATTN_EXT's f16 copies of a
 * quantized or BF16 K and V after the result, in the room its get_alloc_size
 * asks for (fattn-common.cuh, ggml_cuda_flash_attn_ext_get_f16_extra_data);
 * the host keeps that room inside the result's buffer (op_shapes.c,
 * allocation_error).  Writes there are the guest's own business; past it,
 * a finding.  The address only matters modulo 128 (the copies start at
 * 128-byte boundaries): a device buffer's base is at least that aligned.
 */
static size_t result_alloc_size(const struct ggml_tensor *t, uint64_t off)
{
    ggml_backend_buffer_type_t buft = fz_host.n_devices ? ggml_backend_dev_buffer_type(fz_host.devices[0]) : NULL;
    if (!buft)
        return 0;
    struct ggml_tensor at = *t;
    at.data = (void *)(uintptr_t)((1ull << 32) + off);
    at.buffer = NULL;
    return ggml_backend_buft_get_alloc_size(buft, &at);
}

/* Which bytes the node may write: its own extent (on a device, its
 * allocation's), and for OPT_STEP_* the tensors it updates in place. */
static void allowed_writes(const struct gen *g, int node, uint8_t *const *allow)
{
    const struct ggml_tensor *t = g->t[node];
    const struct ggml_tensor *w[5] = { t, NULL, NULL, NULL, NULL };
    if (t->op == GGML_OP_OPT_STEP_ADAMW) {
        w[1] = t->src[0]; w[2] = t->src[2]; w[3] = t->src[3];
    } else if (t->op == GGML_OP_OPT_STEP_SGD) {
        w[1] = t->src[0];
    }
    for (int k = 0; k < 5; k++) {
        int i = w[k] ? find_t(g, w[k]) : -1;
        if (i < 0)
            continue;
        int b = g->buf_of[i];
        uint64_t size = buf_size_of(g, b), off = g->off_of[i], n = ggml_nbytes(w[k]);
        if (off >= size)
            continue;
        if (k == 0 && device_path && !w[k]->view_src) {
            const uint64_t alloc = result_alloc_size(w[k], off);
            n = alloc > n ? alloc : n;
        }
        if (n > size - off)
            n = size - off;
        memset(allow[b] + buf_start_of(g, b) + off, 1, n);
    }
}

/* ggml_op_desc, which indexes its name tables with a UNARY or GLU node's
 * sub-op unchecked: a raw node's can be anything. */
static const char *op_name(const struct ggml_tensor *t)
{
    if (t->op == GGML_OP_UNARY && (uint32_t)ggml_get_op_params_i32(t, 0) >= GGML_UNARY_OP_COUNT)
        return "UNARY (sub-op out of range)";
    if (t->op == GGML_OP_GLU && (uint32_t)ggml_get_op_params_i32(t, 0) >= GGML_GLU_OP_COUNT)
        return "GLU (sub-op out of range)";
    return ggml_op_desc(t);
}

/* FUZZ_VERBOSE: what was sent, for triage. */
static void dump(const struct gen *g)
{
    for (int i = 0; i < g->n; i++) {
        const struct ggml_tensor *t = g->t[i];
        fprintf(stderr, "fuzz_op: #%d %-14s %-5s ne %lld %lld %lld %lld nb %zu %zu %zu %zu buf %d off %llu", i + 1,
                op_name(t), ggml_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1],
                (long long)t->ne[2], (long long)t->ne[3], t->nb[0], t->nb[1], t->nb[2], t->nb[3], g->buf_of[i],
                (unsigned long long)g->off_of[i]);
        if (g->buf_of[i] >= OWN0)
            fprintf(stderr, " (own mapping: buffer of %llu bytes at %llu of %u)",
                    (unsigned long long)buf_size_of(g, g->buf_of[i]), (unsigned long long)buf_start_of(g, g->buf_of[i]),
                    OWN_SIZE);
        if (t->view_src)
            fprintf(stderr, " view of #%d at %zu", find_t(g, t->view_src) + 1, t->view_offs);
        for (int k = 0; k < GGML_MAX_SRC; k++)
            if (t->src[k])
                fprintf(stderr, " src%d #%d", k, find_t(g, t->src[k]) + 1);
        if (t->op != GGML_OP_NONE)
            fprintf(stderr, " params %d %d %d %d %d %d", t->op_params[0], t->op_params[1], t->op_params[2],
                    t->op_params[3], t->op_params[4], t->op_params[5]);
        fputc('\n', stderr);
    }
    if (g->n_chain) {
        fprintf(stderr, "fuzz_op: chain %s, nodes and the use counts sent:", chain_names[g->kind]);
        for (int i = 0; i < g->n_chain; i++)
            fprintf(stderr, " #%d %u", find_t(g, g->chain[i]) + 1, g->uses[i]);
        fputc('\n', stderr);
    }
}

/* What an input sent, for messages: its node's op, or its chain's ops. */
static const char *sent_name(const struct gen *g, const int *nodes, int n_nodes)
{
    static char buf[512];
    if (!g->n_chain)
        return op_name(g->t[nodes[0]]);
    size_t n = (size_t)snprintf(buf, sizeof(buf), "chain %s:", chain_names[g->kind]);
    for (int i = 0; i < n_nodes && n < sizeof(buf); i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, " %s", op_name(g->t[nodes[i]]));
    return buf;
}

/*
 * In the child, after the host answered: the write oracle, over the nodes
 * sent (a chain's each may write its own result; a fused kernel writes
 * fewer).  A refused node writes nothing; but a refused chain may have
 * computed the nodes before the one refused: an index tensor that an
 * earlier node writes over is checked right before its use, after those
 * nodes ran (op_policy.c, "late" uses).
 */
static void check_writes(const struct gen *g, const int *nodes, int n_nodes, bool accepted, uint8_t *const *base)
{
    static uint8_t allow_mem[N_BUFS][REGION_MAX];
    uint8_t *allow[N_BUFS];
    for (int b = 0; b < n_bufs_of(g); b++) {
        allow[b] = allow_mem[b];
        memset(allow[b], 0, region_size_of(b));
    }
    for (int i = 0; i < n_nodes && (accepted || g->n_chain); i++)
        if (!ggml_op_is_empty(g->t[nodes[i]]->op))
            allowed_writes(g, nodes[i], allow);
    for (int b = 0; b < n_bufs_of(g); b++) {
        if (memcmp(base[b], snapshot[b], region_size_of(b)) == 0)
            continue;
        for (uint64_t k = 0; k < region_size_of(b); k++)
            if (base[b][k] != snapshot[b][k] && !allow[b][k]) {
                /* k counts from the region's start: an own mapping's buffer
                 * starts buf_start_of into it */
                fprintf(stderr,
                        "FUZZ ORACLE: %s (%s) changed byte %llu of buffer %d (region of %llu, buffer at %llu) "
                        "outside what it may write\n",
                        sent_name(g, nodes, n_nodes), accepted ? "accepted" : "refused", (unsigned long long)k, b,
                        (unsigned long long)region_size_of(b), (unsigned long long)buf_start_of(g, b));
                if (device_path)
                    abort();  /* the driver (or libFuzzer) keeps the input */
                _exit(ORACLE_EXIT);
            }
    }
}

/*
 * Findings of this target not fixed yet (fuzz/findings/README.md, "fuzz_op"):
 * with FUZZ_SKIP_KNOWN set, inputs that would hit them are skipped so that
 * a run can look past them.  All are in what a node's shape, strides and
 * placement allow (host/check/op_shapes.c, op_derive.c), not in index values.
 */
static bool hits_known(const struct gen *g, int node_i)
{
    const struct ggml_tensor *node = g->t[node_i];
    switch (node->op) {
    /* fuzz_op-1, -4 (ROPE n_dims, freq factors), -2 (COUNT_EQUAL rows),
     * -3 (IM2COL_BACK), -5 (POOL_2D_BACK), -9 (WIN_UNPART), -14
     * (SILU_BACK), -18, -21, -22 (FLASH_ATTN_EXT V and mask extents) fixed:
     * op_shapes.c kernel_params_error */
    /* fuzz_op-13, -15, -16, -17, -19, -20, -23 (types without kernel
     * functions) fixed: op_operands.c types_error */
    default:
        break;
    }
    /* fuzz_op-7, -8 (a result overlapping a source other than in place)
     * fixed: op_operands.c overlap_error */
    return false;
}

/*
 * Issue 24 class 1 (fuzz_op-61, -62): a size-1 dimension whose stride is
 * not ggml_new_tensor's, i.e. not the stride below it times that
 * dimension's count.  The import normalises these (host/check/import.c); on a
 * tree without that, FUZZ_SKIP_KNOWN skips such inputs so that a run looks
 * past them.  Not a reason to leave an input out of the seeds.
 */
static bool has_odd_size1_stride(const struct gen *g)
{
    for (int i = 0; i < g->n; i++) {
        const struct ggml_tensor *t = g->t[i];
        for (int k = 0; k < 4; k++) {
            if (t->ne[k] != 1)
                continue;
            size_t want = k == 0 ? ggml_type_size(t->type)
                                 : t->nb[k - 1] * (size_t)(k == 1 ? t->ne[0] / ggml_blck_size(t->type) : t->ne[k - 1]);
            if (t->nb[k] != want)
                return true;
        }
    }
    return false;
}

static bool build(struct gen *g, struct ggml_tensor **node);

/* The no-alloc context inputs build their tensors in: one for the process,
 * reset per input (a fresh one per input is mostly page faults). */
static struct ggml_context *scratch_ctx(void)
{
    static struct ggml_context *ctx;
    if (!ctx) {
        struct ggml_init_params params = { .mem_size = 256 * 1024, .mem_buffer = NULL, .no_alloc = true };
        if (!(ctx = ggml_init(params)))
            abort();
    } else {
        ggml_reset(ctx);
    }
    return ctx;
}

/*
 * FUZZ_OP_SEEDS=DIR: writes, per op, a few inputs whose node its constructor
 * accepts (random bytes, tried until some pass) and exits: plain inputs and
 * edges inputs.  Random leaves rarely fit an op's shape rules, and the
 * constructors are not coverage-instrumented, so these give the fuzzer a
 * start inside every op.
 */
static void write_constructible_seeds(const char *dir)
{
    uint32_t x = 0x9e3779b9u;
    for (int edges = 0; edges < 2; edges++) {
        for (int op = 0; op < GGML_OP_COUNT; op++) {
            int found = 0;
            for (int attempt = 0; attempt < 20000 && found < 4; attempt++) {
                uint8_t in[128];  /* edges inputs read more bytes per leaf */
                size_t len = edges ? sizeof(in) : 96;
                for (size_t i = 0; i < len; i++) {
                    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
                    in[i] = (uint8_t)x;
                }
                uint8_t *body = in;
                if (edges)
                    *body++ = EDGES_MARK;
                body[0] = (uint8_t)op;
                body[1] = (uint8_t)((body[1] & 0x80) | 0x11);  /* constructed, not mutated */
                struct gen g;
                memset(&g, 0, sizeof(g));
                g.r.p = in;
                g.r.left = len;
                g.ctx = scratch_ctx();
                struct ggml_tensor *node;
                bool ok = build(&g, &node) && g.constructed && !hits_known(&g, find_t(&g, node));
                if (!ok)
                    continue;
                char path[512];
                snprintf(path, sizeof(path), "%s/constructed-%s%02d-%d.bin", dir, edges ? "edges-" : "", op, found++);
                FILE *f = fopen(path, "wb");
                if (!f || fwrite(in, 1, len, f) != len || fclose(f) != 0) {
                    perror(path);
                    exit(1);
                }
            }
        }
    }
    exit(0);
}

/* size bytes (a multiple of the page size) with a PROT_NONE page right
 * before and right after them. */
static uint8_t *map_guarded(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *p = mmap(NULL, size + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0 || mprotect(p + page + size, page, PROT_NONE) != 0)
        abort();
    return p + page;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    strict_aborts = getenv("FUZZ_OP_STRICT") && strcmp(getenv("FUZZ_OP_STRICT"), "0") != 0;
    const char *dp = getenv("FUZZ_OP_DEVICE_PATH");
    device_path = strcmp(fz_backend_name(), "CPU") != 0 || (dp && strcmp(dp, "0") != 0);
    const char *ch = getenv("FUZZ_OP_CHAINS");
    chains = ch && strcmp(ch, "0") != 0;
    if (getenv("FUZZ_OP_CHAIN_KINDS"))
        read_chain_kinds(getenv("FUZZ_OP_CHAIN_KINDS"));
    fz_host_init();
    previous_abort = ggml_set_abort_callback(on_abort);
    if (getenv("FUZZ_OP_SEEDS"))
        write_constructible_seeds(getenv("FUZZ_OP_SEEDS"));
    data_blob = mmap(NULL, REGION_MAX, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data_blob == MAP_FAILED)
        abort();
    for (int b = 0; b < N_GUARDED; b++)
        guarded[b] = map_guarded(GUARDED_SIZE);
    for (int o = 0; o < N_OWN; o++)
        own_map[o] = map_guarded(OWN_SIZE);
    msg_blob = mmap(NULL, MSG_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (msg_blob == MAP_FAILED)
        abort();
    return 0;
}

/* Builds the node; false when nothing can be sent. */
static bool build(struct gen *g, struct ggml_tensor **node)
{
    if (g->r.left && g->r.p[0] == EDGES_MARK) {
        g->edges = true;
        rd(g, 1);
    }
    /* volatile: read after a longjmp back to the setjmp below */
    volatile enum ggml_op op = (enum ggml_op)(rd(g, 1) % GGML_OP_COUNT);
    uint32_t mode = rd(g, 1);
    g->use_alloc = (mode & 0x80) != 0;
    for (int k = 0; k < 4; k++) {
        static const int64_t pool[] = { 1, 2, 3, 4, 8, 16, 32, 5 };
        g->dims[k] = pool[rd(g, 1) & 7];
    }
    /* volatile: assigned between setjmp and a longjmp back to it */
    struct ggml_tensor *volatile made = NULL;
    jmp_buf trap;
    if (setjmp(trap) == 0) {
        construct_trap = &trap;
        if ((mode & 0x0f) != 0) {  /* 15 in 16: constructed */
            made = construct(g, op);
            g->constructed = made != NULL;
            if (made && (mode & 0x70) == 0)
                mutate(g, made);
        }
    }
    if (!made && setjmp(trap) == 0) {
        construct_trap = &trap;
        made = raw_node(g, op);
    }
    construct_trap = NULL;
    *node = made;
    return made && place(g, made) >= 0;
}

/* ---- chain mode: the chains (enum chain_kind says why) -------------------- */

/* One of the values listed, by the input. */
#define PICK(g, ...) \
    pick_of(g, (const int64_t[]){ __VA_ARGS__ }, sizeof((const int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))
static int64_t pick_of(struct gen *g, const int64_t *pool, size_t n) { return pool[rd(g, 1) % n]; }

/* A chain's leaf: the shape its constructor needs, dense as a model's
 * tensors are (what ggml's fusion checks want); one in six with its layout
 * varied as a plain input's leaf (relayout).  Here and below a byte past
 * the input's end (0) takes the common case. */
static struct ggml_tensor *cleaf(struct gen *g, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                                 int64_t ne3)
{
    struct ggml_tensor *t = ggml_new_tensor_4d(g->ctx, type, ne0, ne1, ne2, ne3);
    return rd(g, 1) >= 216 ? relayout(g, t) : t;
}

/* Whether the next constructor that has an in-place form takes it. */
static bool in_place(struct gen *g)
{
    return g->n_inplace < 32 && ((g->inplace >> g->n_inplace++) & 1);
}

/* t as the chain's next node. */
static struct ggml_tensor *push(struct gen *g, struct ggml_tensor *t)
{
    if (g->n_chain == CHAIN_MAX)
        abort();  /* a builder below made more nodes than CHAIN_MAX */
    g->chain[g->n_chain++] = t;
    return t;
}

/* RMS_NORM of x times a weight, as a layer makes it: a row broadcast over x
 * (the norm the first operand, ggml_mul's rule), or x's shape (either). */
static struct ggml_tensor *chain_norm_mul(struct gen *g, struct ggml_tensor *x)
{
    const float eps = rd(g, 1) < 240 ? 1e-6f : rf(g);
    struct ggml_tensor *n = push(g, (in_place(g) ? ggml_rms_norm_inplace : ggml_rms_norm)(g->ctx, x, eps));
    const uint32_t how = rd(g, 1);
    struct ggml_tensor *w = how & 1 ? cleaf(g, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2], x->ne[3])
                                    : cleaf(g, GGML_TYPE_F32, x->ne[0], 1, 1, 1);
    const bool swap = (how & 3) == 3;
    struct ggml_tensor *(*mul)(struct ggml_context *, struct ggml_tensor *, struct ggml_tensor *) =
        in_place(g) ? ggml_mul_inplace : ggml_mul;
    return push(g, swap ? mul(g->ctx, w, n) : mul(g->ctx, n, w));
}

/* ROPE of x ([head size, heads, tokens]) with a position per token: NORMAL
 * or NEOX mostly (the modes the fused kernels have), the head's whole size
 * rotated mostly. */
static struct ggml_tensor *chain_rope(struct gen *g, struct ggml_tensor *x)
{
    const uint32_t m = rd(g, 1), d = rd(g, 1);
    /* any other: ggml_rope_impl asserts an odd mode */
    const int mode = m < 110 ? GGML_ROPE_TYPE_NORMAL : m < 220 ? GGML_ROPE_TYPE_NEOX : (int)(rd(g, 1) & 0x2e);
    const int n_dims = d < 192 ? (int)x->ne[0] : d < 240 ? (int)(x->ne[0] / 2) & ~1 : ri(g, 0, 2 * (int)x->ne[0]);
    struct ggml_tensor *pos = cleaf(g, GGML_TYPE_I32, x->ne[2] * (mode & GGML_ROPE_TYPE_MROPE ? 4 : 1), 1, 1, 1);
    struct ggml_tensor *ff = rd(g, 1) >= 232 ? cleaf(g, GGML_TYPE_F32, n_dims / 2 > 0 ? n_dims / 2 : 1, 1, 1, 1) : NULL;
    if (mode & GGML_ROPE_TYPE_MROPE) {
        int sections[GGML_MROPE_SECTIONS] = { ri(g, 0, 8), ri(g, 0, 8), ri(g, 0, 8), ri(g, 0, 8) };
        return push(g, ggml_rope_multi(g->ctx, x, pos, ff, n_dims, sections, mode, 0, 10000.0f, 1.0f, 0.0f, 1.0f,
                                       32.0f, 1.0f));
    }
    return push(g, (in_place(g) ? ggml_rope_ext_inplace : ggml_rope_ext)(g->ctx, x, pos, ff, n_dims, mode, 0, 10000.0f,
                                                                         1.0f, 0.0f, 1.0f, 32.0f, 1.0f));
}

/* The rows of every head of rope (a VIEW), stored by SET_ROWS in a cache at
 * the rows an index tensor names (llama's K cache store: int64 indices,
 * an F16 or F32 cache). */
static void chain_set_rows(struct gen *g, struct ggml_tensor *rope)
{
    const int64_t row = rope->ne[0] * rope->ne[1], n_tokens = rope->ne[2];
    struct ggml_tensor *v = push(g, ggml_view_2d(g->ctx, rope, row, n_tokens, rope->nb[2], 0));
    int64_t n_kv = PICK(g, 16, 10, 12, 32, 8, 4);  /* fill's indices are mostly 0..9 */
    if (row * n_kv > 4096)
        n_kv = 10;
    struct ggml_tensor *cache = cleaf(g, rd(g, 1) & 1 ? GGML_TYPE_F16 : GGML_TYPE_F32, row, n_kv, 1, 1);
    struct ggml_tensor *idx = cleaf(g, rd(g, 1) < 224 ? GGML_TYPE_I64 : GGML_TYPE_I32, n_tokens, 1, 1, 1);
    push(g, ggml_set_rows(g->ctx, cache, v, idx));
}

/*
 * A MoE router's top-k, in the orders ggml-cuda's topk-moe matcher takes
 * (ggml_cuda_topk_moe_fusion): the gate (SOFT_MAX, a sigmoid, or the square
 * root of a softplus), its probabilities reshaped to one row per expert, an
 * optional selection bias, ARGSORT, the VIEW of the first experts, their
 * weights by GET_ROWS, then optionally the weights normalised (RESHAPE,
 * SUM_ROWS, CLAMP, DIV, RESHAPE) and scaled; or gpt-oss's order (ARGSORT of
 * the logits first, the softmax over the weights chosen).
 */
static void chain_topk(struct gen *g)
{
    struct ggml_context *c = g->ctx;
    const int64_t n_expert = PICK(g, 8, 16, 4, 32, 2, 64, 6, 12), n_tokens = PICK(g, 1, 2, 3, 4, 8, 1, 5, 2);
    const int64_t k = 1 + (int64_t)(rd(g, 1) % (uint32_t)n_expert);
    struct ggml_tensor *logits = cleaf(g, GGML_TYPE_F32, n_expert, n_tokens, 1, 1);
    const uint32_t how = rd(g, 1);
    if ((how & 3) == 3) {
        struct ggml_tensor *r = push(g, ggml_reshape_3d(c, logits, 1, n_expert, n_tokens));
        struct ggml_tensor *sel = push(g, ggml_argsort(c, logits, GGML_SORT_ORDER_DESC));
        struct ggml_tensor *top = push(g, ggml_view_2d(c, sel, k, n_tokens, sel->nb[1], 0));
        struct ggml_tensor *w = push(g, ggml_get_rows(c, r, top));
        struct ggml_tensor *sm = push(g, ggml_soft_max(c, push(g, ggml_reshape_2d(c, w, k, n_tokens))));
        push(g, ggml_reshape_3d(c, sm, 1, k, n_tokens));
        return;
    }
    struct ggml_tensor *probs;
    if ((how & 3) == 0)
        probs = push(g, (in_place(g) ? ggml_soft_max_inplace : ggml_soft_max)(c, logits));
    else if ((how & 3) == 1)
        probs = push(g, ggml_sigmoid(c, logits));
    else
        probs = push(g, ggml_sqrt(c, push(g, ggml_softplus(c, logits))));
    struct ggml_tensor *r = push(g, ggml_reshape_3d(c, probs, 1, n_expert, n_tokens));
    struct ggml_tensor *sel_in = probs;
    if (how & 4)
        sel_in = push(g, ggml_add(c, probs, cleaf(g, GGML_TYPE_F32, n_expert, 1, 1, 1)));
    struct ggml_tensor *sel = push(g, ggml_argsort(c, sel_in, GGML_SORT_ORDER_DESC));
    struct ggml_tensor *top = push(g, ggml_view_2d(c, sel, k, n_tokens, sel->nb[1], 0));
    struct ggml_tensor *w = push(g, ggml_get_rows(c, r, top));
    if (how & 8) {
        struct ggml_tensor *w2 = push(g, ggml_reshape_2d(c, w, k, n_tokens));
        struct ggml_tensor *sum = push(g, ggml_clamp(c, push(g, ggml_sum_rows(c, w2)), 6.103515625e-5f, INFINITY));
        w = push(g, ggml_reshape_3d(c, push(g, ggml_div(c, w2, sum)), 1, k, n_tokens));
    }
    if (how & 16)
        push(g, ggml_scale(c, w, rf(g)));
}

/* The chain g->kind names, from shapes the input picks (a constructor's
 * assert longjmps out: no chain). */
static void construct_chain(struct gen *g)
{
    struct ggml_context *c = g->ctx;
    static const enum ggml_type wtypes[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0,
                                             GGML_TYPE_F16, GGML_TYPE_BF16 };
    switch (g->kind) {
    case CH_ROPE_SET_ROWS: case CH_NORM_ROPE_SET_ROWS: case CH_NORM_ROPE: {
        const int64_t hd = PICK(g, 4, 8, 16, 32, 64, 6, 2, 8), heads = PICK(g, 1, 2, 4, 3, 1, 2, 8, 2);
        struct ggml_tensor *x = cleaf(g, GGML_TYPE_F32, hd, heads, PICK(g, 1, 2, 3, 4, 8, 1, 5, 2), 1);
        if (g->kind != CH_ROPE_SET_ROWS)
            x = chain_norm_mul(g, x);
        struct ggml_tensor *rope = chain_rope(g, x);
        if (g->kind != CH_NORM_ROPE)
            chain_set_rows(g, rope);
        break;
    }
    case CH_NORM_MUL: {
        struct ggml_tensor *x = cleaf(g, GGML_TYPE_F32, PICK(g, 4, 8, 16, 32, 64, 5, 3, 128), g->dims[1], g->dims[2],
                                      rd(g, 1) < 200 ? 1 : g->dims[3]);
        struct ggml_tensor *m = chain_norm_mul(g, x);
        const uint32_t how = rd(g, 1);
        if (how & 1) {  /* the residual */
            struct ggml_tensor *b = how & 2 ? cleaf(g, GGML_TYPE_F32, m->ne[0], 1, 1, 1)
                                            : cleaf(g, GGML_TYPE_F32, m->ne[0], m->ne[1], m->ne[2], m->ne[3]);
            const bool swap = (how & 6) == 4;
            push(g, (in_place(g) ? ggml_add_inplace : ggml_add)(c, swap ? b : m, swap ? m : b));
        }
        break;
    }
    case CH_UNARY_MUL: {
        static const enum ggml_unary_op ops[] = { GGML_UNARY_OP_SILU, GGML_UNARY_OP_SIGMOID, GGML_UNARY_OP_SOFTPLUS };
        const enum ggml_unary_op u = ops[rd(g, 1) % 3];
        const enum ggml_type type = rd(g, 1) < 192 ? GGML_TYPE_F32 : GGML_TYPE_F16;
        struct ggml_tensor *x = cleaf(g, type, PICK(g, 4, 8, 16, 32, 64, 5, 3, 128), g->dims[1], g->dims[2], 1);
        struct ggml_tensor *a = push(g, (in_place(g) ? ggml_unary_inplace : ggml_unary)(c, x, u));
        const uint32_t how = rd(g, 1);
        struct ggml_tensor *y = how & 1 ? cleaf(g, type, x->ne[0], 1, 1, 1) : cleaf(g, type, x->ne[0], x->ne[1], x->ne[2], 1);
        const bool swap = (how & 3) == 2;
        push(g, (in_place(g) ? ggml_mul_inplace : ggml_mul)(c, swap ? y : a, swap ? a : y));
        break;
    }
    case CH_TOPK:
        chain_topk(g);
        break;
    case CH_MUL_MAT_ADD: {
        /* a matrix-vector product mostly (the fused kernels' case: one column) */
        const enum ggml_type wt = wtypes[rd(g, 1) % (sizeof(wtypes) / sizeof(wtypes[0]))];
        const int64_t k = PICK(g, 32, 64, 128, 32, 96), n = PICK(g, 1, 2, 4, 8, 16, 3, 32, 5);
        const int64_t cols = rd(g, 1) < 192 ? 1 : PICK(g, 2, 3, 4, 8);
        struct ggml_tensor *mm = push(g, ggml_mul_mat(c, cleaf(g, wt, k, n, 1, 1), cleaf(g, GGML_TYPE_F32, k, cols, 1, 1)));
        const uint32_t how = rd(g, 1);
        struct ggml_tensor *bias = how & 1 ? cleaf(g, GGML_TYPE_F32, n, 1, 1, 1) : cleaf(g, GGML_TYPE_F32, n, cols, 1, 1);
        const bool swap = (how & 3) == 2;
        push(g, (in_place(g) ? ggml_add_inplace : ggml_add)(c, swap ? bias : mm, swap ? mm : bias));
        break;
    }
    case CH_MUL_MAT_ID_ADD_ID: {
        const enum ggml_type wt = wtypes[rd(g, 1) % (sizeof(wtypes) / sizeof(wtypes[0]))];
        const int64_t k = PICK(g, 32, 64, 32, 96), n_expert = PICK(g, 10, 16, 12, 4);
        int64_t n = PICK(g, 1, 2, 4, 8, 16, 3);
        if (ggml_row_size(wt, k) * (size_t)(n * n_expert) > 32768)
            n = 1;
        const int64_t used = 1 + (int64_t)(rd(g, 1) % 4), tokens = rd(g, 1) < 192 ? 1 : PICK(g, 2, 3, 4);
        struct ggml_tensor *as = cleaf(g, wt, k, n, n_expert, 1);
        struct ggml_tensor *b = cleaf(g, GGML_TYPE_F32, k, rd(g, 1) & 1 ? 1 : used, tokens, 1);
        struct ggml_tensor *ids = cleaf(g, GGML_TYPE_I32, used, tokens, 1, 1);
        struct ggml_tensor *mm = push(g, ggml_mul_mat_id(c, as, b, ids));
        push(g, ggml_add_id(c, mm, cleaf(g, GGML_TYPE_F32, n, n_expert, 1, 1), ids));
        break;
    }
    case CH_GLU: {
        /* llama.cpp's FFN for a token: gate = W_g x (+ b_g), up = W_u x (+ b_u),
         * GLU(gate, up); by experts (MUL_MAT_ID, ADD_ID) as gpt-oss has it */
        const enum ggml_type wt = wtypes[rd(g, 1) % (sizeof(wtypes) / sizeof(wtypes[0]))];
        const uint32_t how = rd(g, 1);
        const bool experts = how & 1, biased = how & 2;
        const int64_t k = PICK(g, 32, 64, 96, 32), n = PICK(g, 8, 16, 3, 1, 32, 4);
        const int64_t n_expert = experts ? PICK(g, 4, 8, 3) : 1;
        const int64_t used = experts ? 1 + (int64_t)(rd(g, 1) % 3) : 1;
        const int64_t tokens = rd(g, 1) < 192 ? 1 : PICK(g, 2, 3, 4);
        struct ggml_tensor *lane[2];
        struct ggml_tensor *x = experts ? cleaf(g, GGML_TYPE_F32, k, rd(g, 1) & 1 ? 1 : used, tokens, 1)
                                        : cleaf(g, GGML_TYPE_F32, k, tokens, 1, 1);
        struct ggml_tensor *ids = experts ? cleaf(g, GGML_TYPE_I32, used, tokens, 1, 1) : NULL;
        for (int l = 0; l < 2; l++) {  /* the gate's lane, then the up's (ggml-cuda's order) */
            struct ggml_tensor *w = cleaf(g, wt, k, n, n_expert, 1);
            lane[l] = push(g, experts ? ggml_mul_mat_id(c, w, x, ids) : ggml_mul_mat(c, w, x));
            if (biased)
                lane[l] = push(g, experts ? ggml_add_id(c, lane[l], cleaf(g, GGML_TYPE_F32, n, n_expert, 1, 1), ids)
                                          : ggml_add(c, lane[l], cleaf(g, GGML_TYPE_F32, n, tokens, 1, 1)));
        }
        static const enum ggml_glu_op glus[] = { GGML_GLU_OP_SWIGLU, GGML_GLU_OP_GEGLU, GGML_GLU_OP_SWIGLU_OAI };
        const enum ggml_glu_op op = glus[rd(g, 1) % 3];
        push(g, op == GGML_GLU_OP_SWIGLU_OAI ? ggml_swiglu_oai(c, lane[0], lane[1], 1.702f, 7.0f)
                                             : ggml_glu_split(c, lane[0], lane[1], op));
        break;
    }
    case CH_ADDS: default: {
        /* the operands of one layout (what the multi-add kernel takes); MULs
         * in one chain of eight (the same kernel's other form) */
        const int n_ops = 2 + (int)(rd(g, 1) % 4);
        const uint32_t how = rd(g, 1);
        const bool muls = (how & 0xe) == 0xe;
        struct ggml_tensor *cur = cleaf(g, GGML_TYPE_F32, PICK(g, 4, 8, 16, 32, 64, 5, 3, 128), g->dims[1], g->dims[2], 1);
        for (int i = 0; i < n_ops; i++) {
            struct ggml_tensor *y = how & 1 ? cleaf(g, GGML_TYPE_F32, cur->ne[0], 1, 1, 1)
                                            : cleaf(g, GGML_TYPE_F32, cur->ne[0], cur->ne[1], cur->ne[2], 1);
            const bool swap = !(how & 1) && rd(g, 1) >= 232, ip = in_place(g);
            struct ggml_tensor *(*op)(struct ggml_context *, struct ggml_tensor *, struct ggml_tensor *) =
                muls ? (ip ? ggml_mul_inplace : ggml_mul) : (ip ? ggml_add_inplace : ggml_add);
            cur = push(g, op(c, swap ? y : cur, swap ? cur : y));
        }
        break;
    }
    }
}

/* The chain's leaves: each tensor a chain node reads (or views) that is no
 * chain node, once; their count. */
static int chain_leaves(const struct gen *g, struct ggml_tensor **out)
{
    int n = 0;
    for (int i = 0; i < g->n_chain; i++)
        for (int k = 0; k <= GGML_MAX_SRC; k++) {
            struct ggml_tensor *t = k < GGML_MAX_SRC ? g->chain[i]->src[k] : g->chain[i]->view_src;
            bool seen = !t;
            for (int j = 0; j < g->n_chain && !seen; j++)
                seen = g->chain[j] == t;
            for (int j = 0; j < n && !seen; j++)
                seen = out[j] == t;
            if (!seen && n < MAX_TENSORS)
                out[n++] = t;
        }
    return n;
}

/* A new stride for dimension k of t: one from the edges' range, or one
 * element off ggml's own, or a small one. */
static size_t chain_stride(struct gen *g, const struct ggml_tensor *t, int k)
{
    if (g->edges)
        return stride_value(g, t, k);
    const uint32_t v = rd(g, 1);
    const size_t ts = ggml_type_size(t->type);
    return v & 1 ? natural_stride(t, k) + ts * (size_t)ri(g, 0, 2) - ts : (size_t)ri(g, 0, 64) * 4;
}

/*
 * What a hostile guest changes in a chain ggml made (0-3 changes; none in
 * nearly half the inputs, so that most chains stay what ggml's fusion
 * checks accept): strides of a leaf or a view; a view's shape or offset; an
 * index tensor's length, stride or type; a node that reads a fresh leaf
 * (or the node two before) where it read the node before it, or its two
 * operands swapped; one field of a node (mutate); a node marked an output.
 */
static void chain_mutate(struct gen *g)
{
    const uint32_t m = rd(g, 1);
    const int n_changes = m < 112 ? 0 : m < 200 ? 1 : m < 240 ? 2 : 3;
    for (int j = 0; j < n_changes; j++) {
        struct ggml_tensor *leaves[MAX_TENSORS], *views[CHAIN_MAX + MAX_TENSORS], *index[MAX_TENSORS];
        const int n_leaves = chain_leaves(g, leaves);
        int n_views = 0, n_index = 0;
        for (int i = 0; i < g->n_chain; i++)
            if (g->chain[i]->view_src)
                views[n_views++] = g->chain[i];
        for (int i = 0; i < n_leaves; i++) {
            if (leaves[i]->view_src)
                views[n_views++] = leaves[i];
            if (leaves[i]->type == GGML_TYPE_I32 || leaves[i]->type == GGML_TYPE_I64)
                index[n_index++] = leaves[i];
        }
        const int at = (int)rd(g, 1) % g->n_chain, kdim = (int)(rd(g, 1) & 3);
        struct ggml_tensor *node = g->chain[at];
        switch (rd(g, 1) % 9) {
        case 0: /* a leaf's strides */
            if (n_leaves) {
                struct ggml_tensor *t = leaves[rd(g, 1) % (uint32_t)n_leaves];
                t->nb[kdim] = chain_stride(g, t, kdim);
            }
            break;
        case 1: /* a view's shape (the fused ROPE + SET_ROWS never looks at it) */
            if (n_views) {
                struct ggml_tensor *v = views[rd(g, 1) % (uint32_t)n_views];
                v->ne[kdim] = rd(g, 1) & 1 ? v->ne[kdim] * 2 : v->ne[kdim] + ri(g, -1, 2);
            }
            break;
        case 2: /* a view's strides */
            if (n_views) {
                struct ggml_tensor *v = views[rd(g, 1) % (uint32_t)n_views];
                v->nb[kdim] = chain_stride(g, v, kdim);
            }
            break;
        case 3: /* a view's offset, as VIEW's op_params carry it too */
            if (n_views) {
                struct ggml_tensor *v = views[rd(g, 1) % (uint32_t)n_views];
                v->view_offs = rd(g, 1) & 1 ? v->view_offs + (size_t)ri(g, 1, 64) * 4 : ggml_nbytes(v->view_src) / 2;
                if (v->op == GGML_OP_VIEW)
                    memcpy(v->op_params, &v->view_offs, sizeof(v->view_offs));
            }
            break;
        case 4: /* an index tensor's length, stride or type */
            if (n_index) {
                struct ggml_tensor *t = index[rd(g, 1) % (uint32_t)n_index];
                switch (rd(g, 1) % 4) {
                case 0: t->ne[0] = rd(g, 1) & 1 ? t->ne[0] * 2 : t->ne[0] + ri(g, -1, 1); break;
                case 1: t->ne[1] += ri(g, -1, 1); break;
                case 2: t->nb[kdim] = chain_stride(g, t, kdim); break;
                default: /* the other width, ggml's strides for it */
                    t->type = t->type == GGML_TYPE_I32 ? GGML_TYPE_I64 : GGML_TYPE_I32;
                    t->nb[0] = ggml_type_size(t->type);
                    for (int d = 1; d < 4; d++)
                        t->nb[d] = t->nb[d - 1] * (size_t)t->ne[d - 1];
                    break;
                }
            }
            break;
        case 5: /* node at no longer reads the node before it */
            for (int s = 0; at > 0 && s < GGML_MAX_SRC; s++) {
                const struct ggml_tensor *prev = g->chain[at - 1];
                if (node->src[s] != prev)
                    continue;
                node->src[s] = at > 1 && (rd(g, 1) & 1) ? g->chain[at - 2]
                                                         : ggml_new_tensor(g->ctx, prev->type, 4, prev->ne);
                break;
            }
            break;
        case 6: /* its first two operands swapped */
            if (node->src[1]) {
                struct ggml_tensor *t = node->src[0];
                node->src[0] = node->src[1];
                node->src[1] = t;
            }
            break;
        case 7:
            node->flags |= GGML_TENSOR_FLAG_OUTPUT;
            break;
        default:
            mutate(g, node);
            break;
        }
    }
}

/* The use counts sent: each node's uses by the chain's src slots (what a
 * guest counts), one of them then changed in one input of four. */
static void chain_counts(struct gen *g)
{
    for (int i = 0; i < g->n_chain; i++) {
        g->uses[i] = 0;
        for (int j = 0; j < g->n_chain; j++)
            for (int k = 0; k < GGML_MAX_SRC; k++)
                g->uses[i] += g->chain[j]->src[k] == g->chain[i];
    }
    if (rd(g, 1) < 192)
        return;
    uint32_t *u = &g->uses[rd(g, 1) % (uint32_t)g->n_chain];
    switch (rd(g, 1) % 6) {
    case 0: *u = 0; break;
    case 1: *u = 1; break;
    case 2: *u += 1; break;             /* read elsewhere too: no fusion */
    case 3: *u = *u ? *u - 1 : 0; break;
    case 4: *u = UINT32_MAX; break;
    default: *u = rd(g, 4); break;
    }
}

/*
 * After fill: the index leaves a chain's gathers and scatters read (SET_ROWS'
 * rows, MUL_MAT_ID's and ADD_ID's experts), in three inputs of four
 * rewritten in range and distinct along a row, as a model's are (fill's
 * small values are out of range of a few rows, and repeat an expert, which
 * the host refuses): the chains then get past the value checks to the
 * kernels.  Written as fill writes, element after element from the
 * tensor's start, whatever its strides.
 */
static void chain_indices(struct gen *g, uint8_t *const *base)
{
    if (rd(g, 1) >= 192)
        return;
    for (int i = 0; i < g->n_chain; i++) {
        const struct ggml_tensor *n = g->chain[i];
        const struct ggml_tensor *idx = NULL;
        int64_t limit = 0;
        if (n->op == GGML_OP_SET_ROWS) {
            idx = n->src[1];
            limit = n->ne[1];
        } else if (n->op == GGML_OP_MUL_MAT_ID && n->src[0]) {
            idx = n->src[2];
            limit = n->src[0]->ne[2];
        } else if (n->op == GGML_OP_ADD_ID && n->src[1]) {
            idx = n->src[2];
            limit = n->src[1]->ne[1];
        }
        const int t = idx ? find_t(g, idx) : -1;
        if (t < 0 || idx->op != GGML_OP_NONE || idx->view_src || limit <= 0 ||
            (idx->type != GGML_TYPE_I32 && idx->type != GGML_TYPE_I64))
            continue;
        const uint64_t size = buf_size_of(g, g->buf_of[t]), nbytes = ggml_nbytes(idx);
        if (g->off_of[t] > size || nbytes > size - g->off_of[t] || idx->ne[0] <= 0)
            continue;  /* does not fit: the host refuses it */
        uint8_t *p = base[g->buf_of[t]] + buf_start_of(g, g->buf_of[t]) + g->off_of[t];
        const size_t ts = ggml_type_size(idx->type);
        for (uint64_t k = 0; k < nbytes / ts; k++) {
            const int64_t row = (int64_t)k / idx->ne[0], v = (row * 3 + (int64_t)k % idx->ne[0]) % limit;
            if (idx->type == GGML_TYPE_I32) {
                const int32_t v32 = (int32_t)v;
                memcpy(p + k * 4, &v32, 4);
            } else {
                memcpy(p + k * 8, &v, 8);
            }
        }
    }
}

/* Builds a chain (chain mode's build); false when nothing can be sent. */
static bool build_chain(struct gen *g)
{
    if (g->r.left && g->r.p[0] == EDGES_MARK) {
        g->edges = true;
        rd(g, 1);
    }
    const uint32_t kind_byte = rd(g, 1);
    g->kind = n_chain_kinds_only ? chain_kinds_only[kind_byte % (uint32_t)n_chain_kinds_only]
                                 : (int)(kind_byte % CH_COUNT);
    const uint32_t mode = rd(g, 1);
    g->use_alloc = (mode & 0x80) != 0;
    g->inplace = (mode & 0x70) == 0 ? rd(g, 4) : 0;  /* 1 in 8: some constructors in place */
    for (int k = 0; k < 4; k++) {
        static const int64_t pool[] = { 1, 2, 3, 4, 8, 16, 1, 5 };
        g->dims[k] = pool[rd(g, 1) & 7];
    }
    /* volatile: assigned between setjmp and a longjmp back to it */
    volatile bool made = false;
    jmp_buf trap;
    if (setjmp(trap) == 0) {
        construct_trap = &trap;
        construct_chain(g);
        chain_mutate(g);
        made = true;
    }
    construct_trap = NULL;
    if (!made && verbose)
        fprintf(stderr, "fuzz_op: chain %s: a constructor asserted\n", chain_names[g->kind]);
    if (!made || g->n_chain == 0)
        return false;
    g->constructed = true;
    for (int i = 0; i < g->n_chain; i++)
        if (place(g, g->chain[i]) < 0)
            return false;
    chain_counts(g);
    return true;
}

/* A blob of the harness's memory and the guest buffer over all of it
 * (DEVICE_BUFFER_FROM_PTR): its handle. */
static uint64_t buffer_from_ptr(struct apir_session *s, uint32_t res, uint8_t *p, uint64_t size)
{
    if (!apir_session_blob_add(s, res, p, size, NULL, NULL))
        abort();
    uint8_t req[24], rep[16];
    struct apir_encoder enc;
    apir_encoder_init(&enc, req, sizeof(req));
    apir_encode_request_DEVICE_BUFFER_FROM_PTR(&enc, res, size, size);
    size_t used = 0;
    if (fz_forward(s, APIR_CMD_DEVICE_BUFFER_FROM_PTR, req, apir_encoder_used(&enc), rep, sizeof(rep), &used) !=
        APIR_HANDLER_OK)
        abort();
    uint64_t handle, buft;
    struct apir_decoder dec;
    apir_decoder_init(&dec, rep, used);
    if (!apir_decode_reply_DEVICE_BUFFER_FROM_PTR(&dec, &handle, &buft) || !handle)
        abort();
    return handle;
}

/*
 * The device path: size bytes of buffer `handle` from DATA_RES (upload) or
 * into it, as a guest moves them (a record of bytes over the whole buffer).
 */
static void buffer_io(struct apir_session *s, uint64_t handle, uint64_t size, bool upload)
{
    struct apir_tensor_rec r;
    memset(&r, 0, sizeof(r));
    r.id = MAX_TENSORS + 1;
    r.type = GGML_TYPE_I8;
    r.buffer = handle;
    r.ne[0] = (uint32_t)size;
    r.ne[1] = r.ne[2] = r.ne[3] = 1;
    r.nb[0] = 1;
    r.nb[1] = r.nb[2] = r.nb[3] = (uint32_t)size;
    uint8_t req[APIR_TENSOR_REC_SIZE + 64], rep[16];
    struct apir_encoder enc;
    apir_encoder_init(&enc, req, sizeof(req));
    if (upload)
        apir_encode_request_BUFFER_SET_TENSOR(&enc, handle, &r, DATA_RES, 0, size);
    else
        apir_encode_request_BUFFER_GET_TENSOR(&enc, handle, &r, DATA_RES, 0, size);
    uint32_t rc = fz_forward(s, upload ? APIR_CMD_BUFFER_SET_TENSOR : APIR_CMD_BUFFER_GET_TENSOR, req,
                             apir_encoder_used(&enc), rep, sizeof(rep), NULL);
    FZ_ASSERT(!enc.fatal && rc == APIR_HANDLER_OK, "%s of %llu bytes failed (%u)", upload ? "upload" : "read-back",
              (unsigned long long)size, rc);
}

/* The device path's buffers: every one allocated by the host. */
static void device_buffers(struct apir_session *s, const struct gen *g, struct fz_known *k, uint64_t *handles,
                           uint8_t **base)
{
    if (!apir_session_blob_add(s, DATA_RES, data_blob, REGION_MAX, NULL, NULL))
        abort();
    for (int b = 0; b < n_bufs_of(g); b++) {
        handles[b] = fz_alloc_buffer(s, buf_size_of(g, b), k);
        base[b] = stage[b];
    }
}

/* Each buffer's bytes to the host (up) or back into its region (down). */
static void device_move(struct apir_session *s, const struct gen *g, const uint64_t *handles, uint8_t *const *base,
                        bool up)
{
    for (int b = 0; b < n_bufs_of(g); b++) {
        const uint64_t n = buf_size_of(g, b);
        uint8_t *at = base[b] + buf_start_of(g, b);
        if (up)
            memcpy(data_blob, at, n);
        buffer_io(s, handles[b], n, up);
        if (!up)
            memcpy(at, data_blob, n);
    }
}

/* The graph request (cmd: GRAPH_COMPUTE_AT, or GRAPH_COMPUTE_KEYED for a
 * chain) to the host: whether it computed the graph. */
static bool send_graph(struct apir_session *s, uint32_t cmd, const uint8_t *req, size_t req_len)
{
    uint8_t rep[64];
    size_t used = 0;
    uint32_t res = fz_forward(s, cmd, req, req_len, rep, sizeof(rep), &used);
    uint32_t status = 99;
    struct apir_decoder dec;
    apir_decoder_init(&dec, rep, used);
    const bool decoded = cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED
                             ? apir_decode_reply_BACKEND_GRAPH_COMPUTE_KEYED(&dec, &status)
                             : apir_decode_reply_BACKEND_GRAPH_COMPUTE_AT(&dec, &status);
    if (res != APIR_HANDLER_OK || !decoded)
        status = 99;
    if (verbose)
        fprintf(stderr, "fuzz_op: -> handler %u, status %u\n", res, status);
    return res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS;
}

/* The device path's compute, in this process (see the top). */
static void device_compute(struct apir_session *s, const struct gen *g, const int *nodes, int n_nodes,
                           const uint64_t *handles, uint8_t *const *base, uint32_t cmd, const uint8_t *req,
                           size_t req_len)
{
    device_move(s, g, handles, base, true);
    if (verbose)
        dump(g);
    in_child = true;  /* aborts from here on are the node's */
    alarm(CHILD_SECONDS);
    const bool accepted = send_graph(s, cmd, req, req_len);
    fuzz_op_last_outcome = accepted ? 'A' : 'R';
    device_move(s, g, handles, base, false);  /* also waits for the device */
    alarm(0);
    in_child = false;
    check_writes(g, nodes, n_nodes, accepted, base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gen g;
    memset(&g, 0, sizeof(g));
    g.r.p = data;
    g.r.left = size;
    g.ctx = scratch_ctx();
    struct ggml_tensor *node = NULL;
    fuzz_op_last_outcome = 'N';
    if (chains ? !build_chain(&g) : !build(&g, &node))
        return 0;
    fuzz_op_last_outcome = 'C';
    /* the nodes sent, in graph order: the chain's, or the one node */
    int nodes[CHAIN_MAX], n_nodes = 0;
    for (int i = 0; i < g.n_chain; i++)
        nodes[n_nodes++] = find_t(&g, g.chain[i]);
    if (!chains)
        nodes[n_nodes++] = find_t(&g, node);

    struct fz_known k;
    struct apir_session *s = fz_session_new(&k);
    uint64_t handles[N_BUFS];
    uint8_t *base[N_BUFS];  /* each buffer's region (fill, snapshot, oracle) */
    if (!apir_session_blob_add(s, MSG_RES, msg_blob, MSG_SIZE, NULL, NULL))
        abort();
    if (device_path)
        device_buffers(s, &g, &k, handles, base);
    for (int b = 0; b < N_GUARDED && !device_path; b++) {
        handles[b] = buffer_from_ptr(s, GUARDED_RES0 + (uint32_t)b, guarded[b], GUARDED_SIZE);
        base[b] = guarded[b];
    }
    if (!device_path) {
        handles[N_GUARDED] = fz_alloc_buffer(s, ALLOC_SIZE, &k);
        struct apir_handle_slot *slot = apir_handle_get(&s->handles, handles[N_GUARDED], APIR_HANDLE_BUFFER);
        if (!slot)
            abort();
        base[N_GUARDED] = ((struct apir_host_buffer *)slot->object)->base;  /* CPU buffer: host memory */
    }
    for (int o = 0; o < g.n_own && !device_path; o++) {
        handles[OWN0 + o] = buffer_from_ptr(s, OWN_RES0 + (uint32_t)o, own_map[o] + g.own_start[o], g.own_size[o]);
        base[OWN0 + o] = own_map[o];
    }

    fill(&g, base);
    if (chains)
        chain_indices(&g, base);
    for (int b = 0; b < n_bufs_of(&g); b++)
        memcpy(snapshot[b], base[b], region_size_of(b));

    /* The graph message: the nodes, every tensor they reach; a chain's keyed,
     * with its use counts (without them nothing is fused). */
    static struct apir_tensor_rec recs[MAX_TENSORS];
    for (int i = 0; i < g.n; i++)
        recs[i] = rec_of(&g, i, handles);
    struct apir_encoder e;
    apir_encoder_init(&e, msg_blob, MSG_SIZE);
    apir_encode_u32(&e, (uint32_t)n_nodes);
    for (int i = 0; i < n_nodes; i++)
        apir_encode_u64(&e, (uint64_t)nodes[i] + 1);
    apir_encode_tensor_list(&e, (uint32_t)g.n, recs);
    uint8_t req[48];
    struct apir_encoder re;
    apir_encoder_init(&re, req, sizeof(req));
    const uint32_t cmd = chains ? APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED : APIR_CMD_BACKEND_GRAPH_COMPUTE_AT;
    if (chains) {
        apir_encode_u32(&e, APIR_GRAPH_USE_COUNTS_TAG);
        for (int i = 0; i < n_nodes; i++)
            apir_encode_u32(&e, g.uses[i]);
        apir_encode_request_BACKEND_GRAPH_COMPUTE_KEYED(&re, MSG_RES, 0, apir_encoder_used(&e), CHAIN_KEY);
    } else {
        apir_encode_request_BACKEND_GRAPH_COMPUTE_AT(&re, MSG_RES, 0, apir_encoder_used(&e));
    }

    bool known = false;
    for (int i = 0; i < n_nodes; i++)
        known |= hits_known(&g, nodes[i]);
    if (fz_skipping_known() && (known || has_odd_size1_stride(&g))) {
        apir_session_free(s);
        return 0;
    }
    if (device_path) {
        device_compute(s, &g, nodes, n_nodes, handles, base, cmd, req, apir_encoder_used(&re));
        apir_session_free(s);
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        in_child = true;
        signal(SIGALRM, SIG_DFL);  /* not libFuzzer's handler */
        alarm(CHILD_SECONDS);
        if (verbose)
            dump(&g);
        const bool accepted = send_graph(s, cmd, req, apir_encoder_used(&re));
        check_writes(&g, nodes, n_nodes, accepted, base);
        _exit(0);
    }
    const char *what = sent_name(&g, nodes, n_nodes);
    int status = 0;
    pid_t w = fz_wait_child(pid, &status);
    FZ_ASSERT(pid > 0 && w == pid, "fork/wait failed (errno %d)", errno);
    FZ_ASSERT(!WIFSIGNALED(status) || WTERMSIG(status) != SIGALRM, "%s: compute did not end within %d s",
              what, CHILD_SECONDS);
    FZ_ASSERT(WIFEXITED(status), "%s: the computing process died of signal %d", what,
              WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    FZ_ASSERT(WEXITSTATUS(status) != ORACLE_EXIT, "%s: oracle (see the child's line above)", what);
    FZ_ASSERT(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == CONTAINED_ABORT_EXIT, "%s: child exit %d",
              what, WEXITSTATUS(status));
    apir_session_free(s);
    return 0;
}
