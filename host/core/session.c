#include "session.h"
#include "pin.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void apir_session_init(struct apir_session *s, struct apir_host *host, const char *name)
{
    s->host = host;
    s->minor = APIR_VERSION_MINOR_REFERENCE;
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "session");
    apir_log_budget_init(&s->log, s->name, host->cfg.limits.guest_log_per_s, host->cfg.limits.guest_log_burst);
    /* The default memory quota is sized from the devices here, where the
     * guest's own process (or thread) will use them anyway (host.h). */
    apir_host_resolve_alloc_quota(host);
    /* buffers + one buffer type per device */
    apir_handles_init(&s->handles, host->cfg.limits.max_buffers + APIR_HOST_MAX_DEVICES);
    for (uint32_t i = 0; i < host->n_devices; i++) {
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(host->devices[i]);
        s->buft_handles[i] = apir_handle_new(&s->handles, APIR_HANDLE_BUFT, buft, i);
    }
}

static void blob_unmap(struct apir_blob *b)
{
    if (b->page_locked)
        apir_unpin(b->ptr);
    b->page_locked = false;
    if (b->release)
        b->release(b->ptr, b->size, b->release_user);
    b->release = NULL;
}

void apir_session_release(struct apir_session *s)
{
    apir_handles_destroy(&s->handles);
    for (uint32_t i = 0; i < s->n_blobs; i++) {
        blob_unmap(s->blobs[i]);
        free(s->blobs[i]);
    }
    free(s->blobs);
    for (uint32_t i = 0; i < APIR_HOST_MAX_DEVICES; i++)
        if (s->backends[i])
            ggml_backend_free(s->backends[i]);
}

/* Any blob still mapped under res_id, closing or not; NULL if none. */
static struct apir_blob *blob_any(struct apir_session *s, uint32_t res_id)
{
    for (uint32_t i = 0; i < s->n_blobs; i++)
        if (s->blobs[i]->res_id == res_id)
            return s->blobs[i];
    return NULL;
}

struct apir_blob *apir_session_blob_find(struct apir_session *s, uint32_t res_id)
{
    struct apir_blob *b = blob_any(s, res_id);
    return b && !b->closing ? b : NULL;
}

bool apir_session_blob_add(struct apir_session *s, uint32_t res_id, void *ptr, size_t size,
                           void (*release)(void *, size_t, void *), void *user)
{
    const struct apir_limits *lim = &s->host->cfg.limits;
    const struct apir_blob *old = res_id ? blob_any(s, res_id) : NULL;
    if (res_id == 0 || old) {
        if (old && old->closing)
            APIR_WARN("host", "%s: blob res_id %u refused: the blob destroyed under that id is still wrapped by %u "
                      "buffer(s); free them first", s->name, res_id, old->refs);
        else
            APIR_WARN("host", "%s: blob res_id %u is 0 or already in use", s->name, res_id);
        return false;
    }
    if (s->n_blobs >= lim->max_blobs || size > lim->max_blob_bytes - s->blob_bytes) {
        APIR_WARN("host", "%s: blob limit reached (%u blobs, %llu bytes, destroyed ones still wrapped by a buffer "
                  "included)", s->name, s->n_blobs, (unsigned long long)s->blob_bytes);
        return false;
    }
    if (s->n_blobs == s->blobs_cap) {
        uint32_t cap = s->blobs_cap ? s->blobs_cap * 2 : 8;
        struct apir_blob **t = realloc(s->blobs, cap * sizeof(*t));
        if (!t)
            return false;
        s->blobs = t;
        s->blobs_cap = cap;
    }
    struct apir_blob *b = malloc(sizeof(*b));
    if (!b)
        return false;
    *b = (struct apir_blob){
        .res_id = res_id, .refs = 1, .ptr = ptr, .size = size, .release = release, .release_user = user,
        .page_locked = s->host->pin_shared && size != SIZE_MAX && apir_pin(ptr, size),
    };
    s->blobs[s->n_blobs++] = b;
    s->blob_bytes += size;
    return true;
}

struct apir_blob *apir_session_blob_hold(struct apir_blob *b)
{
    b->refs++;
    return b;
}

void apir_session_blob_put(struct apir_session *s, struct apir_blob *b)
{
    if (--b->refs)
        return;
    /* The last reference: the table's went when the guest destroyed it. */
    for (uint32_t i = 0; i < s->n_blobs; i++) {
        if (s->blobs[i] != b)
            continue;
        s->blobs[i] = s->blobs[--s->n_blobs];
        break;
    }
    s->blob_bytes -= b->size;
    blob_unmap(b);
    free(b);
}

bool apir_session_blob_remove(struct apir_session *s, uint32_t res_id)
{
    struct apir_blob *b = apir_session_blob_find(s, res_id);
    if (!b)
        return false;
    b->closing = true;
    apir_session_blob_put(s, b);  /* the table's reference */
    return true;
}

uint8_t *apir_session_blob_range(struct apir_session *s, uint32_t res_id, uint64_t offset, uint64_t size)
{
    struct apir_blob *b = apir_session_blob_find(s, res_id);
    if (b) {
        uint64_t end;
        if (__builtin_add_overflow(offset, size, &end) || end > b->size)
            return NULL;
        return b->ptr + offset;
    }
    return NULL;
}

ggml_backend_t apir_session_backend(struct apir_session *s, uint32_t device)
{
    if (device >= s->host->n_devices)
        return NULL;
    if (s->backends[device])
        return s->backends[device];
    ggml_backend_dev_t dev = s->host->devices[device];
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    if (!be) {
        APIR_ERROR("host", "%s: cannot start a backend stream on %s", s->name, ggml_backend_dev_name(dev));
        return NULL;
    }
    if (s->host->cfg.n_threads > 0) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        typedef void (*set_threads_fn)(ggml_backend_t, int);
        set_threads_fn set_threads = (set_threads_fn)ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
        if (set_threads)
            set_threads(be, s->host->cfg.n_threads);
    }
    struct ggml_backend_dev_props props;
    ggml_backend_dev_get_props(dev, &props);
    s->backend_async[device] = props.caps.async && s->host->cfg.async_uploads;
    s->computes_sync[device] = !props.caps.async;
    s->backends[device] = be;
    return be;
}

void apir_session_refuse_limit(struct apir_session *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->limit_why, sizeof(s->limit_why), fmt, ap);
    va_end(ap);
    APIR_WARN("host", "%s: %s", s->name, s->limit_why);
}
