/*
 * LD_PRELOAD helper for the VM checks: the reference guest library reports
 * the host device's own type, so a host serving the CPU backend appears as
 * a CPU-type device "[virtgpu] CPU", and llama.cpp (and apir-llama-greedy,
 * which treats a CPU-type device as "everything on the CPU") never offloads
 * to it.  Our guest reports such a device as a GPU (guest/frontend_device.c).
 * This makes ggml_backend_dev_type() say GPU for devices whose name starts
 * with "[virtgpu] ", so that the reference guest's greedy decode runs on the
 * remote device as ours does.  Nothing else changes.
 */
#define _GNU_SOURCE
#include "ggml-backend.h"

#include <dlfcn.h>
#include <string.h>

enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device)
{
    static enum ggml_backend_dev_type (*real)(ggml_backend_dev_t);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "ggml_backend_dev_type");
    if (!real)
        return GGML_BACKEND_DEVICE_TYPE_CPU;
    enum ggml_backend_dev_type t = real(device);
    const char *name = ggml_backend_dev_name(device);
    if (t == GGML_BACKEND_DEVICE_TYPE_CPU && name && strncmp(name, "[virtgpu] ", 10) == 0)
        return GGML_BACKEND_DEVICE_TYPE_GPU;
    return t;
}
