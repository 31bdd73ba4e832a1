/*
 * The serialized tensor record of APIR 0.1 section 4 (304 bytes).
 *
 * This is a wire format, laid out with natural C alignment so that the struct
 * can be copied to and from the wire as-is on little-endian hosts; the
 * offsets are pinned by static assertions in apir_codec.c.  ne and nb are
 * 32-bit, as in ggml-rpc's record: a tensor that does not fit is refused by
 * the guest's serializer, never truncated.
 */
#ifndef APIR_TENSOR_H
#define APIR_TENSOR_H

#include <stdint.h>

#define APIR_TENSOR_MAX_DIMS      4
#define APIR_TENSOR_MAX_SRC       10
#define APIR_TENSOR_MAX_OP_PARAMS 16   /* int32 words */
#define APIR_TENSOR_MAX_NAME      64
#define APIR_TENSOR_REC_SIZE      304

struct apir_tensor_rec {
    uint64_t id;                                   /*   0 guest-chosen, opaque, unique */
    uint32_t type;                                 /*   8 ggml_type */
    uint32_t pad0;                                 /*  12 */
    uint64_t buffer;                               /*  16 host buffer handle, 0 = none */
    uint32_t ne[APIR_TENSOR_MAX_DIMS];             /*  24 */
    uint32_t nb[APIR_TENSOR_MAX_DIMS];             /*  40 */
    uint32_t op;                                   /*  56 ggml_op */
    int32_t  op_params[APIR_TENSOR_MAX_OP_PARAMS]; /*  60 */
    int32_t  flags;                                /* 124 */
    uint64_t src[APIR_TENSOR_MAX_SRC];             /* 128 ids, 0 = none */
    uint64_t view_src;                             /* 208 id */
    uint64_t view_offs;                            /* 216 */
    uint64_t data;                                 /* 224 offset from the buffer's base */
    char     name[APIR_TENSOR_MAX_NAME];           /* 232 */
    uint32_t pad1;                                 /* 296 (+4 tail padding) */
};

#endif
