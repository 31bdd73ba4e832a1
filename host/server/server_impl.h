/*
 * The server's state, shared by its files (cut as virglrenderer's render
 * server is): server.c (the listener, the poll loop, the pending and
 * lingering connections, the server's life), admission.c (who a connection
 * is, what it may cost), client.c (one guest's client and its commands),
 * client_shm.c and stream.c (the two framings: shm, and tcp:/tls:/vsock:),
 * workers.c (worker processes: one per guest with process isolation).
 * Nothing else includes this.  Each guest's counters are published into a stats page
 * (host_stats.h), read by the daemon for its control socket and metrics file
 * (control.h).
 */
#ifndef APIR_SERVER_IMPL_H
#define APIR_SERVER_IMPL_H

#include "apir_log.h"
#include "control.h"
#include "host_stats.h"
#include "server.h"
#include "dispatcher.h"
#include "shm_proto.h"
#include "stream_proto.h"

#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>

/*
 * Admission (admission.c).  Who a connection is: a tenant - a local peer's
 * container (its cgroup, with its uid) or uid (--tenant-by), or a stream
 * peer's address (an IPv6 /64) - named by a key.  Each tenant has its own
 * buckets and counts, and its own share of the log while it is not yet a
 * guest: a connection costs only its own tenant (and the shared
 * --max-clients).  Before its hello a connection is checked against its
 * tenant's connection count and connect bucket; once its hello is in (and,
 * tcp:, its token checked) against its spawn bucket, before a worker or
 * session is spent on it.  The table is bounded: the least recently seen
 * entry makes room (the counts are not in it, only buckets).
 */
struct apir_tenant {
    uint64_t key;                   /* 0: a free entry */
    char name[96];                  /* "uid 1000", "uid 1000, cgroup /docker/abc", "address 10.0.0.5" */
    double connect_tokens, spawn_tokens;
    uint64_t refill_ns;             /* both buckets' last refill */
    uint64_t seen_ns;
    struct apir_log_budget log;     /* its lines before it is a guest */
};
#define APIR_MAX_TENANTS 1024
#define APIR_MAX_PENDING 256

struct apir_client {
    struct apir_server *srv;
    int fd;
    struct ucred peer;              /* SO_PEERCRED: pid (in our namespace), uid, gid */
    uint64_t tenant;                /* its tenant's key (admission) */
    int32_t reported_pid;           /* what the hello says (a container's guest: often 1) */
    _Atomic uint64_t busy_since_ns; /* when the command being served began; 0: idle */
    atomic_int refs;
    atomic_bool dead;
    struct apir_shm_ctrl *ctrl;     /* NULL on a stream connection */
    bool stream;                    /* tcp:/tls:/vsock: (stream.c) */
    bool tls_pending;               /* tls: its serving thread handshakes first */
    struct apir_tls *tls;           /* tls: the session, once handshaken */
    char peer_name[64];             /* a stream peer's address, for log lines */
    /* Its lanes (tcp:, vsock:; stream_proto.h): NULL where it may have
     * none; the ticket a join presents, set before it is served; how many
     * its guest asked for and was granted (the joins taken, at most). */
    struct apir_lanes *lanes;
    uint8_t lane_ticket[APIR_STREAM_TICKET_BYTES];
    atomic_uint lanes_granted;
    struct apir_session *session;
    struct apir_client *next;
    /* What the daemon shows of it (apir stat); set before it is listed. */
    uint64_t id;                    /* guest#N */
    uint64_t connected_ns;
    char comm[20];                  /* /proc/PID/comm at accept (the daemon only) */
    struct apir_stats_page *stats;  /* published by the serving thread after each command */
    bool stats_owned;               /* allocated here (not a worker's shared page) */
};

struct apir_server {
    struct apir_host *host;
    int listen_fd;                /* -1: serving one inherited connection */
    int stop_pipe[2];
    char path[108];
    bool activated;               /* listen_fd came from a service manager: path is not ours to remove */
    struct apir_client *clients;
    atomic_uint n_clients;
    uint64_t next_id;
    /* Process isolation: each guest is served by a fresh worker process
     * (this program re-executed with --serve-fd), so a guest that makes a
     * backend abort takes down only its own worker. */
    char **worker_argv;
    struct worker_slot {
        pid_t pid;                /* 0: free */
        uint64_t client_id;
        struct ucred peer;        /* its guest (SO_PEERCRED) */
        uint64_t started_ns;
        char comm[20];            /* /proc/PID/comm of its guest at accept */
        struct apir_stats_page *stats;  /* shared with the worker (--stats-fd); NULL if none */
        uint64_t tenant;          /* its tenant's key (set by admission once spawned) */
        int64_t uid;              /* its uid of the pool (apir_worker_uid_take), or -1 */
        /* A tcp:/vsock: guest's lanes: the socket its joins are passed on
         * (SCM_RIGHTS; -1: none) and the ticket they present. */
        int lane_sock;
        uint8_t lane_ticket[APIR_STREAM_TICKET_BYTES];
    } *children;                  /* max_clients slots */
    uint32_t n_children;
    int child_pipe[2];
    /* Admission: the tenants seen lately (struct apir_tenant); the one
     * whose connection is being dealt with, and the log budget before. */
    struct apir_tenant *tenants;
    uint32_t n_tenants;
    struct apir_tenant *tenant_now;
    struct apir_log_budget *log_before;
    char admission_why[200];      /* the last refusal's message (sent to the peer) */
    /* Connections whose hello has not arrived yet (either isolation: a
     * worker is started only for a connection that spoke). */
    struct pending_conn {
        int fd;
        struct ucred peer;
        uint64_t tenant;
        uint64_t deadline_ns;
        bool stream;              /* its hello is read (and checked) here, with either isolation */
        bool tls;                 /* a tls: listener's: a TLS guest (handed on at its first byte) or a lane's join */
        uint8_t hello_len;        /* stream: bytes of its hello received so far */
        uint8_t hello[sizeof(struct apir_stream_hello)];
    } pending[APIR_MAX_PENDING];
    uint32_t n_pending;
    /* Refused connections linger until the guest has read why: closing a
     * socket with its hello unread would reset the connection and lose the
     * answer.  Bounded; the oldest goes first. */
    int lingering[16];
    uint32_t n_lingering;
    /* What the host does (host_stats.h, control.h): the daemon only. */
    struct apir_stats_page *worker_stats;  /* a worker process: its guest's page (--stats-fd) */
    uint64_t start_ns;
    int64_t start_unix_ms;
    uint64_t refused_connections;
    struct apir_guest_counters retired;    /* guests gone: their counters, for the totals */
    struct apir_control *control;          /* NULL: no control socket, no metrics file */
    /* Stream listeners (tcp:, vsock:; stream.c) beside the Unix
     * socket, and the token their guests must present. */
    struct net_listener {
        int fd;
        char endpoint[128];
        bool loopback_only;
        bool tls;                 /* tls: - the handshake authenticates; no token */
    } net[APIR_MAX_NET_LISTENERS];
    struct apir_tls_keys *tls_keys;  /* --tls-psk-file: who may connect over tls: */
    /* A worker serving a tcp:/vsock: guest: the daemon's socket that passes
     * its lanes (--lane-fd; -1: none) and the ticket the daemon gave it. */
    int lane_in_fd;
    uint8_t lane_ticket[APIR_STREAM_TICKET_BYTES];
    uint32_t n_net;
    uint8_t token[APIR_STREAM_TOKEN_MAX];
    uint32_t token_len;           /* 0: none */
};

/* Stream peers are shown (apir stat) under numbers from here up, one per
 * address (stream.c, peer_uid); admission counts them by address. */
#define APIR_NET_PEER_UID_BASE 0x7E000000u


/* client.c: one client's lifetime and its commands, for either
 * framing.  client_new: a session named name, its stats page, not yet
 * served (NULL with *why set); client_serve: starts its thread (fn) and
 * lists it; false: it was freed. */
struct apir_client *apir_client_new(struct apir_server *srv, const char *name, const struct ucred *peer,
                                   int32_t reported_pid, const char **why);
bool apir_client_serve(struct apir_client *c, int fd, void *(*fn)(void *));
void apir_client_put(struct apir_client *c);
/* The backend commands of a frame (handshake, library, forward); other
 * command types are the transport's.  Returns the command's return value. */
uint32_t apir_client_run_command(struct apir_client *c, const struct apir_cmd_header *hdr, struct apir_decoder *req,
                                 struct apir_encoder *reply, bool *handled);
/* The next client id: the daemon counts; a worker has its own. */
uint64_t apir_server_next_id(struct apir_server *srv);
/* The release of a blob the host mapped itself (munmap). */
void apir_client_unmap_release(void *ptr, size_t size, void *user);

/* client_shm.c: reads the shm hello (waiting at most timeout_ms) and
 * starts serving the guest, or refuses it; fd is the client's or closed
 * either way.  tenant: the daemon's admission (a guest's session is its
 * spawn), NULL in a worker. */
void apir_client_shm_accept(struct apir_server *srv, int fd, const struct ucred *peer, struct apir_tenant *tenant,
                            int timeout_ms);

/* admission.c.  The tenant of key (found, or made with name), valid until
 * the next call; its log budget is entered for this thread (the lines
 * about this connection are its), until apir_tenant_leave. */
struct apir_tenant *apir_tenant_enter(struct apir_server *srv, uint64_t key, const char *name);
void apir_tenant_leave(struct apir_server *srv);
/* A local peer's tenant key and name: its uid and, --tenant-by cgroup, its
 * cgroups. */
uint64_t apir_tenant_local_key(const struct apir_server *srv, int fd, const struct ucred *peer, char *name,
                              size_t len);
/* A stream peer's tenant key and name (its address: an IPv6 /64). */
uint64_t apir_tenant_net_key(int fd, char *name, size_t len);
/* Before anything is spent on a new connection: its tenant's count and
 * connect bucket.  NULL: admitted; else why not. */
const char *apir_admit_connection(struct apir_server *srv, struct apir_tenant *t);
/* Before a worker or a session is spent on a connection whose hello came
 * (tls: before its handshake): its tenant's spawn bucket.  NULL: go on. */
const char *apir_admit_guest(struct apir_server *srv, struct apir_tenant *t);
/* A worker was just started for tenant (apir_workers_spawn): it is counted
 * as one of its connections until it ends. */
void apir_tenant_spawned(struct apir_server *srv, uint64_t tenant, uint32_t children_before);
/* A new connection waits among the polled for its hello, until its
 * deadline (--handshake-timeout-ms). */
void apir_server_add_pending(struct apir_server *srv, int fd, const struct ucred *peer, uint64_t tenant,
                             bool stream, bool tls);

/* stream.c */
void apir_stream_accept(struct apir_server *srv, uint32_t listener);
/* Refuses a stream connection with a message it can read (a stream hello
 * reply, then a lingering close); a TLS one before its handshake is only
 * closed.  Logged with the peer's address, counted. */
void apir_stream_refuse(struct apir_server *srv, int fd, const char *peer_name, bool tls, const char *message);
/* A pending stream connection is readable or past its deadline: true when
 * it has been dealt with (served, handed on, refused), false to keep
 * waiting for the rest of its hello. */
bool apir_stream_pending(struct apir_server *srv, struct pending_conn *p, short revents, uint64_t now);
/* Serves a stream connection: one whose hello the daemon read and
 * checked, or (tls) one whose serving thread handshakes and reads it. */
void apir_stream_start_client(struct apir_server *srv, int fd, const char *peer_name, uint64_t tenant, bool tls);
/* A worker: a lane the daemon passed on lane_in_fd is readable. */
void apir_stream_lane_intake(struct apir_server *srv);

/* admission.c: refusing a connection with a message it can read (the log
 * line names the peer by its credentials; counted by apir_server_refuse);
 * apir_peer_refuse sends and logs only. */
void apir_server_refuse(struct apir_server *srv, int fd, const char *message);
void apir_peer_refuse(int fd, const char *message, bool with_comm);
/* server.c: a refused connection stays open until the guest read why. */
void apir_server_linger_close(struct apir_server *srv, int fd);
/* admission.c: "pid P, uid U, gid G", and the process name the host sees (/proc/P/comm,
 * which the guest chooses: a hint) when with_comm and it can be read. */
void apir_peer_describe(const struct ucred *peer, bool with_comm, char *buf, size_t len);
/* /proc/PID/comm, printable characters only ("" when it cannot be read). */
void apir_peer_comm(pid_t pid, char *buf, size_t len);
/* server.c: the number of guests served (workers or clients), for STATUS= lines. */
void apir_server_status_changed(struct apir_server *srv);

/* workers.c */
/* Hands the connection to a new worker process in a free slot (the slot
 * gives the worker its uid: sandbox.h); fd is closed here either way.
 * stream_peer: a stream connection (its address), whose hello was read
 * here, or which the worker handshakes first (stream_tls); NULL: a Unix
 * socket guest, whose hello the worker reads. */
void apir_workers_spawn(struct apir_server *srv, int fd, const struct ucred *peer, const char *stream_peer,
                        bool stream_tls);
/* Collects the workers that ended (SIGCHLD woke the main loop); their
 * counters go to the totals. */
void apir_workers_reap(struct apir_server *srv);
/* The guests being served by workers, as rows of a view (host_stats.h);
 * returns the number written (at most max). */
uint32_t apir_workers_rows(struct apir_server *srv, struct apir_guest_row *rows, uint32_t max);
/* Ends every worker: SIGTERM, a bounded wait, then SIGKILL. */
void apir_workers_stop(struct apir_server *srv);
/* In a worker process: ends it when its guest hung up mid-command or the
 * command ran past its budget. */
void apir_worker_watch(struct apir_server *srv, bool hung_up);

#endif
