/*
 * fuzz_inline: APIR 0.1 inline tensors (DEVICE_SUPPORTS_OP and
 * BUFFER_TYPE_GET_ALLOC_SIZE requests) through apir_import_inline.
 *
 * The raw structs carry guest pointers; the host must only test them
 * against NULL.  Per input: a fresh session with buffer FZ_H_BUF_A, the
 * input copied to an exact-size heap block, the handle after the first
 * struct rewritten (fuzz_format.h).  An accepted tensor then goes where the
 * two handlers send it: the device's supports_op and the buffer type's
 * get_alloc_size.  Oracle: it lies inside its buffer, if it has one.
 */
#include "fuzz_host.h"
#include "inline_tensor.h"

#include <stdlib.h>
#include <string.h>

FZ_INITIALIZE_HOST_ONLY()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_known k;
    struct apir_session *s = fz_session_new(&k);
    fz_alloc_buffer(s, FZ_BUF_A_SIZE, &k);

    uint8_t *req = fz_copy(data, size);
    bool known_hit = false;
    fz_patch_inline(req, size, &k, &known_hit);
    for (int pass = 0; pass < 2 && !(known_hit && fz_skipping_known()); pass++) {
        struct apir_decoder dec;
        apir_decoder_init(&dec, req, size);
        struct ggml_tensor *t = apir_import_inline(s, &s->scratch, &dec);
        if (!t)
            continue;
        /* Known finding 2: a buffer handle cut short makes the decoder
         * fatal, yet a tensor is returned (inline_tensor.h promises NULL).
         * The handlers check the decoder and refuse, as skipping does. */
        if (dec.fatal && fz_skipping_known())
            continue;
        FZ_ASSERT(!dec.fatal, "tensor returned from a fatal decode");
        fz_check_tensor(s, t, 0);
        for (int i = 0; i < GGML_MAX_SRC; i++)
            fz_check_tensor(s, t->src[i], 0);
        ggml_backend_dev_t dev = s->host->devices[s->device];
        (void)ggml_backend_dev_supports_op(dev, t);
        (void)ggml_backend_buft_get_alloc_size(ggml_backend_dev_buffer_type(dev), t);
    }
    free(req);
    apir_session_free(s);
    return 0;
}
