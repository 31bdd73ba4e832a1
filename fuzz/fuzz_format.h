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

/*
 * fuzz_stream_frame input (one TCP connection to the host's stream
 * listener; structs of transport/stream_proto.h):
 *   u8 plan          bit 0: the server with the token FZ_STREAM_TOKEN (else one without)
 *                    bits 1-2: hello: 0 valid fields, 1 magic and version from the
 *                              input, 2 all 80 bytes raw from the input, 3 valid
 *                              fields but cut short (we shut our side)
 *                    bits 3-4: token (modes 0, 1, 3): 0 the right one, 1 none,
 *                              2 u8 token_len + 64 token bytes from the input,
 *                              3 the right one with a near miss (u8 how [, u8 xor])
 *                    bit 5:    the hello in two writes, split at the next u8 % 80
 *                    bit 6:    a handshake frame sent right after the hello, before
 *                              its answer is read (answered after it, if accepted)
 *   hello fields     modes 0, 1, 3: u16 pid [, u32 magic, u32 version], then the
 *                    token bytes above; mode 2: 80 raw bytes
 *   then frames, while the host serves (at most 48), by a byte K, K & 7:
 *     0-2  a frame: [u8 lie if K bit 3], u8 nseg (n_in = bits 0-2, n_out =
 *          bits 3-5), the segments, the command, u8 n + n payload prefix
 *          bytes (the rest of each upload is zeros); lie bit 0: u32 magic,
 *          bit 1: u32 reserved, bit 2: u32 cmd_len, bit 3: u16 n_in, u16 n_out
 *          in the header (the bytes sent stay as built); K bit 4: its reply is
 *          read later (pipelined, upload-only frames), bit 5: u8 n + n+1
 *          garbage bytes after it, bit 6: u16 cut point (the frame is cut
 *          there and our side shut)
 *          segment: u8 sel; sel bit 7: 24 raw bytes (res_id, reserved, offset,
 *          size); else res_id FIRST_RES_ID + (sel & 7) (6: the reply id 2,
 *          7: 0), u16 offset, u16 size; bit 6: offset counts from the blob's
 *          end, bit 5: size * 64, bit 4: size = the rest of the blob
 *          command: u8 ck; ck & 3 == 0: FORWARD, u8 command number, u16 len,
 *          items (handle numbers rewritten as above; graph computes become an
 *          unknown number); 1: type from ck bits 2-4 (handshake, load, blob
 *          create, destroy, file, create, 3, -1), u16 len, items; 2-3: u16 len,
 *          raw command bytes, APIR header included
 *     3    u16 len, raw bytes on the wire; the session ends
 *     4    BLOB_CREATE: u8 id (bit 7: id & 0x7f, else FIRST_RES_ID + (id & 7)),
 *          u32 size (K bit 7: shifted left by 16)
 *     5    BLOB_DESTROY: u8 id as above
 *     6    echo: u8 id, u16 offset, u16 size, u8 n + n prefix bytes: one frame
 *          uploads the range and downloads it around DEVICE_GET_COUNT
 *     7    HANDSHAKE 0.(u8 % 8)
 */
#define FZ_STREAM_TOKEN "fuzz-token-5e1f0a7c"

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
