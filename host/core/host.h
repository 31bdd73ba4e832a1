/*
 * The host: one real ggml backend (CPU, CUDA, Vulkan...) chosen at start, and
 * the limits every guest session runs under.  Shared by the apir-host daemon
 * and libapir-virgl.so; sessions (session.h) hold all per-guest state.
 */
#ifndef APIR_HOST_H
#define APIR_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml-backend.h"

#define APIR_HOST_MAX_DEVICES 16

/* max_alloc_bytes until it is sized from the devices (apir_host_resolve_alloc_quota). */
#define APIR_ALLOC_QUOTA_AUTO (UINT64_MAX - 1)
/* The default per-guest memory quota: this share of the devices' memory,
 * at least APIR_ALLOC_QUOTA_FLOOR. */
#define APIR_ALLOC_QUOTA_SHARE_NUM 1
#define APIR_ALLOC_QUOTA_SHARE_DEN 2
#define APIR_ALLOC_QUOTA_SHARE_TEXT "half"
#define APIR_ALLOC_QUOTA_FLOOR (1ull << 30)

/* Per-session limits.  Over a limit the call fails; other sessions go on. */
struct apir_limits {
    uint32_t max_buffers;        /* live buffers per session */
    uint64_t max_alloc_bytes;    /* bytes in live buffers per session; UINT64_MAX: none; APIR_ALLOC_QUOTA_AUTO */
    uint32_t max_graph_nodes;
    uint32_t max_graph_tensors;
    uint32_t max_blobs;          /* shared-memory blobs per session */
    uint64_t max_blob_bytes;     /* bytes of blobs mapped per session */
    uint32_t max_clients;        /* concurrent sessions (daemon) */
    /* Denial of service (host/server/admission.c): a guest must not hold what others
     * need.  A tenant is a local peer's container (its cgroup) or uid
     * (tenant_by), or a stream peer's address; each has its own counts and
     * buckets, so no tenant's connections - silent, hung up or served -
     * cost another anything but the shared max_clients. */
    uint32_t max_clients_per_tenant; /* connections of one tenant, waiting or served, root's too (0: no limit) */
    uint32_t connect_per_s;        /* new connections per second of one source, before its hello (0: no limit) */
    uint32_t connect_burst;        /* ... and at once */
    uint32_t spawn_per_s;          /* guests started per second of one tenant, after its hello (0: no limit) */
    uint32_t spawn_burst;          /* ... and at once */
    uint32_t handshake_timeout_ms; /* a connection that sends no hello by then is closed */
    uint32_t graph_timeout_ms;     /* one command's time (a graph's compute); over it the worker ends (0: none) */
    uint32_t guest_log_per_s;      /* log lines a guest's commands may cause a second (0: no limit) */
    uint32_t guest_log_burst;      /* ... and at once */
};

/* How local peers are told apart for the limits above (--tenant-by). */
enum apir_tenant_by {
    APIR_TENANT_BY_CGROUP,   /* the peer's cgroup (its container), else its uid */
    APIR_TENANT_BY_UID,
};

void apir_limits_default(struct apir_limits *l);

/* The weight cache's bound when none is given (--weight-cache-max-gib). */
#define APIR_WEIGHT_CACHE_MAX_GIB_DEFAULT 64

/* A session's upload stage when none is given (APIR_HOST_STAGE_MB): two
 * halves of at most 16 MiB each, sized to the largest upload staged; a half
 * bounds it (an 8B model's 8 MiB of embeddings, a long context's mask). */
#define APIR_STAGE_MB_DEFAULT 32

struct apir_host_config {
    const char *backend_name;    /* registry name; NULL: first GPU, else CPU */
    int device;                  /* -1: every device of the backend */
    const char *device_name;     /* a ggml device name (CUDA0, CPU...): serve that one device (NULL: see device) */
    int n_threads;               /* CPU backend threads (default: apir_host_default_threads()); 0: ggml's default */
    const char *backend_dir;     /* where ggml's backend libraries are; NULL: ggml's search */
    bool op_profile;             /* time each node alone (APIR_HOST_OP_PROFILE=1): slow, for profiles */
    /* Switches that are on unless APIR_HOST_<NAME>=0, for measuring what each is worth: */
    bool pin_shared_memory;      /* PIN: page-lock shared memory for a GPU's copy engines (pin.c) */
    bool async_uploads;          /* ASYNC_UPLOADS: small uploads queued on the stream (upload_mirror.c) */
    bool weight_copies;          /* WEIGHT_COPIES: weights laid out for the device (weight_copies.c) */
    bool defer_graphs;           /* DEFER: keyed graphs computed after their reply (graph_exec.h) */
    bool import_memo;            /* IMPORT_MEMO: a graph's unchanged nodes keep the last graph's op checks (import.h) */
    /* A stream's downloads sent in pieces of at least this many bytes as the
     * device copies them (APIR_HOST_SEND_PIECE_KB, default 128; 0: after the
     * whole copy; download_pieces.h). */
    size_t send_piece_bytes;
    /* Page-locked memory a session on a GPU may stage its larger uploads
     * in while a graph runs (APIR_HOST_STAGE_MB, default 32; 0: none;
     * upload_mirror.h): taken as a prompt's batches need it, kept until the
     * session ends. */
    size_t stage_bytes;
    /* A tls: guest's replies sealed on its serving thread and sent by one of
     * their own (transport/sender.h), where this process has 4 CPUs or more
     * (the thread needs a core beside the one sealing):
     * APIR_HOST_TLS_SEND_THREAD=1 always, =0 never. */
    bool tls_send_thread;
    /* Lanes a tcp:/vsock: guest may join to its session (stream_proto.h,
     * transport/lanes.h): APIR_HOST_LANES, at most APIR_STREAM_MAX_LANES;
     * by default all of them where this process has 4 CPUs or more (each
     * lane's copies need a core), else none. */
    uint32_t max_lanes;
    /* Huge pages asked for the buffers in this process's memory and the
     * weight copies (data/buffers.c): APIR_HOST_HUGEPAGES=1 always, =0
     * never, unset unless free memory goes back to a hypervisor
     * (transport/fdpass.h, apir_huge_pages_wanted). */
    bool huge_pages;
    /* The weight cache (weight_cache.h; --weight-cache, APIR_HOST_WEIGHT_CACHE): NULL: none */
    const char *weight_cache_dir;
    uint64_t weight_cache_max_bytes;   /* --weight-cache-max-gib, APIR_HOST_WEIGHT_CACHE_MAX_GIB; 0: no bound */
    struct apir_limits limits;
    enum apir_tenant_by tenant_by;
};

/*
 * Defaults, then the APIR_HOST_* environment variables: the one place that
 * reads them (apir-host and libapir-virgl.so both start here; a worker
 * process inherits the daemon's environment).
 */
void apir_host_config_default(struct apir_host_config *cfg);

struct apir_host {
    struct apir_host_config cfg;
    ggml_backend_reg_t reg;
    uint32_t n_devices;
    ggml_backend_dev_t devices[APIR_HOST_MAX_DEVICES];
    bool device_memory; /* a device has its own memory (a GPU): its work leaves the CPU idle */
    bool pin_shared;   /* device_memory, and page-locking shared memory is on (pin.c) */
    uint64_t alloc_quota_default; /* the default memory quota as sized (apir_host_resolve_alloc_quota); 0: not */
    /* How sessions reach the weight cache (weight_cache.h), set by whoever
     * opened or was given it (apir_host_main.c); NULL: no cache. */
    struct apir_wcache_link *weight_cache;
};

/* Loads ggml's backends and picks the devices; false with a message in err. */
bool apir_host_init(struct apir_host *host, const struct apir_host_config *cfg, char *err, size_t err_len);

/*
 * The default per-guest memory quota (max_alloc_bytes APIR_ALLOC_QUOTA_AUTO)
 * made a number: APIR_ALLOC_QUOTA_SHARE of the served devices' total memory
 * (ggml_backend_dev_memory), at least APIR_ALLOC_QUOTA_FLOOR.  apir_host_init
 * does it for devices in host memory; a GPU's memory is asked for only where
 * guests are served (apir_session_new): asking a CUDA device creates a
 * context, which the daemon of worker processes never needs.  Call it
 * before guests run (it writes the host's limits).
 */
void apir_host_resolve_alloc_quota(struct apir_host *host);

/* Lists every device of every backend ggml found (for --list-devices). */
void apir_host_print_devices(const char *backend_dir, void *out_file);

/* Loads ggml's backends once per process. */
void apir_host_load_backends(const char *backend_dir);

/*
 * The CPU threads a host uses by default: the CPUs this process may use
 * (apir_usable_cpus, transport/cpus.h: its affinity mask, at most the cgroup
 * v2 CPU quota), as llama.cpp's tools choose.  At least 1.
 */
int apir_host_default_threads(void);

/*
 * Where ggml's backend libraries are when no --backend-dir is given:
 * $APIR_BACKEND_DIR; else beside this program as installed
 * (PREFIX/bin/../lib/apir); else, for a program running from its build tree,
 * the pinned build it was linked against.  Returns buf, the environment's
 * string, or NULL (none of these: ggml's own search); *source says which.
 */
const char *apir_host_default_backend_dir(char *buf, size_t len, const char **source);

/* A backend directory that exists and can be read; false with a message. */
bool apir_host_check_backend_dir(const char *dir, char *err, size_t err_len);

/* Usable backends (not APIR, not RPC, with a device) ggml found. */
size_t apir_host_usable_backend_count(void);

#endif
