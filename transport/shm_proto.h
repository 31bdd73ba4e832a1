/*
 * The same-host shared-memory transport ("shm"), shared by guest and host.
 *
 * A guest connects to the host's Unix socket (SOCK_SEQPACKET: one message per
 * send, and file descriptors ride along with SCM_RIGHTS).  All memory the two
 * share is memfd memory the guest creates, seals against shrinking (so the
 * host can never fault on a truncated mapping) and names by res_id, exactly
 * like virtio-gpu blob resources:
 *
 *   - the control blob: the doorbell words and the command area;
 *   - the reply blob: APIR's reply page (word 0 = return value + 1, items
 *     from byte 4);
 *   - data blobs, created on demand (tensor data, graphs, buffers).
 *
 * A call: the guest writes the command bytes (APIR header + items) into the
 * command area, zeroes the reply word, bumps cmd_seq and wakes the host if it
 * sleeps.  The host worker copies nothing it does not need, decodes forward
 * only, writes the reply and stores the reply word.  Both sides spin for a
 * bounded time before sleeping on a futex: a kernel sleep and wake-up costs
 * ~40 us per direction on these machines, a spin ~0.2 us.
 *
 * The socket carries only the hello, blob file descriptors (each announced by
 * an ordered SHM_BLOB_CREATE command), and hang-up: the host notices a dead
 * guest through it, and the guest a dead host.
 */
#ifndef APIR_SHM_PROTO_H
#define APIR_SHM_PROTO_H

#include <stdatomic.h>
#include <stdint.h>

#define APIR_SHM_MAGIC          0x52495041u  /* "APIR" */
#define APIR_SHM_VERSION        1u
#define APIR_SHM_CTRL_HEADER    64u
#define APIR_SHM_CMD_AREA       (64u * 1024u)
#define APIR_SHM_CTRL_SIZE      (APIR_SHM_CTRL_HEADER + APIR_SHM_CMD_AREA)
#define APIR_SHM_CTRL_RES_ID    1u
#define APIR_SHM_REPLY_RES_ID   2u
#define APIR_SHM_FIRST_RES_ID   3u

struct apir_shm_ctrl {
    _Atomic uint32_t cmd_seq;        /* futex word: the guest bumps it per command */
    _Atomic uint32_t host_waiting;   /* the host sleeps on cmd_seq */
    _Atomic uint32_t guest_waiting;  /* the guest sleeps on the reply word */
    _Atomic uint32_t cmd_len;        /* bytes of the current command */
    _Atomic uint32_t reply_len;      /* bytes of the last reply's items, stored before its reply word (the
                                      * library side of libapir-virgl.so copies that many: host/virgl) */
    uint32_t reserved[11];
    uint8_t cmd[APIR_SHM_CMD_AREA];
};
_Static_assert(sizeof(struct apir_shm_ctrl) == APIR_SHM_CTRL_SIZE, "control blob layout");

/* First message of a connection, with two fds: control blob, reply blob. */
struct apir_shm_hello {
    uint32_t magic;
    uint32_t version;
    uint64_t ctrl_size;
    uint64_t reply_size;
    int32_t  pid;         /* for log lines only */
    uint32_t reserved;
};

struct apir_shm_hello_reply {
    uint32_t magic;
    int32_t  status;      /* 0 accepted; else refused (message follows) */
    char     message[120];
};

/* The one byte that carries a blob's fd before its SHM_BLOB_CREATE. */
#define APIR_SHM_FD_MSG 0x42

#endif
