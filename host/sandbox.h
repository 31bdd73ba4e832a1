/*
 * The worker sandbox: what a guest's worker process may still do once it
 * has loaded its backend and before it decodes the guest's first byte.
 * Defence in depth for whatever gets past the decoders and op checks: a
 * compromised worker must not read another worker, exec, signal the daemon
 * or write files.  See sandbox.c for the rules and why.
 */
#ifndef APIR_SANDBOX_H
#define APIR_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct apir_host;

/* Worker uids: uid_base + worker slot (slots are < max_clients, reused). */
#define APIR_SANDBOX_UID_BASE_DEFAULT 0x7A000000u

struct apir_sandbox_config {
    bool enabled;        /* false: --no-sandbox (debugging only; logged loudly) */
    bool log_only;       /* --sandbox-log: each refused syscall is named in the worker's log */
    const char *extra_allow;  /* --sandbox-allow: comma-separated syscall names allowed besides the lists */
    uint32_t uid_base;   /* --worker-uid-base */
};

void apir_sandbox_config_default(struct apir_sandbox_config *cfg);

/*
 * Before apir_sandbox_enter, still privileged: a GPU backend opens its
 * device nodes and driver files here (one stream per device, freed again:
 * the driver context stays), so nothing needs opening afterwards.
 */
void apir_sandbox_prepare(struct apir_host *host);

/*
 * Enters the sandbox for the worker in slot `slot`: a distinct unprivileged
 * uid/gid when running as root, no new privileges, not dumpable, resource
 * limits, and the seccomp allowlist (plus the GPU set when the host serves a
 * GPU).  All threads of the process are covered.  false with a message in
 * err: the worker must not serve its guest.
 */
bool apir_sandbox_enter(const struct apir_sandbox_config *cfg, const struct apir_host *host, uint32_t slot, char *err,
                        size_t err_len);

#endif
