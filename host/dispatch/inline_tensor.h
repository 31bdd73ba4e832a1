#ifndef APIR_INLINE_TENSOR_H
#define APIR_INLINE_TENSOR_H

#include "session.h"

/* sizeof(struct ggml_tensor) of the pinned ggml on x86-64. */
#define APIR_INLINE_TENSOR_SIZE 336

/* Decodes an APIR 0.1 inline tensor into a fresh, checked tensor in sc
 * (its srcs too; sc is begun here); NULL and a fatal decoder on malformed
 * input, NULL alone when a check refuses it. */
struct ggml_tensor *apir_import_inline(struct apir_session *s, struct apir_import_scratch *sc, struct apir_decoder *dec);

#endif
