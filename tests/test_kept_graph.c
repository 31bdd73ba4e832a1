/*
 * A kept graph computes what the guest sent last under its key, on every
 * backend: a key sent again with another graph - after a buffer the first
 * one read was freed, too - computes the new graph, never a replay of the
 * old.  The CUDA backend replays a captured CUDA graph, kernels with the
 * addresses of then, without looking, when a graph's ggml uid is the last
 * one's; the uid is the host's (graph_exec.c), and this is the end-to-end
 * check of it.  The CPU backend (CI) keeps no graphs: there it checks the
 * results only.  On a GPU machine: APIR_TEST_BACKEND=CUDA (bench/h200.sh
 * check runs it).
 */
#include "apir_codec.h"
#include "apir_proto.h"
#include "dispatcher.h"
#include "ggml.h"
#include "host.h"
#include "test_records.h"
#include "test_session.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#define DATA_RES 10u
#define DATA_SIZE (1u << 16)
#define N 256u

static struct apir_host host;
static uint8_t data_blob[DATA_SIZE] __attribute__((aligned(64)));

static struct apir_session *new_session(void)
{
    return test_session_with_blob(&host, DATA_RES, data_blob, DATA_SIZE);
}

/* x filled with v, through the data blob. */
static void fill(struct apir_session *s, uint64_t buf, const struct apir_tensor_rec *x, float v)
{
    for (uint32_t i = 0; i < N; i++)
        ((float *)data_blob)[i] = v;
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, x, DATA_RES, 0, N * 4) == APIR_HANDLER_OK);
}

/* out = a OP a as a keyed graph, sent whole; then recomputed `again`
 * times (the CUDA backend captures a graph at its second compute and
 * replays it from the third). */
static void compute(struct apir_session *s, uint64_t key, enum ggml_op op, struct apir_tensor_rec a,
                    struct apir_tensor_rec out, int again)
{
    out.op = op;
    out.src[0] = out.src[1] = a.id;
    out.flags = GGML_TENSOR_FLAG_COMPUTE;
    struct apir_tensor_rec t[2] = { a, out };
    struct apir_encoder e;
    apir_encoder_init(&e, data_blob + 8192, DATA_SIZE - 8192);
    apir_encode_u32(&e, 1);
    apir_encode_u64(&e, out.id);
    apir_encode_tensor_list(&e, 2, t);
    uint32_t status = 99;
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, apir_encoder_used(&e), key, &status) ==
              APIR_HANDLER_OK &&
          status == GGML_STATUS_SUCCESS);
    for (int i = 0; i < again; i++)
        CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, key, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
}

/* Every element of out is want. */
static bool reads(struct apir_session *s, uint64_t buf, const struct apir_tensor_rec *out, float want)
{
    memset(data_blob, 0, N * 4);
    if (fwd_BUFFER_GET_TENSOR(s, buf, out, DATA_RES, 0, N * 4) != APIR_HANDLER_OK)
        return false;
    for (uint32_t i = 0; i < N; i++) {
        if (((float *)data_blob)[i] != want) {
            fprintf(stderr, "out[%u] = %g, want %g\n", i, ((float *)data_blob)[i], want);
            return false;
        }
    }
    return true;
}

static void test_same_key_new_graph(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec x = f32_rec(1, buf, 0, N), out = f32_rec(2, buf, 4096, N);
    fill(s, buf, &x, 3.0f);
    compute(s, 500, GGML_OP_ADD, x, out, 3);
    CHECK(reads(s, buf, &out, 6.0f));
    /* the same key, another op: the new graph runs */
    compute(s, 500, GGML_OP_MUL, x, out, 0);
    CHECK(reads(s, buf, &out, 9.0f));
    compute(s, 500, GGML_OP_MUL, x, out, 3);
    CHECK(reads(s, buf, &out, 9.0f));
    apir_session_free(s);
}

static void test_same_key_after_free(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16), in = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec out = f32_rec(2, buf, 4096, N), y = f32_rec(3, in, 0, N);
    fill(s, in, &y, 5.0f);
    compute(s, 600, GGML_OP_ADD, y, out, 3);
    CHECK(reads(s, buf, &out, 10.0f));
    /* the buffer the kept graph read goes; its key is stale */
    CHECK(fwd_BUFFER_FREE_BUFFER(s, in) == APIR_HANDLER_OK);
    uint32_t status = 99;
    CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, 600, &status) == APIR_HANDLER_STALE);
    uint64_t in2 = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec z = f32_rec(4, in2, 0, N);
    fill(s, in2, &z, 7.0f);
    compute(s, 600, GGML_OP_MUL, z, out, 0);
    CHECK(reads(s, buf, &out, 49.0f));
    apir_session_free(s);
}

static void setup(void)
{
    if (!test_host_init_env(&host))
        exit(1);
    CHECK(host.n_devices >= 1);
}

TEST_MAIN("kept_graph", TEST(setup), TEST(test_same_key_new_graph), TEST(test_same_key_after_free))
