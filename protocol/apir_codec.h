/*
 * The APIR codec: the one place that turns items into bytes and back.
 *
 * Both directions work on a [cur, end) window.  Every item is a multiple of 4
 * bytes.  The first short read or write sets a sticky `fatal` flag: after it
 * every read yields zeros and every write is dropped, so a caller can decode a
 * whole message and check the flag once (the Venus decoder's rule), and no
 * path reads or writes past `end`.
 *
 * A decoder may point into memory the peer can still write (a shared blob).
 * It therefore reads every byte at most once, moving forward only, and hands
 * out copies; callers validate those copies, never re-read the source.
 */
#ifndef APIR_CODEC_H
#define APIR_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apir_tensor.h"

struct apir_encoder {
    uint8_t *start;
    uint8_t *cur;
    uint8_t *end;
    bool fatal;
};

struct apir_decoder {
    const uint8_t *start;
    const uint8_t *cur;
    const uint8_t *end;
    bool fatal;
};

void apir_encoder_init(struct apir_encoder *enc, void *buf, size_t size);
void apir_decoder_init(struct apir_decoder *dec, const void *buf, size_t size);

static inline size_t apir_encoder_used(const struct apir_encoder *enc) { return (size_t)(enc->cur - enc->start); }
static inline size_t apir_decoder_left(const struct apir_decoder *dec) { return (size_t)(dec->end - dec->cur); }
static inline size_t apir_decoder_used(const struct apir_decoder *dec) { return (size_t)(dec->cur - dec->start); }

/* Mark the message bad (an item decoded but was invalid). */
static inline void apir_decoder_set_fatal(struct apir_decoder *dec) { dec->fatal = true; }

/* Round up to the 4-byte item granularity; SIZE_MAX on overflow. */
size_t apir_pad4(size_t n);

/* Scalars. */
void apir_encode_u32(struct apir_encoder *enc, uint32_t v);
void apir_encode_u64(struct apir_encoder *enc, uint64_t v);
void apir_encode_bool(struct apir_encoder *enc, bool v);   /* 4 bytes */
void apir_encode_u8(struct apir_encoder *enc, uint8_t v);  /* 4 bytes */
uint32_t apir_decode_u32(struct apir_decoder *dec);
uint64_t apir_decode_u64(struct apir_decoder *dec);
bool     apir_decode_bool(struct apir_decoder *dec);       /* byte 0 must be 0 or 1 */
uint8_t  apir_decode_u8(struct apir_decoder *dec);

/* Raw bytes padded with zeros to a multiple of 4. */
void apir_encode_bytes(struct apir_encoder *enc, const void *src, size_t n);
void apir_decode_bytes(struct apir_decoder *dec, void *dst, size_t n);
/* Reserve n bytes (padded) in place; NULL (and fatal) when they do not fit. */
void *apir_encode_reserve(struct apir_encoder *enc, size_t n);
/* Skip n bytes (padded) and return where they start; NULL and fatal if short.
 * The bytes may be shared: read each once. */
const void *apir_decode_inplace(struct apir_decoder *dec, size_t n);

/* Strings: uint64 length including the NUL, the bytes, zero padding.
 * Decoding copies into dst[cap]; a length of 0, over cap or over
 * APIR_MAX_STRING, or a missing NUL, is fatal and leaves dst = "". */
void apir_encode_string(struct apir_encoder *enc, const char *s);
void apir_decode_string(struct apir_decoder *dec, char *dst, size_t cap);

/* Serialized tensors (section 4). */
void apir_encode_tensor(struct apir_encoder *enc, const struct apir_tensor_rec *rec);
void apir_decode_tensor(struct apir_decoder *dec, struct apir_tensor_rec *rec);

/* A digest (signature 'd', apir 0.4): a SHA-256, 32 raw bytes, no length.
 * Decoding a short one is fatal and leaves zeros. */
struct apir_digest {
    uint8_t b[32];
};
void apir_encode_digest(struct apir_encoder *enc, const struct apir_digest *d);
void apir_decode_digest(struct apir_decoder *dec, struct apir_digest *d);

/* Tensor list (signature 'L'): uint32 n then n records.  Decoding checks that
 * n is in 1..max and that all records are present, and returns the in-place
 * records; read record i with apir_tensor_list_get. */
struct apir_tensor_list {
    uint32_t count;
    const uint8_t *records;
};
void apir_encode_tensor_list(struct apir_encoder *enc, uint32_t n, const struct apir_tensor_rec *recs);
void apir_decode_tensor_list(struct apir_decoder *dec, struct apir_tensor_list *list, uint32_t max);
void apir_tensor_list_get(const struct apir_tensor_list *list, uint32_t i, struct apir_tensor_rec *rec);

/* The command header (12 bytes). */
struct apir_cmd_header {
    int32_t  cmd_type;
    int32_t  cmd_flags;
    uint32_t reply_res_id;
};
void apir_encode_header(struct apir_encoder *enc, const struct apir_cmd_header *hdr);
void apir_decode_header(struct apir_decoder *dec, struct apir_cmd_header *hdr);

#endif
