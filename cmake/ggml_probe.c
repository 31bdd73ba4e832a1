/* Run at configure time against the ggml libggml-apir.so is built for
 * (cmake/GgmlFeatures.cmake): what that ggml's own library answers about
 * itself, which the guest library compares with the program's ggml at load
 * (guest/frontend_compat.c).  Prints
 *   TENSOR_OVERHEAD;GRAPH_OVERHEAD_1;TYPE_COUNT;TYPE_DIGEST;VERSION;COMMIT */
#include <stdint.h>
#include <stdio.h>

#include "ggml.h"

int main(void)
{
    /* FNV-1a over the type names, each with its terminating NUL. */
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < GGML_TYPE_COUNT; i++) {
        const char *s = ggml_type_name((enum ggml_type)i);
        do {
            h = (h ^ (unsigned char)*s) * 1099511628211ull;
        } while (*s++);
    }
    printf("%zu;%zu;%d;0x%016llxull;%s;%s", ggml_tensor_overhead(), ggml_graph_overhead_custom(1, false),
           (int)GGML_TYPE_COUNT, (unsigned long long)h, ggml_version(), ggml_commit());
    return 0;
}
