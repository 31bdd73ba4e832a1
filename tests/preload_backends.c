/* libapir-preload-backends.so: loads ggml's backends when a program starts.
 *
 *   LD_PRELOAD=build/tests/libapir-preload-backends.so GGML_BACKEND_PATH=build/libggml-apir.so \
 *       .deps/bin/test-llama-archs -a llama
 *
 * Why: in a GGML_BACKEND_DL build a program sees only the backends someone
 * loads.  llama.cpp's tools do it (common_params_parse, llama_backend_init),
 * but some of its tests never call either -- test-llama-archs at the pinned
 * commit then finds no device at all and skips every case.  Preloading this
 * library runs ggml_backend_load_all() before main(): the CPU backend next to
 * the executable, plus GGML_BACKEND_PATH (the APIR frontend) when set, exactly
 * the devices a tool would see.  Only for programs that load no backends
 * themselves: ggml registers a library loaded twice twice.
 */
#include "ggml-backend.h"

__attribute__((constructor)) static void apir_preload_backends(void) {
    if (ggml_backend_reg_count() == 0) {
        ggml_backend_load_all();
    }
}
