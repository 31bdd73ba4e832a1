/*
 * The backend of a libapir-virgl.so worker (backend_lib.h): one library per
 * worker process, loaded once and never unloaded (the process ends with
 * its context).
 */
#include "backend_lib.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "ggml-backend-impl.h"

#include <dlfcn.h>
#include <string.h>

/* Returns 0 with *reg set, or an initialize return code. */
static uint32_t load(const char *path, const char *sym, ggml_backend_reg_t *reg)
{
    /* Our own dlopen first, to tell "cannot open" from "no symbol". */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *fn = handle ? dlsym(handle, sym) : NULL;
    if (!handle) {
        APIR_ERROR("virgl", "cannot open the ggml backend library %s: %s", path, dlerror());
        return APIR_LOAD_CANNOT_OPEN;
    }
    if (!fn) {
        APIR_ERROR("virgl", "%s has no registration function %s", path, sym);
        return APIR_LOAD_SYMBOL_MISSING;
    }
    ggml_backend_reg_t r;
    if (strcmp(sym, APIR_VIRGL_DEFAULT_REG) == 0) {
        r = ggml_backend_load(path);  /* score check, API version, ggml's registry */
    } else {
        ggml_backend_reg_t (*reg_fn)(void) = (ggml_backend_reg_t(*)(void))fn;
        r = reg_fn();
        if (r && r->api_version != GGML_BACKEND_API_VERSION) {
            APIR_ERROR("virgl", "%s: backend API version %d, this library needs %d", path, r->api_version,
                       GGML_BACKEND_API_VERSION);
            r = NULL;
        }
    }
    if (!r) {
        APIR_ERROR("virgl", "%s: %s() registered no backend", path, sym);
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_REG_FAILED;
    }
    APIR_INFO("virgl", "loaded %s: backend %s, %zu device(s)", path, ggml_backend_reg_name(r), ggml_backend_reg_dev_count(r));
    *reg = r;
    return 0;
}

/* Our own frontend (a loop) and ggml-rpc (someone else's remote) are never
 * served, as in the daemon. */
static bool reg_is_servable(ggml_backend_reg_t reg)
{
    const char *name = ggml_backend_reg_name(reg);
    return strcmp(name, "APIR") != 0 && strcmp(name, "RPC") != 0 && ggml_backend_reg_dev_count(reg) > 0;
}

uint32_t apir_virgl_backend_open(struct apir_host *host, const struct apir_host_config *cfg, const char *path,
                                 const char *sym)
{
    memset(host, 0, sizeof(*host));
    host->cfg = *cfg;
    ggml_backend_reg_t reg = NULL;
    uint32_t code = load(path, sym && *sym ? sym : APIR_VIRGL_DEFAULT_REG, &reg);
    if (code)
        return code;
    host->reg = reg;
    if (!reg_is_servable(reg)) {
        APIR_ERROR("virgl", "backend %s cannot be served (no device, or a remoting backend)", ggml_backend_reg_name(reg));
        return APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE;
    }
    const size_t n = ggml_backend_reg_dev_count(reg);
    if (cfg->device >= 0) {
        if ((size_t)cfg->device >= n) {
            APIR_ERROR("virgl", "apir.device=%d but %s has %zu device(s)", cfg->device, ggml_backend_reg_name(reg), n);
            return APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE;
        }
        host->devices[host->n_devices++] = ggml_backend_reg_dev_get(reg, (size_t)cfg->device);
    } else {
        for (size_t i = 0; i < n && i < APIR_HOST_MAX_DEVICES; i++)
            host->devices[host->n_devices++] = ggml_backend_reg_dev_get(reg, i);
    }
    for (uint32_t i = 0; i < host->n_devices; i++) {
        if (!ggml_backend_buft_is_host(ggml_backend_dev_buffer_type(host->devices[i]))) {
            host->device_memory = true;
            host->pin_shared = cfg->pin_shared_memory;
        }
    }
    /* As apir_host_init: host memory is asked for without cost. */
    if (!host->device_memory)
        apir_host_resolve_alloc_quota(host);
    return 0;
}
