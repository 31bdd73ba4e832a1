/*
 * libapir-virgl.so driven as virglrenderer drives it, for the tests that
 * load it (test_virgl_abi.c, test_virgl_sandbox.c): the callbacks, the
 * three entry points, and typed calls.
 *
 * A test defines lib_dispatch, cbs, request_buf, reply_buf and reply_ok,
 * then APIR_COMMAND_LIST(VIRGL_X_CALL): call_<NAME>(ctx, <request items>,
 * <pointers for the reply items>) encodes the request, dispatches it and
 * decodes the reply whatever the result (the outputs are zero when the
 * handler answered nothing); reply_ok says whether the reply held its items.
 */
#ifndef APIR_VIRGL_LIB_H
#define APIR_VIRGL_LIB_H

#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"

#include <stddef.h>
#include <stdint.h>

struct callbacks {
    const char *(*get_config)(uint32_t ctx_id, const char *key);
    void *(*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
    size_t (*get_shmem_size)(uint32_t ctx_id, uint32_t res_id);
};
typedef uint32_t (*init_fn)(uint32_t, struct callbacks *);
typedef uint32_t (*dispatch_fn)(uint32_t, struct callbacks *, uint32_t, char *, const char *, char *, const char *, char **);
typedef void (*deinit_fn)(uint32_t);

#define VIRGL_X_CALL(num, NAME, since, classes)                                                                 \
    static inline uint32_t call_##NAME(uint32_t ctx APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)                         \
                                           APIR_REP_##NAME(APIR_ITEM_PARAM_OUT))                                \
    {                                                                                                           \
        struct apir_encoder enc;                                                                                \
        apir_encoder_init(&enc, request_buf, sizeof(request_buf));                                              \
        apir_encode_request_##NAME(&enc APIR_REQ_##NAME(APIR_ITEM_ARG));                                        \
        char *after = NULL;                                                                                     \
        uint32_t r = lib_dispatch(ctx, &cbs, APIR_CMD_##NAME, (char *)request_buf,                              \
                                  (const char *)request_buf + apir_encoder_used(&enc), (char *)reply_buf,       \
                                  (const char *)reply_buf + sizeof(reply_buf), &after);                         \
        struct apir_decoder reply;                                                                              \
        apir_decoder_init(&reply, reply_buf, after ? (size_t)(after - (char *)reply_buf) : 0);                  \
        reply_ok = apir_decode_reply_##NAME(&reply APIR_REP_##NAME(APIR_ITEM_ARG));                             \
        return r;                                                                                               \
    }

#endif
