/*
 * fuzz_graph: graph blobs of BACKEND_GRAPH_COMPUTE through apir_graph_build (the import and its checks),
 * without computing.
 *
 * Per input: a fresh session with two buffers (FZ_H_BUF_A, 64 KiB, and
 * FZ_H_BUF_B, 4 KiB), the input copied to an exact-size heap block (a real
 * blob is shared memory: import must not read past the size it was given)
 * with handle numbers rewritten (fuzz_format.h), imported twice: the second
 * import runs on the warmed-up scratch, which is the token path.  Oracle:
 * every tensor of an accepted graph lies inside a buffer of the session.
 * Then the import memo (import.h) is put to the test: one byte of the blob
 * changed (where and how, the input's last three bytes say), the graph is
 * imported after the original (the memo holding it, if it was accepted)
 * and again with the memo off: the two must agree, so the memo never lets
 * through what the full checks refuse.
 */
#include "fuzz_host.h"
#include "import.h"

#include <stdlib.h>
#include <string.h>

FZ_INITIALIZE_HOST_ONLY()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_known k;
    struct apir_session *s = fz_session_new(&k);
    fz_alloc_buffer(s, FZ_BUF_A_SIZE, &k);
    fz_alloc_buffer(s, FZ_BUF_B_SIZE, &k);

    uint8_t *blob = fz_copy(data, size);
    bool known_hit = false;
    fz_patch_graph(blob, size, &k, &known_hit);
    const char *why = NULL;
    for (int pass = 0; pass < 2 && !(known_hit && fz_skipping_known()); pass++) {
        /* the second pass reads a trailing use-count section, as for keyed graphs */
        struct ggml_cgraph *g = apir_graph_build(s, &s->scratch, blob, size, pass == 1, &why);
        if (g) {
            FZ_ASSERT(ggml_graph_n_nodes(g) >= 2, "accepted graph without nodes");
            fz_check_graph(s, g);
        }
    }
    if (size > 16 && !(known_hit && fz_skipping_known())) {
        const size_t pos = ((size_t)data[size - 1] << 8 | data[size - 2]) % (size - 3);
        const uint8_t flip = data[size - 3] ? data[size - 3] : 1;
        apir_graph_build(s, &s->scratch, blob, size, false, &why);  /* the memo: this graph, if accepted */
        blob[pos] ^= flip;
        const bool with_memo = apir_graph_build(s, &s->scratch, blob, size, false, &why) != NULL;
        s->host->cfg.import_memo = false;
        struct ggml_cgraph *g = apir_graph_build(s, &s->scratch, blob, size, false, &why);
        s->host->cfg.import_memo = true;
        FZ_ASSERT(with_memo == (g != NULL), "the import memo changed a graph's verdict");
        if (g)
            fz_check_graph(s, g);
    }
    free(blob);
    apir_session_free(s);
    return 0;
}
