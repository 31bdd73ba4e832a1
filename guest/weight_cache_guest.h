/*
 * The guest's side of the host's weight cache (apir 0.4): what is sent and
 * when, guest/weight_cache.c; the host's side, host/data/weight_cache.h.
 */
#ifndef APIR_GUEST_WEIGHT_CACHE_H
#define APIR_GUEST_WEIGHT_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "apir_codec.h"
#include "ggml-backend.h"

/* What a miss leaves to do once the bytes are uploaded. */
struct apir_weight_cache_pending {
    bool upload_then_keep;
    struct apir_digest hash;
};

/* At the top of a buffer's set_tensor: true when the host filled the range
 * from its cache (nothing more to send).  False: upload as usual, then call
 * apir_weight_cache_uploaded with the same pending. */
bool apir_weight_cache_set(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, const void *data, size_t offset,
                           size_t size, struct apir_weight_cache_pending *pending);
/* After that upload: asks the host to keep the weight (a miss before). */
void apir_weight_cache_uploaded(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor,
                                const struct apir_weight_cache_pending *pending);

#endif
