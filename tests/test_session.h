/*
 * Driving a host session directly, as the dispatcher is driven by a guest:
 * one command marshalled from the command table's request signature, the
 * reply decoded from a reply area, and a buffer allocated on the session's
 * device.  Shared by the node-check and index-check unit tests.
 */
#ifndef APIR_TEST_SESSION_H
#define APIR_TEST_SESSION_H

#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_proto.h"
#include "session.h"
#include "test_util.h"

#include <stdarg.h>

static uint8_t reply_buf[APIR_REPLY_BLOB_SIZE];

static uint32_t fwd(struct apir_session *s, uint32_t cmd, struct apir_decoder *reply, ...)
{
    uint8_t req_buf[8192];
    struct apir_encoder enc;
    apir_encoder_init(&enc, req_buf, sizeof(req_buf));
    va_list ap;
    va_start(ap, reply);
    apir_vmarshal(&enc, apir_command_table[cmd].request, &ap);
    va_end(ap);
    struct apir_decoder req;
    apir_decoder_init(&req, req_buf, apir_encoder_used(&enc));
    struct apir_encoder out;
    apir_encoder_init(&out, reply_buf, sizeof(reply_buf));
    uint32_t r = apir_session_forward(s, cmd, &req, &out);
    apir_decoder_init(reply, reply_buf, apir_encoder_used(&out));
    return r;
}

static uint64_t alloc_buffer(struct apir_session *s, uint64_t size)
{
    struct apir_decoder r;
    uint64_t buft = 0, buf = 0;
    fwd(s, APIR_CMD_DEVICE_GET_BUFFER_TYPE, &r);
    apir_demarshal(&r, "h", &buft);
    CHECK(fwd(s, APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER, &r, buft, size) == APIR_HANDLER_OK);
    apir_demarshal(&r, "h", &buf);
    return buf;
}

#endif
