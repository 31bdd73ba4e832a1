#include "host.h"

#include "apir_build.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "cpus.h"
#include "fdpass.h"
#include "stream_proto.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
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
    l->max_alloc_bytes = APIR_ALLOC_QUOTA_AUTO;  /* a share of the devices' memory */
    l->max_graph_nodes = 65536;
    l->max_graph_tensors = 262144;
    l->max_blobs = 1024;
    l->max_blob_bytes = default_blob_bytes();
    l->max_clients = 64;
    /* Per tenant (a container, a uid, an address: host/server/admission.c).  16 of the
     * 64 places: four tenants that fill their share still leave room; a
     * program of one tenant starting more guests at once raises it
     * (--max-clients-per-tenant 64 --spawn-burst 64 for 64 guests). */
    l->max_clients_per_tenant = 16;
    /* Before the hello, per source: generous (a refusal costs as much as
     * serving the hello), only a bound on one source's churn. */
    l->connect_per_s = 50;
    l->connect_burst = 100;
    l->spawn_per_s = 20;
    l->spawn_burst = 40;
    l->handshake_timeout_ms = 5000;
    l->graph_timeout_ms = 60000;
    /* A guest refused at every command: 10 lines a second after the first
     * 100, instead of one per command (up to 2.5 GiB of log a minute). */
    l->guest_log_per_s = 10;
    l->guest_log_burst = 100;
}

void apir_host_resolve_alloc_quota(struct apir_host *host)
{
    struct apir_limits *l = &host->cfg.limits;
    if (l->max_alloc_bytes != APIR_ALLOC_QUOTA_AUTO)
        return;
    uint64_t total = 0;
    for (uint32_t i = 0; i < host->n_devices; i++) {
        size_t dev_free = 0, dev_total = 0;
        ggml_backend_dev_memory(host->devices[i], &dev_free, &dev_total);
        total += dev_total;
    }
    uint64_t quota = total / APIR_ALLOC_QUOTA_SHARE_DEN * APIR_ALLOC_QUOTA_SHARE_NUM;
    l->max_alloc_bytes = quota > APIR_ALLOC_QUOTA_FLOOR ? quota : APIR_ALLOC_QUOTA_FLOOR;
    host->alloc_quota_default = l->max_alloc_bytes;
    APIR_DEBUG("host", "memory quota per guest: %llu MiB (%u/%u of %llu MiB of device memory; --max-alloc-mib)",
               (unsigned long long)(l->max_alloc_bytes >> 20), APIR_ALLOC_QUOTA_SHARE_NUM, APIR_ALLOC_QUOTA_SHARE_DEN,
               (unsigned long long)(total >> 20));
}

/*
 * ggml's own messages, as lines of ours ("apir ggml: info: ..."), filtered
 * by our log level.  Its default logger prints
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
    apir_log_relay(need, "ggml", text);  /* our line format, whole lines */
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
    ggml_backend_dev_t named = NULL;
    if (cfg->device_name && *cfg->device_name) {
        /* rpc-server's -d: a device by its ggml name. */
        named = ggml_backend_dev_by_name(cfg->device_name);
        if (!named || !reg_is_usable(ggml_backend_dev_backend_reg(named))) {
            snprintf(err, err_len, "no device '%s' (try --list-devices)", cfg->device_name);
            return false;
        }
        reg = ggml_backend_dev_backend_reg(named);
        if (cfg->backend_name && *cfg->backend_name && strcasecmp(cfg->backend_name, ggml_backend_reg_name(reg)) != 0) {
            snprintf(err, err_len, "device %s belongs to backend %s, not %s", cfg->device_name, ggml_backend_reg_name(reg),
                     cfg->backend_name);
            return false;
        }
    } else if (cfg->backend_name && *cfg->backend_name) {
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
            snprintf(err, err_len, "no ggml backend found in %s (give --backend-dir DIR or APIR_BACKEND_DIR)",
                     cfg->backend_dir ? cfg->backend_dir : "the program's or the current folder");
            return false;
        }
    }
    host->reg = reg;
    size_t n = ggml_backend_reg_dev_count(reg);
    if (named) {
        host->devices[0] = named;
        host->n_devices = 1;
    } else if (cfg->device >= 0) {
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
        if (!ggml_backend_buft_is_host(ggml_backend_dev_buffer_type(host->devices[i]))) {
            host->device_memory = true;
            host->pin_shared = cfg->pin_shared_memory;
        }
    }
    /* Host memory is asked for without cost (apir_host_resolve_alloc_quota). */
    if (!host->device_memory)
        apir_host_resolve_alloc_quota(host);
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

/* APIR_HOST_<name> set to a decimal number below `limit`: true, in *out;
 * unset, empty or anything else: false (the caller's default stays). */
static bool env_number(const char *name, unsigned long long limit, unsigned long long *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return false;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end != '\0' || n >= limit)
        return false;
    *out = n;
    return true;
}

void apir_host_config_default(struct apir_host_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = -1;
    cfg->n_threads = apir_host_default_threads();
    apir_limits_default(&cfg->limits);
    const char *prof = getenv("APIR_HOST_OP_PROFILE");
    cfg->op_profile = prof && !strcmp(prof, "1");
    cfg->pin_shared_memory = switch_on("APIR_HOST_PIN");
    cfg->async_uploads = switch_on("APIR_HOST_ASYNC_UPLOADS");
    cfg->weight_copies = switch_on("APIR_HOST_WEIGHT_COPIES");
    cfg->defer_graphs = switch_on("APIR_HOST_DEFER");
    cfg->import_memo = switch_on("APIR_HOST_IMPORT_MEMO");
    unsigned long long n;
    cfg->send_piece_bytes = 128u * 1024u;
    if (env_number("APIR_HOST_SEND_PIECE_KB", 1024u * 1024u + 1, &n))
        cfg->send_piece_bytes = (size_t)n * 1024u;
    cfg->stage_bytes = (size_t)APIR_STAGE_MB_DEFAULT << 20;
    if (env_number("APIR_HOST_STAGE_MB", 4096 + 1, &n))
        cfg->stage_bytes = (size_t)n << 20;
    const char *st = getenv("APIR_HOST_TLS_SEND_THREAD");
    cfg->tls_send_thread = st && *st ? strcmp(st, "0") != 0 : apir_host_default_threads() >= 4;
    cfg->huge_pages = apir_huge_pages_wanted("APIR_HOST_HUGEPAGES");
    cfg->max_lanes = apir_host_default_threads() >= 4 ? APIR_STREAM_MAX_LANES : 0;
    if (env_number("APIR_HOST_LANES", APIR_STREAM_MAX_LANES + 1, &n))
        cfg->max_lanes = (uint32_t)n;
    /* The weight cache (weight_cache.h): opt-in, a directory. */
    const char *wc = getenv("APIR_HOST_WEIGHT_CACHE");
    cfg->weight_cache_dir = wc && *wc ? wc : NULL;
    cfg->weight_cache_max_bytes = (uint64_t)APIR_WEIGHT_CACHE_MAX_GIB_DEFAULT << 30;
    if (env_number("APIR_HOST_WEIGHT_CACHE_MAX_GIB", 1ull << 30, &n))
        cfg->weight_cache_max_bytes = n << 30;
}
/* ---- defaults that fit the machine ---------------------------------------- */

int apir_host_default_threads(void)
{
    return apir_usable_cpus();
}

/* The directory of this program, symbolic links resolved; false if unknown. */
static bool exe_dir(char *out, size_t len)
{
    char exe[PATH_MAX];
    if (!realpath("/proc/self/exe", exe))
        return false;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return false;
    *slash = '\0';
    return snprintf(out, len, "%s", exe) < (int)len;
}

const char *apir_host_default_backend_dir(char *buf, size_t len, const char **source)
{
    const char *src_dummy;
    if (!source)
        source = &src_dummy;
    const char *env = getenv("APIR_BACKEND_DIR");
    if (env && *env) {
        *source = "APIR_BACKEND_DIR";
        return env;
    }
    char dir[PATH_MAX], cand[PATH_MAX + 64];
    if (exe_dir(dir, sizeof(dir))) {
        /* Installed: PREFIX/bin/apir-host, PREFIX/lib/apir (CMakeLists.txt). */
        snprintf(cand, sizeof(cand), "%s/%s", dir, APIR_BIN_TO_GGML);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISDIR(st.st_mode) && realpath(cand, buf)) {
            *source = "installed beside the program";
            return buf;
        }
        /* A program of the build tree (tests too): the pinned build, never
         * for an installed copy. */
        char tree[PATH_MAX];
        size_t n = realpath(APIR_BUILD_TREE, tree) ? strlen(tree) : 0;
        if (n && !strncmp(dir, tree, n) && (dir[n] == '\0' || dir[n] == '/') &&
            snprintf(buf, len, "%s", APIR_BUILD_TREE_GGML_BIN) < (int)len) {
            *source = "the build tree's pinned ggml";
            return buf;
        }
    }
    *source = "ggml's search: the program's folder, then the current folder";
    return NULL;
}

bool apir_host_check_backend_dir(const char *dir, char *err, size_t err_len)
{
    struct stat st;
    if (!dir || !*dir)
        return true;
    if (stat(dir, &st) != 0) {
        snprintf(err, err_len, "backend directory %s: %s", dir, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "backend directory %s is not a directory", dir);
        return false;
    }
    if (access(dir, R_OK | X_OK) != 0) {
        snprintf(err, err_len, "backend directory %s: %s", dir, strerror(errno));
        return false;
    }
    return true;
}

size_t apir_host_usable_backend_count(void)
{
    size_t n = 0;
    for (size_t r = 0; r < ggml_backend_reg_count(); r++)
        n += reg_is_usable(ggml_backend_reg_get(r));
    return n;
}
