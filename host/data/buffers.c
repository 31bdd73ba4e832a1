#include "buffers.h"

#include "apir_log.h"
#include "upload_mirror.h"
#include "weight_copies.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES ((uintptr_t)2 << 20)

/*
 * A guest's buffer in the host's memory (tcp: guests, zero copy off) and the
 * host's weight copies are written once, from end to end, as a model loads:
 * page by page, the faults of a VM's 4 KiB pages were a third of a 1B Q4_0
 * load over loopback TCP here (570-604 ms against 402-457 with huge pages;
 * docs/MEASUREMENTS.md).  Anonymous memory that asks gets huge pages where
 * transparent_hugepage/enabled is "madvise" ("always" gives them unasked,
 * "never" none).  Only the whole huge pages (2 MiB: x86-64's, and arm64's
 * with 4 KiB pages) inside the buffer are advised: nothing beyond it
 * changes, and the memory is what the buffer's size (the quota's) already
 * says.  Not by default where free memory goes back to a hypervisor
 * (the host's config, huge_pages: fresh huge pages are slower there).
 */
void apir_buffer_prefer_huge_pages(const struct apir_host_config *cfg, ggml_backend_buffer_t buf)
{
    if (!cfg->huge_pages || !buf || !ggml_backend_buffer_is_host(buf))
        return;
    const uintptr_t base = (uintptr_t)ggml_backend_buffer_get_base(buf);
    const size_t size = ggml_backend_buffer_get_size(buf);
    if (!base || size < HUGE_PAGE_BYTES || base > UINTPTR_MAX - size)
        return;
    const uintptr_t lo = (base + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
    const uintptr_t hi = (base + size) & ~(HUGE_PAGE_BYTES - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

bool apir_buffer_quota_ok(struct apir_session *s, uint64_t size)
{
    const struct apir_limits *lim = &s->host->cfg.limits;
    if (s->n_buffers >= lim->max_buffers) {
        apir_session_refuse_limit(s, "buffer quota reached (%u buffers, asking %llu bytes): --max-buffers %u",
                                  s->n_buffers, (unsigned long long)size, lim->max_buffers);
        return false;
    }
    if (size > apir_buffer_bytes_left(s)) {
        const bool by_default = lim->max_alloc_bytes == s->host->alloc_quota_default;
        apir_session_refuse_limit(s, "buffer quota reached (%llu bytes in %u buffers, asking %llu): --max-alloc-mib %llu%s",
                                  (unsigned long long)s->bytes_allocated, s->n_buffers, (unsigned long long)size,
                                  (unsigned long long)(lim->max_alloc_bytes >> 20),
                                  by_default ? " (the default: " APIR_ALLOC_QUOTA_SHARE_TEXT " of the device memory; 0: no limit)"
                                             : "");
        return false;
    }
    return true;
}

uint64_t apir_buffer_register(struct apir_session *s, ggml_backend_buffer_t buf, uint32_t device,
                              struct apir_blob *blob)
{
    struct apir_host_buffer *hb = calloc(1, sizeof(*hb));
    uint64_t handle = hb ? apir_handle_new(&s->handles, APIR_HANDLE_BUFFER, hb, 0) : 0;
    if (!handle) {
        free(hb);
        ggml_backend_buffer_free(buf);
        return 0;
    }
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, handle, APIR_HANDLE_BUFFER);
    hb->handle = handle;
    hb->buffer = buf;
    hb->base = ggml_backend_buffer_get_base(buf);
    hb->size = ggml_backend_buffer_get_size(buf);
    hb->device = device;
    hb->pinned_blob = blob ? blob->res_id : 0;
    hb->blob = blob ? apir_session_blob_hold(blob) : NULL;
    hb->opaque_base = ((uint64_t)apir_handle_slot_index(&s->handles, slot) + 1) << APIR_OPAQUE_BASE_SHIFT;
    s->n_buffers++;
    s->bytes_allocated += hb->size;
    if (!blob)
        apir_buffer_prefer_huge_pages(&s->host->cfg, buf);
    return handle;
}

void apir_buffer_forget_copies(struct apir_session *s, struct apir_host_buffer *hb, const void *data, size_t len)
{
    if (len == SIZE_MAX) {
        apir_mirror_forget_buffer(s, hb->buffer);
        apir_weights_forget_buffer(s, hb->buffer);
    } else {
        apir_mirror_forget_range(s, hb->buffer, data, len);
        apir_weights_forget_range(s, data, len);
    }
}

void apir_buffer_release(struct apir_session *s, struct apir_host_buffer *hb)
{
    apir_buffer_forget_copies(s, hb, NULL, SIZE_MAX);
    ggml_backend_buffer_free(hb->buffer);
    /* After the buffer: it is the blob's memory the buffer was made on. */
    if (hb->blob)
        apir_session_blob_put(s, hb->blob);
    s->n_buffers--;
    s->bytes_allocated -= hb->size;
    s->buffers_epoch++;
    apir_handle_free(&s->handles, hb->handle);
    free(hb);
}

void apir_buffers_release_all(struct apir_session *s)
{
    for (uint32_t i = 0; i < s->handles.capacity; i++) {
        struct apir_handle_slot *slot = &s->handles.slots[i];
        if (slot->kind == APIR_HANDLE_BUFFER)
            apir_buffer_release(s, slot->object);
    }
}
