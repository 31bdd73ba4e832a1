/*
 * The backend of a libapir-virgl.so worker: the ggml backend library the
 * hypervisor's configuration names (ggml.library.path, ggml.library.reg),
 * loaded in the worker process - apir-host --serve-fd --backend-library -
 * never in the hypervisor.  Linked into apir-host by virgl.cmake.
 */
#ifndef APIR_BACKEND_LIB_H
#define APIR_BACKEND_LIB_H

#include "host.h"

#include <stdint.h>

/* The registration function every GGML_BACKEND_DL library exports. */
#define APIR_VIRGL_DEFAULT_REG "ggml_backend_init"

/*
 * Loads the backend library `path` through its registration function `sym`
 * and fills host with its devices (cfg->device: one of them, or all) the
 * way apir_host_init does for the daemon's backend.  Returns 0, or the
 * initialize return code virglrenderer's guest sees (libapir-virgl's
 * virgl.c lists them): the worker exits with it, and the library returns
 * it from apir_backend_initialize.  The reason is logged.
 */
uint32_t apir_virgl_backend_open(struct apir_host *host, const struct apir_host_config *cfg, const char *path,
                                 const char *sym);

#endif
