/*
 * Tensor records for tests that speak APIR to a host directly (the
 * dispatcher, the virgl library, the reference interop).
 */
#ifndef APIR_TEST_RECORDS_H
#define APIR_TEST_RECORDS_H

#include "apir_tensor.h"
#include "ggml.h"

#include <string.h>

/* A 1-D f32 tensor of n elements at offset in buffer (a handle). */
static inline struct apir_tensor_rec f32_rec(uint64_t id, uint64_t buffer, uint64_t offset, uint32_t n)
{
    struct apir_tensor_rec t;
    memset(&t, 0, sizeof(t));
    t.id = id;
    t.type = GGML_TYPE_F32;
    t.buffer = buffer;
    t.ne[0] = n;
    t.ne[1] = t.ne[2] = t.ne[3] = 1;
    t.nb[0] = 4;
    t.nb[1] = t.nb[2] = t.nb[3] = 4 * n;
    t.data = offset;
    return t;
}

#endif
