/*
 * A virtio-gpu context's worker, seen from libapir-virgl.so: apir-host
 * started in its worker mode (--serve-fd) in the sandbox the daemon's
 * workers get (host/server/workers.c, sandbox.c), spoken to the way a guest
 * speaks to the daemon's worker - the shm transport's framing
 * (transport/shm_proto.h): a control blob and a reply blob the library
 * creates, blob descriptors over the socket, a doorbell word, a bounded
 * spin and then a futex.
 *
 * The hypervisor process holds no ggml state and runs no kernel on guest
 * memory: what a guest's bytes can reach is this worker, alone with the
 * blobs of its own context.
 */
#ifndef APIR_VIRGL_WORKER_LINK_H
#define APIR_VIRGL_WORKER_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct apir_worker_link;

struct apir_worker_spec {
    const char *program;     /* the apir-host executable */
    const char *library;     /* ggml.library.path */
    const char *reg;         /* ggml.library.reg; NULL: ggml_backend_init */
    int device;              /* apir.device; -1: every device */
    int n_threads;           /* apir.n_threads; -1: the worker's default */
    uint32_t ctx_id;
    uint32_t timeout_ms;     /* a command's answer; past it the worker is ended (0: none) */
};

/*
 * Starts the worker for one context and waits for its hello: 0 with *out,
 * or an initialize return code (virgl.c lists them) with the reason
 * logged - the worker's own code when its backend failed (backend_lib.h).
 */
uint32_t apir_worker_link_open(const struct apir_worker_spec *spec, struct apir_worker_link **out);

/* Ends the worker (hang-up, then SIGKILL past a short grace) and frees. */
void apir_worker_link_close(struct apir_worker_link *l);

/* Where a command's request items go (len bytes after the header), or NULL
 * when they do not fit the command area. */
uint8_t *apir_worker_link_begin(struct apir_worker_link *l, size_t len);

/*
 * Sends the command begun (cmd_type, cmd_flags; the items written) and
 * waits for its answer: true with *ret, false when the worker is gone or
 * did not answer in time (it is then ended; every later call fails too).
 */
bool apir_worker_link_submit(struct apir_worker_link *l, int32_t cmd_type, int32_t cmd_flags, uint32_t *ret);

/* The last answer's reply items and their length, as the worker says,
 * bounded by the reply blob. */
const uint8_t *apir_worker_link_reply(struct apir_worker_link *l, size_t *len);

/* Gives the worker blob descriptor fd (a sealed memfd of size bytes or
 * more) under id, as the shm transport's guests do: true when it took it. */
bool apir_worker_link_blob_add(struct apir_worker_link *l, int fd, uint32_t id, uint64_t size);
void apir_worker_link_blob_remove(struct apir_worker_link *l, uint32_t id);

#endif
