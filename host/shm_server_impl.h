/*
 * The shm server's state, shared by its two files: shm_server.c (the accept
 * loop, admission, serving guests on threads) and workers.c (worker
 * processes: one per guest with process isolation).  Nothing else includes
 * this.  Each guest's counters are published into a stats page
 * (host_stats.h), read by the daemon for its control socket and metrics file
 * (control.h).
 */
#ifndef APIR_SHM_SERVER_IMPL_H
#define APIR_SHM_SERVER_IMPL_H

#include "control.h"
#include "host_stats.h"
#include "shm_server.h"
#include "session.h"
#include "shm_proto.h"
#include "stream_proto.h"

#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>

struct shm_client {
    struct apir_shm_server *srv;
    int fd;
    struct ucred peer;              /* SO_PEERCRED: pid (in our namespace), uid, gid */
    int32_t reported_pid;           /* what the hello says (a container's guest: often 1) */
    _Atomic uint64_t busy_since_ns; /* when the command being served began; 0: idle */
    atomic_int refs;
    atomic_bool dead;
    struct apir_shm_ctrl *ctrl;     /* NULL on a stream connection */
    bool stream;                    /* tcp:/tls:/vsock: (stream_server.c) */
    bool tls_pending;               /* tls: its serving thread handshakes first */
    struct apir_tls *tls;           /* tls: the session, once handshaken */
    char peer_name[64];             /* a stream peer's address, for log lines */
    struct apir_session *session;
    struct shm_client *next;
    /* What the daemon shows of it (apir stat); set before it is listed. */
    uint64_t id;                    /* guest#N */
    uint64_t connected_ns;
    char comm[20];                  /* /proc/PID/comm at accept (the daemon only) */
    struct apir_stats_page *stats;  /* published by the serving thread after each command */
    bool stats_owned;               /* allocated here (not a worker's shared page) */
};

struct apir_shm_server {
    struct apir_host *host;
    int listen_fd;                /* -1: serving one inherited connection */
    int stop_pipe[2];
    char path[108];
    bool activated;               /* listen_fd came from a service manager: path is not ours to remove */
    struct shm_client *clients;
    atomic_uint n_clients;
    uint64_t next_id;
    /* Process isolation: each guest is served by a fresh worker process
     * (this program re-executed with --serve-fd), so a guest that makes a
     * backend abort takes down only its own worker. */
    char **worker_argv;
    struct worker_slot {
        pid_t pid;                /* 0: free; the slot names the worker's uid (sandbox.h) */
        uint64_t client_id;
        struct ucred peer;        /* its guest (SO_PEERCRED) */
        uint64_t started_ns;
        char comm[20];            /* /proc/PID/comm of its guest at accept */
        struct apir_stats_page *stats;  /* shared with the worker (--stats-fd); NULL if none */
    } *children;                  /* max_clients slots */
    uint32_t n_children;
    int child_pipe[2];
    /* New connections: a token bucket refilled at spawn_per_s. */
    double spawn_tokens;
    uint64_t spawn_refill_ns;
    /* Serving threads: connections whose hello has not arrived yet. */
    struct pending_conn {
        int fd;
        struct ucred peer;
        uint64_t deadline_ns;
        bool stream;              /* its hello is read (and checked) here, with either isolation */
        uint8_t hello_len;        /* stream: bytes of its hello received so far */
        uint8_t hello[sizeof(struct apir_stream_hello)];
    } pending[128];
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
    /* Stream listeners (tcp:, vsock:; stream_server.c) beside the Unix
     * socket, and the token their guests must present. */
    struct net_listener {
        int fd;
        char endpoint[128];
        bool loopback_only;
        bool tls;                 /* tls: - the handshake authenticates; no token */
    } net[APIR_MAX_NET_LISTENERS];
    struct apir_tls_keys *tls_keys;  /* --tls-psk-file: who may connect over tls: */
    uint32_t n_net;
    uint8_t token[APIR_STREAM_TOKEN_MAX];
    uint32_t token_len;           /* 0: none */
};

/* Stream peers are counted (admission, --max-clients-per-uid) under
 * numbers from here up, one per address (stream_server.c, peer_uid). */
#define APIR_NET_PEER_UID_BASE 0x7E000000u


/* shm_server.c: one client's lifetime and its commands, for either
 * transport.  client_new: a session named name, its stats page, not yet
 * served (NULL with *why set); client_serve: starts its thread (fn) and
 * lists it; false: it was freed. */
struct shm_client *apir_client_new(struct apir_shm_server *srv, const char *name, const struct ucred *peer,
                                   int32_t reported_pid, const char **why);
bool apir_client_serve(struct shm_client *c, int fd, void *(*fn)(void *));
void apir_client_put(struct shm_client *c);
/* The backend commands of a frame (handshake, library, forward); other
 * command types are the transport's.  Returns the command's return value. */
uint32_t apir_client_run_command(struct shm_client *c, const struct apir_cmd_header *hdr, struct apir_decoder *req,
                                 struct apir_encoder *reply, bool *handled);
/* The next client id: the daemon counts; a worker has its own. */
uint64_t apir_server_next_id(struct apir_shm_server *srv);
/* Before anything is spent on a new connection: its rate and its peer's
 * share.  NULL: admitted; else why not. */
const char *apir_server_admission_refusal(struct apir_shm_server *srv, uid_t uid);
/* A new connection waits among the polled for its hello, until its
 * deadline (--handshake-timeout-ms). */
void apir_server_add_pending(struct apir_shm_server *srv, int fd, const struct ucred *peer, bool stream);

/* stream_server.c */
void apir_stream_accept(struct apir_shm_server *srv, uint32_t listener);
/* Refuses a stream connection with a message it can read (a stream hello
 * reply, then a lingering close); a TLS one before its handshake is only
 * closed.  Logged with the peer's address, counted. */
void apir_stream_refuse(struct apir_shm_server *srv, int fd, const char *peer_name, bool tls, const char *message);
/* A pending stream connection is readable or past its deadline: true when
 * it has been dealt with (served, handed on, refused), false to keep
 * waiting for the rest of its hello. */
bool apir_stream_pending(struct apir_shm_server *srv, struct pending_conn *p, short revents, uint64_t now);
/* Serves a stream connection: one whose hello the daemon read and
 * checked, or (tls) one whose serving thread handshakes and reads it. */
void apir_stream_start_client(struct apir_shm_server *srv, int fd, const char *peer_name, bool tls);

/* shm_server.c: refusing a connection with a message it can read (the
 * log line names the peer by its credentials; counted). */
void apir_server_refuse(struct apir_shm_server *srv, int fd, const char *message);
void apir_server_linger_close(struct apir_shm_server *srv, int fd);
/* "pid P, uid U, gid G", and the process name the host sees (/proc/P/comm,
 * which the guest chooses: a hint) when with_comm and it can be read. */
void apir_peer_describe(const struct ucred *peer, bool with_comm, char *buf, size_t len);
/* /proc/PID/comm, printable characters only ("" when it cannot be read). */
void apir_peer_comm(pid_t pid, char *buf, size_t len);
/* The number of guests served (workers or clients), for STATUS= lines. */
void apir_server_status_changed(struct apir_shm_server *srv);

/* workers.c */
/* Hands the connection to a new worker process in a free slot (the slot
 * gives the worker its uid: sandbox.h); fd is closed here either way.
 * stream_peer: a stream connection (its address), whose hello was read
 * here, or which the worker handshakes first (stream_tls); NULL: a Unix
 * socket guest, whose hello the worker reads. */
void apir_workers_spawn(struct apir_shm_server *srv, int fd, const struct ucred *peer, const char *stream_peer,
                        bool stream_tls);
/* Collects the workers that ended (SIGCHLD woke the main loop); their
 * counters go to the totals. */
void apir_workers_reap(struct apir_shm_server *srv);
/* The guests being served by workers, as rows of a view (host_stats.h);
 * returns the number written (at most max). */
uint32_t apir_workers_rows(struct apir_shm_server *srv, struct apir_guest_row *rows, uint32_t max);
/* Ends every worker: SIGTERM, a bounded wait, then SIGKILL. */
void apir_workers_stop(struct apir_shm_server *srv);
/* In a worker process: ends it when its guest hung up mid-command or the
 * command ran past its budget. */
void apir_worker_watch(struct apir_shm_server *srv, bool hung_up);

#endif
