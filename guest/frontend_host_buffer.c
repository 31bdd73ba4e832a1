/*
 * The device's host buffer type: guest memory that is a shared blob the host
 * has mapped, so tensor data between it and the device crosses no data area.
 *
 * llama.cpp keeps the CPU backend's compute buffer and the logits in the
 * first GPU's host buffer type (CUDA_Host, page-locked, natively).  Ours
 * puts them in shared memory: the scheduler's copy of the CPU-computed
 * embeddings into the device (4 MiB per 512-token batch of a 1B model) and
 * the logits read back each token then go straight between that memory and
 * the device (BUFFER_SET/GET_TENSOR_AT with the blob's res_id), with no copy
 * in the guest, and page-locked on a GPU host (host/core/pin.c).
 *
 * Offered only over transports whose blobs are shared memory, to a 0.2 host,
 * for devices that are not zero copy already.  APIR_HOST_BUFFER=0 turns it
 * off.  To the guest these are plain CPU buffers.
 */
#include "frontend.h"

#include "apir_log.h"

#include <stdlib.h>
#include <string.h>

struct apir_host_buffer_ctx {
    struct apir_device *device;
    struct apir_conn *conn;    /* the connection that knows res_id (a reference) */
    uint8_t *ptr;
    size_t size;
    uint32_t res_id;
};

static const char *host_buft_get_name(ggml_backend_buffer_type_t buft)
{
    return ((struct apir_device *)buft->device->context)->host_buft_name;
}

/* As ggml's CPU buffers (TENSOR_ALIGNMENT), rounded up to a cache line. */
static size_t host_buft_get_alignment(ggml_backend_buffer_type_t buft)
{
    (void)buft;
    return 64;
}

static bool host_buft_is_host(ggml_backend_buffer_type_t buft)
{
    (void)buft;
    return true;
}

static void host_blobs_forget(struct apir_device *d, const uint8_t *ptr)
{
    pthread_mutex_lock(&d->host_blobs_lock);
    for (uint32_t i = 0; i < d->n_host_blobs; i++)
        if (d->host_blobs[i].ptr == ptr) {
            d->host_blobs[i] = d->host_blobs[--d->n_host_blobs];
            break;
        }
    pthread_mutex_unlock(&d->host_blobs_lock);
}

bool apir_host_blob_find(struct apir_device *d, const void *data, size_t size, uint32_t *res_id, uint64_t *blob_offset)
{
    const uint8_t *p = data;
    bool found = false;
    pthread_mutex_lock(&d->host_blobs_lock);
    for (uint32_t i = 0; i < d->n_host_blobs && !found; i++) {
        const struct apir_host_blob *b = &d->host_blobs[i];
        /* A blob of a connection since replaced: unknown to this host. */
        if (b->generation != atomic_load(&d->remote.generation))
            continue;
        if (p >= b->ptr && size <= b->size && (size_t)(p - b->ptr) <= b->size - size) {
            *res_id = b->res_id;
            *blob_offset = (uint64_t)(p - b->ptr);
            found = true;
        }
    }
    pthread_mutex_unlock(&d->host_blobs_lock);
    return found;
}

static void host_buffer_free(ggml_backend_buffer_t buffer)
{
    struct apir_host_buffer_ctx *hc = buffer->context;
    struct apir_remote *r = &hc->device->remote;
    host_blobs_forget(hc->device, hc->ptr);
    pthread_mutex_lock(&r->lock);
    hc->conn->t->ops->blob_destroy(hc->conn->t, hc->res_id, hc->ptr, hc->size);
    apir_conn_put_locked(r, hc->conn);
    pthread_mutex_unlock(&r->lock);
    free(hc);
}

static void *host_buffer_get_base(ggml_backend_buffer_t buffer)
{
    return ((struct apir_host_buffer_ctx *)buffer->context)->ptr;
}

static void host_buffer_memset_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, uint8_t value,
                                      size_t offset, size_t size)
{
    (void)buffer;
    memset((uint8_t *)tensor->data + offset, value, size);
}

static void host_buffer_set_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, const void *data,
                                   size_t offset, size_t size)
{
    (void)buffer;
    memcpy((uint8_t *)tensor->data + offset, data, size);
}

static void host_buffer_get_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, void *data,
                                   size_t offset, size_t size)
{
    (void)buffer;
    memcpy(data, (const uint8_t *)tensor->data + offset, size);
}

static bool host_buffer_cpy_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor *src, struct ggml_tensor *dst)
{
    (void)buffer;
    if (!src->buffer || !ggml_backend_buffer_is_host(src->buffer))
        return false;
    memcpy(dst->data, src->data, ggml_nbytes(src));
    return true;
}

static void host_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value)
{
    struct apir_host_buffer_ctx *hc = buffer->context;
    memset(hc->ptr, value, hc->size);
}

static const struct ggml_backend_buffer_i host_buffer_iface = {
    .free_buffer = host_buffer_free,
    .get_base = host_buffer_get_base,
    .init_tensor = NULL,
    .memset_tensor = host_buffer_memset_tensor,
    .set_tensor = host_buffer_set_tensor,
    .get_tensor = host_buffer_get_tensor,
#if APIR_GGML_HAS_BUFFER_2D
    .set_tensor_2d = NULL,
    .get_tensor_2d = NULL,
#endif
    .cpy_tensor = host_buffer_cpy_tensor,
    .clear = host_buffer_clear,
    .reset = NULL,
};

static ggml_backend_buffer_t host_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size)
{
    struct apir_device *d = buft->device->context;
    struct apir_remote *r = &d->remote;
    struct apir_host_buffer_ctx *hc = calloc(1, sizeof(*hc));
    if (!hc)
        return NULL;
    hc->device = d;
    hc->size = size ? size : 1;
    void *ptr = NULL;
    pthread_mutex_lock(&r->lock);
    int rc = apir_device_ready_locked(d, "a shared host buffer") ? r->t->ops->blob_create(r->t, hc->size, &hc->res_id, &ptr)
                                                                 : -1;
    hc->conn = apir_remote_conn_get_locked(r);
    pthread_mutex_unlock(&r->lock);
    hc->ptr = ptr;
    pthread_mutex_lock(&d->host_blobs_lock);
    bool listed = rc == 0 && d->n_host_blobs < APIR_MAX_HOST_BLOBS;
    if (listed)
        d->host_blobs[d->n_host_blobs++] = (struct apir_host_blob){
            .ptr = hc->ptr, .size = hc->size, .res_id = hc->res_id, .generation = hc->conn->generation,
        };
    pthread_mutex_unlock(&d->host_blobs_lock);
    if (!listed) {
        /* Out of shared memory or of table slots: a plain CPU buffer does. */
        APIR_WARN("guest", "%s: no shared host buffer of %zu bytes; using a CPU buffer", d->name, size);
        pthread_mutex_lock(&r->lock);
        if (rc == 0)
            hc->conn->t->ops->blob_destroy(hc->conn->t, hc->res_id, hc->ptr, hc->size);
        apir_conn_put_locked(r, hc->conn);
        pthread_mutex_unlock(&r->lock);
        free(hc);
        return ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), size);
    }
    return ggml_backend_buffer_init(buft, host_buffer_iface, hc, size);
}

static const struct ggml_backend_buffer_type_i host_buft_iface = {
    .get_name = host_buft_get_name,
    .alloc_buffer = host_buft_alloc_buffer,
    .get_alignment = host_buft_get_alignment,
    .get_max_size = NULL,
    .get_alloc_size = NULL,
    .is_host = host_buft_is_host,
};

void apir_host_buft_setup(struct apir_device *d)
{
    const char *env = getenv("APIR_HOST_BUFFER");
    pthread_mutex_init(&d->host_blobs_lock, NULL);
    d->has_host_buft = d->remote.t->blobs_shared && apir_minor_has(d->remote.minor, APIR_FEATURE_HOST_BUFFER) && !d->zero_copy && !(env && !strcmp(env, "0"));
    snprintf(d->host_buft_name, sizeof(d->host_buft_name), "%s_Host", d->name);
    d->host_buft.iface = host_buft_iface;
    d->host_buft.device = &d->dev;
    d->host_buft.context = NULL;
}
