/*
 * Typed messages, derived from the command table (apir_commands.h).
 *
 * Each item kind has a C type it is given as (APIR_IN_<kind>: what a guest
 * puts in a request, what a host puts in a reply) and one it is decoded
 * into (APIR_OUT_<kind>), and a put and a get in the codec's rules (sticky
 * fatal, zeroed outputs on short reads).  From the item lists every command
 * gets
 *
 *   void apir_encode_request_<NAME>(enc, <request items as parameters>);
 *   bool apir_decode_reply_<NAME>(dec, <pointers for the reply items>);
 *   void apir_encode_reply_<NAME>(enc, const struct apir_reply_<NAME> *);
 *   struct apir_reply_<NAME>     the reply items as fields (a host fills it)
 *
 * so a wrong type at a call site is a compile error, not a wrong byte on the
 * wire.  The host's request side is its own (host/dispatch/requests.h): it decodes
 * the items with the getters here, then resolves handles and imports
 * tensors.
 */
#ifndef APIR_MESSAGES_H
#define APIR_MESSAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_proto.h"

/* A reply string, decoded: as long as a peer may send. */
struct apir_string {
    char s[APIR_MAX_STRING];
};

/* The records of a tensor list, as a guest sends them. */
struct apir_tensor_span {
    uint32_t count;
    const struct apir_tensor_rec *recs;
};

/* Bytes already laid out (an APIR 0.1 inline tensor: only tests and the
 * fuzzers build those; our guest sends tensor lists). */
struct apir_bytes {
    const void *data;
    size_t size;
};

/* A tensor list holds an op and its sources, view sources included. */
#define APIR_MAX_LIST_TENSORS (2 * (APIR_TENSOR_MAX_SRC + 1))

/* ---- item kinds --------------------------------------------------------- */

#define APIR_SIG_u32     "u"
#define APIR_SIG_i32     "i"
#define APIR_SIG_enum    "e"
#define APIR_SIG_res     "r"
#define APIR_SIG_bool    "b"
#define APIR_SIG_u8      "c"
#define APIR_SIG_u64     "q"
#define APIR_SIG_buffer  "h"
#define APIR_SIG_buft    "h"
#define APIR_SIG_string  "s"
#define APIR_SIG_tensor  "t"
#define APIR_SIG_tensors "L"
#define APIR_SIG_inline  "T"
#define APIR_SIG_digest  "d"

#define APIR_IN_u32      uint32_t
#define APIR_IN_i32      int32_t
#define APIR_IN_enum     uint32_t
#define APIR_IN_res      uint32_t
#define APIR_IN_bool     bool
#define APIR_IN_u8       uint8_t
#define APIR_IN_u64      uint64_t
#define APIR_IN_buffer   uint64_t
#define APIR_IN_buft     uint64_t
#define APIR_IN_string   const char *
#define APIR_IN_tensor   const struct apir_tensor_rec *
#define APIR_IN_tensors  struct apir_tensor_span
#define APIR_IN_inline   struct apir_bytes
#define APIR_IN_digest   const struct apir_digest *

#define APIR_OUT_u32     uint32_t
#define APIR_OUT_i32     int32_t
#define APIR_OUT_enum    uint32_t
#define APIR_OUT_res     uint32_t
#define APIR_OUT_bool    bool
#define APIR_OUT_u8      uint8_t
#define APIR_OUT_u64     uint64_t
#define APIR_OUT_buffer  uint64_t
#define APIR_OUT_buft    uint64_t
#define APIR_OUT_string  struct apir_string
#define APIR_OUT_tensor  struct apir_tensor_rec
#define APIR_OUT_tensors struct apir_tensor_list    /* in place: read each record once */
#define APIR_OUT_digest  struct apir_digest
/* inline has no OUT: only the host decodes it (host/dispatch/inline_tensor.c). */

static inline void apir_put_u32(struct apir_encoder *e, uint32_t v) { apir_encode_u32(e, v); }
static inline void apir_put_i32(struct apir_encoder *e, int32_t v) { apir_encode_u32(e, (uint32_t)v); }
static inline void apir_put_enum(struct apir_encoder *e, uint32_t v) { apir_encode_u32(e, v); }
static inline void apir_put_res(struct apir_encoder *e, uint32_t v) { apir_encode_u32(e, v); }
static inline void apir_put_bool(struct apir_encoder *e, bool v) { apir_encode_bool(e, v); }
static inline void apir_put_u8(struct apir_encoder *e, uint8_t v) { apir_encode_u8(e, v); }
static inline void apir_put_u64(struct apir_encoder *e, uint64_t v) { apir_encode_u64(e, v); }
static inline void apir_put_buffer(struct apir_encoder *e, uint64_t v) { apir_encode_u64(e, v); }
static inline void apir_put_buft(struct apir_encoder *e, uint64_t v) { apir_encode_u64(e, v); }
static inline void apir_put_string(struct apir_encoder *e, const char *v) { apir_encode_string(e, v ? v : ""); }
static inline void apir_put_tensor(struct apir_encoder *e, const struct apir_tensor_rec *v) { apir_encode_tensor(e, v); }
static inline void apir_put_tensors(struct apir_encoder *e, struct apir_tensor_span v)
{
    apir_encode_tensor_list(e, v.count, v.recs);
}
static inline void apir_put_inline(struct apir_encoder *e, struct apir_bytes v) { apir_encode_bytes(e, v.data, v.size); }
static inline void apir_put_digest(struct apir_encoder *e, const struct apir_digest *v) { apir_encode_digest(e, v); }

static inline void apir_get_u32(struct apir_decoder *d, uint32_t *v) { *v = apir_decode_u32(d); }
static inline void apir_get_i32(struct apir_decoder *d, int32_t *v) { *v = (int32_t)apir_decode_u32(d); }
static inline void apir_get_enum(struct apir_decoder *d, uint32_t *v) { *v = apir_decode_u32(d); }
static inline void apir_get_res(struct apir_decoder *d, uint32_t *v) { *v = apir_decode_u32(d); }
static inline void apir_get_bool(struct apir_decoder *d, bool *v) { *v = apir_decode_bool(d); }
static inline void apir_get_u8(struct apir_decoder *d, uint8_t *v) { *v = apir_decode_u8(d); }
static inline void apir_get_u64(struct apir_decoder *d, uint64_t *v) { *v = apir_decode_u64(d); }
static inline void apir_get_buffer(struct apir_decoder *d, uint64_t *v) { *v = apir_decode_u64(d); }
static inline void apir_get_buft(struct apir_decoder *d, uint64_t *v) { *v = apir_decode_u64(d); }
static inline void apir_get_string(struct apir_decoder *d, struct apir_string *v) { apir_decode_string(d, v->s, sizeof(v->s)); }
static inline void apir_get_tensor(struct apir_decoder *d, struct apir_tensor_rec *v) { apir_decode_tensor(d, v); }
static inline void apir_get_digest(struct apir_decoder *d, struct apir_digest *v) { apir_decode_digest(d, v); }
static inline void apir_get_tensors(struct apir_decoder *d, struct apir_tensor_list *v)
{
    apir_decode_tensor_list(d, v, APIR_MAX_LIST_TENSORS);
}

/* ---- per command ---------------------------------------------------------- */

#define APIR_ITEM_SIG(kind, field) APIR_SIG_##kind
#define APIR_ITEM_PARAM_IN(kind, field) , APIR_IN_##kind field
#define APIR_ITEM_PARAM_OUT(kind, field) , APIR_OUT_##kind *field
#define APIR_ITEM_ARG(kind, field) , field
#define APIR_ITEM_PUT(kind, field) apir_put_##kind(enc, field);
#define APIR_ITEM_GET(kind, field) apir_get_##kind(dec, field);
#define APIR_ITEM_FIELD_IN(kind, field) APIR_IN_##kind field;
#define APIR_ITEM_PUT_FIELD(kind, field) apir_put_##kind(enc, rep->field);

/* Structs need a member even when a message has no items. */
#define APIR_X_MESSAGES(num, NAME, since, classes)                                                       \
    struct apir_reply_##NAME {                                                                           \
        APIR_REP_##NAME(APIR_ITEM_FIELD_IN) uint8_t no_items_;                                           \
    };                                                                                                   \
    static inline void apir_encode_request_##NAME(struct apir_encoder *enc APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)) \
    {                                                                                                    \
        (void)enc;                                                                                       \
        APIR_REQ_##NAME(APIR_ITEM_PUT)                                                                   \
    }                                                                                                    \
    static inline bool apir_decode_reply_##NAME(struct apir_decoder *dec APIR_REP_##NAME(APIR_ITEM_PARAM_OUT)) \
    {                                                                                                    \
        APIR_REP_##NAME(APIR_ITEM_GET)                                                                   \
        return !dec->fatal;                                                                              \
    }                                                                                                    \
    static inline void apir_encode_reply_##NAME(struct apir_encoder *enc, const struct apir_reply_##NAME *rep) \
    {                                                                                                    \
        (void)enc;                                                                                       \
        (void)rep;                                                                                       \
        APIR_REP_##NAME(APIR_ITEM_PUT_FIELD)                                                             \
    }
APIR_COMMAND_LIST(APIR_X_MESSAGES)

#endif
