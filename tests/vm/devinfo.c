/*
 * apir-vm-devinfo: what any ggml guest library (ours, libggml-apir.so, or the
 * reference libggml-virtgpu.so) shows through ggml's own API, used by the VM
 * checks of tests/vm/checks.sh for both guests alike:
 *   - every device: name, description, type, memory, capabilities, its buffer
 *     type (name, alignment, maximum size);
 *   - on the chosen device: a buffer, two tensors set, the graph
 *     d = (a + b) * b computed N times, d read back and checked each time
 *     (a round trip per iteration, timed: p50/p99/max).
 *
 * usage: apir-vm-devinfo [-n N] [-e N_ELEMENTS] DEVICE_NAME
 * Backends come from ggml_backend_load_all() (GGML_BACKEND_PATH adds the
 * remote one).  Prints "devinfo: PASS ..." and exits 0 when every graph
 * gave the right values; "devinfo: FAIL ..." and exit 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *type_name(enum ggml_backend_dev_type t)
{
    switch (t) {
    case GGML_BACKEND_DEVICE_TYPE_CPU: return "CPU";
    case GGML_BACKEND_DEVICE_TYPE_GPU: return "GPU";
    case GGML_BACKEND_DEVICE_TYPE_IGPU: return "IGPU";
    case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "ACCEL";
    default: return "?";
    }
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int n_iter = 50;
    long n_el = 4096;
    const char *want = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            n_iter = atoi(argv[++i]);
        else if (strcmp(argv[i], "-e") == 0 && i + 1 < argc)
            n_el = atol(argv[++i]);
        else if (argv[i][0] != '-' && !want)
            want = argv[i];
        else {
            fprintf(stderr, "usage: apir-vm-devinfo [-n N] [-e N_ELEMENTS] DEVICE_NAME\n");
            return 2;
        }
    }
    if (!want || n_iter < 1 || n_iter > 100000 || n_el < 1 || n_el > (1L << 24)) {
        fprintf(stderr, "usage: apir-vm-devinfo [-n N (1..100000)] [-e N_ELEMENTS (1..2^24)] DEVICE_NAME\n");
        return 2;
    }
    ggml_backend_load_all();
    ggml_backend_dev_t dev = NULL;
    size_t n_dev = ggml_backend_dev_count();
    printf("devices: %zu\n", n_dev);
    for (size_t i = 0; i < n_dev; i++) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        struct ggml_backend_dev_props p;
        ggml_backend_dev_get_props(d, &p);
        ggml_backend_buffer_type_t bt = ggml_backend_dev_buffer_type(d);
        printf("  %zu: %s (%s), type %s, memory %zu/%zu MiB free, async %d host_buffer %d from_ptr %d events %d"
               " mmap %d; buffer type %s, alignment %zu, max size %zu MiB\n",
               i, p.name, p.description, type_name(p.type), p.memory_free >> 20, p.memory_total >> 20,
               p.caps.async, p.caps.host_buffer, p.caps.buffer_from_host_ptr, p.caps.events, p.caps.mmap_support,
               bt ? ggml_backend_buft_name(bt) : "(none)", bt ? ggml_backend_buft_get_alignment(bt) : 0,
               bt ? ggml_backend_buft_get_max_size(bt) >> 20 : 0);
        if (strcmp(p.name, want) == 0)
            dev = d;
    }
    if (!dev) {
        printf("devinfo: FAIL no device named '%s'\n", want);
        return 1;
    }
    double t0 = now_us();
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    if (!be) {
        printf("devinfo: FAIL cannot initialize a backend on %s\n", want);
        return 1;
    }
    printf("backend %s initialized in %.1f ms\n", ggml_backend_name(be), (now_us() - t0) / 1e3);

    struct ggml_init_params ip = { .mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead(),
                                   .mem_buffer = NULL, .no_alloc = true };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_el);
    struct ggml_tensor *b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_el);
    struct ggml_tensor *d = ggml_mul(ctx, ggml_add(ctx, a, b), b);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, d);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    if (!buf) {
        printf("devinfo: FAIL cannot allocate the tensors on %s\n", want);
        return 1;
    }
    printf("buffer: %s, %zu bytes\n", ggml_backend_buffer_name(buf), ggml_backend_buffer_get_size(buf));
    float *va = malloc((size_t)n_el * sizeof(float)), *vb = malloc((size_t)n_el * sizeof(float)),
          *vd = malloc((size_t)n_el * sizeof(float));
    double *lat = malloc((size_t)n_iter * sizeof(double));
    if (!va || !vb || !vd || !lat)
        return 1;
    int good = 0;
    for (int it = 0; it < n_iter; it++) {
        for (long i = 0; i < n_el; i++) {
            va[i] = (float)(i % 97) + (float)it;
            vb[i] = (float)(i % 7) - 3.0f;
        }
        double s = now_us();
        ggml_backend_tensor_set(a, va, 0, ggml_nbytes(a));
        ggml_backend_tensor_set(b, vb, 0, ggml_nbytes(b));
        enum ggml_status st = ggml_backend_graph_compute(be, gf);
        ggml_backend_tensor_get(d, vd, 0, ggml_nbytes(d));
        lat[it] = now_us() - s;
        int right = st == GGML_STATUS_SUCCESS;
        for (long i = 0; right && i < n_el; i++)
            right = vd[i] == (va[i] + vb[i]) * vb[i];
        if (right)
            good++;
        else if (good == it)
            printf("iteration %d: status %d, d[1] = %g, expected %g\n", it, (int)st, (double)vd[1],
                   (double)((va[1] + vb[1]) * vb[1]));
    }
    qsort(lat, (size_t)n_iter, sizeof(double), cmp_double);
    printf("graph (a + b) * b, %ld elements, set + set + compute + get: %d/%d right; round trip p50 %.0f us, "
           "p99 %.0f us, max %.0f us\n",
           n_el, good, n_iter, lat[n_iter / 2], lat[(n_iter * 99) / 100], lat[n_iter - 1]);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(be);
    free(va);
    free(vb);
    free(vd);
    free(lat);
    printf("devinfo: %s %s: %d/%d graphs right\n", good == n_iter ? "PASS" : "FAIL", want, good, n_iter);
    return good == n_iter ? 0 : 1;
}
