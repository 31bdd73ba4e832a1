/*
 * Driving a host session directly, as the dispatcher is driven by a guest:
 * typed forwarders derived from the command table, one per command,
 *
 *   uint32_t fwd_<NAME>(s, <request items>, <pointers for the reply items>)
 *
 * (the request encoded by apir_encode_request_<NAME>, the reply decoded by
 * apir_decode_reply_<NAME> whatever the result, so a test can read the
 * status a refused graph answers; outputs are zero when the handler did not
 * run), fwd_raw for hand-made request bytes, and a buffer allocated on the
 * session's device.
 */
#ifndef APIR_TEST_SESSION_H
#define APIR_TEST_SESSION_H

#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "dispatcher.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>

static uint8_t reply_buf[APIR_REPLY_BLOB_SIZE];
static uint8_t request_buf[APIR_MAX_COMMAND_SIZE];

/* Forwards len request bytes; *reply decodes what the handler answered. */
static inline uint32_t fwd_raw(struct apir_session *s, uint32_t cmd, const void *bytes, size_t len,
                               struct apir_decoder *reply)
{
    struct apir_decoder req;
    apir_decoder_init(&req, bytes, len);
    struct apir_encoder out;
    apir_encoder_init(&out, reply_buf, sizeof(reply_buf));
    uint32_t r = apir_session_forward(s, cmd, &req, &out);
    apir_decoder_init(reply, reply_buf, apir_encoder_used(&out));
    return r;
}

#define APIR_X_TEST_FWD(num, NAME, since, classes)                                                          \
    static inline uint32_t fwd_##NAME(struct apir_session *s APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)            \
                                          APIR_REP_##NAME(APIR_ITEM_PARAM_OUT))                             \
    {                                                                                                       \
        struct apir_encoder enc;                                                                            \
        apir_encoder_init(&enc, request_buf, sizeof(request_buf));                                          \
        apir_encode_request_##NAME(&enc APIR_REQ_##NAME(APIR_ITEM_ARG));                                    \
        struct apir_decoder reply;                                                                          \
        uint32_t r = fwd_raw(s, APIR_CMD_##NAME, request_buf, apir_encoder_used(&enc), &reply);             \
        apir_decode_reply_##NAME(&reply APIR_REP_##NAME(APIR_ITEM_ARG));                                    \
        return r;                                                                                           \
    }
APIR_COMMAND_LIST(APIR_X_TEST_FWD)
#undef APIR_X_TEST_FWD

/* The host these tests drive: the named backend of the pinned ggml, one
 * thread.  False (and a message) when it cannot start. */
static inline bool test_host_init_backend(struct apir_host *host, const char *backend)
{
    struct apir_host_config cfg;
    apir_host_config_default(&cfg);
    cfg.backend_name = backend;
    cfg.n_threads = 1;
    cfg.backend_dir = APIR_GGML_BIN;
    char err[256];
    if (apir_host_init(host, &cfg, err, sizeof(err)))
        return true;
    fprintf(stderr, "host init (%s): %s\n", backend, err);
    return false;
}

static inline bool test_host_init_cpu(struct apir_host *host)
{
    return test_host_init_backend(host, "CPU");
}

/* The CPU, or APIR_TEST_BACKEND (CUDA on a GPU machine: bench/h200.sh
 * check), for the tests whose checks hold on any backend. */
static inline bool test_host_init_env(struct apir_host *host)
{
    const char *b = getenv("APIR_TEST_BACKEND");
    return test_host_init_backend(host, b && *b ? b : "CPU");
}

/* A session of host speaking this build's APIR minor, with blob res_id
 * over [blob, blob + size) (the tests' shared memory). */
static inline struct apir_session *test_session_with_blob(struct apir_host *host, uint32_t res_id, void *blob,
                                                          size_t size)
{
    struct apir_session *s = apir_session_new(host, "test");
    if (s) {
        s->minor = APIR_VERSION_MINOR;
        apir_session_blob_add(s, res_id, blob, size, NULL, NULL);
    }
    return s;
}

static inline uint64_t alloc_buffer(struct apir_session *s, uint64_t size)
{
    uint64_t buft = 0, buf = 0;
    fwd_DEVICE_GET_BUFFER_TYPE(s, &buft);
    CHECK(fwd_BUFFER_TYPE_ALLOC_BUFFER(s, buft, size, &buf) == APIR_HANDLER_OK);
    return buf;
}

#endif
