/* The host's server for the shm transport (transport/shm_proto.h): the
 * accept loop, guests served on threads (client.c) or in worker
 * processes (workers.c). */
#ifndef APIR_SERVER_H
#define APIR_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control.h"
#include "host.h"
#include "transport.h"

struct apir_server;
struct apir_stats_page;
struct ucred;

/* The socket file the server binds (not one a service manager passed). */
#define APIR_SHM_SOCKET_MODE_DEFAULT 0660u
#define APIR_MAX_NET_LISTENERS 4
struct apir_server_listen_options {
    unsigned mode;       /* permission bits of the socket file (default 0660) */
    const char *group;   /* its group: a name or a number; NULL: the daemon's */
};
/* 0660 and no group, or APIR_SOCKET_MODE / APIR_SOCKET_GROUP from the
 * environment (the command line's --socket-mode/--socket-group override). */
void apir_server_listen_options_default(struct apir_server_listen_options *opts);
/* An octal mode, 0 to 0777 ("0660", "660"); -1 if s is not one. */
int apir_server_parse_socket_mode(const char *s, unsigned *mode);

/*
 * Serves the socket a service manager passed (socket activation: LISTEN_FDS
 * and LISTEN_PID naming this process; host/server/service.h), else listens on the
 * Unix socket at path (replacing a stale socket file), with the file's
 * mode and group from opts (NULL: apir_server_listen_options_default).  A
 * passed socket keeps the mode and group its unit gave it.
 */
struct apir_server *apir_server_listen(struct apir_host *host, const char *path,
                                               const struct apir_server_listen_options *opts, char *err, size_t err_len);
/* apir_server_listen with the default options. */
struct apir_server *apir_server_new(struct apir_host *host, const char *path, char *err, size_t err_len);
/* Serves fd, an already listening AF_UNIX SOCK_SEQPACKET socket (checked):
 * the server owns it from now on, but never removes its file. */
struct apir_server *apir_server_adopt(struct apir_host *host, int fd, char *err, size_t err_len);
/* The socket's path as served ("unix:" not included). */
const char *apir_server_path(const struct apir_server *srv);
/* Serves until apir_server_stop; returns 0, or -1 on a fatal error.
 * A listening server tells a service manager READY=1 as it starts serving
 * and STOPPING=1 when stopped (host/server/service.h; nothing without one). */
int apir_server_run(struct apir_server *srv);
/* Serve each guest in its own worker process: worker_argv (kept by the
 * caller) is re-executed with "--serve-fd FD --client-id N --worker-slot S
 * --stats-fd F" appended. */
bool apir_server_isolate(struct apir_server *srv, char **worker_argv);
/* In a worker process: serve the one guest connected on fd, then return;
 * its counters go to stats (the page the daemon passed; NULL: nowhere).
 * peer: the guest as the daemon's SO_PEERCRED gave it (a worker's own
 * namespaces show neither its pid nor, in a user namespace, its uid);
 * NULL: as fd's says. */
int apir_server_serve_shm_fd(struct apir_host *host, int fd, uint64_t client_id, struct apir_stats_page *stats,
                      const struct ucred *peer);
/* The control socket and the metrics file (control.h), served by this
 * server's loop; false with a message in err. */
bool apir_server_control(struct apir_server *srv, const struct apir_control_config *cfg, char *err,
                             size_t err_len);
/* Async-signal-safe. */
void apir_server_stop(struct apir_server *srv);

/*
 * Stream endpoints (tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT;
 * host/server/stream.c)
 * served beside the Unix socket, by the same workers and limits.  The
 * token (1 to 64 bytes) is what their guests must present; a listener on
 * an address other machines reach is refused without one.  Set the token
 * first.
 */
bool apir_server_set_token(struct apir_server *srv, const char *token, char *err, size_t err_len);
/* tls: listeners: the guests' pre-shared keys (transport/tls.h), owned by
 * the server from now on. */
struct apir_tls_keys;
bool apir_server_set_tls_keys(struct apir_server *srv, struct apir_tls_keys *keys);
bool apir_server_listen_stream(struct apir_server *srv, const char *endpoint, char *err, size_t err_len);
/* A worker process: serves one stream connection the daemon accepted and
 * authenticated (its hello already read there), or, with tls_keys, one it
 * handshakes with itself first.  lane_fd: the daemon's socket that passes
 * the guest's lanes (its ticket first), or -1. */
int apir_server_serve_stream_fd(struct apir_host *host, int fd, uint64_t client_id, struct apir_stats_page *stats,
                         const char *peer_name, struct apir_tls_keys *tls_keys, int lane_fd);
/* Disconnects every guest, frees everything, removes the socket file (not
 * a passed one). */
void apir_server_free(struct apir_server *srv);

#endif
