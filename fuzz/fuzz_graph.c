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
 * through what the full checks refuse.  The changed graph also goes as a
 * delta (0.9) against the original, which must give the same verdict as
 * the whole; and the input itself is read as a delta against the last
 * graph accepted (the delta decoder on raw bytes).
 */
#include "fuzz_host.h"
#include "import.h"

#include <stdlib.h>
#include <string.h>

FZ_INITIALIZE_HOST_ONLY()

static bool stale;  /* the last build was a delta whose base the host did not hold */

/* A graph blob imported whole (base 0) or as a delta against the graph of
 * key base; key: its own key, for a later delta's base. */
static struct ggml_cgraph *build(struct apir_session *s, const uint8_t *blob, size_t size, bool use_counts, uint64_t key,
                                 uint64_t base, const char **why)
{
    struct apir_graph_blob in = { .bytes = blob, .size = size, .key = key, .base = base, .use_counts = use_counts };
    struct ggml_cgraph *g = apir_graph_build(s, &s->scratch, &in, why);
    stale = in.stale;
    return g;
}

/* Where a whole blob's records start and how many it holds; false unless
 * the blob is long enough for them. */
static bool records_of(const uint8_t *g, size_t len, size_t *at, uint32_t *n)
{
    uint32_t n_nodes;
    if (len < 4)
        return false;
    memcpy(&n_nodes, g, 4);
    if ((uint64_t)n_nodes * 8 > len - 4 || len - 4 - (size_t)n_nodes * 8 < 4)
        return false;
    memcpy(n, g + 4 + (size_t)n_nodes * 8, 4);
    *at = 8 + (size_t)n_nodes * 8;
    return *n <= (len - *at) / APIR_TENSOR_REC_SIZE;
}

/* The delta of whole blob m against whole blob o, as the guest writes it
 * (guest/graph_delta.c); its size, 0 when either blob is too short. */
static size_t delta_of(const uint8_t *o, size_t o_len, const uint8_t *m, size_t m_len, uint8_t **out)
{
    size_t o_at, m_at;
    uint32_t o_n, m_n;
    if (!records_of(o, o_len, &o_at, &o_n) || !records_of(m, m_len, &m_at, &m_n))
        return 0;
    const size_t tail = m_len - m_at - (size_t)m_n * APIR_TENSOR_REC_SIZE;
    uint8_t *d = malloc(m_at + 4 + (size_t)m_n * (4 + APIR_TENSOR_REC_SIZE) + tail);
    if (!d)
        return 0;
    uint32_t changed = 0;
    for (uint32_t i = 0; i < m_n; i++)
        changed += i >= o_n || memcmp(m + m_at + (size_t)i * APIR_TENSOR_REC_SIZE,
                                      o + o_at + (size_t)i * APIR_TENSOR_REC_SIZE, APIR_TENSOR_REC_SIZE) != 0;
    memcpy(d, m, m_at);
    memcpy(d + m_at, &changed, 4);
    uint8_t *index = d + m_at + 4, *recs = index + (size_t)changed * 4;
    for (uint32_t i = 0, k = 0; i < m_n; i++) {
        const uint8_t *rec = m + m_at + (size_t)i * APIR_TENSOR_REC_SIZE;
        if (i < o_n && memcmp(rec, o + o_at + (size_t)i * APIR_TENSOR_REC_SIZE, APIR_TENSOR_REC_SIZE) == 0)
            continue;
        memcpy(index + (size_t)k * 4, &i, 4);
        memcpy(recs + (size_t)k * APIR_TENSOR_REC_SIZE, rec, APIR_TENSOR_REC_SIZE);
        k++;
    }
    memcpy(recs + (size_t)changed * APIR_TENSOR_REC_SIZE, m + m_at + (size_t)m_n * APIR_TENSOR_REC_SIZE, tail);
    *out = d;
    return m_at + 4 + (size_t)changed * (4 + APIR_TENSOR_REC_SIZE) + tail;
}

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
    bool accepted = false;
    for (int pass = 0; pass < 2 && !(known_hit && fz_skipping_known()); pass++) {
        /* the second pass reads a trailing use-count section, as for keyed graphs */
        struct ggml_cgraph *g = build(s, blob, size, pass == 1, 1, 0, &why);
        if (g) {
            FZ_ASSERT(ggml_graph_n_nodes(g) >= 2, "accepted graph without nodes");
            fz_check_graph(s, g);
        }
        accepted = g != NULL;
    }
    if (accepted) {
        /* the input itself as a delta against the graph just accepted */
        struct ggml_cgraph *g = build(s, blob, size, true, 2, 1, &why);
        if (g)
            fz_check_graph(s, g);
    }
    if (size > 16 && !(known_hit && fz_skipping_known())) {
        const size_t pos = ((size_t)data[size - 1] << 8 | data[size - 2]) % (size - 3);
        const uint8_t flip = data[size - 3] ? data[size - 3] : 1;
        uint8_t *original = fz_copy(blob, size);
        const bool base = build(s, blob, size, true, 1, 0, &why) != NULL;  /* the memo: this graph, if accepted */
        blob[pos] ^= flip;
        const bool with_memo = build(s, blob, size, true, 3, 0, &why) != NULL;
        s->host->cfg.import_memo = false;
        struct ggml_cgraph *g = build(s, blob, size, true, 3, 0, &why);
        s->host->cfg.import_memo = true;
        FZ_ASSERT(with_memo == (g != NULL), "the import memo changed a graph's verdict");
        if (g)
            fz_check_graph(s, g);
        /* the changed graph as a delta against the original: as the whole */
        uint8_t *delta = NULL;
        const size_t delta_size = base ? delta_of(original, size, blob, size, &delta) : 0;
        if (delta_size && build(s, original, size, true, 1, 0, &why)) {
            g = build(s, delta, delta_size, true, 4, 1, &why);
            /* stale: a graph past APIR_IMPORT_MEMO_MAX records, which no delta can name */
            FZ_ASSERT(stale || with_memo == (g != NULL), "a delta's verdict differs from its whole graph's: %s",
                      g ? "accepted" : why);
            if (g)
                fz_check_graph(s, g);
        }
        free(delta);
        free(original);
    }
    free(blob);
    apir_session_free(s);
    return 0;
}
