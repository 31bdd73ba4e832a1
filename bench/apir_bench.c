/*
 * apir-bench: what apir adds, measured side by side against the same host.
 *
 *   apir-bench [--endpoint unix:PATH] [--frontend build/libggml-apir.so]
 *              [--mib N] [--nodes N] [--calls N] [--read-kib N] [--native DEV]
 *
 *   1. null call: DEVICE_GET_COUNT round trips, p50/p99;
 *   2. tensor upload/download through APIR0 (ggml_backend_tensor_set/get of
 *      one big tensor) against memcpy and against the CPU backend natively;
 *   2b. one tensor of --read-kib KiB (default 513: a token's logits for a
 *      128256-word vocabulary) read 200 times, then written 200 times
 *      (each write followed by a 1-byte read, so a posted write is paid
 *      for), median microseconds through APIR0 and natively;
 *   3. graph compute: a chain of N small ADD nodes through APIR0 and on the
 *      CPU backend; the difference per node and per graph, first compute
 *      (graph sent) and recomputes (graph kept by the host).
 * Ratios are printed for each, from runs interleaved in one process.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "calls.h"
#include "wait.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double secs(uint64_t ns) { return (double)ns / 1e9; }

static void bench_null_call(const char *endpoint, int n)
{
    struct apir_remote r;
    char err[256];
    if (!apir_remote_open(&r, endpoint, 0, err, sizeof(err))) {
        printf("null call: %s\n", err);
        return;
    }
    uint64_t *lat = malloc(sizeof(*lat) * (size_t)n);
    int32_t c;
    for (int i = 0; i < 1000; i++)
        apir_call_DEVICE_GET_COUNT(&r, &c);
    for (int i = 0; i < n; i++) {
        uint64_t t = apir_now_ns();
        apir_call_DEVICE_GET_COUNT(&r, &c);
        lat[i] = apir_now_ns() - t;
    }
    qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
    printf("null call x%d: p50 %.2f us, p99 %.2f us (targets: p50 <= 2, p99 <= 20)\n", n, lat[n / 2] / 1e3,
           lat[(size_t)n * 99 / 100] / 1e3);
    free(lat);
    apir_remote_close(&r);
}

/* Best of `reps` for set and get of `bytes` through a backend's buffer. */
/* One I8 tensor of `bytes` in a buffer of dev's buffer type (buf NULL when
 * the device cannot have it). */
struct one_tensor {
    struct ggml_context *ctx;
    struct ggml_tensor *t;
    ggml_backend_buffer_t buf;
};

static void one_tensor_alloc(struct one_tensor *o, ggml_backend_dev_t dev, size_t bytes)
{
    struct ggml_init_params p = { .mem_size = ggml_tensor_overhead() * 2, .no_alloc = true };
    o->ctx = ggml_init(p);
    o->t = ggml_new_tensor_1d(o->ctx, GGML_TYPE_I8, (int64_t)bytes);
    o->buf = ggml_backend_alloc_ctx_tensors_from_buft(o->ctx, ggml_backend_dev_buffer_type(dev));
}

static void one_tensor_free(struct one_tensor *o)
{
    if (o->buf)
        ggml_backend_buffer_free(o->buf);
    ggml_free(o->ctx);
}

/* A benchmark that moved wrong bytes measured nothing: a pattern no two
 * pieces share goes in, comes back into cleared memory and is compared
 * (said on stdout, and the exit status: bench_wrong). */
static int bench_wrong;
static void check_round_trip(ggml_backend_dev_t dev, const struct ggml_tensor *t, size_t bytes)
{
    uint8_t *in = calloc(1, bytes), *back = calloc(1, bytes);
    if (!in || !back) {
        free(in);
        free(back);
        return;
    }
    for (size_t i = 0; i < bytes; i++)
        in[i] = (uint8_t)(i * 131u + (i >> 13));
    ggml_backend_tensor_set((struct ggml_tensor *)t, in, 0, bytes);
    ggml_backend_tensor_get(t, back, 0, bytes);
    if (memcmp(in, back, bytes) != 0) {
        size_t at = 0;
        while (at < bytes && in[at] == back[at])
            at++;
        printf("  WRONG: %zu bytes read back from %s differ from those written, from byte %zu\n", bytes,
               ggml_backend_dev_name(dev), at);
        bench_wrong = 1;
    }
    free(in);
    free(back);
}

static void tensor_io(ggml_backend_dev_t dev, size_t bytes, int reps, double *set_gbs, double *get_gbs)
{
    struct one_tensor o;
    one_tensor_alloc(&o, dev, bytes);
    if (o.buf)
        check_round_trip(dev, o.t, bytes);
    uint8_t *src = malloc(bytes);
    memset(src, 1, bytes);
    uint64_t best_set = UINT64_MAX, best_get = UINT64_MAX;
    for (int i = 0; i < reps && o.buf; i++) {
        uint64_t t0 = apir_now_ns();
        ggml_backend_tensor_set(o.t, src, 0, bytes);
        uint64_t t1 = apir_now_ns();
        ggml_backend_tensor_get(o.t, src, 0, bytes);
        uint64_t t2 = apir_now_ns();
        if (t1 - t0 < best_set) best_set = t1 - t0;
        if (t2 - t1 < best_get) best_get = t2 - t1;
    }
    *set_gbs = o.buf ? (double)bytes / 1e9 / secs(best_set) : 0;
    *get_gbs = o.buf ? (double)bytes / 1e9 / secs(best_get) : 0;
    free(src);
    one_tensor_free(&o);
}

/* Medians of `reps` reads and writes of one tensor of `bytes`, in
 * microseconds: a token's read-back of its logits (128256 floats, 513 KB,
 * for a Llama-3 vocabulary) is this size, and over a stream transport it is
 * most of what a token costs beyond native. */
static void small_io(ggml_backend_dev_t dev, size_t bytes, int reps, double *set_us, double *get_us)
{
    struct one_tensor o;
    one_tensor_alloc(&o, dev, bytes);
    uint8_t *data = malloc(bytes);
    uint64_t *set_ns = malloc(sizeof(uint64_t) * (size_t)reps), *get_ns = malloc(sizeof(uint64_t) * (size_t)reps);
    *set_us = *get_us = 0;
    if (o.buf && data && set_ns && get_ns) {
        check_round_trip(dev, o.t, bytes);
        memset(data, 3, bytes);
        /* Reads alone, then writes each followed by a 1-byte read: a stream
         * transport posts a write and goes on, and its cost would otherwise
         * land in whatever call comes next. */
        ggml_backend_tensor_set(o.t, data, 0, bytes);
        for (int i = 0; i < reps; i++) {
            uint64_t t0 = apir_now_ns();
            ggml_backend_tensor_get(o.t, data, 0, bytes);
            get_ns[i] = apir_now_ns() - t0;
        }
        uint8_t one;
        for (int i = 0; i < reps; i++) {
            uint64_t t0 = apir_now_ns();
            ggml_backend_tensor_set(o.t, data, 0, bytes);
            ggml_backend_tensor_get(o.t, &one, 0, 1);
            set_ns[i] = apir_now_ns() - t0;
        }
        qsort(set_ns, (size_t)reps, sizeof(uint64_t), cmp_u64);
        qsort(get_ns, (size_t)reps, sizeof(uint64_t), cmp_u64);
        *set_us = (double)set_ns[reps / 2] / 1e3;
        *get_us = (double)get_ns[reps / 2] / 1e3;
    }
    free(set_ns);
    free(get_ns);
    free(data);
    one_tensor_free(&o);
}

static double memcpy_gbs(size_t bytes, int reps)
{
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = apir_now_ns();
        memcpy(b, a, bytes);
        uint64_t t = apir_now_ns() - t0;
        if (t < best) best = t;
    }
    volatile uint8_t sink = b[bytes / 2];
    (void)sink;
    free(a);
    free(b);
    return (double)bytes / 1e9 / secs(best);
}

/* A chain of n ADD nodes on tiny tensors: compute cost is near zero, so the
 * time is what the path adds.  Returns microseconds per compute: the first
 * (graph sent) and the median of the next `reps`. */
static void graph_chain(ggml_backend_dev_t dev, int n, int reps, double *first_us, double *again_us)
{
    size_t meta = ggml_tensor_overhead() * (size_t)(n + 4) + ggml_graph_overhead_custom((size_t)n + 4, false);
    struct ggml_init_params p = { .mem_size = meta, .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64);
    struct ggml_tensor *y = x;
    for (int i = 0; i < n; i++)
        y = ggml_add(ctx, y, x);
    struct ggml_cgraph *g = ggml_new_graph_custom(ctx, (size_t)n + 4, false);
    ggml_build_forward_expand(g, y);
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_dev_buffer_type(dev));
    float ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1.0f;
    ggml_backend_tensor_set(x, ones, 0, sizeof(ones));
    uint64_t t0 = apir_now_ns();
    ggml_backend_graph_compute(be, g);
    *first_us = (double)(apir_now_ns() - t0) / 1e3;
    uint64_t *lat = malloc(sizeof(*lat) * (size_t)reps);
    for (int i = 0; i < reps; i++) {
        uint64_t t = apir_now_ns();
        ggml_backend_graph_compute(be, g);
        lat[i] = apir_now_ns() - t;
    }
    qsort(lat, (size_t)reps, sizeof(*lat), cmp_u64);
    *again_us = (double)lat[reps / 2] / 1e3;
    float out[64];
    ggml_backend_tensor_get(y, out, 0, sizeof(out));
    if (out[0] != (float)(n + 1))
        printf("  (wrong result on %s: %f)\n", ggml_backend_dev_name(dev), out[0]);
    free(lat);
    ggml_backend_buffer_free(buf);
    ggml_backend_free(be);
    ggml_free(ctx);
}

int main(int argc, char **argv)
{
    const char *endpoint = getenv("APIR_HOST");
    const char *frontend = NULL;
    const char *native_name = "CPU";
    size_t mib = 256;
    int nodes = 1000, calls = 100000, read_kib = 513;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) endpoint = argv[++i];
        else if (!strcmp(argv[i], "--frontend") && i + 1 < argc) frontend = argv[++i];
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nodes") && i + 1 < argc) nodes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc) calls = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--read-kib") && i + 1 < argc) read_kib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--native") && i + 1 < argc) native_name = argv[++i];
        else {
            fprintf(stderr, "usage: apir-bench [--endpoint unix:PATH] [--frontend libggml-apir.so] [--mib N] [--nodes N] [--calls N] [--read-kib N]\n");
            return 2;
        }
    }
    if (endpoint)
        setenv("APIR_HOST", endpoint, 1);
    bench_null_call(endpoint, calls);

    ggml_backend_load_all_from_path(APIR_GGML_BIN);
    if (frontend)
        ggml_backend_load(frontend);
        /* The native comparison: the host's device in this process (CUDA0 on a
     * GPU machine), or the CPU backend. */
    ggml_backend_dev_t apir = ggml_backend_dev_by_name("APIR0"), cpu = ggml_backend_dev_by_name(native_name);
    if (!apir || !cpu) {
        printf("need devices APIR0 and %s (pass --frontend, --native)\n", native_name);
        return 1;
    }
    size_t bytes = mib << 20;
    double mc = memcpy_gbs(bytes, 3), as, ag, cs, cg;
    tensor_io(apir, bytes, 3, &as, &ag);
    tensor_io(cpu, bytes, 3, &cs, &cg);
    printf("tensor upload   %zu MiB: APIR0 %.2f GB/s, %s %.2f GB/s, memcpy %.2f GB/s -> apir/memcpy %.2f (target >= 0.8), apir/native %.2f\n",
           mib, as, native_name, cs, mc, as / mc, as / cs);
    printf("tensor download %zu MiB: APIR0 %.2f GB/s, %s %.2f GB/s, memcpy %.2f GB/s -> apir/memcpy %.2f, apir/native %.2f\n",
           mib, ag, native_name, cg, mc, ag / mc, ag / cg);

    if (read_kib > 0) {
        double aw, ar, nw, nr;
        small_io(apir, (size_t)read_kib << 10, 200, &aw, &ar);
        small_io(cpu, (size_t)read_kib << 10, 200, &nw, &nr);
        printf("tensor of %d KiB, median of 200: read APIR0 %.1f us, %s %.1f us (+%.1f us); write APIR0 %.1f us, %s %.1f us (+%.1f us)\n",
               read_kib, ar, native_name, nr, ar - nr, aw, native_name, nw, aw - nw);
    }

    double af, aa, cf, ca;
    graph_chain(cpu, nodes, 50, &cf, &ca);
    graph_chain(apir, nodes, 50, &af, &aa);
    printf("graph of %d ADD nodes: %s %.1f us; APIR0 first %.1f us, again %.1f us -> +%.2f us/node sent, +%.2f us/node kept\n",
           nodes, native_name, ca, af, aa, (af - ca) / nodes, (aa - ca) / nodes);
    graph_chain(cpu, 1, 200, &cf, &ca);
    graph_chain(apir, 1, 200, &af, &aa);
    printf("graph of 1 node: %s %.1f us, APIR0 %.1f us -> +%.1f us per graph\n", native_name, ca, aa, aa - ca);
    if (bench_wrong)
        printf("WRONG: some bytes read back differ from those written (above)\n");
    return bench_wrong;
}
