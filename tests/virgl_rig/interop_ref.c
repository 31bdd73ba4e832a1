/*
 * Our guest core against whichever host library the rig serves, using only
 * APIR 0.1 commands (0..22): what works with the reference host library
 * (ggml-virtgpu-backend) as well as with ours.
 *
 *   connect (virtgpu): HANDSHAKE, LOADLIBRARY, the 0.2 probe
 *   device and buffer-type queries
 *   ALLOC_BUFFER, GET_BASE, SET_TENSOR, GRAPH_COMPUTE (c = a + b, then
 *   d = c * b), GET_TENSOR: the values are checked
 *   CLEAR, FREE_BUFFER
 *
 * usage (as a rig guest): interop_ref [EXPECTED_MINOR]
 */
#include "apir_codec.h"
#include "apir_proto.h"
#include "calls.h"
#include "ggml.h"
#include "remote.h"
#include "test_records.h"
#include "test_util.h"

#include <string.h>

static unsigned expected_minor = 0;

static void test_reference_subset(void)
{
    struct apir_remote r;
    char err[256];
    bool open = apir_remote_open(&r, "virtgpu", 0, err, sizeof(err));
    CHECK_MSG(open, "%s", err);
    if (!open)
        return;
    printf("connected: %s, APIR 0.%u\n", r.t->endpoint, r.minor);
    if (expected_minor)
        CHECK(r.minor == expected_minor);

    int32_t count = 0;
    struct apir_string name = { "" }, desc = { "" }, buft_name = { "" };
    uint32_t type = 99;
    uint64_t free_mem = 0, total = 0, buft = 0, align = 0, max_size = 0;
    bool async = 1, host_buf = 1, from_ptr = 0, events = 1, mmap_support = 0;
    CHECK(apir_call_DEVICE_GET_COUNT(&r, &count) == 0 && count >= 1);
    CHECK(apir_call_DEVICE_GET_NAME(&r, &name) == 0 && name.s[0]);
    CHECK(apir_call_DEVICE_GET_DESCRIPTION(&r, &desc) == 0);
    CHECK(apir_call_DEVICE_GET_TYPE(&r, &type) == 0 && type <= 3);
    CHECK(apir_call_DEVICE_GET_MEMORY(&r, &free_mem, &total) == 0 && total > 0);
    CHECK(apir_call_DEVICE_GET_PROPS(&r, &async, &host_buf, &from_ptr, &events, &mmap_support) == 0);
    CHECK(apir_call_DEVICE_GET_BUFFER_TYPE(&r, &buft) == 0 && buft);
    CHECK(apir_call_BUFFER_TYPE_GET_NAME(&r, buft, &buft_name) == 0);
    CHECK(apir_call_BUFFER_TYPE_GET_ALIGNMENT(&r, buft, &align) == 0 && align > 0);
    CHECK(apir_call_BUFFER_TYPE_GET_MAX_SIZE(&r, buft, &max_size) == 0 && max_size > 0);
    printf("device %d: %s (%s), type %u, %llu MiB; buffer type %s, alignment %llu\n", count, name.s, desc.s, type,
           (unsigned long long)(total >> 20), buft_name.s, (unsigned long long)align);

    uint64_t buf = 0, base = 0;
    CHECK(apir_call_BUFFER_TYPE_ALLOC_BUFFER(&r, buft, 1 << 16, &buf) == 0 && buf);
    CHECK(apir_call_BUFFER_GET_BASE(&r, buf, &base) == 0);
    enum { N = 64 };
    struct apir_tensor_rec t[4] = { f32_rec(1, buf, 0, N), f32_rec(2, buf, 1024, N), f32_rec(3, buf, 2048, N),
                                    f32_rec(4, buf, 3072, N) };
    t[2].op = GGML_OP_ADD;
    t[2].src[0] = 1;
    t[2].src[1] = 2;
    t[3].op = GGML_OP_MUL;
    t[3].src[0] = 3;
    t[3].src[1] = 2;
    t[2].flags = t[3].flags = GGML_TENSOR_FLAG_COMPUTE;  /* what ggml_build_forward sets on nodes */
    float *f = (float *)(void *)r.data;
    for (int i = 0; i < N; i++)
        f[i] = (float)i;
    CHECK(apir_call_BUFFER_SET_TENSOR(&r, buf, &t[0], r.data_res_id, 0, 4 * N) == 0);
    for (int i = 0; i < N; i++)
        f[i] = 2.0f;
    CHECK(apir_call_BUFFER_SET_TENSOR(&r, buf, &t[1], r.data_res_id, 0, 4 * N) == 0);

    /* Graph blob (section 3): n_nodes, node ids, n_tensors, records. */
    struct apir_encoder e;
    apir_encoder_init(&e, r.data, r.data_size);
    apir_encode_u32(&e, 2);
    apir_encode_u64(&e, 3);
    apir_encode_u64(&e, 4);
    apir_encode_tensor_list(&e, 4, t);
    uint32_t status = 99;
    CHECK(apir_call_BACKEND_GRAPH_COMPUTE(&r, r.data_res_id, apir_encoder_used(&e), &status) == 0);
    CHECK(status == GGML_STATUS_SUCCESS);
    memset(f, 0, 4 * N);
    CHECK(apir_call_BUFFER_GET_TENSOR(&r, buf, &t[3], r.data_res_id, 0, 4 * N) == 0);
    bool right = true;
    for (int i = 0; i < N; i++)
        right = right && f[i] == ((float)i + 2.0f) * 2.0f;
    CHECK_MSG(right, "d[1] = %g, expected 6", (double)f[1]);
    printf("graph (a + b) * b on the host: %s\n", right ? "correct" : "WRONG");
    CHECK(apir_call_BUFFER_CLEAR(&r, buf, 0) == 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, buf) == 0);
    apir_remote_close(&r);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        expected_minor = (unsigned)strtoul(argv[1], NULL, 10);
    static const struct test_case cases[] = { TEST(test_reference_subset) };
    return test_run("interop", cases, 1);
}
