/*
 * Page-locking guest shared memory for a discrete GPU's copy engines.
 *
 * Tensor data crosses between a guest and the GPU through shared memory
 * (the data area, blobs) and the upload mirror.  A CUDA copy from pageable
 * memory goes through a driver staging buffer and waits for it: on the
 * H200 machine a 128 KiB download took 31 us that way, a per-token cost the
 * native program does not pay (its inputs and logits live in page-locked
 * CUDA_Host buffers).  Page-locked, the copy engines read and write our
 * memory directly.
 *
 * ggml's own hook (ggml_backend_register_host_buffer) registers read-only,
 * for mmapped model files, and only under GGML_CUDA_REGISTER_HOST; our
 * downloads write into the memory.  So the host asks the CUDA runtime that
 * ggml-cuda already loaded into this process: no CUDA runtime (another
 * backend, a static build), or a refusal, and the memory stays pageable -
 * slower, never wrong.  APIR_HOST_PIN=0 turns it off.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "pin.h"

#include "apir_log.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cudaError_t cudaHostRegister(void *, size_t, unsigned int) and
 * cudaHostUnregister(void *): cudaSuccess is 0. */
typedef int (*host_register_fn)(void *ptr, size_t size, unsigned int flags);
typedef int (*host_unregister_fn)(void *ptr);
typedef int (*get_last_error_fn)(void);
#define CUDA_HOST_REGISTER_PORTABLE 0x01u

/* Process-wide, as the runtime is: resolved once. */
static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;
static host_register_fn runtime_register;
static host_unregister_fn runtime_unregister;
static get_last_error_fn runtime_clear_error;

static int find_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "/libcudart.so")) {
        snprintf(data, 512, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

static void resolve_runtime(void)
{
    char path[512] = "";
    dl_iterate_phdr(find_cudart, path);
    if (!path[0])
        return;
    /* Already loaded by ggml-cuda: this only takes a reference. */
    void *lib = dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib)
        return;
    runtime_register = (host_register_fn)dlsym(lib, "cudaHostRegister");
    runtime_unregister = (host_unregister_fn)dlsym(lib, "cudaHostUnregister");
    runtime_clear_error = (get_last_error_fn)dlsym(lib, "cudaGetLastError");
    if (!runtime_register || !runtime_unregister || !runtime_clear_error) {
        runtime_register = NULL;
        runtime_unregister = NULL;
        return;
    }
    APIR_INFO("host", "page-locking shared memory through %s", path);
}

bool apir_pin(void *ptr, size_t size)
{
    pthread_once(&runtime_once, resolve_runtime);
    if (!runtime_register || !ptr || size == 0)
        return false;
    int err = runtime_register(ptr, size, CUDA_HOST_REGISTER_PORTABLE);
    if (err != 0) {
        /* Clear it: ggml-cuda checks cudaGetLastError after its launches
         * and would take our failure for its own. */
        runtime_clear_error();
        APIR_DEBUG("host", "cudaHostRegister of %zu bytes failed (error %d): copies stay pageable", size, err);
        return false;
    }
    return true;
}

void apir_unpin(void *ptr)
{
    if (runtime_unregister && ptr && runtime_unregister(ptr) != 0)
        runtime_clear_error();
}
