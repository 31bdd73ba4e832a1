/*
 * The guest's side of the host's weight cache (apir 0.4; the host's side and
 * what it guarantees: host/data/weight_cache.h).  A weight written whole into a
 * buffer whose bytes travel to the host (not a zero-copy buffer, which the
 * host already shares) is first offered by its digest - from apir 0.5 the
 * tree digest (protocol/apir_tree_digest.h), its 4 MiB leaves hashed on
 * APIR_HASH_THREADS threads (default min(cores, 8)), against a 0.4 host
 * plain SHA-256 -:
 * BUFFER_SET_TENSOR_HASH fills it from the host's cache when the host holds
 * those bytes, and nothing else crosses.  After a miss the weight is
 * uploaded as usual and BUFFER_CACHE_TENSOR asks the host to keep it (the
 * host hashes it itself).
 *
 * Only weights (buffer usage WEIGHTS, offset 0, the whole tensor) of at
 * least APIR_HASH_MIN_KB KiB (default 1024) are hashed, and only while the
 * device's host has a cache: its first answer "no cache" turns it off for
 * the device, so a program against a host without one hashes one weight.
 * APIR_WEIGHT_CACHE=0 turns it off in the guest.
 *
 * The hashing threads live only while one weight is hashed: a library
 * leaves no thread behind, and a weight of one leaf starts none.
 *
 * SHA-256 comes from GnuTLS, loaded when first needed (dlopen): the guest
 * library itself needs nothing beyond glibc (README, Containers); without
 * libgnutls.so.30 the cache is simply not used.
 */
#include "weight_cache_guest.h"

#include "calls.h"
#include "frontend.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "apir_tree_digest.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* gnutls_hash_fast(GNUTLS_DIG_SHA256 = 6, ...) and the init/hash/deinit
 * triple, as gnutls/crypto.h declares them (gnutls_hash_hd_t is a
 * pointer); not included, so building the guest needs no GnuTLS headers. */
#define APIR_GNUTLS_DIG_SHA256 6
typedef int (*gnutls_hash_fast_fn)(int algorithm, const void *text, size_t textlen, void *digest);
typedef int (*gnutls_hash_init_fn)(void **handle, int algorithm);
typedef int (*gnutls_hash_fn)(void *handle, const void *text, size_t textlen);
typedef void (*gnutls_hash_deinit_fn)(void *handle, void *digest);

static struct {
    pthread_once_t once;
    gnutls_hash_fast_fn hash_fast;
    gnutls_hash_init_fn hash_init;
    gnutls_hash_fn hash;
    gnutls_hash_deinit_fn hash_deinit;
    size_t min_bytes;
    bool off;
} wc = { PTHREAD_ONCE_INIT, NULL, NULL, NULL, NULL, 0, false };

/* The tree digest's SHA-256 (apir_tree_digest.h), through the loaded
 * GnuTLS. */
static bool sha256_parts(const void *const *parts, const size_t *lens, int n, uint8_t out[32])
{
    void *hh = NULL;
    if (wc.hash_init(&hh, APIR_GNUTLS_DIG_SHA256) != 0)
        return false;
    bool ok = true;
    for (int i = 0; i < n; i++)
        ok = ok && wc.hash(hh, parts[i], lens[i]) == 0;
    wc.hash_deinit(hh, out);
    return ok;
}

static void wc_init(void)
{
    const char *v = getenv("APIR_WEIGHT_CACHE");
    if (v && !strcmp(v, "0")) {
        wc.off = true;
        return;
    }
    const char *kb = getenv("APIR_HASH_MIN_KB");
    char *end = NULL;
    unsigned long long n = kb && *kb ? strtoull(kb, &end, 10) : 1024;
    if (kb && *kb && (!end || *end))
        n = 1024;
    wc.min_bytes = (size_t)(n ? n : 1) * 1024;
    void *lib = dlopen("libgnutls.so.30", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        wc.hash_fast = (gnutls_hash_fast_fn)dlsym(lib, "gnutls_hash_fast");
        wc.hash_init = (gnutls_hash_init_fn)dlsym(lib, "gnutls_hash_init");
        wc.hash = (gnutls_hash_fn)dlsym(lib, "gnutls_hash");
        wc.hash_deinit = (gnutls_hash_deinit_fn)dlsym(lib, "gnutls_hash_deinit");
    }
    if (!wc.hash_fast || !wc.hash_init || !wc.hash || !wc.hash_deinit) {
        APIR_INFO("guest", "weight cache not used: no libgnutls.so.30 for SHA-256 (%s)", lib ? "no symbol" : dlerror());
        wc.off = true;
    }
}

bool apir_weight_cache_set(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, const void *data, size_t offset,
                           size_t size, struct apir_weight_cache_pending *pending)
{
    pending->upload_then_keep = false;
    struct apir_buffer_ctx *bc = buffer->context;
    struct apir_device *d = bc->device;
    struct apir_remote *r = &d->remote;
    /* Cheap tests first: most writes are not weights, or not this size. */
    if (!apir_minor_speaks(r->minor, APIR_CMD_BUFFER_SET_TENSOR_HASH) || d->weight_cache_off || bc->mapped || bc->file_backed || tensor->view_src || offset != 0 ||
        size != ggml_nbytes(tensor) || ggml_backend_buffer_get_usage(buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS ||
        !apir_buffer_live(bc))
        return false;
    pthread_once(&wc.once, wc_init);
    if (wc.off || size < wc.min_bytes)
        return false;
    struct apir_tensor_rec rec;
    if (!apir_tensor_to_rec(tensor, &rec, true))
        return false;
    /* The kind the host expects at this minor (host/data/weight_cache.h). */
    if (r->minor >= APIR_WCACHE_TREE_MINOR
            ? !apir_tree_digest(sha256_parts, data, -1, -1, size, apir_hash_threads(), pending->hash.b)
            : wc.hash_fast(APIR_GNUTLS_DIG_SHA256, data, size, pending->hash.b) != 0)
        return false;
    uint32_t answer = APIR_WCACHE_MISS;
    apir_inputs_flush(d);
    int rc = apir_call_BUFFER_SET_TENSOR_HASH(r, bc->handle, &rec, offset, size, &pending->hash, &answer);
    if ((rc == APIR_HANDLER_OK && answer == APIR_WCACHE_NONE) || rc == APIR_HANDLER_INVALID_INDEX) {
        APIR_DEBUG("guest", "%s: the host has no weight cache: weights are sent whole", d->name);
        d->weight_cache_off = true;
        return false;
    }
    if (rc != APIR_HANDLER_OK)
        return false;  /* refused, or the host is gone: the upload says what it says */
    if (answer == APIR_WCACHE_DONE) {
        APIR_DEBUG("guest", "%s: '%s' (%zu bytes) from the host's weight cache", d->name, tensor->name, size);
        return true;
    }
    pending->upload_then_keep = true;
    return false;
}

void apir_weight_cache_uploaded(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor,
                                const struct apir_weight_cache_pending *pending)
{
    if (!pending->upload_then_keep)
        return;
    struct apir_buffer_ctx *bc = buffer->context;
    struct apir_device *d = bc->device;
    struct apir_tensor_rec rec;
    if (!apir_buffer_live(bc) || !apir_tensor_to_rec(tensor, &rec, true))
        return;
    uint32_t answer = APIR_WCACHE_MISS;
    apir_inputs_flush(d);
    int rc = apir_call_BUFFER_CACHE_TENSOR(&d->remote, bc->handle, &rec, &pending->hash, &answer);
    if ((rc == APIR_HANDLER_OK && answer == APIR_WCACHE_NONE) || rc == APIR_HANDLER_INVALID_INDEX)
        d->weight_cache_off = true;
}
