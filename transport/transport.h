/*
 * The guest's view of a transport: a place to write one command, a way to
 * submit it and read the reply, and shared-memory blobs named by res_id.
 *
 * Implementations: shm (same host, shm_client.c), virtgpu (VM guests) and
 * stream (tcp:, vsock:; stream_client.c), whose blobs are not shared memory:
 * each side has its own copy, and the bytes a command needs travel with it
 * (stage_in, stage_out).
 * A transport is used by one thread at a time (the caller serializes).
 */
#ifndef APIR_TRANSPORT_H
#define APIR_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apir_codec.h"

struct apir_transport;

/*
 * Work the caller has for the time a submit waits for its reply (a
 * download's pieces to copy out as they land: guest/download.c).  A
 * transport whose host writes our memory while it runs a command (shm)
 * calls run after sending, again and again while the reply has not come
 * and run returns true; between calls it checks that the host is alive.
 * run returns within about 50 ms, and early once *reply_word is non-zero
 * (the host answered; the reply word of transport/shm_proto.h).  It is only
 * ever an early start of work the caller finishes after the reply, so a
 * transport that cannot run it ignores it.
 */
struct apir_wait_work {
    bool (*run)(struct apir_wait_work *w, _Atomic uint32_t *reply_word);
};

/* A spin of a glance (apir_submit_opts.spin_ns): for a wait the caller
 * knows is long and computed on the cores a spin would take. */
#define APIR_SPIN_GLANCE_NS 1000u

/*
 * How one submit is to be made, given with that submit (nothing of it
 * outlives the call).  Zero in every field: the defaults.
 */
struct apir_submit_opts {
    /* Give up on a reply after this long and mark the transport broken;
     * 0: wait as long as the host lives (a graph may compute for long). */
    uint64_t timeout_ns;
    /* How long to spin on the reply before sleeping; 0: the transport's
     * default.  The caller knows what it waits for: a graph on a GPU takes
     * ~1 ms, and a sleep plus wake-up costs 50 us or more, so graph waits
     * spin (yielding) much longer than short commands. */
    uint64_t spin_ns;
    /* The reply need not be waited for (APIR_POSTED commands): a transport
     * that can (stream) answers APIR_FORWARD_BASE at once with no reply
     * items and reads the real reply later, in order; a failure is logged
     * then.  Others wait as usual. */
    bool posted;
    /* Work for the wait (NULL: none); run only where runs_wait_work. */
    struct apir_wait_work *wait_work;
};

/* opts, or the defaults where it is NULL (what a submit reads). */
static inline const struct apir_submit_opts *apir_submit_opts_or_defaults(const struct apir_submit_opts *opts)
{
    static const struct apir_submit_opts defaults;
    return opts ? opts : &defaults;
}

struct apir_transport_ops {
    /* Starts a command: returns the encoder for its items (after the header). */
    struct apir_encoder *(*begin)(struct apir_transport *t);
    /* Sends it and waits for the reply, as opts asks (NULL: the defaults).
     * On success (0) *ret holds the command's return value and *reply
     * decodes the reply items.  -1: the transport failed (host gone,
     * timeout); the message is logged. */
    int (*submit)(struct apir_transport *t, int32_t cmd_type, int32_t cmd_flags, const struct apir_submit_opts *opts,
                  uint32_t *ret, struct apir_decoder *reply);
    /* A shared blob of at least size bytes, mapped at *ptr. */
    int (*blob_create)(struct apir_transport *t, size_t size, uint32_t *res_id, void **ptr);
    /* ptr NULL: the blob is not ours to unmap (a shared file range). */
    void (*blob_destroy)(struct apir_transport *t, uint32_t res_id, void *ptr, size_t size);
    /* The host maps [offset, offset + size) of file fd, page-aligned offset,
     * as blob *res_id, less its first skip bytes.  NULL where the transport
     * cannot pass files (virtio-gpu); -1 when the host refused. */
    int (*blob_share_file)(struct apir_transport *t, int fd, uint64_t offset, uint64_t size, uint64_t skip,
                           uint32_t *res_id);
    /* Stream transports only (NULL where blobs are shared memory): the next
     * submit first puts src's size bytes at [offset, offset + size) of the
     * host's blob res_id (stage_in), and after it reads the host's bytes of
     * such a range into dst (stage_out).  src and dst are the caller's until
     * that submit returns.  -1: too many ranges for one command. */
    int (*stage_in)(struct apir_transport *t, uint32_t res_id, uint64_t offset, const void *src, size_t size);
    int (*stage_out)(struct apir_transport *t, uint32_t res_id, uint64_t offset, void *dst, size_t size);
    /* Drops what was staged for a command that will not be sent. */
    void (*unstage)(struct apir_transport *t);
    /* The transport's own profile line (APIR_PROFILE=1) into out; false
     * with nothing to say.  NULL where a transport keeps none. */
    bool (*describe_profile)(struct apir_transport *t, char *out, size_t len);
    void (*close)(struct apir_transport *t);
};

struct apir_transport {
    const struct apir_transport_ops *ops;
    char endpoint[128];
    bool broken;          /* a failure made the connection unusable */
    bool blobs_shared;    /* blobs are memory the host maps (zero copy possible) */
    /* What the transport is, set when it connects (not a per-call
     * setting): it calls a submit's wait_work (shm, whose host writes our
     * memory while it runs a command). */
    bool runs_wait_work;
};

/* "unix:PATH" (or a bare path): the shm transport. */
struct apir_transport *apir_shm_connect(const char *path, char *err, size_t err_len);

/* The daemon's default socket: $XDG_RUNTIME_DIR/apir/host.sock, else
 * /run/apir/host.sock. */
void apir_shm_default_path(char *out, size_t len);

/* "tcp:HOST:PORT", "tls:HOST:PORT" or "vsock:CID:PORT": the stream transport. */
struct apir_transport *apir_stream_connect(const char *endpoint, char *err, size_t err_len);

/* Opens an endpoint string: unix:PATH, virtgpu[:/dev/dri/renderD*],
 * tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT. */
struct apir_transport *apir_transport_open(const char *endpoint, char *err, size_t err_len);

#endif
