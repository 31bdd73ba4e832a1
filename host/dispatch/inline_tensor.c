/*
 * The reference guest's "inline tensor" (APIR 0.1 section 3): its raw
 * in-memory struct ggml_tensor, then the 8-byte buffer handle if `buffer` was
 * non-null, the raw struct of view_src if non-null, and the raw struct of
 * each src up to the first null.
 *
 * The raw structs hold guest pointers.  They are only ever tested against
 * NULL (to know which items follow) and otherwise dropped: each struct is
 * converted into a serialized record and goes through the same checks as
 * every other tensor (import.c).  The buffer handle is looked up; the
 * reference guest sends a stack address there, so an unknown handle only
 * means "no buffer".
 */
#include "inline_tensor.h"

#include "apir_log.h"
#include "import.h"
#include "ggml.h"

#include <string.h>

_Static_assert(sizeof(struct ggml_tensor) == APIR_INLINE_TENSOR_SIZE, "inline tensor size changed with ggml");

/* Converts a raw guest struct to a record; false if it cannot be one. */
static bool raw_to_record(const struct ggml_tensor *raw, uint64_t id, struct apir_tensor_rec *rec)
{
    memset(rec, 0, sizeof(*rec));
    rec->id = id;
    rec->type = (uint32_t)raw->type;
    rec->op = (uint32_t)raw->op;
    for (int i = 0; i < 4; i++) {
        if (raw->ne[i] < 0 || raw->ne[i] > (int64_t)UINT32_MAX || raw->nb[i] > UINT32_MAX)
            return false;
        rec->ne[i] = (uint32_t)raw->ne[i];
        rec->nb[i] = (uint32_t)raw->nb[i];
    }
    memcpy(rec->op_params, raw->op_params, sizeof(rec->op_params));
    rec->flags = raw->flags;
    memcpy(rec->name, raw->name, sizeof(rec->name));
    rec->name[sizeof(rec->name) - 1] = '\0';
    return true;
}

struct ggml_tensor *apir_import_inline(struct apir_session *s, struct apir_import_scratch *sc, struct apir_decoder *dec)
{
    /* op, view_src, up to GGML_MAX_SRC srcs */
    struct apir_tensor_rec recs[2 + GGML_MAX_SRC];
    struct ggml_tensor raw;
    uint32_t n = 0;

    apir_decode_bytes(dec, &raw, sizeof(raw));
    if (dec->fatal || !raw_to_record(&raw, 1, &recs[n++]))
        goto bad;
    struct apir_tensor_rec *op = &recs[0];
    if (raw.buffer) {
        uint64_t handle = apir_decode_u64(dec);
        if (dec->fatal)
            goto bad;
        if (apir_handle_get(&s->handles, handle, APIR_HANDLE_BUFFER))
            op->buffer = handle;
        else
            APIR_DEBUG("host", "%s: inline tensor names unknown buffer %#llx; treated as none", s->name,
                       (unsigned long long)handle);
    }
    /* Record which raw pointers were set before the struct is reused. */
    bool has_view = raw.view_src != NULL;
    bool has_src[GGML_MAX_SRC];
    for (int i = 0; i < GGML_MAX_SRC; i++)
        has_src[i] = raw.src[i] != NULL;

    if (has_view) {
        apir_decode_bytes(dec, &raw, sizeof(raw));
        if (dec->fatal || !raw_to_record(&raw, 2, &recs[n]))
            goto bad;
        n++;  /* decoded for framing; supports_op needs no placement */
    }
    for (int i = 0; i < GGML_MAX_SRC && has_src[i]; i++) {
        apir_decode_bytes(dec, &raw, sizeof(raw));
        if (dec->fatal || !raw_to_record(&raw, 3 + (uint64_t)i, &recs[n]))
            goto bad;
        op->src[i] = 3 + (uint64_t)i;
        n++;
    }
    const char *why = NULL;
    struct ggml_tensor **tensors = NULL;
    if (apir_import_begin(sc, n, 0, &why))
        tensors = apir_import_list(s, sc, n, (const uint8_t *)recs, false, &why);
    if (!tensors) {
        APIR_WARN("host", "%s: inline tensor refused: %s", s->name, why);
        return NULL;
    }
    return tensors[0];
bad:
    apir_decoder_set_fatal(dec);
    APIR_WARN("host", "%s: malformed inline tensor", s->name);
    return NULL;
}
