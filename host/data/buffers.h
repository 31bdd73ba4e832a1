/*
 * The session's backend buffers: made under a handle with an opaque base
 * address and within the session's quota, and released in one place (a
 * guest's BUFFER_FREE_BUFFER and the session's end both come here, so the
 * counters, blob references and host copies stay in step).
 */
#ifndef APIR_BUFFERS_H
#define APIR_BUFFERS_H

#include "session.h"

/* Where the opaque base addresses of buffers live: slot i at (i+1) << 40,
 * so buffers up to 1 TiB never overlap and no host address leaks. */
#define APIR_OPAQUE_BASE_SHIFT 40
#define APIR_MAX_BUFFER_SIZE (1ull << APIR_OPAQUE_BASE_SHIFT)

/* Bytes the session may still allocate under --max-alloc-mib.  What is
 * charged is what backends really allocated, which may round a request up
 * past the quota: then nothing is left (never a wrapped difference). */
static inline uint64_t apir_buffer_bytes_left(const struct apir_session *s)
{
    uint64_t max = s->host->cfg.limits.max_alloc_bytes;
    return s->bytes_allocated < max ? max - s->bytes_allocated : 0;
}

/* Whether the session may hold another buffer of size bytes (logs if not). */
bool apir_buffer_quota_ok(struct apir_session *s, uint64_t size);

/* Registers buf under a new handle; frees buf and returns 0 on failure.
 * blob: the blob buf wraps (BUFFER_FROM_PTR), else NULL; the buffer holds
 * a reference to it until it is released, so the blob stays mapped (and
 * its res_id taken) as long as the buffer lives, destroyed or not. */
uint64_t apir_buffer_register(struct apir_session *s, ggml_backend_buffer_t buf, uint32_t device,
                              struct apir_blob *blob);

/* Asks the kernel for huge pages for a buffer in this process's memory (a
 * CPU backend's; a no-op for device memory and blobs): on a VM every 4 KiB
 * page of it costs a fault when its bytes first arrive.  Where cfg's
 * huge_pages says so (APIR_HOST_HUGEPAGES, host.h). */
void apir_buffer_prefer_huge_pages(const struct apir_host_config *cfg, ggml_backend_buffer_t buf);

/* [data, data+len) of hb is about to change: the host's copies of those
 * bytes - upload mirrors (upload_mirror.c), weight copies
 * (weight_copies.c) - are old.  len SIZE_MAX: the whole buffer. */
void apir_buffer_forget_copies(struct apir_session *s, struct apir_host_buffer *hb, const void *data, size_t len);

/* Frees hb, its handle, its copies and its blob reference (the last one of
 * a destroyed blob unmaps it); kept graphs that may point into it stop
 * being reused (buffers_epoch). */
void apir_buffer_release(struct apir_session *s, struct apir_host_buffer *hb);

/* Every buffer of the session (its end). */
void apir_buffers_release_all(struct apir_session *s);

#endif
