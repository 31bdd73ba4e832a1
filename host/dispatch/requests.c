/*
 * Decoding and checking request items for the derived request structs
 * (requests.h), in two phases: the wire values first, every item read once
 * and in order, so that a short or malformed request is refused as
 * malformed whatever it names; then handles looked up in the session's
 * table and tensors imported through import.c.  After the first refusal
 * nothing more is resolved (no import is wasted on a request that fails
 * anyway; an inline tensor, which has no fixed layout, is the exception:
 * it is imported where it stands) and outputs are zero.
 */
#include "requests.h"

#include "apir_log.h"
#include "import.h"
#include "inline_tensor.h"

#include <string.h>

void apir_request_begin(struct apir_request_decoder *rd, struct apir_session *s, struct apir_decoder *dec, uint32_t cmd,
                        uint32_t n_tensor_items)
{
    rd->s = s;
    rd->dec = dec;
    rd->cmd = cmd;
    rd->result = APIR_HANDLER_OK;
    rd->why = NULL;
    const char *why = NULL;
    if (n_tensor_items && !apir_import_begin(&s->scratch, n_tensor_items, 0, &why)) {
        rd->result = APIR_HANDLER_FAILED;
        rd->why = why;
    }
}

static void refuse(struct apir_request_decoder *rd, uint32_t result, const char *why)
{
    if (rd->result == APIR_HANDLER_OK) {
        rd->result = result;
        rd->why = why;
    }
}

uint32_t apir_request_finish(struct apir_request_decoder *rd)
{
    if (rd->result != APIR_HANDLER_OK)
        APIR_WARN("host", "%s: %s refused: %s", rd->s->name, apir_command_name(rd->cmd), rd->why);
    return rd->result;
}

/* Phase one: the wire values, every item read once, in order, by the
 * codec's own getters (apir_messages.h).  Scalars need nothing more; the
 * rest is resolved once the whole request decoded, so a short or malformed
 * request is refused as such, whatever it names. */
#define WIRE_GET(kind)                                                              \
    void apir_req_wire_##kind(struct apir_request_decoder *rd, APIR_WIRE_##kind *w) \
    {                                                                               \
        apir_get_##kind(rd->dec, w);                                                \
    }
#define RESOLVE_COPY(kind)                                                          \
    void apir_req_resolve_##kind(struct apir_request_decoder *rd, const APIR_WIRE_##kind *w, APIR_HOST_##kind *out) \
    {                                                                               \
        (void)rd;                                                                   \
        *out = *w;                                                                  \
    }
/* (not through a third macro: `bool` would expand to _Bool first) */
WIRE_GET(u32) RESOLVE_COPY(u32)
WIRE_GET(i32) RESOLVE_COPY(i32)
WIRE_GET(enum) RESOLVE_COPY(enum)
WIRE_GET(res) RESOLVE_COPY(res)
WIRE_GET(bool) RESOLVE_COPY(bool)
WIRE_GET(u8) RESOLVE_COPY(u8)
WIRE_GET(u64) RESOLVE_COPY(u64)
WIRE_GET(digest) RESOLVE_COPY(digest)
WIRE_GET(string) RESOLVE_COPY(string)
WIRE_GET(buffer)
WIRE_GET(buft)
WIRE_GET(tensor)
WIRE_GET(tensors)
#undef RESOLVE_COPY
#undef WIRE_GET

/* An inline tensor has no fixed layout: it is parsed and imported where it
 * stands (always the request's last item), and resolved already. */
void apir_req_wire_inline(struct apir_request_decoder *rd, struct ggml_tensor **w)
{
    *w = NULL;
    if (rd->result != APIR_HANDLER_OK || rd->dec->fatal)
        return;
    *w = apir_import_inline(rd->s, &rd->s->scratch, rd->dec);
    if (rd->dec->fatal)
        refuse(rd, APIR_HANDLER_BAD_REQUEST, "malformed inline tensor");
}

void apir_request_wire_done(struct apir_request_decoder *rd)
{
    if (rd->dec->fatal)
        refuse(rd, APIR_HANDLER_BAD_REQUEST, "malformed request");
}

/* Phase two: handles and tensors, until the first refusal. */
void apir_req_resolve_buffer(struct apir_request_decoder *rd, const uint64_t *handle, struct apir_host_buffer **out)
{
    *out = NULL;
    if (rd->result != APIR_HANDLER_OK)
        return;
    struct apir_handle_slot *slot = apir_handle_get(&rd->s->handles, *handle, APIR_HANDLE_BUFFER);
    if (!slot)
        refuse(rd, APIR_HANDLER_BAD_HANDLE, "unknown, stale or foreign buffer handle");
    else
        *out = slot->object;
}

void apir_req_resolve_buft(struct apir_request_decoder *rd, const uint64_t *handle, struct apir_buft_ref *out)
{
    memset(out, 0, sizeof(*out));
    if (rd->result != APIR_HANDLER_OK)
        return;
    struct apir_handle_slot *slot = apir_handle_get(&rd->s->handles, *handle, APIR_HANDLE_BUFT);
    if (!slot) {
        refuse(rd, APIR_HANDLER_BAD_HANDLE, "unknown, stale or foreign buffer type handle");
        return;
    }
    out->buft = slot->object;
    out->device = (uint32_t)slot->aux;
}

void apir_req_resolve_tensor(struct apir_request_decoder *rd, const struct apir_tensor_rec *rec, struct ggml_tensor **out)
{
    *out = NULL;
    if (rd->result != APIR_HANDLER_OK)
        return;
    const char *why = NULL;
    *out = apir_import_tensor(rd->s, &rd->s->scratch, rec, true, NULL, &why);
    if (!*out)
        refuse(rd, APIR_HANDLER_BAD_REQUEST, why);
}

void apir_req_resolve_tensors(struct apir_request_decoder *rd, const struct apir_tensor_list *list, struct ggml_tensor **out)
{
    *out = NULL;
    if (rd->result != APIR_HANDLER_OK)
        return;
    struct ggml_tensor **tensors = NULL;
    const char *why = NULL;
    if (apir_import_begin(&rd->s->scratch, list->count, 0, &why))
        tensors = apir_import_list(rd->s, &rd->s->scratch, list->count, list->records, false, &why);
    if (tensors)
        *out = tensors[0];
    else
        APIR_DEBUG("host", "%s: %s: tensor refused: %s", rd->s->name, apir_command_name(rd->cmd), why);
}

void apir_req_resolve_inline(struct apir_request_decoder *rd, struct ggml_tensor *const *w, struct ggml_tensor **out)
{
    (void)rd;
    *out = *w;
}
