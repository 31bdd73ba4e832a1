/*
 * Host-side copies of uploads into device memory: the mirror of small ones,
 * kept for the index checks, and the stage of larger ones (below).
 *
 * The index checks of op_policy.c must read index values before an op runs.
 * In host memory that is a plain read; in device memory (CUDA, Vulkan) it
 * would be a device-to-host copy and a stream sync on every token.  Index
 * tensors are small inputs the guest uploads before each compute, so the
 * upload itself keeps a host copy: the bytes are copied out of the shared
 * blob once, uploaded from that private copy, and remembered.  A check then
 * reads the copy - exactly what the device holds.
 *
 * A copy is dropped when anything else may write its range: another upload,
 * memset, clear, copy, the buffer being freed, or a graph that writes to the
 * buffer (a computed graph drops every copy of the buffers it writes).
 */
#ifndef APIR_UPLOAD_MIRROR_H
#define APIR_UPLOAD_MIRROR_H

#include "session.h"

#define APIR_MIRROR_MAX_BYTES (64u * 1024u)
#define APIR_MIRROR_ENTRIES 32

/* The session's mirror (s->mirror); NULL when memory cannot be had. */
struct apir_mirror *apir_mirror_new(void);
/* Nothing may be in flight (apir_session_settle). */
void apir_mirror_free(struct apir_mirror *m);

/* Uploads [offset, offset+size) of t from src (shared memory) through a
 * private copy: up to APIR_MIRROR_MAX_BYTES one it keeps; larger, while a
 * graph of the session is on a GPU, one in the stage (cfg.stage_bytes of
 * page-locked memory), queued behind that graph instead of waiting for it.
 * False: neither (host memory; too big; an idle device, where the plain
 * copy is cheaper); the caller uploads the plain way. */
bool apir_mirror_upload(struct apir_session *s, struct ggml_tensor *t, const uint8_t *src, uint64_t offset, uint64_t size);
/* The kept copy of [data, data+len) of buf, or NULL. */
const uint8_t *apir_mirror_find(struct apir_session *s, ggml_backend_buffer_t buf, const void *data, size_t len);
void apir_mirror_forget_range(struct apir_session *s, ggml_backend_buffer_t buf, const void *data, size_t len);
void apir_mirror_forget_buffer(struct apir_session *s, ggml_backend_buffer_t buf);
/* After a graph ran: forget the copies of every buffer it wrote. */
void apir_mirror_forget_written(struct apir_session *s, struct ggml_cgraph *graph);

/* Uploads queued on a backend stream from mirror memory and not yet known
 * complete (their source may not be reused before); a staged batch counts
 * as one. */
uint32_t apir_mirror_uploads_in_flight(const struct apir_session *s);
/* Stage memory outgrown while a graph ran, to be freed at the next settle
 * (upload_mirror.c: giving it back would wait for the device). */
uint32_t apir_mirror_stage_retired(const struct apir_session *s);
/* apir_session_settle: waits for those uploads.  synced: a stream the
 * caller has just synchronized (or NULL); uploads queued on it are done. */
void apir_mirror_wait_uploads(struct apir_session *s, ggml_backend_t synced);

/* Waits for the graph in flight (session.h, graph_in_flight; a keyed graph
 * launched and not waited for, so that queries are answered meanwhile) and
 * for the uploads above: before anything that may reach the same memory
 * other than through the stream they are on. */
void apir_session_settle(struct apir_session *s);

#endif
