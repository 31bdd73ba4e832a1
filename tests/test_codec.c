/*
 * Unit tests of the APIR codec (protocol/apir_codec.c) and the command table.
 *
 * Links apir_protocol only.  What is pinned here:
 *   - every item round-trips and occupies a multiple of 4 bytes (APIR 0.1
 *     section 1), with the exact sizes the spec gives;
 *   - the decoder's refusals (bool > 1, bad strings, bad tensor lists) are
 *     fatal, and after a fatal every read yields zeros;
 *   - the encoder never writes past its end;
 *   - for every row of apir_command_table, the typed encoders
 *     (apir_messages.h) write exactly what the row's signature string
 *     says, and every truncation of a valid request or reply fails
 *     cleanly - walked by its letters and, for a reply, through its typed
 *     decoder - with the message placed against a PROT_NONE page so that
 *     a read past the end faults instead of passing silently;
 *   - command numbers and names are those of the spec's section 3, the
 *     signature strings are the letters of each row's items, and the class
 *     columns say what apir_commands.h says they do.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "test_util.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------- */

static bool all_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void fill_rec(struct apir_tensor_rec *r, uint64_t seed)
{
    /* memset first: the record is copied with its padding, and memcmp below
     * compares all 304 bytes. */
    memset(r, 0, sizeof(*r));
    r->id = 0x1000 + seed;
    r->type = (uint32_t)(seed % 30);
    r->pad0 = 0;
    r->buffer = 0x0200000000000000ull | (seed * 0x10001);
    for (int i = 0; i < APIR_TENSOR_MAX_DIMS; i++) {
        r->ne[i] = (uint32_t)(seed + (uint64_t)i + 1);
        r->nb[i] = (uint32_t)(4u << i);
    }
    r->op = (uint32_t)(seed % 90);
    for (int i = 0; i < APIR_TENSOR_MAX_OP_PARAMS; i++)
        r->op_params[i] = (int32_t)(seed * 31) - i * 7;
    r->flags = (int32_t)(seed & 3);
    for (int i = 0; i < APIR_TENSOR_MAX_SRC; i++)
        r->src[i] = seed * 100 + (uint64_t)i;
    r->view_src = seed * 7 + 1;
    r->view_offs = seed * 64;
    r->data = seed * 4096 + 128;
    snprintf(r->name, sizeof(r->name), "tensor-%llu", (unsigned long long)seed);
}

/* Memory whose usable part ends right before a PROT_NONE page: an access at
 * or past `end` faults. */
struct guarded {
    uint8_t *map;
    size_t map_len;
    uint8_t *end;
};

static bool guard_init(struct guarded *g, size_t max_len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t usable = (max_len + page - 1) / page * page;
    if (usable == 0)
        usable = page;
    g->map_len = usable + page;
    void *p = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    g->map = p;
    g->end = g->map + usable;
    return mprotect(g->end, page, PROT_NONE) == 0;
}

static void guard_free(struct guarded *g)
{
    munmap(g->map, g->map_len);
}

/* What is being checked against a guard page, for the fault handler: a
 * fault there means the codec touched memory past a message's end. */
static char fault_context[160] = "(no guarded check running)";

static void on_fault(int sig)
{
    static const char head[] = "FATAL: fault past the end of a message (guard page) while checking: ";
    ssize_t r = write(2, head, sizeof(head) - 1);
    r = write(2, fault_context, strnlen(fault_context, sizeof(fault_context)));
    r = write(2, "\n", 1);
    (void)r;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_fault_handler(void)
{
    signal(SIGSEGV, on_fault);
    signal(SIGBUS, on_fault);
}

/* Copies src[0..len) so that it ends exactly at the guard page. */
static const uint8_t *guard_place(struct guarded *g, const void *src, size_t len)
{
    uint8_t *p = g->end - len;
    if (len)
        memcpy(p, src, len);
    return p;
}

/* ---- items ----------------------------------------------------------------- */

static void test_scalars_roundtrip(void)
{
    uint8_t buf[64];
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_u32(&enc, 0xdeadbeefu);
    CHECK(apir_encoder_used(&enc) == 4);
    apir_encode_u64(&enc, 0x0123456789abcdefull);
    CHECK(apir_encoder_used(&enc) == 12);
    apir_encode_bool(&enc, true);
    CHECK(apir_encoder_used(&enc) == 16);
    apir_encode_bool(&enc, false);
    CHECK(apir_encoder_used(&enc) == 20);
    apir_encode_u8(&enc, 0xab);
    CHECK(apir_encoder_used(&enc) == 24);
    apir_encode_u32(&enc, 0);
    apir_encode_u64(&enc, UINT64_MAX);
    CHECK(apir_encoder_used(&enc) == 36);
    CHECK(!enc.fatal);

    /* Little-endian on the wire, value of a bool/uint8 in the first byte. */
    CHECK(buf[0] == 0xef && buf[3] == 0xde);
    CHECK(buf[4] == 0xef && buf[11] == 0x01);
    CHECK(buf[12] == 1 && buf[16] == 0 && buf[20] == 0xab);

    struct apir_decoder dec;
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    CHECK(apir_decode_u32(&dec) == 0xdeadbeefu);
    CHECK(apir_decode_u64(&dec) == 0x0123456789abcdefull);
    CHECK(apir_decode_bool(&dec) == true);
    CHECK(apir_decode_bool(&dec) == false);
    CHECK(apir_decode_u8(&dec) == 0xab);
    CHECK(apir_decode_u32(&dec) == 0);
    CHECK(apir_decode_u64(&dec) == UINT64_MAX);
    CHECK(!dec.fatal);
    CHECK(apir_decoder_left(&dec) == 0);
    CHECK(apir_decoder_used(&dec) == 36);
}

static void test_bool_and_u8_rules(void)
{
    /* The rest of a bool's 4 bytes is undefined in 0.1: only byte 0 counts. */
    uint8_t t1[4] = { 1, 0xff, 0xff, 0xff };
    struct apir_decoder dec;
    apir_decoder_init(&dec, t1, 4);
    CHECK(apir_decode_bool(&dec) == true && !dec.fatal);

    /* A bool byte > 1 is fatal, and the value read is false. */
    for (unsigned v = 2; v < 256; v += 37) {
        uint8_t b[8] = { (uint8_t)v, 0, 0, 0, 7, 0, 0, 0 };
        apir_decoder_init(&dec, b, sizeof(b));
        CHECK(apir_decode_bool(&dec) == false);
        CHECK(dec.fatal);
        CHECK(apir_decode_u32(&dec) == 0);  /* sticky */
    }
    uint8_t b255[4] = { 0xff, 0, 0, 0 };
    apir_decoder_init(&dec, b255, 4);
    CHECK(apir_decode_bool(&dec) == false && dec.fatal);

    /* uint8: first byte, the rest ignored. */
    uint8_t c[4] = { 0x7f, 0x11, 0x22, 0x33 };
    apir_decoder_init(&dec, c, 4);
    CHECK(apir_decode_u8(&dec) == 0x7f && !dec.fatal);
}

static void test_bytes_padding(void)
{
    for (size_t n = 0; n <= 13; n++) {
        uint8_t src[16], out[16], buf[32];
        for (size_t i = 0; i < sizeof(src); i++)
            src[i] = (uint8_t)(0xa0 + i);
        memset(buf, 0xee, sizeof(buf));
        struct apir_encoder enc;
        apir_encoder_init(&enc, buf, sizeof(buf));
        apir_encode_bytes(&enc, src, n);
        size_t padded = (n + 3) & ~(size_t)3;
        CHECK(apir_encoder_used(&enc) == padded);
        CHECK(apir_pad4(n) == padded);
        CHECK(memcmp(buf, src, n) == 0);
        /* Padding is zeros, and nothing past it is touched. */
        CHECK(all_zero(buf + n, padded - n));
        CHECK(buf[padded] == 0xee);

        struct apir_decoder dec;
        apir_decoder_init(&dec, buf, padded);
        memset(out, 0xee, sizeof(out));
        apir_decode_bytes(&dec, out, n);
        CHECK(!dec.fatal && apir_decoder_left(&dec) == 0);
        CHECK(memcmp(out, src, n) == 0);
        CHECK(out[n] == 0xee);
    }
    /* Sizes that would wrap when padded are refused, not wrapped. */
    CHECK(apir_pad4(SIZE_MAX) == SIZE_MAX);
    CHECK(apir_pad4(SIZE_MAX - 2) == SIZE_MAX);
    CHECK(apir_pad4(SIZE_MAX - 3) == SIZE_MAX - 3);
    uint8_t buf[16] = { 0 };
    struct apir_decoder dec;
    apir_decoder_init(&dec, buf, sizeof(buf));
    CHECK(apir_decode_inplace(&dec, SIZE_MAX - 1) == NULL && dec.fatal);
    apir_decoder_init(&dec, buf, sizeof(buf));
    CHECK(apir_decode_inplace(&dec, SIZE_MAX) == NULL && dec.fatal);
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    CHECK(apir_encode_reserve(&enc, SIZE_MAX - 1) == NULL && enc.fatal);
    CHECK(apir_encoder_used(&enc) == 0);
}

static void test_strings_roundtrip(void)
{
    static const char *const samples[] = { "", "a", "ab", "abc", "abcd", "abcdefg", "CPU", "device-0 name" };
    for (size_t k = 0; k < sizeof(samples) / sizeof(samples[0]); k++) {
        const char *s = samples[k];
        uint8_t buf[64];
        memset(buf, 0xee, sizeof(buf));
        struct apir_encoder enc;
        apir_encoder_init(&enc, buf, sizeof(buf));
        apir_encode_string(&enc, s);
        size_t len = strlen(s) + 1;
        /* uint64 length including the NUL, the bytes, zeros up to 4. */
        CHECK(apir_encoder_used(&enc) == 8 + ((len + 3) & ~(size_t)3));
        uint64_t wire_len;
        memcpy(&wire_len, buf, 8);
        CHECK(wire_len == len);
        CHECK(all_zero(buf + 8 + len - 1, apir_encoder_used(&enc) - 8 - (len - 1)));

        char out[32];
        memset(out, 'x', sizeof(out));
        struct apir_decoder dec;
        apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
        apir_decode_string(&dec, out, sizeof(out));
        CHECK(!dec.fatal && apir_decoder_left(&dec) == 0);
        CHECK(strcmp(out, s) == 0);
    }
    /* The empty string encodes length 1 (just the NUL), 12 bytes in all. */
    uint8_t buf[16];
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_string(&enc, "");
    uint64_t len;
    memcpy(&len, buf, 8);
    CHECK(len == 1 && apir_encoder_used(&enc) == 12);

    /* Exactly cap (NUL included) fits. */
    char out4[4];
    struct apir_decoder dec;
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_string(&enc, "abc");
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    apir_decode_string(&dec, out4, sizeof(out4));
    CHECK(!dec.fatal && strcmp(out4, "abc") == 0);

    /* The longest string allowed: APIR_MAX_STRING bytes with the NUL. */
    static char big[APIR_MAX_STRING + 1];
    static uint8_t bigbuf[APIR_MAX_STRING + 64];
    static char bigout[APIR_MAX_STRING + 8];
    memset(big, 'z', APIR_MAX_STRING - 1);
    big[APIR_MAX_STRING - 1] = '\0';
    apir_encoder_init(&enc, bigbuf, sizeof(bigbuf));
    apir_encode_string(&enc, big);
    CHECK(!enc.fatal && apir_encoder_used(&enc) == 8 + APIR_MAX_STRING);
    apir_decoder_init(&dec, bigbuf, apir_encoder_used(&enc));
    apir_decode_string(&dec, bigout, sizeof(bigout));
    CHECK(!dec.fatal && strcmp(bigout, big) == 0);
    /* One more byte is over the limit: the encoder refuses it. */
    memset(big, 'z', APIR_MAX_STRING);
    big[APIR_MAX_STRING] = '\0';
    apir_encoder_init(&enc, bigbuf, sizeof(bigbuf));
    apir_encode_string(&enc, big);
    CHECK(enc.fatal);
}

/* Decodes raw bytes as a string into a dirty dst; returns whether it was
 * fatal, and checks that a refusal leaves dst == "". */
static bool string_refused(const void *bytes, size_t n, size_t cap)
{
    static char dst[APIR_MAX_STRING + 64];
    memset(dst, 'x', sizeof(dst));
    struct apir_decoder dec;
    apir_decoder_init(&dec, bytes, n);
    apir_decode_string(&dec, dst, cap);
    if (dec.fatal) {
        CHECK(dst[0] == '\0');
        /* Everything after a refusal reads as zero. */
        CHECK(apir_decode_u32(&dec) == 0);
    }
    return dec.fatal;
}

static void test_string_errors(void)
{
    static uint8_t buf[APIR_MAX_STRING * 2 + 64];
    uint64_t len;

    /* Length 0 (there must be at least the NUL). */
    memset(buf, 0, sizeof(buf));
    len = 0;
    memcpy(buf, &len, 8);
    CHECK(string_refused(buf, 16, 64));

    /* Longer than the caller's cap. */
    len = 6;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, "hello", 6);
    CHECK(string_refused(buf, 16, 5));
    CHECK(!string_refused(buf, 16, 6));

    /* Longer than APIR_MAX_STRING, even with a cap that would hold it. */
    memset(buf, 'y', sizeof(buf));
    len = APIR_MAX_STRING + 1;
    memcpy(buf, &len, 8);
    buf[8 + APIR_MAX_STRING] = '\0';
    CHECK(string_refused(buf, 8 + APIR_MAX_STRING + 4, APIR_MAX_STRING + 64));
    len = 1ull << 63;
    memcpy(buf, &len, 8);
    CHECK(string_refused(buf, sizeof(buf), APIR_MAX_STRING + 64));
    len = UINT64_MAX;
    memcpy(buf, &len, 8);
    CHECK(string_refused(buf, sizeof(buf), APIR_MAX_STRING + 64));

    /* No NUL at position len - 1. */
    memset(buf, 0, sizeof(buf));
    len = 4;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, "abcd", 4);
    CHECK(string_refused(buf, 12, 64));
    /* A NUL earlier but not last is still refused (len counts the NUL). */
    memcpy(buf + 8, "ab\0d", 4);
    CHECK(string_refused(buf, 12, 64));

    /* Payload shorter than its length. */
    len = 9;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, "abcdefgh", 9);
    CHECK(string_refused(buf, 8 + 8, 64));
    CHECK(!string_refused(buf, 8 + 12, 64));

    /* Length itself truncated. */
    CHECK(string_refused(buf, 4, 64));
    CHECK(string_refused(buf, 0, 64));
}

static void test_tensor_and_list(void)
{
    struct apir_tensor_rec recs[3], out;
    for (int i = 0; i < 3; i++)
        fill_rec(&recs[i], (uint64_t)i + 5);

    static uint8_t buf[4096];
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_tensor(&enc, &recs[0]);
    CHECK(apir_encoder_used(&enc) == APIR_TENSOR_REC_SIZE);
    /* The record is the section 4 layout byte for byte. */
    uint64_t id;
    memcpy(&id, buf, 8);
    CHECK(id == recs[0].id);
    CHECK(memcmp(buf + 232, recs[0].name, 64) == 0);
    struct apir_decoder dec;
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    memset(&out, 0xee, sizeof(out));
    apir_decode_tensor(&dec, &out);
    CHECK(!dec.fatal && memcmp(&out, &recs[0], sizeof(out)) == 0);

    for (uint32_t n = 1; n <= 3; n++) {
        apir_encoder_init(&enc, buf, sizeof(buf));
        apir_encode_tensor_list(&enc, n, recs);
        CHECK(apir_encoder_used(&enc) == 4 + (size_t)n * APIR_TENSOR_REC_SIZE);
        struct apir_tensor_list list;
        apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
        apir_decode_tensor_list(&dec, &list, 3);
        CHECK(!dec.fatal && list.count == n && list.records == buf + 4);
        for (uint32_t i = 0; i < n; i++) {
            apir_tensor_list_get(&list, i, &out);
            CHECK(memcmp(&out, &recs[i], sizeof(out)) == 0);
        }
        /* Reading past the list yields a zero record, not stray memory. */
        memset(&out, 0xee, sizeof(out));
        apir_tensor_list_get(&list, n, &out);
        CHECK(all_zero(&out, sizeof(out)));
    }

    /* A digest (apir 0.4): 32 raw bytes, no length, no padding; a short one
     * is fatal and reads as zeros. */
    struct apir_digest dg, dg_out;
    for (int i = 0; i < 32; i++)
        dg.b[i] = (uint8_t)(0xa0 + i);
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_digest(&enc, &dg);
    CHECK(!enc.fatal && apir_encoder_used(&enc) == 32 && memcmp(buf, dg.b, 32) == 0);
    apir_decoder_init(&dec, buf, 32);
    memset(&dg_out, 0xee, sizeof(dg_out));
    apir_decode_digest(&dec, &dg_out);
    CHECK(!dec.fatal && apir_decoder_left(&dec) == 0 && memcmp(&dg_out, &dg, 32) == 0);
    apir_decoder_init(&dec, buf, 31);
    memset(&dg_out, 0xee, sizeof(dg_out));
    apir_decode_digest(&dec, &dg_out);
    CHECK(dec.fatal && all_zero(&dg_out, sizeof(dg_out)));
    apir_encoder_init(&enc, buf, 28);
    apir_encode_digest(&enc, &dg);
    CHECK(enc.fatal && apir_encoder_used(&enc) == 0);

    /* n == 0, n > max, and records missing are fatal with an empty list. */
    struct apir_tensor_list list;
    uint32_t zero = 0;
    apir_decoder_init(&dec, &zero, 4);
    apir_decode_tensor_list(&dec, &list, 3);
    CHECK(dec.fatal && list.count == 0 && list.records == NULL);

    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_tensor_list(&enc, 3, recs);
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    apir_decode_tensor_list(&dec, &list, 2);
    CHECK(dec.fatal && list.count == 0 && list.records == NULL);

    apir_decoder_init(&dec, buf, apir_encoder_used(&enc) - 4);
    apir_decode_tensor_list(&dec, &list, 3);
    CHECK(dec.fatal && list.count == 0 && list.records == NULL);

    /* A count whose byte size would overflow 32 bits must not wrap. */
    uint32_t huge = UINT32_MAX;
    apir_decoder_init(&dec, &huge, 4);
    apir_decode_tensor_list(&dec, &list, UINT32_MAX);
    CHECK(dec.fatal && list.count == 0 && list.records == NULL);
}

static void test_header(void)
{
    struct apir_cmd_header in = { .cmd_type = APIR_CMD_TYPE_FORWARD, .cmd_flags = 22, .reply_res_id = 0x11223344u };
    struct apir_cmd_header neg = { .cmd_type = -5, .cmd_flags = INT32_MIN, .reply_res_id = UINT32_MAX };
    uint8_t buf[32];
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_header(&enc, &in);
    CHECK(apir_encoder_used(&enc) == APIR_CMD_HEADER_SIZE);
    apir_encode_header(&enc, &neg);
    CHECK(apir_encoder_used(&enc) == 2 * APIR_CMD_HEADER_SIZE);

    struct apir_cmd_header out;
    struct apir_decoder dec;
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    apir_decode_header(&dec, &out);
    CHECK(out.cmd_type == in.cmd_type && out.cmd_flags == in.cmd_flags && out.reply_res_id == in.reply_res_id);
    apir_decode_header(&dec, &out);
    CHECK(out.cmd_type == neg.cmd_type && out.cmd_flags == neg.cmd_flags && out.reply_res_id == neg.reply_res_id);
    CHECK(!dec.fatal);

    /* A short header is fatal and reads as zeros. */
    apir_decoder_init(&dec, buf, APIR_CMD_HEADER_SIZE - 4);
    apir_decode_header(&dec, &out);
    CHECK(dec.fatal && out.reply_res_id == 0);
}

/* After the first failure every read yields zero, even where bytes remain. */
static void test_sticky_fatal_reads(void)
{
    uint8_t buf[1024];
    memset(buf, 0xa5, sizeof(buf));
    uint64_t len = 5;
    memcpy(buf + 8, &len, 8);
    memcpy(buf + 16, "abcd", 5);

    struct apir_decoder dec;
    apir_decoder_init(&dec, buf, sizeof(buf));
    apir_decoder_set_fatal(&dec);
    CHECK(apir_decode_u32(&dec) == 0);
    CHECK(apir_decode_u64(&dec) == 0);
    CHECK(apir_decode_bool(&dec) == false);
    CHECK(apir_decode_u8(&dec) == 0);
    uint8_t bytes[12];
    memset(bytes, 0xee, sizeof(bytes));
    apir_decode_bytes(&dec, bytes, sizeof(bytes));
    CHECK(all_zero(bytes, sizeof(bytes)));
    CHECK(apir_decode_inplace(&dec, 4) == NULL);
    char s[16] = "dirty";
    apir_decode_string(&dec, s, sizeof(s));
    CHECK(s[0] == '\0');
    struct apir_tensor_rec rec;
    memset(&rec, 0xee, sizeof(rec));
    apir_decode_tensor(&dec, &rec);
    CHECK(all_zero(&rec, sizeof(rec)));
    struct apir_tensor_list list = { 7, buf };
    apir_decode_tensor_list(&dec, &list, 8);
    CHECK(list.count == 0 && list.records == NULL);
    struct apir_cmd_header hdr = { 1, 2, 3 };
    apir_decode_header(&dec, &hdr);
    CHECK(hdr.cmd_type == 0 && hdr.cmd_flags == 0 && hdr.reply_res_id == 0);
    /* A fatal decoder does not move. */
    CHECK(apir_decoder_used(&dec) == 0);

    /* A short read makes it fatal the same way. */
    apir_decoder_init(&dec, buf, 6);
    CHECK(apir_decode_u32(&dec) == 0xa5a5a5a5u);
    CHECK(apir_decode_u32(&dec) == 0 && dec.fatal);
    CHECK(apir_decoder_used(&dec) == 4);

    /* A NULL buffer is an empty one. */
    apir_decoder_init(&dec, NULL, 100);
    CHECK(apir_decode_u32(&dec) == 0 && dec.fatal);

    /* Typed reply decoders after fatal: false, and every output zeroed. */
    apir_decoder_init(&dec, buf, sizeof(buf));
    apir_decoder_set_fatal(&dec);
    uint32_t u = 1;
    uint64_t q0 = 1, q1 = 1;
    int32_t i = -1;
    bool b[5] = { true, true, true, true, true };
    static struct apir_string str;
    memset(&str, 'x', sizeof(str));
    CHECK(!apir_decode_reply_BUFFER_NOTE_WEIGHT(&dec, &u) && u == 0);
    CHECK(!apir_decode_reply_DEVICE_GET_MEMORY(&dec, &q0, &q1) && q0 == 0 && q1 == 0);
    CHECK(!apir_decode_reply_DEVICE_GET_COUNT(&dec, &i) && i == 0);
    CHECK(!apir_decode_reply_DEVICE_GET_PROPS(&dec, &b[0], &b[1], &b[2], &b[3], &b[4]));
    CHECK(!b[0] && !b[1] && !b[2] && !b[3] && !b[4]);
    CHECK(!apir_decode_reply_DEVICE_GET_NAME(&dec, &str) && str.s[0] == '\0');
    /* A reply without items fails on a fatal decoder too, and not on an
     * empty one. */
    CHECK(!apir_decode_reply_BUFFER_SET_TENSOR(&dec));
    apir_decoder_init(&dec, buf, 0);
    CHECK(apir_decode_reply_BUFFER_SET_TENSOR(&dec) && !dec.fatal);
}

static void test_writes_past_end(void)
{
    uint8_t buf[32];

    /* A u64 that does not fit: fatal, nothing written. */
    memset(buf, 0xcc, sizeof(buf));
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, 12);
    apir_encode_u64(&enc, 0x1111111111111111ull);
    CHECK(!enc.fatal && apir_encoder_used(&enc) == 8);
    apir_encode_u64(&enc, 0x2222222222222222ull);
    CHECK(enc.fatal && apir_encoder_used(&enc) == 8);
    /* Sticky: a u32 would fit in the 4 bytes left, but is dropped. */
    apir_encode_u32(&enc, 0x33333333u);
    CHECK(apir_encoder_used(&enc) == 8);
    for (size_t i = 8; i < sizeof(buf); i++)
        CHECK(buf[i] == 0xcc);

    /* Bytes whose padding would cross the end are refused whole. */
    memset(buf, 0xcc, sizeof(buf));
    apir_encoder_init(&enc, buf, 7);
    apir_encode_bytes(&enc, "abcde", 5);
    CHECK(enc.fatal && apir_encoder_used(&enc) == 0);
    CHECK(buf[0] == 0xcc && buf[7] == 0xcc);

    /* A string whose length fits but whose bytes do not. */
    memset(buf, 0xcc, sizeof(buf));
    apir_encoder_init(&enc, buf, 12);
    apir_encode_string(&enc, "abcdef");
    CHECK(enc.fatal);
    for (size_t i = 8; i < sizeof(buf); i++)
        CHECK(buf[i] == 0xcc);

    /* Reserve past the end. */
    apir_encoder_init(&enc, buf, 8);
    CHECK(apir_encode_reserve(&enc, 9) == NULL && enc.fatal);

    /* A NULL buffer takes nothing. */
    apir_encoder_init(&enc, NULL, 64);
    apir_encode_u32(&enc, 1);
    CHECK(enc.fatal);

    /* Against a guard page: every item kind, every room size. */
    install_fault_handler();
    struct guarded g;
    CHECK(guard_init(&g, 4096));
    struct apir_tensor_rec rec;
    fill_rec(&rec, 3);
    for (size_t room = 0; room < 2 * APIR_TENSOR_REC_SIZE + 24; room++) {
        snprintf(fault_context, sizeof(fault_context), "item encoders into a room of %zu bytes", room);
        apir_encoder_init(&enc, g.end - room, room);
        apir_encode_u32(&enc, 1);
        apir_encode_u8(&enc, 2);
        apir_encode_bool(&enc, true);
        apir_encode_u64(&enc, 3);
        apir_encode_string(&enc, "abcde");
        apir_encode_tensor(&enc, &rec);
        apir_encode_tensor_list(&enc, 1, &rec);
        CHECK(apir_encoder_used(&enc) <= room);
    }
    guard_free(&g);

    /* An inline tensor ('T') is its raw bytes, padded; a typed encoder
     * that does not fit writes nothing past its room. */
    memset(buf, 0xcc, sizeof(buf));
    apir_encoder_init(&enc, buf, sizeof(buf));
    apir_encode_request_DEVICE_SUPPORTS_OP(&enc, (struct apir_bytes){ "abcde", 5 });
    CHECK(!enc.fatal && apir_encoder_used(&enc) == 8);
    CHECK(memcmp(buf, "abcde", 5) == 0 && all_zero(buf + 5, 3) && buf[8] == 0xcc);
    memset(buf, 0xcc, sizeof(buf));
    apir_encoder_init(&enc, buf, 12);
    apir_encode_request_BUFFER_TYPE_ALLOC_BUFFER(&enc, 0x1111111111111111ull, 0x2222222222222222ull);
    CHECK(enc.fatal && apir_encoder_used(&enc) == 8);
    for (size_t i = 8; i < sizeof(buf); i++)
        CHECK(buf[i] == 0xcc);
}

/* ---- the command table ------------------------------------------------------- */

/* APIR 0.1 section 3, numbers 0..22, with the signatures the table must have. */
static const struct {
    const char *name, *request, *reply;
} spec_commands[23] = {
    { "DEVICE_GET_DEVICE_COUNT", "", "i" },     { "DEVICE_GET_COUNT", "", "i" },
    { "DEVICE_GET_NAME", "", "s" },             { "DEVICE_GET_DESCRIPTION", "", "s" },
    { "DEVICE_GET_TYPE", "", "e" },             { "DEVICE_GET_MEMORY", "", "qq" },
    { "DEVICE_SUPPORTS_OP", "T", "b" },         { "DEVICE_GET_BUFFER_TYPE", "", "h" },
    { "DEVICE_GET_PROPS", "", "bbbbb" },         { "DEVICE_BUFFER_FROM_PTR", "rqq", "hh" },
    { "BUFFER_TYPE_GET_NAME", "h", "s" },       { "BUFFER_TYPE_GET_ALIGNMENT", "h", "q" },
    { "BUFFER_TYPE_GET_MAX_SIZE", "h", "q" },   { "BUFFER_TYPE_IS_HOST", "h", "b" },
    { "BUFFER_TYPE_ALLOC_BUFFER", "hq", "h" },  { "BUFFER_TYPE_GET_ALLOC_SIZE", "hT", "q" },
    { "BUFFER_GET_BASE", "h", "q" },            { "BUFFER_SET_TENSOR", "htrqq", "" },
    { "BUFFER_GET_TENSOR", "htrqq", "" },       { "BUFFER_CPY_TENSOR", "htt", "b" },
    { "BUFFER_CLEAR", "hc", "" },               { "BUFFER_FREE_BUFFER", "h", "" },
    { "BACKEND_GRAPH_COMPUTE", "rq", "e" },
};

static void test_command_table_spec(void)
{
    CHECK(APIR_CMD_COUNT_0_1 == 23);
    CHECK(APIR_CMD_COUNT >= APIR_CMD_COUNT_0_1);
    CHECK(APIR_CMD_DEVICE_GET_DEVICE_COUNT == 0);
    CHECK(APIR_CMD_BACKEND_GRAPH_COMPUTE == 22);
    for (uint32_t i = 0; i < 23; i++) {
        const struct apir_command_info *c = &apir_command_table[i];
        CHECK_MSG(c->name && strcmp(c->name, spec_commands[i].name) == 0, "command %u is %s, spec says %s", i,
                  c->name ? c->name : "(none)", spec_commands[i].name);
        CHECK_MSG(c->request && strcmp(c->request, spec_commands[i].request) == 0, "command %u request '%s', spec '%s'",
                  i, c->request ? c->request : "(null)", spec_commands[i].request);
        CHECK_MSG(c->reply && strcmp(c->reply, spec_commands[i].reply) == 0, "command %u reply '%s', spec '%s'", i,
                  c->reply ? c->reply : "(null)", spec_commands[i].reply);
        CHECK(strcmp(apir_command_name(i), spec_commands[i].name) == 0);
    }
    CHECK(strcmp(apir_command_name(APIR_CMD_COUNT), "UNKNOWN") == 0);
    CHECK(strcmp(apir_command_name(UINT32_MAX), "UNKNOWN") == 0);
}

static void test_command_table_extensions(void)
{
    /* 0.2 commands: numbered from 23 with no gap, every row complete, names
     * unique over the whole table, signatures made of known letters. */
    for (uint32_t i = 0; i < APIR_CMD_COUNT; i++) {
        const struct apir_command_info *c = &apir_command_table[i];
        CHECK_MSG(c->name && c->request && c->reply, "command %u: gap in the table", i);
        if (!c->name || !c->request || !c->reply)
            continue;
        for (uint32_t j = 0; j < i; j++)
            CHECK_MSG(!apir_command_table[j].name || strcmp(apir_command_table[j].name, c->name) != 0,
                      "commands %u and %u are both %s", j, i, c->name);
        for (const char *p = c->request; *p; p++)
            CHECK_MSG(strchr("uiercbqhstLTd", *p) != NULL, "%s: request letter '%c'", c->name, *p);
        for (const char *p = c->reply; *p; p++)
            CHECK_MSG(strchr("uiercbqhstLd", *p) != NULL, "%s: reply letter '%c'", c->name, *p);
        CHECK(strcmp(apir_command_name(i), c->name) == 0);
    }
    CHECK(APIR_CMD_DEVICE_SELECT == APIR_CMD_COUNT_0_1);
    /* The since column: every command of the reference at 1, then minors
     * that never go down along the numbers (a new command takes a new
     * number), none above the minor we speak. */
    for (uint32_t i = 0; i < APIR_CMD_COUNT; i++) {
        CHECK_MSG(apir_command_since(i) >= 1 && apir_command_since(i) <= APIR_VERSION_MINOR, "command %u: since %u", i,
                  apir_command_since(i));
        if (i > 0)
            CHECK_MSG(apir_command_since(i) >= apir_command_since(i - 1), "command %u: since %u below command %u's", i,
                      apir_command_since(i), i - 1);
        CHECK(i >= APIR_CMD_COUNT_0_1 || apir_command_since(i) == 1);
        CHECK(apir_minor_speaks(apir_command_since(i), i) && !apir_minor_speaks(apir_command_since(i) - 1, i));
    }
    CHECK(apir_command_since(APIR_CMD_BACKEND_GRAPH_COMPUTE) == 1 && apir_command_since(APIR_CMD_DEVICE_SELECT) == 2 &&
          apir_command_since(APIR_CMD_BACKEND_GRAPH_RECOMPUTE) == 2 && apir_command_since(APIR_CMD_BUFFER_NOTE_WEIGHT) == 3 &&
          apir_command_since(APIR_CMD_BUFFER_WRITTEN) == 3 && apir_command_since(APIR_CMD_HOST_GET_VERSION) == 3 &&
          apir_command_since(APIR_CMD_BUFFER_SET_TENSOR_HASH) == 4 && apir_command_since(APIR_CMD_BUFFER_CACHE_TENSOR) == 4);
    /* 0.5 added no command: the next one needs 0.6 */
    CHECK(apir_command_since(APIR_CMD_BUFFER_GET_TENSOR_CHUNKED) == 6);
    CHECK(apir_command_since(APIR_CMD_HOST_CHECK_GGML) == 7);
    CHECK(apir_command_since(APIR_CMD_DEVICE_ASK_OPS) == 8 && apir_command_since(APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS) == 8);
    CHECK(apir_command_since(APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA) == 9 &&
          !apir_minor_speaks(8, APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA));
    CHECK(apir_command_since(APIR_CMD_COUNT) == 0 && !apir_minor_speaks(UINT32_MAX, APIR_CMD_COUNT));
    /* Features: their minors, and none past the minor we speak. */
    CHECK(!apir_minor_has(1, APIR_FEATURE_ZERO_COPY) && apir_minor_has(2, APIR_FEATURE_ZERO_COPY));
    CHECK(!apir_minor_has(2, APIR_FEATURE_LIMIT_REASON) && apir_minor_has(3, APIR_FEATURE_LIMIT_REASON));
    CHECK(!apir_minor_has(2, APIR_FEATURE_FILE_BLOBS) && apir_minor_has(3, APIR_FEATURE_FILE_BLOBS));
    for (int f = 0; f < APIR_FEATURE_COUNT; f++)
        CHECK(apir_minor_has(APIR_VERSION_MINOR, (enum apir_feature)f) && !apir_minor_has(1, (enum apir_feature)f));
    CHECK(!apir_minor_has(UINT32_MAX, APIR_FEATURE_COUNT));
    CHECK(APIR_VERSION_MINOR == 9);
    /* What may run while a graph is on the device: queries, graphs, uploads;
     * never a read, a synchronize, or anything freeing or writing memory
     * outside the stream. */
    const uint32_t beside[] = { APIR_CMD_DEVICE_SUPPORTS_OP_L, APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE_L, APIR_CMD_DEVICE_GET_MEMORY,
                                APIR_CMD_BUFFER_SET_TENSOR_AT, APIR_CMD_BACKEND_GRAPH_RECOMPUTE };
    const uint32_t waits[] = { APIR_CMD_BUFFER_GET_TENSOR, APIR_CMD_BUFFER_GET_TENSOR_AT,
                               APIR_CMD_BUFFER_GET_TENSOR_CHUNKED, APIR_CMD_BACKEND_SYNCHRONIZE,
                               APIR_CMD_BUFFER_FREE_BUFFER, APIR_CMD_BUFFER_CLEAR, APIR_CMD_BUFFER_MEMSET_TENSOR,
                               APIR_CMD_BUFFER_CPY_TENSOR, APIR_CMD_BUFFER_INIT_TENSOR, APIR_CMD_DEVICE_SELECT,
                               APIR_CMD_BUFFER_NOTE_WEIGHT, APIR_CMD_BUFFER_WRITTEN, APIR_CMD_BUFFER_SET_TENSOR_HASH,
                               APIR_CMD_BUFFER_CACHE_TENSOR, APIR_CMD_COUNT };
    for (size_t i = 0; i < sizeof(beside) / sizeof(beside[0]); i++)
        CHECK_MSG(apir_command_runs_beside_device(beside[i]), "%s should run beside the device", apir_command_name(beside[i]));
    for (size_t i = 0; i < sizeof(waits) / sizeof(waits[0]); i++)
        CHECK_MSG(!apir_command_runs_beside_device(waits[i]), "%s must wait for the device", apir_command_name(waits[i]));
}

/* ---- the classes and the derived signatures ------------------------------------ */

/* What each class column says, pinned row by row (apir_commands.h): which
 * commands go on the stream, wait for the device, report a deferred graph's
 * failure, leave the device running after their reply. */
static void test_command_classes(void)
{
    const uint32_t all = APIR_QUERY | APIR_ON_STREAM | APIR_WAITS_DEVICE | APIR_REPORTS | APIR_LEAVES_BUSY | APIR_POSTED;
    static const struct {
        uint32_t bit;
        const char *what;
        uint32_t cmds[11];  /* ends at the first APIR_CMD_COUNT */
    } pinned[] = {
        { APIR_ON_STREAM, "on the stream",
          { APIR_CMD_BUFFER_SET_TENSOR, APIR_CMD_BACKEND_GRAPH_COMPUTE, APIR_CMD_BUFFER_SET_TENSOR_AT,
            APIR_CMD_BACKEND_GRAPH_COMPUTE_AT, APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, APIR_CMD_BACKEND_GRAPH_RECOMPUTE,
            APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS, APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA, APIR_CMD_COUNT } },
        { APIR_WAITS_DEVICE, "waiting for the device",
          { APIR_CMD_BACKEND_GRAPH_COMPUTE, APIR_CMD_BACKEND_SYNCHRONIZE, APIR_CMD_BACKEND_GRAPH_COMPUTE_AT,
            APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, APIR_CMD_BACKEND_GRAPH_RECOMPUTE, APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS,
            APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA, APIR_CMD_COUNT } },
        { APIR_REPORTS, "reporting a deferred failure",
          { APIR_CMD_BUFFER_GET_TENSOR, APIR_CMD_BACKEND_GRAPH_COMPUTE, APIR_CMD_BACKEND_SYNCHRONIZE,
            APIR_CMD_BUFFER_GET_TENSOR_AT, APIR_CMD_BACKEND_GRAPH_COMPUTE_AT, APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED,
            APIR_CMD_BACKEND_GRAPH_RECOMPUTE, APIR_CMD_BUFFER_GET_TENSOR_CHUNKED, APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS,
            APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA, APIR_CMD_COUNT } },
        { APIR_LEAVES_BUSY, "leaving the device busy",
          { APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, APIR_CMD_BACKEND_GRAPH_RECOMPUTE, APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS,
            APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA, APIR_CMD_COUNT } },
        { APIR_POSTED, "posted (not waited for on a stream)",
          { APIR_CMD_BUFFER_SET_TENSOR, APIR_CMD_BUFFER_CLEAR, APIR_CMD_BUFFER_MEMSET_TENSOR, APIR_CMD_BUFFER_WRITTEN,
            APIR_CMD_COUNT } },
    };
    for (size_t i = 0; i < sizeof(pinned) / sizeof(pinned[0]); i++) {
        for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
            bool listed = false;
            for (const uint32_t *c = pinned[i].cmds; *c != APIR_CMD_COUNT; c++)
                listed = listed || *c == cmd;
            bool has = (apir_command_classes(cmd) & pinned[i].bit) != 0;
            CHECK_MSG(has == listed, "%s is%s %s", apir_command_name(cmd), has ? "" : " not", pinned[i].what);
        }
    }
    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        uint32_t c = apir_command_classes(cmd);
        const char *name = apir_command_name(cmd);
        CHECK_MSG((c & ~all) == 0, "%s: unknown class bits %#x", name, c & ~all);
        /* A query touches no tensor memory: it is nothing else. */
        CHECK_MSG(!(c & APIR_QUERY) || c == APIR_QUERY, "%s: a query with other classes (%#x)", name, c);
        /* Only a graph can still run after its reply, and it must run
         * beside the device (the guest keeps counting it as computing). */
        CHECK_MSG(!(c & APIR_LEAVES_BUSY) || (c & APIR_GRAPH) == APIR_GRAPH, "%s: leaves busy but is no graph", name);
        CHECK_MSG(!(c & APIR_LEAVES_BUSY) || apir_command_runs_beside_device(cmd), "%s", name);
        /* A posted command's reply is not read at once: it must carry no
         * items (the guest gets none) and not be a query (queries answer). */
        CHECK_MSG(!(c & APIR_POSTED) || (!(c & APIR_QUERY) && apir_command_table[cmd].reply[0] == '\0'),
                  "%s: posted, but its reply carries items or it is a query", name);
        /* What waits for the device's work is where its failure shows. */
        CHECK_MSG(!(c & APIR_WAITS_DEVICE) || (c & APIR_REPORTS), "%s: waits for the device but reports nothing",
                  name);
        /* The graph commands are exactly the rows with all of APIR_GRAPH. */
        bool graph = cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE || cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_AT ||
                     cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED || cmd == APIR_CMD_BACKEND_GRAPH_RECOMPUTE ||
                     cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS || cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA;
        CHECK_MSG(((c & APIR_GRAPH) == APIR_GRAPH) == graph, "%s: graph classes %#x", name, c);
    }
    CHECK(apir_command_classes(APIR_CMD_COUNT) == 0 && apir_command_classes(UINT32_MAX) == 0);
}

/* The letter of each item kind, written here independently of
 * apir_messages.h's APIR_SIG_<kind>: the table's strings are derived from
 * the item lists, and must read as the lists do. */
#define KIND_LETTER_u32     'u'
#define KIND_LETTER_i32     'i'
#define KIND_LETTER_enum    'e'
#define KIND_LETTER_res     'r'
#define KIND_LETTER_bool    'b'
#define KIND_LETTER_u8      'c'
#define KIND_LETTER_u64     'q'
#define KIND_LETTER_buffer  'h'
#define KIND_LETTER_buft    'h'
#define KIND_LETTER_string  's'
#define KIND_LETTER_tensor  't'
#define KIND_LETTER_tensors 'L'
#define KIND_LETTER_inline  'T'
#define KIND_LETTER_digest  'd'

#define ITEM_LETTER(kind, field) KIND_LETTER_##kind,
#define X_LETTERS(num, NAME, since, classes)                                           \
    static const char letters_req_##NAME[] = { APIR_REQ_##NAME(ITEM_LETTER) '\0' };    \
    static const char letters_rep_##NAME[] = { APIR_REP_##NAME(ITEM_LETTER) '\0' };
APIR_COMMAND_LIST(X_LETTERS)
#undef X_LETTERS

static const struct {
    const char *request, *reply;
} item_letters[APIR_CMD_COUNT] = {
#define X_LETTER_ROW(num, NAME, since, classes) [num] = { letters_req_##NAME, letters_rep_##NAME },
    APIR_COMMAND_LIST(X_LETTER_ROW)
#undef X_LETTER_ROW
};

static void test_signatures_derived(void)
{
    /* Every row: the signature strings are its items' letters in order. */
    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        const struct apir_command_info *c = &apir_command_table[cmd];
        if (!c->name || !c->request || !c->reply)
            continue;  /* test_command_table_extensions reports the gap */
        CHECK_MSG(strcmp(c->request, item_letters[cmd].request) == 0, "%s: request signature '%s', items '%s'",
                  c->name, c->request, item_letters[cmd].request);
        CHECK_MSG(strcmp(c->reply, item_letters[cmd].reply) == 0, "%s: reply signature '%s', items '%s'", c->name,
                  c->reply, item_letters[cmd].reply);
        /* 'T' has no length of its own: only last, and only in requests. */
        const char *t = strchr(c->request, 'T');
        CHECK_MSG(!t || t[1] == '\0', "%s: inline tensor not last", c->name);
    }
    /* And as written out by hand, for the rows past APIR 0.1 (the spec's
     * rows are pinned by test_command_table_spec) and two of those. */
    static const struct {
        uint32_t cmd;
        const char *request, *reply;
    } known[] = {
        { APIR_CMD_BUFFER_SET_TENSOR, "htrqq", "" },
        { APIR_CMD_DEVICE_BUFFER_FROM_PTR, "rqq", "hh" },
        { APIR_CMD_DEVICE_SELECT, "u", "" },
        { APIR_CMD_DEVICE_SUPPORTS_OP_L, "L", "b" },
        { APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE_L, "hL", "q" },
        { APIR_CMD_BUFFER_MEMSET_TENSOR, "htcqq", "" },
        { APIR_CMD_BACKEND_SYNCHRONIZE, "", "" },
        { APIR_CMD_DEVICE_OFFLOAD_OP_L, "L", "b" },
        { APIR_CMD_BUFFER_SET_TENSOR_AT, "htrqqq", "" },
        { APIR_CMD_BUFFER_GET_TENSOR_AT, "htrqqq", "" },
        { APIR_CMD_BACKEND_GRAPH_COMPUTE_AT, "rqq", "e" },
        { APIR_CMD_BUFFER_INIT_TENSOR, "ht", "e" },
        { APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, "rqqq", "e" },
        { APIR_CMD_BACKEND_GRAPH_RECOMPUTE, "q", "e" },
        { APIR_CMD_BUFFER_NOTE_WEIGHT, "ht", "u" },
        { APIR_CMD_BUFFER_WRITTEN, "hqq", "" },
        { APIR_CMD_HOST_GET_VERSION, "", "uu" },
        { APIR_CMD_BUFFER_SET_TENSOR_HASH, "htqqd", "u" },
        { APIR_CMD_BUFFER_CACHE_TENSOR, "htd", "u" },
        { APIR_CMD_BUFFER_GET_TENSOR_CHUNKED, "htrqqqqq", "" },
        { APIR_CMD_HOST_CHECK_GGML, "ssssss", "uss" },
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        const struct apir_command_info *c = &apir_command_table[known[i].cmd];
        CHECK_MSG(c->request && strcmp(c->request, known[i].request) == 0, "%s: request '%s', expected '%s'",
                  apir_command_name(known[i].cmd), c->request ? c->request : "(null)", known[i].request);
        CHECK_MSG(c->reply && strcmp(c->reply, known[i].reply) == 0, "%s: reply '%s', expected '%s'",
                  apir_command_name(known[i].cmd), c->reply ? c->reply : "(null)", known[i].reply);
    }
}

/* ---- every command: encode, decode, truncate ------------------------------------ */

#define MAX_ITEMS  8
#define LIST_MAX   3
#define INLINE_LEN 37   /* raw bytes of a 'T' item: not a multiple of 4 */

/* Item values by position in a message; a letter (or kind) picks which
 * array. */
struct items {
    uint32_t u[MAX_ITEMS];
    int32_t i[MAX_ITEMS];
    bool b[MAX_ITEMS];
    uint8_t c[MAX_ITEMS];
    uint64_t q[MAX_ITEMS];
    char s[MAX_ITEMS][32];
    struct apir_tensor_rec t[MAX_ITEMS];
    uint32_t ln[MAX_ITEMS];                          /* 'L' to encode */
    struct apir_tensor_rec lrec[MAX_ITEMS][LIST_MAX];
    struct apir_tensor_list list[MAX_ITEMS];         /* 'L' decoded */
    uint8_t raw[MAX_ITEMS][INLINE_LEN];              /* 'T' to encode */
    struct apir_digest d[MAX_ITEMS];                 /* 'd' */
};

static void items_sample(struct items *v, uint32_t list_n)
{
    memset(v, 0, sizeof(*v));
    for (int p = 0; p < MAX_ITEMS; p++) {
        v->u[p] = 0xa5000000u | ((uint32_t)p << 8) | 0x5au;
        v->i[p] = -1000 - p;
        v->b[p] = (p % 2) == 0;
        v->c[p] = (uint8_t)(0xc0 + p);
        v->q[p] = 0x0123456789abcdefull ^ ((uint64_t)p << 52) ^ (uint64_t)p;
        /* Lengths 9, 10, 11...: with the NUL, every padding remainder. */
        snprintf(v->s[p], sizeof(v->s[p]), "device-%d%.*s", p, p, "xxxxxxxx");
        fill_rec(&v->t[p], 40 + (uint64_t)p);
        v->ln[p] = list_n;
        for (uint32_t k = 0; k < list_n; k++)
            fill_rec(&v->lrec[p][k], 100 + (uint64_t)p * 10 + k);
        for (int k = 0; k < INLINE_LEN; k++)
            v->raw[p][k] = (uint8_t)(0x30 + p * 7 + k);
        for (int k = 0; k < 32; k++)
            v->d[p].b[k] = (uint8_t)(0x90 + p * 11 + k);
    }
}

static size_t item_size(char letter, const struct items *v, int p)
{
    switch (letter) {
    case 'u': case 'i': case 'e': case 'r': case 'b': case 'c': return 4;
    case 'q': case 'h': return 8;
    case 's': return 8 + ((strlen(v->s[p]) + 1 + 3) & ~(size_t)3);
    case 't': return APIR_TENSOR_REC_SIZE;
    case 'L': return 4 + (size_t)v->ln[p] * APIR_TENSOR_REC_SIZE;
    case 'T': return (INLINE_LEN + 3) & ~(size_t)3;
    case 'd': return 32;
    }
    return 0;
}

/*
 * The letter path: a message walked by its signature string, one item at a
 * time with the codec's primitives (what virgl's own walk and the fuzzers
 * do).  Same sticky semantics as the typed path.  'T' is raw bytes; it is
 * encoded, never decoded here (host/dispatch/inline_tensor.c reads it).
 */
static void encode_letter(struct apir_encoder *enc, char letter, const struct items *v, int p)
{
    switch (letter) {
    case 'u': case 'e': case 'r': apir_encode_u32(enc, v->u[p]); return;
    case 'i': apir_encode_u32(enc, (uint32_t)v->i[p]); return;
    case 'b': apir_encode_bool(enc, v->b[p]); return;
    case 'c': apir_encode_u8(enc, v->c[p]); return;
    case 'q': case 'h': apir_encode_u64(enc, v->q[p]); return;
    case 's': apir_encode_string(enc, v->s[p]); return;
    case 't': apir_encode_tensor(enc, &v->t[p]); return;
    case 'L': apir_encode_tensor_list(enc, v->ln[p], v->lrec[p]); return;
    case 'T': apir_encode_bytes(enc, v->raw[p], INLINE_LEN); return;
    case 'd': apir_encode_digest(enc, &v->d[p]); return;
    }
    enc->fatal = true;
}

static void decode_letter(struct apir_decoder *dec, char letter, struct items *o, int p)
{
    switch (letter) {
    case 'u': case 'e': case 'r': o->u[p] = apir_decode_u32(dec); return;
    case 'i': o->i[p] = (int32_t)apir_decode_u32(dec); return;
    case 'b': o->b[p] = apir_decode_bool(dec); return;
    case 'c': o->c[p] = apir_decode_u8(dec); return;
    case 'q': case 'h': o->q[p] = apir_decode_u64(dec); return;
    case 's': apir_decode_string(dec, o->s[p], sizeof(o->s[p])); return;
    case 't': apir_decode_tensor(dec, &o->t[p]); return;
    case 'L': apir_decode_tensor_list(dec, &o->list[p], LIST_MAX); return;
    case 'd': apir_decode_digest(dec, &o->d[p]); return;
    }
    apir_decoder_set_fatal(dec);
}

static bool encode_letters(struct apir_encoder *enc, const char *sig, const struct items *v)
{
    for (int p = 0; sig[p]; p++)
        encode_letter(enc, sig[p], v, p);
    return !enc->fatal;
}

static bool decode_letters(struct apir_decoder *dec, const char *sig, struct items *o)
{
    for (int p = 0; sig[p]; p++)
        decode_letter(dec, sig[p], o, p);
    return !dec->fatal;
}

/*
 * The typed path: per command, generated from its item lists, the sample
 * values given to apir_encode_request_<NAME> / apir_encode_reply_<NAME> and
 * the reply decoded by apir_decode_reply_<NAME>.  Item p of a message takes
 * the sample of position p, as the letter path does, so both must write the
 * same bytes.
 */
static inline uint32_t in_u32(const struct items *v, int p) { return v->u[p]; }
static inline int32_t in_i32(const struct items *v, int p) { return v->i[p]; }
static inline uint32_t in_enum(const struct items *v, int p) { return v->u[p]; }
static inline uint32_t in_res(const struct items *v, int p) { return v->u[p]; }
static inline bool in_bool(const struct items *v, int p) { return v->b[p]; }
static inline uint8_t in_u8(const struct items *v, int p) { return v->c[p]; }
static inline uint64_t in_u64(const struct items *v, int p) { return v->q[p]; }
static inline uint64_t in_buffer(const struct items *v, int p) { return v->q[p]; }
static inline uint64_t in_buft(const struct items *v, int p) { return v->q[p]; }
static inline const char *in_string(const struct items *v, int p) { return v->s[p]; }
static inline const struct apir_tensor_rec *in_tensor(const struct items *v, int p) { return &v->t[p]; }
static inline struct apir_tensor_span in_tensors(const struct items *v, int p)
{
    return (struct apir_tensor_span){ v->ln[p], v->lrec[p] };
}
static inline struct apir_bytes in_inline(const struct items *v, int p)
{
    return (struct apir_bytes){ v->raw[p], INLINE_LEN };
}
static inline const struct apir_digest *in_digest(const struct items *v, int p) { return &v->d[p]; }

/* A decoded reply item against the sample of position p, or zero.  One per
 * kind, used or not: no reply holds a res, a u8 or a tensor today. */
#define OUT_FN static inline __attribute__((unused)) bool
OUT_FN out_u32(const uint32_t *o, const struct items *w, int p, bool s) { return *o == (s ? w->u[p] : 0); }
OUT_FN out_i32(const int32_t *o, const struct items *w, int p, bool s) { return *o == (s ? w->i[p] : 0); }
OUT_FN out_enum(const uint32_t *o, const struct items *w, int p, bool s) { return out_u32(o, w, p, s); }
OUT_FN out_res(const uint32_t *o, const struct items *w, int p, bool s) { return out_u32(o, w, p, s); }
OUT_FN out_bool(const bool *o, const struct items *w, int p, bool s) { return *o == (s && w->b[p]); }
OUT_FN out_u8(const uint8_t *o, const struct items *w, int p, bool s) { return *o == (s ? w->c[p] : 0); }
OUT_FN out_u64(const uint64_t *o, const struct items *w, int p, bool s) { return *o == (s ? w->q[p] : 0); }
OUT_FN out_buffer(const uint64_t *o, const struct items *w, int p, bool s) { return out_u64(o, w, p, s); }
OUT_FN out_buft(const uint64_t *o, const struct items *w, int p, bool s) { return out_u64(o, w, p, s); }
OUT_FN out_string(const struct apir_string *o, const struct items *w, int p, bool s)
{
    return strcmp(o->s, s ? w->s[p] : "") == 0;
}
OUT_FN out_tensor(const struct apir_tensor_rec *o, const struct items *w, int p, bool s)
{
    return s ? memcmp(o, &w->t[p], sizeof(*o)) == 0 : all_zero(o, sizeof(*o));
}
OUT_FN out_digest(const struct apir_digest *o, const struct items *w, int p, bool s)
{
    return s ? memcmp(o, &w->d[p], sizeof(*o)) == 0 : all_zero(o, sizeof(*o));
}
OUT_FN out_tensors(const struct apir_tensor_list *o, const struct items *w, int p, bool s)
{
    if (!s)
        return o->count == 0 && o->records == NULL;
    if (o->count != w->ln[p] || !o->records)
        return false;
    for (uint32_t k = 0; k < o->count; k++) {
        struct apir_tensor_rec r;
        apir_tensor_list_get(o, k, &r);
        if (memcmp(&r, &w->lrec[p][k], sizeof(r)) != 0)
            return false;
    }
    return true;
}

/* Whether decoded item p of the letter path equals the sample
 * (want_sample) or is zero. */
static bool item_matches(char letter, const struct items *got, const struct items *want, int p, bool want_sample)
{
    switch (letter) {
    case 'u': case 'e': case 'r': return out_u32(&got->u[p], want, p, want_sample);
    case 'i': return out_i32(&got->i[p], want, p, want_sample);
    case 'b': return out_bool(&got->b[p], want, p, want_sample);
    case 'c': return out_u8(&got->c[p], want, p, want_sample);
    case 'q': case 'h': return out_u64(&got->q[p], want, p, want_sample);
    case 's': return strcmp(got->s[p], want_sample ? want->s[p] : "") == 0;
    case 't': return out_tensor(&got->t[p], want, p, want_sample);
    case 'L': return out_tensors(&got->list[p], want, p, want_sample);
    case 'd': return out_digest(&got->d[p], want, p, want_sample);
    }
    return false;
}

#define T_IN_DECL(kind, field) APIR_IN_##kind a_##field = in_##kind(x_v, x_p++);
#define T_IN_ARG(kind, field) , a_##field
#define T_IN_SET(kind, field) x_rep.field = in_##kind(x_v, x_p++);
#define T_OUT_DECL(kind, field)  \
    APIR_OUT_##kind o_##field;   \
    memset(&o_##field, 0xee, sizeof(o_##field));
#define T_OUT_ADDR(kind, field) , &o_##field
#define T_OUT_CHECK(kind, field)                                                      \
    *x_match = *x_match && out_##kind(&o_##field, x_want, x_p, x_ends[x_p] <= x_k);   \
    x_p++;

typedef void typed_encode_fn(struct apir_encoder *x_enc, const struct items *x_v);
/* Decodes a reply, *x_match: every item as the sample where it ended within
 * x_k bytes, zero elsewhere.  Returns what the decoder returned. */
typedef bool typed_decode_fn(struct apir_decoder *x_dec, const struct items *x_want, const size_t *x_ends, size_t x_k,
                             bool *x_match);

#define X_TYPED(num, NAME, since, classes)                                                                 \
    static void typed_request_##NAME(struct apir_encoder *x_enc, const struct items *x_v)                  \
    {                                                                                                      \
        int x_p = 0;                                                                                       \
        (void)x_v;                                                                                         \
        (void)x_p;                                                                                         \
        APIR_REQ_##NAME(T_IN_DECL) apir_encode_request_##NAME(x_enc APIR_REQ_##NAME(T_IN_ARG));            \
    }                                                                                                      \
    static void typed_reply_##NAME(struct apir_encoder *x_enc, const struct items *x_v)                    \
    {                                                                                                      \
        int x_p = 0;                                                                                       \
        struct apir_reply_##NAME x_rep;                                                                    \
        memset(&x_rep, 0, sizeof(x_rep));                                                                  \
        (void)x_v;                                                                                         \
        (void)x_p;                                                                                         \
        APIR_REP_##NAME(T_IN_SET) apir_encode_reply_##NAME(x_enc, &x_rep);                                 \
    }                                                                                                      \
    static bool typed_decode_##NAME(struct apir_decoder *x_dec, const struct items *x_want, const size_t *x_ends, \
                                    size_t x_k, bool *x_match)                                             \
    {                                                                                                      \
        int x_p = 0;                                                                                       \
        (void)x_want;                                                                                      \
        (void)x_ends;                                                                                      \
        (void)x_k;                                                                                         \
        (void)x_p;                                                                                         \
        APIR_REP_##NAME(T_OUT_DECL)                                                                        \
        bool x_ok = apir_decode_reply_##NAME(x_dec APIR_REP_##NAME(T_OUT_ADDR));                           \
        *x_match = true;                                                                                   \
        APIR_REP_##NAME(T_OUT_CHECK)                                                                       \
        return x_ok;                                                                                       \
    }
APIR_COMMAND_LIST(X_TYPED)
#undef X_TYPED

static const struct {
    typed_encode_fn *request, *reply;
    typed_decode_fn *decode_reply;
} typed[APIR_CMD_COUNT] = {
#define X_TYPED_ROW(num, NAME, since, classes) [num] = { typed_request_##NAME, typed_reply_##NAME, typed_decode_##NAME },
    APIR_COMMAND_LIST(X_TYPED_ROW)
#undef X_TYPED_ROW
};

/*
 * The whole check for one message with one 'L' size: encode by letters,
 * the 4-byte rule, the typed encoder writes the same bytes; then (unless
 * it holds a 'T') decode every truncation against a guard page - by
 * letters, and for a reply by its typed decoder - and encode into every
 * too-small room both ways.
 */
static void check_message(const char *what, const char *sig, uint32_t list_n, struct guarded *g,
                          typed_encode_fn *typed_encode, typed_decode_fn *typed_decode)
{
    static struct items want, got;
    static uint8_t msg[8192], msg2[8192];
    items_sample(&want, list_n);

    /* Expected size and item end offsets, from the letters alone. */
    size_t ends[MAX_ITEMS], expect = 0;
    int n_items = (int)strlen(sig);
    if (n_items > MAX_ITEMS) {
        CHECK_MSG(0, "%s: signature '%s' longer than this test handles", what, sig);
        return;
    }
    for (int p = 0; p < n_items; p++) {
        size_t sz = item_size(sig[p], &want, p);
        CHECK_MSG(sz % 4 == 0 && sz > 0, "%s: item %d ('%c') size %zu", what, p, sig[p], sz);
        expect += sz;
        ends[p] = expect;
    }

    struct apir_encoder enc;
    apir_encoder_init(&enc, msg, sizeof(msg));
    CHECK_MSG(encode_letters(&enc, sig, &want), "%s: encoding '%s' by letters failed", what, sig);
    size_t len = apir_encoder_used(&enc);
    CHECK_MSG(len == expect && len % 4 == 0, "%s: '%s' encodes %zu bytes, expected %zu", what, sig, len, expect);

    apir_encoder_init(&enc, msg2, sizeof(msg2));
    typed_encode(&enc, &want);
    CHECK_MSG(!enc.fatal && apir_encoder_used(&enc) == len && memcmp(msg, msg2, len) == 0,
              "%s: the typed encoder does not write what '%s' says (%zu bytes, letters %zu)", what, sig,
              apir_encoder_used(&enc), len);
    if (strchr(sig, 'T'))
        return;  /* raw struct: host/dispatch/inline_tensor.c decodes it (fuzz_inline covers it) */

    unsigned bad = 0;
    size_t first_bad = SIZE_MAX;
    for (size_t k = 0; k <= len; k++) {
        snprintf(fault_context, sizeof(fault_context), "%s '%s' (L=%u) decoding %zu of %zu bytes", what, sig, list_n, k,
                 len);
        const uint8_t *p = guard_place(g, msg, k);
        for (int path = 0; path < 2; path++) {
            if (path == 1 && !typed_decode)
                continue;
            struct apir_decoder dec;
            apir_decoder_init(&dec, p, k);
            bool ok, good = true;
            if (path == 0) {
                /* Dirty outputs: zeros must come from the decoder. */
                memset(&got, 0xee, sizeof(got));
                ok = decode_letters(&dec, sig, &got);
                /* Items that ended inside the bytes decode to their
                 * values, the rest to zero. */
                for (int it = 0; it < n_items && good; it++)
                    good = item_matches(sig[it], &got, &want, it, ends[it] <= k);
            } else {
                ok = typed_decode(&dec, &want, ends, k, &good);
                good = good && ok == !dec.fatal;
            }
            bool whole = k == len;
            good = good && (whole ? (ok && !dec.fatal && apir_decoder_left(&dec) == 0) : (!ok && dec.fatal));
            if (!good) {
                bad++;
                if (first_bad == SIZE_MAX)
                    first_bad = k;
            }
        }
    }
    CHECK_MSG(bad == 0, "%s: '%s' (L=%u): %u bad decodes, first at length %zu of %zu", what, sig, list_n, bad,
              first_bad, len);

    /* Encoding into every room too small for the message: refused, the
     * complete items written are the message's prefix, and nothing is
     * written at or past the guard page. */
    bad = 0;
    for (size_t room = 0; room < len; room++) {
        snprintf(fault_context, sizeof(fault_context), "%s '%s' (L=%u) encoding into %zu of %zu bytes", what, sig,
                 list_n, room, len);
        for (int path = 0; path < 2; path++) {
            apir_encoder_init(&enc, g->end - room, room);
            if (path == 0)
                encode_letters(&enc, sig, &want);
            else
                typed_encode(&enc, &want);
            size_t used = apir_encoder_used(&enc);
            if (!enc.fatal || used > room || memcmp(g->end - room, msg, used) != 0)
                bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s: '%s' (L=%u): %u encodes into short rooms misbehaved", what, sig, list_n, bad);
}

static void test_every_command(void)
{
    install_fault_handler();
    struct guarded g;
    CHECK(guard_init(&g, 8192));
    unsigned checked = 0, skipped = 0;
    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        const struct apir_command_info *c = &apir_command_table[cmd];
        if (!c->name)
            continue;
        const char *sigs[2] = { c->request, c->reply };
        for (int dir = 0; dir < 2; dir++) {
            char what[96];
            snprintf(what, sizeof(what), "%s %s", c->name, dir == 0 ? "request" : "reply");
            typed_encode_fn *encode = dir == 0 ? typed[cmd].request : typed[cmd].reply;
            typed_decode_fn *decode = dir == 0 ? NULL : typed[cmd].decode_reply;
            check_message(what, sigs[dir], 1, &g, encode, decode);
            if (strchr(sigs[dir], 'L'))
                check_message(what, sigs[dir], 3, &g, encode, decode);
            if (strchr(sigs[dir], 'T'))
                skipped++;
            else
                checked++;
        }
    }
    guard_free(&g);
    printf("every command: %u messages checked, %u encoded only ('T')\n", checked, skipped);
    CHECK(checked + skipped == 2u * APIR_CMD_COUNT);
}

TEST_MAIN("codec",
          TEST(test_scalars_roundtrip),
          TEST(test_bool_and_u8_rules),
          TEST(test_bytes_padding),
          TEST(test_strings_roundtrip),
          TEST(test_string_errors),
          TEST(test_tensor_and_list),
          TEST(test_header),
          TEST(test_sticky_fatal_reads),
          TEST(test_writes_past_end),
          TEST(test_command_table_spec),
          TEST(test_command_table_extensions),
          TEST(test_command_classes),
          TEST(test_signatures_derived),
          TEST(test_every_command))
