/*
 * One connection to one remote device, and the guest's call stubs.
 *
 * Every guest device has its own connection (and so its own host session
 * stream), selected with DEVICE_SELECT after the handshake.  A connection is
 * used under its mutex; the data area (a shared blob) carries tensor data and
 * graphs.
 */
#ifndef APIR_REMOTE_H
#define APIR_REMOTE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apir_commands.h"
#include "transport.h"

/*
 * One connection to the host.  What is made on a connection (buffers, shared
 * blobs) holds a reference to it: when the host dies and a new one is
 * reached (apir_remote_reconnect_locked), those objects stay valid in the
 * program, fail their calls locally, and release their memory through the
 * dead connection, which only unmaps.  Their contents lived on the dead host
 * and are gone.  refs is changed under the remote's lock.
 */
struct apir_conn {
    struct apir_transport *t;
    uint32_t refs;                /* the remote's own, plus one per object made on it */
    uint32_t generation;          /* 1 for the first connection, +1 per reconnection */
};

struct apir_remote {
    struct apir_transport *t;     /* conn->t: the current connection's transport */
    struct apir_conn *conn;
    struct apir_encoder *enc;     /* the command being written (apir_remote_begin_locked) */
    pthread_mutex_t lock;
    char endpoint[128];           /* what a reconnection dials */
    uint64_t next_reconnect_ns;   /* no attempt before this (one a second at most) */
    bool gone_logged;             /* "the host is gone" said for this connection */
    _Atomic uint32_t generation;  /* conn->generation, readable without the lock */
    uint32_t minor;               /* negotiated protocol minor */
    uint32_t device;              /* host device index */
    uint8_t *data;                /* data area blob */
    size_t data_size;
    uint32_t data_res_id;
    size_t get_piece;             /* bytes per piece of a download (download.h; 0: none) */
    uint64_t graph_spin_ns;       /* how long graph waits spin (APIR_SPIN_GRAPH_US) */
    bool graph_sleeps;            /* a graph command's own wait hardly spins (a CPU host: frontend_device.c) */
    bool host_computing;          /* the last command was a keyed graph (computed after its reply) */
    bool graph_done_at_reply;     /* keyed graphs are computed before their reply (frontend_device.c) */
    /* Uploads the device keeps for its next graph (struct apir_inputs,
     * frontend.h): a command that may touch device memory must not pass
     * them (apir_remote_begin_locked says so when one does). */
    uint32_t inputs_waiting;
    /* Graphs the host answered before computing them (APIR_LEAVES_BUSY),
     * counted on this connection and its successors; done: how many of them
     * are known finished, because a later command waited for the device.
     * What a guest event records and waits for (frontend_device.c). */
    uint64_t graphs_launched, graphs_done;
    /* APIR_PROFILE=1: where the guest's time goes, per command (wall time
     * of the round trip) - printed at exit by the frontend. */
    bool profile;
    uint64_t cmd_ns[APIR_CMD_COUNT], cmd_count[APIR_CMD_COUNT];
    uint64_t copy_ns, copy_bytes;  /* tensor bytes copied through the data area, guest side, after replies */
    uint64_t copy_early_bytes;     /* and before: out of a download the host was still writing (download.c) */
    /* APIR_TRACE=PATH: a timeline - each command and a few guest spans
     * (apir_remote_trace) in a ring allocated at open, so that tracing adds
     * no allocation per call; written to PATH at exit.  NULL: off. */
    struct apir_trace_event *trace;
    uint64_t trace_n;              /* events recorded; the ring keeps the last APIR_TRACE_EVENTS */
};

/* One span of a trace: [t0, t1] (apir_now_ns), what it was (a static
 * string: a command's name or a guest step), its bytes where it has any. */
struct apir_trace_event {
    uint64_t t0, t1, bytes;
    const char *what;
};
#define APIR_TRACE_EVENTS 65536u

/* Connects, handshakes and selects a host device.  False with err set. */
bool apir_remote_open(struct apir_remote *r, const char *endpoint, uint32_t device, char *err, size_t err_len);
/* Closes the connection; nothing made on it may be left (tools, tests and a
 * device that failed its setup). */
void apir_remote_close(struct apir_remote *r);

/* The host stopped answering (it died, or hung up on us); lock held. */
bool apir_remote_gone_locked(const struct apir_remote *r);

/*
 * Lock held.  True when the connection works: at once if it never broke,
 * else after reaching the host again (a restarted host) - tried at most
 * once a second, so a dead host costs a failed connect() per second, never
 * a busy loop.  A new connection is a new host session: objects made on the
 * old one are gone there (see struct apir_conn).
 */
bool apir_remote_reconnect_locked(struct apir_remote *r);

/* The current connection, with a reference for an object made on it; lock
 * held.  apir_conn_put_locked drops it; a retired connection's
 * transport closes with its last reference. */
struct apir_conn *apir_remote_conn_get_locked(struct apir_remote *r);
void apir_conn_put_locked(struct apir_remote *r, struct apir_conn *c);

/*
 * What one call asks beyond its request items, given with it (the stubs'
 * apir_call_<NAME>_opts_locked, calls.h): nothing of it outlives the call.
 * Zero in every field: nothing more.
 */
struct apir_call_opts {
    /* After a successful reply, [get_offset, get_offset + get_size) of the
     * data area as the host left it, in get_dst: copied out of shared
     * memory, or read from the reply straight into get_dst by a stream
     * transport.  get_dst NULL: none.  A range past the data area fails the
     * call (-1, logged) before it is sent. */
    void *get_dst;
    uint64_t get_offset;
    size_t get_size;
    /* Work for the wait (transport.h: download.c's pieces); NULL: none. */
    struct apir_wait_work *wait_work;
};

/*
 * The core of a backend command, for the typed stubs of calls.h (use
 * those): begin returns the encoder for the request items, or NULL when the
 * command needs a newer protocol than the host answered; submit sends it as
 * opts asks (NULL: nothing more) and waits, setting *reply to the reply
 * items on APIR_HANDLER_OK; it returns an apir_handler_result, or -1 if the
 * transport failed, and logs failures.  reply_checked turns the reply
 * decoder's verdict into a result.  The remote's lock is held throughout.
 */
struct apir_encoder *apir_remote_begin_locked(struct apir_remote *r, enum apir_command cmd);
/* How long submit spins on the reply to a command of these classes
 * (apir_command_classes) before it sleeps: apir_submit_opts.spin_ns, 0 for
 * the transport's default. */
uint64_t apir_remote_spin_ns(const struct apir_remote *r, uint32_t classes);
int apir_remote_submit_locked(struct apir_remote *r, enum apir_command cmd, const struct apir_call_opts *opts,
                              struct apir_decoder *reply);
int apir_remote_reply_checked(struct apir_remote *r, enum apir_command cmd, bool reply_ok);

/* Waits until the host has computed the keyed graph it answered last (it
 * computes after replying): before the guest touches shared memory the
 * graph may use (zero-copy buffers) without a command. */
void apir_remote_wait_idle(struct apir_remote *r);
/* The number of graphs launched so far (a point an event records), and a
 * wait until the first `launched` of them have finished: a round trip only
 * if some of them may still run. */
uint64_t apir_remote_graphs_launched(struct apir_remote *r);
void apir_remote_wait_graphs(struct apir_remote *r, uint64_t launched);

/*
 * The data area's bytes for the next command (lock held), whatever the
 * transport: makes [offset, offset + size) of it hold src's bytes as the
 * host sees it (a copy into shared memory, or sent with the command by a
 * stream transport straight from src).  src stays the caller's until that
 * command returns.  False: not staged (logged).  The way back is a call's
 * get_dst (struct apir_call_opts).
 */
bool apir_remote_put_data_locked(struct apir_remote *r, uint64_t offset, const void *src, size_t size);

/* Makes the data area at least size bytes (lock held). */
bool apir_remote_data_reserve(struct apir_remote *r, size_t size);

/* Prints the profile of a connection (when APIR_PROFILE=1). */
void apir_remote_print_profile(const struct apir_remote *r, const char *name);
/* Records a span in the trace (APIR_TRACE set; else nothing); under the
 * connection's lock.  apir_remote_tracing: whether to take the times. */
static inline bool apir_remote_tracing(const struct apir_remote *r) { return r->trace != NULL; }
void apir_remote_trace(struct apir_remote *r, const char *what, uint64_t t0, uint64_t t1, uint64_t bytes);
/* Appends the trace to APIR_TRACE's file, events in start order, each line
 * "NAME start_us duration_us gap_us what bytes" (gap: since the end of the
 * spans before it), after a "#" line with the start in CLOCK_MONOTONIC; at
 * exit (it sorts the ring in place). */
void apir_remote_write_trace(struct apir_remote *r, const char *name);

/* Default size of the data area; APIR_DATA_MB overrides. */
size_t apir_remote_data_default(void);

#endif
