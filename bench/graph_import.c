/*
 * The host's import of a graph sent whole against the same graph sent as a
 * delta (apir 0.9), side by side in one process, interleaved: a decode-step
 * shaped graph (nodes, each reading the previous and a weight; a share of
 * records changed each step, as a whisper.cpp step changes 26 of 287),
 * imported through apir_graph_build with the session's memo on.  Prints the
 * medians and their ratio; no guest, no transport, no compute.
 *   apir-bench-import [--nodes N] [--changed K] [--rounds R]
 */
#include "graph_exec.h"
#include "test_records.h"
#include "test_session.h"

#include "apir_log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>


#define DATA_RES 10u
static uint8_t blob_whole[8 << 20], blob_delta[8 << 20];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    uint32_t n_nodes = 193, changed = 26, rounds = 2000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--nodes"))
            n_nodes = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--changed"))
            changed = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = (uint32_t)atoi(argv[i + 1]);
    }
    apir_log_set_level(APIR_LOG_ERROR);
    struct apir_host host;
    if (!test_host_init_cpu(&host))
        return 1;
    struct apir_session *s = apir_session_new(&host, "bench");
    s->minor = APIR_VERSION_MINOR;
    const uint32_t n_weights = n_nodes / 2, n = n_nodes + n_weights, elems = 64;
    uint64_t buf = alloc_buffer(s, (uint64_t)n * elems * 4);  /* CHECKs it: test_failed */
    (void)test_passed;
    struct apir_tensor_rec *t = calloc(n, sizeof(*t));
    uint64_t *node_ids = calloc(n_nodes, sizeof(*node_ids));
    for (uint32_t i = 0; i < n_nodes; i++) {
        t[i] = f32_rec(1000 + i, buf, (uint64_t)i * elems * 4, elems);
        t[i].op = GGML_OP_ADD;
        t[i].flags = GGML_TENSOR_FLAG_COMPUTE;
        t[i].src[0] = i ? 1000 + i - 1 : 100000;
        t[i].src[1] = 100000 + i % n_weights;
        node_ids[i] = t[i].id;
    }
    for (uint32_t w = 0; w < n_weights; w++)
        t[n_nodes + w] = f32_rec(100000 + w, buf, (uint64_t)(n_nodes + w) * elems * 4, elems);
    uint64_t *whole_ns = calloc(rounds, 8), *delta_ns = calloc(rounds, 8);
    uint32_t *index = calloc(n, 4);
    for (uint32_t r = 0; r < rounds; r++) {
        /* This step's changes: the names of `changed` nodes spread over the graph. */
        for (uint32_t k = 0; k < changed; k++) {
            index[k] = (uint32_t)(((uint64_t)k * n_nodes) / changed);
            snprintf(t[index[k]].name, sizeof(t[index[k]].name), "step %u", r);
        }
        for (int mode = 0; mode < 2; mode++) {
            struct apir_encoder e;
            uint8_t *blob = mode ? blob_delta : blob_whole;
            apir_encoder_init(&e, blob, sizeof(blob_whole));
            apir_encode_u32(&e, n_nodes);
            for (uint32_t i = 0; i < n_nodes; i++)
                apir_encode_u64(&e, node_ids[i]);
            if (mode == 0) {
                apir_encode_tensor_list(&e, n, t);
            } else {
                apir_encode_u32(&e, n);
                apir_encode_u32(&e, changed);
                for (uint32_t k = 0; k < changed; k++)
                    apir_encode_u32(&e, index[k]);
                for (uint32_t k = 0; k < changed; k++)
                    apir_encode_tensor(&e, &t[index[k]]);
            }
            /* The delta is against the whole graph just imported (the same
             * records): both imports check the same changed records again,
             * and differ only in how the records come. */
            const char *why = NULL;
            struct apir_graph_blob in = { .bytes = blob, .size = apir_encoder_used(&e), .key = 2 + 2 * (uint64_t)r + mode,
                                          .use_counts = true, .base = mode ? 2 + 2 * (uint64_t)r : 0 };
            uint64_t t0 = now_ns();
            struct ggml_cgraph *g = apir_graph_build(s, &s->scratch, &in, &why);
            uint64_t dt = now_ns() - t0;
            if (!g) {
                fprintf(stderr, "round %u %s: refused: %s\n", r, mode ? "delta" : "whole", why);
                return 1;
            }
            (mode ? delta_ns : whole_ns)[r] = dt;
        }
    }
    qsort(whole_ns, rounds, 8, cmp_u64);
    qsort(delta_ns, rounds, 8, cmp_u64);
    printf("graph import, %u nodes, %u records, %u changed a step, %u rounds: whole %.1f us, delta %.1f us (medians); "
           "delta/whole %.3f\n",
           n_nodes, n, changed, rounds, whole_ns[rounds / 2] / 1e3, delta_ns[rounds / 2] / 1e3,
           (double)delta_ns[rounds / 2] / (double)whole_ns[rounds / 2]);
    apir_session_free(s);
    return test_failed ? 1 : 0;
}
