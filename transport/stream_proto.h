/*
 * The stream transport ("tcp:HOST:PORT", "vsock:CID:PORT"), shared by guest
 * and host: a guest on another machine, or in a VM without virtio-gpu,
 * shares no memory with its host, so everything travels in one byte stream.
 *
 * The APIR commands are the same as on the other transports, and so are
 * their blobs: a command still names data by (blob, offset, size).  A blob
 * here is memory on each side - the guest's, and a copy the host allocates
 * (counted against the guest's blob quota) - and each frame says which
 * ranges must travel:
 *
 *   guest -> host   frame header | n_in + n_out segments | command bytes |
 *                   the n_in payloads, in order
 *   host -> guest   reply header | reply items | the n_out payloads
 *
 * An "in" range is written into the host's copy before the command runs
 * (tensor data of an upload, a serialized graph); an "out" range is sent
 * back after it ran (a download).  The guest sends payloads straight from
 * the program's memory and reads downloads straight into it (no copy
 * through the blob on its side); the host reads them into the blob the
 * command names.  Replies come back in command order; a guest need not wait
 * for the replies of uploads before sending its next command (pipelining),
 * and reads them later.
 *
 * Limits are hard and checked on both sides: the command area's size, a
 * handful of segments per frame, segments only inside blobs that exist.
 * Everything is little-endian, sent as these packed structs.
 *
 * Lanes (plain tcp: and vsock:; an extension a guest asks for): extra
 * connections of the same session, so that a large payload crosses on
 * several cores at once (transport/lanes.h says why).  The guest sends
 * APIR_CMD_TYPE_STREAM_LANES (u32: lanes wanted) on its connection; a host
 * that has them answers 0 with u32 granted (at most APIR_STREAM_MAX_LANES)
 * and the session's ticket (APIR_STREAM_TICKET_BYTES random bytes); an
 * older host answers APIR_FORWARD_NO_DISPATCH, a host without them 1.  The
 * guest then connects to the same endpoint once per lane and sends a join:
 * a hello whose magic is APIR_STREAM_JOIN_MAGIC, pid the lane's number
 * (1..granted, for log lines), token the ticket; the host answers with a
 * hello reply once the lane is the session's.  The ticket stands for the
 * token (it was given to a guest that presented one), and a join is taken
 * only from the session's own tenant (its address).
 * A frame whose `lanes` is L > 0 (at most the lanes that joined) has
 * exactly one payload to split - its out range if it has one (n_out == 1),
 * else its in range (n_in == 1, n_out == 0) - cut by apir_stream_lane_part
 * into L + 1 parts: part 0 travels in the frame or reply as before, part i
 * alone on lane i, in frame order.  Everything else stays on the first
 * connection.
 */
#ifndef APIR_STREAM_PROTO_H
#define APIR_STREAM_PROTO_H

#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the stream framing is sent as little-endian structs"
#endif

#define APIR_STREAM_MAGIC        0x53524941u  /* "AIRS": the hello */
#define APIR_STREAM_VERSION      1u
#define APIR_STREAM_FRAME_MAGIC  0x46524941u  /* "AIRF": a command */
#define APIR_STREAM_REPLY_MAGIC  0x52524941u  /* "AIRR": its reply */
#define APIR_STREAM_MAX_SEGMENTS 8u           /* in + out, per frame */
#define APIR_STREAM_TOKEN_MAX    64u
#define APIR_STREAM_JOIN_MAGIC   0x4c524941u  /* "AIRL": a lane's hello */
#define APIR_STREAM_MAX_LANES    4u           /* lanes a session may have */
#define APIR_STREAM_TICKET_BYTES 32u          /* a join's ticket, in the hello's token */
/* Blob ids: the reply blob is the host's own (its reply page); the guest
 * numbers the rest from APIR_STREAM_FIRST_RES_ID. */
#define APIR_STREAM_REPLY_RES_ID 2u
#define APIR_STREAM_FIRST_RES_ID 3u

/* First bytes of a connection, guest to host. */
struct apir_stream_hello {
    uint32_t magic;
    uint32_t version;
    int32_t  pid;                /* for log lines only */
    uint32_t token_len;          /* 0: no token */
    uint8_t  token[APIR_STREAM_TOKEN_MAX];
};
_Static_assert(sizeof(struct apir_stream_hello) == 80, "hello layout");

/* The host's answer; a refusal's message says why, then the host closes. */
struct apir_stream_hello_reply {
    uint32_t magic;
    int32_t  status;             /* 0 accepted */
    char     message[120];
};
_Static_assert(sizeof(struct apir_stream_hello_reply) == 128, "hello reply layout");

struct apir_stream_frame {
    uint32_t magic;
    uint32_t cmd_len;            /* APIR header + items, at most APIR_MAX_COMMAND_SIZE */
    uint16_t n_in;
    uint16_t n_out;
    uint32_t lanes;              /* 0, or the lanes its one payload is split over (above) */
};
_Static_assert(sizeof(struct apir_stream_frame) == 16, "frame layout");

struct apir_stream_segment {
    uint32_t res_id;
    uint32_t reserved;           /* 0 */
    uint64_t offset;
    uint64_t size;
};
_Static_assert(sizeof(struct apir_stream_segment) == 24, "segment layout");

struct apir_stream_reply {
    uint32_t magic;
    uint32_t ret;                /* the command's return value */
    uint32_t reply_len;          /* reply item bytes that follow */
    uint32_t n_out;              /* as asked */
    uint64_t out_bytes;          /* sum of the out ranges' sizes, which follow */
};
_Static_assert(sizeof(struct apir_stream_reply) == 24, "reply layout");

/* Blob commands on a stream: the host allocates its copy (no descriptor
 * travels).  Same numbers as the shm transport's. */

/* Part i (0..lanes) of a payload of `total` bytes split over `lanes`
 * lanes: [*off, *off + *len).  Parts are whole 4 KiB pages but the last,
 * in order; a small payload leaves the last parts empty. */
static inline void apir_stream_lane_part(uint64_t total, uint32_t lanes, uint32_t i, uint64_t *off, uint64_t *len)
{
    const uint64_t parts = (uint64_t)lanes + 1;
    const uint64_t part = ((total + parts - 1) / parts + 4095u) & ~(uint64_t)4095u;
    const uint64_t lo = part * i < total ? part * i : total;
    const uint64_t hi = part * (i + 1) < total ? part * (i + 1) : total;
    *off = lo;
    *len = hi - lo;
}

#endif
