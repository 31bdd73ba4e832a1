/*
 * The node checks' verdict in tests (test_op_derive.c, test_strides.c): a
 * node accepted, or refused for the reason that names needle.
 */
#ifndef APIR_TEST_OP_CHECKS_H
#define APIR_TEST_OP_CHECKS_H

#include "ggml.h"
#include "op_shapes.h"
#include "test_util.h"

#include <string.h>

static inline const char *check(const struct ggml_tensor *t) { return apir_op_shape_error(t, false); }

#define ACCEPTED(t)                                                                          \
    do {                                                                                     \
        const char *why_ = check(t);                                                         \
        CHECK_MSG(why_ == NULL, "%s refused: %s", ggml_op_desc(t), why_);                    \
    } while (0)

#define REFUSED(t, needle)                                                                   \
    do {                                                                                     \
        const char *why_ = check(t);                                                         \
        CHECK_MSG(why_ != NULL && strstr(why_, needle), "%s: got %s", ggml_op_desc(t),       \
                  why_ ? why_ : "(accepted)");                                               \
    } while (0)

#endif
