/*
 * The host's side of each request, derived from the command table
 * (protocol/apir_commands.h): a struct per command whose fields are the
 * request items already decoded and checked -
 *
 *   buffer   struct apir_host_buffer *   a live buffer of this session
 *   buft     struct apir_buft_ref        a buffer type this session was given
 *   tensor   struct ggml_tensor *        imported (host/check/import.c): a valid
 *                                        record inside one of the session's
 *                                        buffers, host pointers filled in
 *   tensors  struct ggml_tensor *        the subject of a tensor list,
 *                                        imported as a query; NULL when the
 *                                        import refused it (a handler answers
 *                                        "no" rather than fail)
 *   inline   struct ggml_tensor *        an APIR 0.1 inline tensor, likewise
 *   digest   struct apir_digest           a copy of the 32 bytes
 *   string   struct apir_string           a copy, NUL-terminated (APIR_MAX_STRING)
 *   others                               their values (res stays a res_id:
 *                                        a blob range needs several items)
 *
 * - and apir_request_decode_<NAME>(s, dec, &req), which fills it or refuses
 * the command with a logged reason (APIR_HANDLER_BAD_REQUEST for what does
 * not decode or import, APIR_HANDLER_BAD_HANDLE for an unknown handle).  A
 * handler host_cmd_<NAME> (host/dispatch/dispatch.c, host/dispatch/graph_exec.c) therefore
 * never decodes: it checks what ties items together (a tensor inside the
 * named buffer, a range inside a tensor) and does the work.
 *
 * Tensor items import into the session's own scratch (s->scratch); the
 * pointers are good until the next import there.
 */
#ifndef APIR_REQUESTS_H
#define APIR_REQUESTS_H

#include "apir_messages.h"
#include "session.h"

struct apir_buft_ref {
    ggml_backend_buffer_type_t buft;
    uint32_t device;        /* the host device the type belongs to */
};

#define APIR_HOST_u32     uint32_t
#define APIR_HOST_i32     int32_t
#define APIR_HOST_enum    uint32_t
#define APIR_HOST_res     uint32_t
#define APIR_HOST_bool    bool
#define APIR_HOST_u8      uint8_t
#define APIR_HOST_u64     uint64_t
#define APIR_HOST_buffer  struct apir_host_buffer *
#define APIR_HOST_buft    struct apir_buft_ref
#define APIR_HOST_tensor  struct ggml_tensor *
#define APIR_HOST_tensors struct ggml_tensor *
#define APIR_HOST_inline  struct ggml_tensor *
#define APIR_HOST_digest  struct apir_digest
#define APIR_HOST_string  struct apir_string

/* Tensor items of a request are imported together (apir_import_begin). */
#define APIR_HOST_IS_TENSOR_u32     0
#define APIR_HOST_IS_TENSOR_i32     0
#define APIR_HOST_IS_TENSOR_enum    0
#define APIR_HOST_IS_TENSOR_res     0
#define APIR_HOST_IS_TENSOR_bool    0
#define APIR_HOST_IS_TENSOR_u8      0
#define APIR_HOST_IS_TENSOR_u64     0
#define APIR_HOST_IS_TENSOR_buffer  0
#define APIR_HOST_IS_TENSOR_buft    0
#define APIR_HOST_IS_TENSOR_tensor  1
#define APIR_HOST_IS_TENSOR_tensors 0
#define APIR_HOST_IS_TENSOR_inline  0
#define APIR_HOST_IS_TENSOR_digest  0
#define APIR_HOST_IS_TENSOR_string  0

/* Wire types: what phase one decodes each kind into - the codec's
 * APIR_OUT_<kind>, but an inline tensor, which is imported where it stands. */
typedef struct ggml_tensor *apir_tensor_ptr;
#define APIR_WIRE_u32     APIR_OUT_u32
#define APIR_WIRE_i32     APIR_OUT_i32
#define APIR_WIRE_enum    APIR_OUT_enum
#define APIR_WIRE_res     APIR_OUT_res
#define APIR_WIRE_bool    APIR_OUT_bool
#define APIR_WIRE_u8      APIR_OUT_u8
#define APIR_WIRE_u64     APIR_OUT_u64
#define APIR_WIRE_buffer  APIR_OUT_buffer
#define APIR_WIRE_buft    APIR_OUT_buft
#define APIR_WIRE_tensor  APIR_OUT_tensor
#define APIR_WIRE_tensors APIR_OUT_tensors
#define APIR_WIRE_inline  apir_tensor_ptr   /* already imported */
#define APIR_WIRE_digest  APIR_OUT_digest
#define APIR_WIRE_string  APIR_OUT_string

/* One request being decoded: the first refusal wins, the rest is skipped. */
struct apir_request_decoder {
    struct apir_session *s;
    struct apir_decoder *dec;
    uint32_t cmd;
    uint32_t result;        /* APIR_HANDLER_OK until something is refused */
    const char *why;
};

void apir_request_begin(struct apir_request_decoder *rd, struct apir_session *s, struct apir_decoder *dec, uint32_t cmd,
                        uint32_t n_tensor_items);
/* Between the phases: a request that did not decode is refused here. */
void apir_request_wire_done(struct apir_request_decoder *rd);
/* The verdict, logged when it is a refusal. */
uint32_t apir_request_finish(struct apir_request_decoder *rd);

#define APIR_REQ_KIND_FNS(kind)                                                                              \
    void apir_req_wire_##kind(struct apir_request_decoder *rd, APIR_WIRE_##kind *w);                        \
    void apir_req_resolve_##kind(struct apir_request_decoder *rd, const APIR_WIRE_##kind *w, APIR_HOST_##kind *out);
APIR_REQ_KIND_FNS(u32)
APIR_REQ_KIND_FNS(i32)
APIR_REQ_KIND_FNS(enum)
APIR_REQ_KIND_FNS(res)
APIR_REQ_KIND_FNS(bool)
APIR_REQ_KIND_FNS(u8)
APIR_REQ_KIND_FNS(u64)
APIR_REQ_KIND_FNS(buffer)
APIR_REQ_KIND_FNS(buft)
APIR_REQ_KIND_FNS(tensor)
APIR_REQ_KIND_FNS(tensors)
APIR_REQ_KIND_FNS(inline)
APIR_REQ_KIND_FNS(digest)
APIR_REQ_KIND_FNS(string)
#undef APIR_REQ_KIND_FNS

#define APIR_HOST_ITEM_FIELD(kind, field) APIR_HOST_##kind field;
#define APIR_HOST_ITEM_WIRE_FIELD(kind, field) APIR_WIRE_##kind field;
#define APIR_HOST_ITEM_WIRE(kind, field) apir_req_wire_##kind(rd, &wire.field);
#define APIR_HOST_ITEM_RESOLVE(kind, field) apir_req_resolve_##kind(rd, &wire.field, &req->field);
#define APIR_HOST_ITEM_IS_TENSOR(kind, field) +APIR_HOST_IS_TENSOR_##kind

#define APIR_X_REQUEST(num, NAME, since, classes)                                                            \
    struct apir_request_##NAME {                                                                            \
        APIR_REQ_##NAME(APIR_HOST_ITEM_FIELD) uint8_t no_items_;                                            \
    };                                                                                                      \
    static inline uint32_t apir_request_decode_##NAME(struct apir_session *s, struct apir_decoder *dec,     \
                                                      struct apir_request_##NAME *req)                      \
    {                                                                                                       \
        struct apir_request_decoder rd_;                                                                    \
        struct apir_request_decoder *rd = &rd_;                                                             \
        struct {                                                                                            \
            APIR_REQ_##NAME(APIR_HOST_ITEM_WIRE_FIELD) uint8_t no_items_;                                   \
        } wire;                                                                                             \
        apir_request_begin(rd, s, dec, APIR_CMD_##NAME, 0 APIR_REQ_##NAME(APIR_HOST_ITEM_IS_TENSOR));       \
        wire.no_items_ = 0;                                                                                 \
        (void)wire;                                                                                         \
        req->no_items_ = 0;                                                                                 \
        APIR_REQ_##NAME(APIR_HOST_ITEM_WIRE)                                                                \
        apir_request_wire_done(rd);                                                                         \
        APIR_REQ_##NAME(APIR_HOST_ITEM_RESOLVE)                                                             \
        return apir_request_finish(rd);                                                                     \
    }
APIR_COMMAND_LIST(APIR_X_REQUEST)
#undef APIR_X_REQUEST

#endif
