/*
 * The APIR codec.  See apir_codec.h for the rules; the short version: every
 * item is a multiple of 4 bytes, the first short read or write is sticky, and
 * nothing is read or written outside [start, end).
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_proto.h"

#include <stdalign.h>
#include <stddef.h>
#include <string.h>

/* The record is copied to the wire as-is: pin its layout to section 4. */
_Static_assert(sizeof(struct apir_tensor_rec) == APIR_TENSOR_REC_SIZE, "tensor record must be 304 bytes");
_Static_assert(offsetof(struct apir_tensor_rec, id) == 0, "id");
_Static_assert(offsetof(struct apir_tensor_rec, type) == 8, "type");
_Static_assert(offsetof(struct apir_tensor_rec, buffer) == 16, "buffer");
_Static_assert(offsetof(struct apir_tensor_rec, ne) == 24, "ne");
_Static_assert(offsetof(struct apir_tensor_rec, nb) == 40, "nb");
_Static_assert(offsetof(struct apir_tensor_rec, op) == 56, "op");
_Static_assert(offsetof(struct apir_tensor_rec, op_params) == 60, "op_params");
_Static_assert(offsetof(struct apir_tensor_rec, flags) == 124, "flags");
_Static_assert(offsetof(struct apir_tensor_rec, src) == 128, "src");
_Static_assert(offsetof(struct apir_tensor_rec, view_src) == 208, "view_src");
_Static_assert(offsetof(struct apir_tensor_rec, view_offs) == 216, "view_offs");
_Static_assert(offsetof(struct apir_tensor_rec, data) == 224, "data");
_Static_assert(offsetof(struct apir_tensor_rec, name) == 232, "name");
_Static_assert(offsetof(struct apir_tensor_rec, pad1) == 296, "pad1");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "APIR is little-endian on the wire; this codec copies records as-is"
#endif

const struct apir_command_info apir_command_table[APIR_CMD_COUNT] = {
#define APIR_X_INFO(num, name, since, classes) \
    [num] = { #name, "" APIR_REQ_##name(APIR_ITEM_SIG), "" APIR_REP_##name(APIR_ITEM_SIG), classes, since },
    APIR_COMMAND_LIST(APIR_X_INFO)
#undef APIR_X_INFO
};

const char *apir_command_name(uint32_t cmd)
{
    if (cmd < APIR_CMD_COUNT && apir_command_table[cmd].name)
        return apir_command_table[cmd].name;
    return "UNKNOWN";
}

void apir_encoder_init(struct apir_encoder *enc, void *buf, size_t size)
{
    enc->start = buf;
    enc->cur = buf;
    enc->end = (uint8_t *)buf + (buf ? size : 0);
    enc->fatal = false;
}

void apir_decoder_init(struct apir_decoder *dec, const void *buf, size_t size)
{
    dec->start = buf;
    dec->cur = buf;
    dec->end = (const uint8_t *)buf + (buf ? size : 0);
    dec->fatal = false;
}

size_t apir_pad4(size_t n)
{
    if (n > SIZE_MAX - 3)
        return SIZE_MAX;
    return (n + 3) & ~(size_t)3;
}

void *apir_encode_reserve(struct apir_encoder *enc, size_t n)
{
    size_t padded = apir_pad4(n);
    if (enc->fatal || padded == SIZE_MAX || padded > (size_t)(enc->end - enc->cur)) {
        enc->fatal = true;
        return NULL;
    }
    uint8_t *p = enc->cur;
    if (padded > n)
        memset(p + n, 0, padded - n);
    enc->cur += padded;
    return p;
}

const void *apir_decode_inplace(struct apir_decoder *dec, size_t n)
{
    size_t padded = apir_pad4(n);
    if (dec->fatal || padded == SIZE_MAX || padded > (size_t)(dec->end - dec->cur)) {
        dec->fatal = true;
        return NULL;
    }
    const uint8_t *p = dec->cur;
    dec->cur += padded;
    return p;
}

void apir_encode_bytes(struct apir_encoder *enc, const void *src, size_t n)
{
    void *p = apir_encode_reserve(enc, n);
    if (p && n)
        memcpy(p, src, n);
}

void apir_decode_bytes(struct apir_decoder *dec, void *dst, size_t n)
{
    const void *p = apir_decode_inplace(dec, n);
    if (!n)
        return;
    if (p)
        memcpy(dst, p, n);
    else
        memset(dst, 0, n);
}

void apir_encode_u32(struct apir_encoder *enc, uint32_t v) { apir_encode_bytes(enc, &v, 4); }
void apir_encode_u64(struct apir_encoder *enc, uint64_t v) { apir_encode_bytes(enc, &v, 8); }
void apir_encode_bool(struct apir_encoder *enc, bool v) { apir_encode_u32(enc, v ? 1u : 0u); }
void apir_encode_u8(struct apir_encoder *enc, uint8_t v) { apir_encode_u32(enc, v); }

uint32_t apir_decode_u32(struct apir_decoder *dec)
{
    uint32_t v;
    apir_decode_bytes(dec, &v, 4);
    return v;
}

uint64_t apir_decode_u64(struct apir_decoder *dec)
{
    uint64_t v;
    apir_decode_bytes(dec, &v, 8);
    return v;
}

/* Only the first byte carries the value (the rest is undefined in 0.1). */
bool apir_decode_bool(struct apir_decoder *dec)
{
    uint8_t b = (uint8_t)(apir_decode_u32(dec) & 0xff);
    if (b > 1) {
        dec->fatal = true;
        return false;
    }
    return b == 1;
}

uint8_t apir_decode_u8(struct apir_decoder *dec)
{
    return (uint8_t)(apir_decode_u32(dec) & 0xff);
}

void apir_encode_string(struct apir_encoder *enc, const char *s)
{
    size_t len = strlen(s) + 1;
    if (len > APIR_MAX_STRING) {
        enc->fatal = true;
        return;
    }
    apir_encode_u64(enc, len);
    apir_encode_bytes(enc, s, len);
}

void apir_decode_string(struct apir_decoder *dec, char *dst, size_t cap)
{
    if (cap)
        dst[0] = '\0';
    uint64_t len = apir_decode_u64(dec);
    if (dec->fatal || len == 0 || len > APIR_MAX_STRING || len > cap) {
        dec->fatal = true;
        return;
    }
    const char *p = apir_decode_inplace(dec, (size_t)len);
    if (!p)
        return;
    memcpy(dst, p, (size_t)len);
    /* Checked on the copy: the source may change under us. */
    if (dst[len - 1] != '\0') {
        dst[0] = '\0';
        dec->fatal = true;
    }
}

void apir_encode_tensor(struct apir_encoder *enc, const struct apir_tensor_rec *rec)
{
    apir_encode_bytes(enc, rec, sizeof(*rec));
}

void apir_decode_tensor(struct apir_decoder *dec, struct apir_tensor_rec *rec)
{
    apir_decode_bytes(dec, rec, sizeof(*rec));
}

_Static_assert(sizeof(struct apir_digest) == 32, "a digest is 32 bytes on the wire");

void apir_encode_digest(struct apir_encoder *enc, const struct apir_digest *d)
{
    apir_encode_bytes(enc, d, sizeof(*d));
}

void apir_decode_digest(struct apir_decoder *dec, struct apir_digest *d)
{
    apir_decode_bytes(dec, d, sizeof(*d));
}

void apir_encode_tensor_list(struct apir_encoder *enc, uint32_t n, const struct apir_tensor_rec *recs)
{
    apir_encode_u32(enc, n);
    for (uint32_t i = 0; i < n; i++)
        apir_encode_tensor(enc, &recs[i]);
}

void apir_decode_tensor_list(struct apir_decoder *dec, struct apir_tensor_list *list, uint32_t max)
{
    list->count = 0;
    list->records = NULL;
    uint32_t n = apir_decode_u32(dec);
    if (dec->fatal || n == 0 || n > max) {
        dec->fatal = true;
        return;
    }
    const void *p = apir_decode_inplace(dec, (size_t)n * APIR_TENSOR_REC_SIZE);
    if (!p)
        return;
    list->count = n;
    list->records = p;
}

void apir_tensor_list_get(const struct apir_tensor_list *list, uint32_t i, struct apir_tensor_rec *rec)
{
    if (i >= list->count) {
        memset(rec, 0, sizeof(*rec));
        return;
    }
    memcpy(rec, list->records + (size_t)i * APIR_TENSOR_REC_SIZE, sizeof(*rec));
}

void apir_encode_header(struct apir_encoder *enc, const struct apir_cmd_header *hdr)
{
    apir_encode_u32(enc, (uint32_t)hdr->cmd_type);
    apir_encode_u32(enc, (uint32_t)hdr->cmd_flags);
    apir_encode_u32(enc, hdr->reply_res_id);
}

void apir_decode_header(struct apir_decoder *dec, struct apir_cmd_header *hdr)
{
    hdr->cmd_type = (int32_t)apir_decode_u32(dec);
    hdr->cmd_flags = (int32_t)apir_decode_u32(dec);
    hdr->reply_res_id = apir_decode_u32(dec);
}
