/* The host's server for the shm transport (transport/shm_proto.h): the
 * accept loop, guests served on threads (shm_server.c) or in worker
 * processes (workers.c). */
#ifndef APIR_SHM_SERVER_H
#define APIR_SHM_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host.h"
#include "transport.h"

struct apir_shm_server;

/* Listens on the Unix socket at path (replacing a stale socket file). */
struct apir_shm_server *apir_shm_server_new(struct apir_host *host, const char *path, char *err, size_t err_len);
/* Serves until apir_shm_server_stop; returns 0, or -1 on a fatal error. */
int apir_shm_server_run(struct apir_shm_server *srv);
/* Serve each guest in its own worker process: worker_argv (kept by the
 * caller) is re-executed with "--serve-fd FD --client-id N" appended. */
bool apir_shm_server_isolate(struct apir_shm_server *srv, char **worker_argv);
/* In a worker process: serve the one guest connected on fd, then return. */
int apir_shm_serve_fd(struct apir_host *host, int fd, uint64_t client_id);
/* Async-signal-safe. */
void apir_shm_server_stop(struct apir_shm_server *srv);
/* Disconnects every guest, frees everything, removes the socket file. */
void apir_shm_server_free(struct apir_shm_server *srv);

#endif
