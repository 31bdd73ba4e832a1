/*
 * The guest's typed call stubs, one per row of the command table
 * (protocol/apir_commands.h):
 *
 *   int apir_call_<NAME>(remote, <request items>, <pointers for the reply items>);
 *   int apir_call_<NAME>_locked(...)          the same, the remote's lock held
 *   int apir_call_<NAME>_opts_locked(remote, opts, ...)   and with struct
 *                                             apir_call_opts (remote.h): a read
 *                                             out of the data area, wait work
 *
 * e.g. apir_call_BUFFER_SET_TENSOR(r, buffer, &rec, blob, offset, size).
 * Each returns APIR_HANDLER_OK (0), another apir_handler_result, or -1 if the
 * transport failed; failures are logged (guest/remote.c).  The reply
 * pointers are written only when the call succeeds (zeros if its reply was
 * malformed): a caller may preset defaults.
 */
#ifndef APIR_CALLS_H
#define APIR_CALLS_H

#include <pthread.h>

#include "apir_messages.h"
#include "remote.h"

#define APIR_X_CALL(num, NAME, since, classes)                                                                 \
    static inline int apir_call_##NAME##_opts_locked(struct apir_remote *r, const struct apir_call_opts *opts   \
                                                         APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)                    \
                                                             APIR_REP_##NAME(APIR_ITEM_PARAM_OUT))              \
    {                                                                                                          \
        struct apir_encoder *enc = apir_remote_begin_locked(r, APIR_CMD_##NAME);                               \
        if (!enc)                                                                                              \
            return APIR_HANDLER_INVALID_INDEX;                                                                 \
        apir_encode_request_##NAME(enc APIR_REQ_##NAME(APIR_ITEM_ARG));                                        \
        struct apir_decoder dec;                                                                               \
        int rc = apir_remote_submit_locked(r, APIR_CMD_##NAME, opts, &dec);                                    \
        if (rc != APIR_HANDLER_OK)                                                                             \
            return rc;                                                                                         \
        return apir_remote_reply_checked(r, APIR_CMD_##NAME,                                                   \
                                         apir_decode_reply_##NAME(&dec APIR_REP_##NAME(APIR_ITEM_ARG)));       \
    }                                                                                                          \
    static inline int apir_call_##NAME##_locked(struct apir_remote *r APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)       \
                                                    APIR_REP_##NAME(APIR_ITEM_PARAM_OUT))                       \
    {                                                                                                          \
        return apir_call_##NAME##_opts_locked(r, NULL APIR_REQ_##NAME(APIR_ITEM_ARG)                           \
                                                  APIR_REP_##NAME(APIR_ITEM_ARG));                             \
    }                                                                                                          \
    static inline int apir_call_##NAME(struct apir_remote *r APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)                \
                                           APIR_REP_##NAME(APIR_ITEM_PARAM_OUT))                                \
    {                                                                                                          \
        pthread_mutex_lock(&r->lock);                                                                          \
        int rc = apir_call_##NAME##_locked(r APIR_REQ_##NAME(APIR_ITEM_ARG) APIR_REP_##NAME(APIR_ITEM_ARG));    \
        pthread_mutex_unlock(&r->lock);                                                                        \
        return rc;                                                                                             \
    }
APIR_COMMAND_LIST(APIR_X_CALL)
#undef APIR_X_CALL

#endif
