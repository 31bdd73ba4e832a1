#include "host.h"

#include "apir_log.h"
#include "apir_proto.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Blob bytes are memory the guest committed and the host maps: at most half
 * the machine's RAM per guest, and never more than 64 GiB. */
static uint64_t default_blob_bytes(void)
{
    const uint64_t cap = 64ull << 30;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return cap;
    uint64_t half = (uint64_t)pages * (uint64_t)page / 2;
    return half < cap ? half : cap;
}

void apir_limits_default(struct apir_limits *l)
{
    l->max_buffers = 4096;
    l->max_alloc_bytes = UINT64_MAX;  /* the device's own memory is the limit */
    l->max_graph_nodes = 65536;
    l->max_graph_tensors = 262144;
    l->max_blobs = 1024;
    l->max_blob_bytes = default_blob_bytes();
    l->max_clients = 64;
    l->max_clients_per_uid = 16;
    l->spawn_per_s = 20;
    l->spawn_burst = 40;
    l->handshake_timeout_ms = 5000;
    l->graph_timeout_ms = 60000;
}

/*
 * ggml's own messages, filtered by our log level.  Its default logger prints
 * every level, debug included: CUDA writes a line per reused graph, i.e. per
 * token, into the host's log.  CONT continues the previous message's level.
 */
static _Thread_local enum ggml_log_level ggml_last_level = GGML_LOG_LEVEL_INFO;

static void ggml_log_filtered(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_CONT)
        level = ggml_last_level;
    ggml_last_level = level;
    enum apir_log_level need = level == GGML_LOG_LEVEL_ERROR  ? APIR_LOG_ERROR
                               : level == GGML_LOG_LEVEL_WARN ? APIR_LOG_WARN
                               : level == GGML_LOG_LEVEL_INFO ? APIR_LOG_INFO
                                                              : APIR_LOG_DEBUG;
    if (apir_log_get_level() >= need)
        fputs(text, stderr);
}

/* ggml's backend registry is process-wide; load it once. */
static pthread_once_t backends_once = PTHREAD_ONCE_INIT;
static const char *backends_dir;

static void load_backends_once(void)
{
    ggml_log_set(ggml_log_filtered, NULL);
    if (backends_dir && *backends_dir)
        ggml_backend_load_all_from_path(backends_dir);
    else
        ggml_backend_load_all();
}

void apir_host_load_backends(const char *backend_dir)
{
    backends_dir = backend_dir;
    pthread_once(&backends_once, load_backends_once);
}

/* Our own frontend may be on the backend path too: never serve it. */
static bool reg_is_usable(ggml_backend_reg_t reg)
{
    return strcmp(ggml_backend_reg_name(reg), "APIR") != 0 && strcmp(ggml_backend_reg_name(reg), "RPC") != 0 &&
           ggml_backend_reg_dev_count(reg) > 0;
}

bool apir_host_init(struct apir_host *host, const struct apir_host_config *cfg, char *err, size_t err_len)
{
    memset(host, 0, sizeof(*host));
    host->cfg = *cfg;
    apir_host_load_backends(cfg->backend_dir);

    ggml_backend_reg_t reg = NULL;
    if (cfg->backend_name && *cfg->backend_name) {
        reg = ggml_backend_reg_by_name(cfg->backend_name);
        if (!reg || !reg_is_usable(reg)) {
            snprintf(err, err_len, "backend '%s' not found or has no device (try --list-devices)", cfg->backend_name);
            return false;
        }
    } else {
        /* Default: the backend of the first GPU device, else CPU. */
        for (size_t i = 0; i < ggml_backend_dev_count() && !reg; i++) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU && reg_is_usable(ggml_backend_dev_backend_reg(dev)))
                reg = ggml_backend_dev_backend_reg(dev);
        }
        if (!reg)
            reg = ggml_backend_reg_by_name("CPU");
        if (!reg) {
            snprintf(err, err_len, "no ggml backend found (backend dir: %s)", cfg->backend_dir ? cfg->backend_dir : "default");
            return false;
        }
    }
    host->reg = reg;
    size_t n = ggml_backend_reg_dev_count(reg);
    if (cfg->device >= 0) {
        if ((size_t)cfg->device >= n) {
            snprintf(err, err_len, "backend %s has %zu device(s); --device %d is out of range", ggml_backend_reg_name(reg), n,
                     cfg->device);
            return false;
        }
        host->devices[0] = ggml_backend_reg_dev_get(reg, (size_t)cfg->device);
        host->n_devices = 1;
    } else {
        for (size_t i = 0; i < n && i < APIR_HOST_MAX_DEVICES; i++)
            host->devices[host->n_devices++] = ggml_backend_reg_dev_get(reg, i);
    }
    for (uint32_t i = 0; i < host->n_devices; i++) {
        APIR_INFO("host", "serving device %u: %s (%s)", i, ggml_backend_dev_name(host->devices[i]),
                  ggml_backend_dev_description(host->devices[i]));
        if (cfg->pin_shared_memory && !ggml_backend_buft_is_host(ggml_backend_dev_buffer_type(host->devices[i])))
            host->pin_shared = true;
    }
    return true;
}

void apir_host_print_devices(const char *backend_dir, void *out_file)
{
    FILE *out = out_file;
    apir_host_load_backends(backend_dir);
    for (size_t r = 0; r < ggml_backend_reg_count(); r++) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(r);
        if (!reg_is_usable(reg))
            continue;
        fprintf(out, "backend %s\n", ggml_backend_reg_name(reg));
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
            size_t free_mem = 0, total = 0;
            ggml_backend_dev_memory(dev, &free_mem, &total);
            fprintf(out, "  device %zu: %s - %s (%zu MiB free of %zu MiB)\n", i, ggml_backend_dev_name(dev),
                    ggml_backend_dev_description(dev), free_mem >> 20, total >> 20);
        }
    }
}

/* APIR_HOST_<name> unset or anything but "0": on. */
static bool switch_on(const char *name)
{
    const char *v = getenv(name);
    return !(v && !strcmp(v, "0"));
}

void apir_host_config_default(struct apir_host_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = -1;
    apir_limits_default(&cfg->limits);
    const char *prof = getenv("APIR_HOST_OP_PROFILE");
    cfg->op_profile = prof && !strcmp(prof, "1");
    cfg->pin_shared_memory = switch_on("APIR_HOST_PIN");
    cfg->async_uploads = switch_on("APIR_HOST_ASYNC_UPLOADS");
    cfg->weight_copies = switch_on("APIR_HOST_WEIGHT_COPIES");
    cfg->defer_graphs = switch_on("APIR_HOST_DEFER");
}
