/*
 * Input formats of the apir fuzz targets, shared by the targets and by the
 * seed generator (make_seeds.c), so that seeds and harnesses cannot drift.
 *
 * Handles.  A session's handles are salted with random bits, so no input
 * could ever name a live handle.  The harnesses therefore rewrite small
 * values in the places where the wire carries a handle (an 'h' item, the
 * `buffer` field of a tensor record, the handle after an inline tensor):
 * a value v in 1..FZ_MAX_KNOWN becomes the session's v-th known handle
 * (1 = the device's buffer type, 2.. = buffers in order of allocation).
 * Real handles always have a non-zero top byte (their kind), so the
 * rewrite never hides one; every other value, 0 included, goes through
 * unchanged and exercises the host's refusals.
 */
#ifndef APIR_FUZZ_FORMAT_H
#define APIR_FUZZ_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FZ_MAX_KNOWN   15u

/* Known handle numbers in every session the harnesses make. */
#define FZ_H_BUFT      1u   /* device 0's buffer type */
#define FZ_H_BUF_A     2u   /* a buffer of FZ_BUF_A_SIZE bytes, allocated first */
#define FZ_H_BUF_B     3u   /* fuzz_graph / fuzz_inline: a second, small buffer */
#define FZ_BUF_A_SIZE  (64u * 1024u)
#define FZ_BUF_B_SIZE  (4u * 1024u)

/*
 * fuzz_dispatch input:
 *   u16 blob_len, blob_len bytes      -> the start of the session's data blob
 *                                        (res_id FZ_BLOB_RES_ID, FZ_BLOB_SIZE bytes, rest zero)
 *   then up to FZ_MAX_CMDS records:
 *   u8 op, u16 len, len bytes         -> one command's request items
 *     op & 0x7f: the command number (numbers past the table test the refusal);
 *                FZ_OP_HANDSHAKE runs a HANDSHAKE with these bytes instead
 *     op & 0x80: the reply goes to an 8-byte area (reply-full paths)
 * The session starts with a 0.2 handshake and buffer FZ_H_BUF_A allocated.
 */
#define FZ_BLOB_RES_ID   3u
#define FZ_BLOB_SIZE     (1u << 20)
#define FZ_MAX_CMDS      64
#define FZ_OP_HANDSHAKE  0x7f
#define FZ_OP_SMALL_REPLY 0x80

/*
 * fuzz_graph input: one graph blob of APIR 0.1 (uint32 n_nodes, ids,
 * uint32 n_tensors, records), with buffers FZ_H_BUF_A and FZ_H_BUF_B.
 *
 * fuzz_inline input: one inline tensor (raw struct ggml_tensor, then the
 * optional handle, view_src struct, src structs), as DEVICE_SUPPORTS_OP's
 * request; buffer FZ_H_BUF_A exists.
 *
 * fuzz_codec input: any bytes.
 *
 * fuzz_shm_frame input:
 *   u8 fd_plan       bits 0-1: fds sent with the hello (0..3)
 *                    bits 2-3: what the control fd is (0 good, 1 unsealed memfd,
 *                              2 memfd smaller than announced, 3 a pipe)
 *                    bits 4-5: the same for the reply fd
 *                    bit 6:    the first 4 bytes of the hello come from the input
 *                              (else the right magic)
 *   u8 hello[32]     the hello (struct apir_shm_hello; reply_size is clamped
 *                    to FZ_SHM_MAX_REPLY for the mapping the harness makes)
 *   then, if the host accepted, up to FZ_SHM_MAX_CMDS records:
 *   u8 kind, u16 len, len bytes
 *     kind & 3 == 0: a command: len bytes into the command area, cmd_len = len
 *     kind & 3 == 1: same, but cmd_len is the next u32 (lying about the length)
 *     kind & 3 == 2: an fd message (tag, fd) sent on the socket; bits 2-3 pick
 *                    the fd as in fd_plan, bit 4 a wrong tag, the u16 the size
 *     kind & 3 == 3: a SHM_BLOB_CREATE with its fd: u32 res_id, u64 size from
 *                    the bytes, the fd made from bits 2-3 with the announced size
 *   Commands whose type is SHM_BLOB_CREATE get an fd message first unless the
 *   record supplied one, so that the host never waits 2 s for a missing fd.
 */
#define FZ_SHM_MAX_REPLY (64u * 1024u)
#define FZ_SHM_MAX_CMDS  32
#define FZ_SHM_HELLO_SIZE 32

/* Little-endian cursor over an input; short reads yield zeros. */
struct fz_reader {
    const uint8_t *p;
    size_t left;
};

static inline uint64_t fz_read_le(struct fz_reader *r, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) {
        if (r->left) {
            v |= (uint64_t)r->p[0] << (8 * i);
            r->p++;
            r->left--;
        }
    }
    return v;
}

/* Takes up to n bytes; *got says how many there were. */
static inline const uint8_t *fz_take(struct fz_reader *r, size_t n, size_t *got)
{
    const uint8_t *p = r->p;
    *got = n < r->left ? n : r->left;
    r->p += *got;
    r->left -= *got;
    return p;
}

/* Writers for the seed generator. */
struct fz_writer {
    uint8_t *buf;
    size_t cap, len;
};

static inline void fz_put(struct fz_writer *w, const void *p, size_t n)
{
    if (w->len + n <= w->cap) {
        memcpy(w->buf + w->len, p, n);
    }
    w->len += n;  /* past cap: the caller sees len > cap and drops the seed */
}

static inline void fz_put_le(struct fz_writer *w, uint64_t v, unsigned n)
{
    uint8_t b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    fz_put(w, b, n);
}

#endif
