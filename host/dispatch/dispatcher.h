/*
 * The dispatcher's entry points: all that a transport (host/server,
 * host/virgl) needs to serve a guest.  A session is made and freed here,
 * not in host/core, because making one makes every module's state (data,
 * checks' scratch, graphs) and freeing one must first settle what the
 * device still runs: the layers below know nothing of each other's state.
 */
#ifndef APIR_DISPATCHER_H
#define APIR_DISPATCHER_H

#include "session.h"

/* NULL when memory cannot be had. */
struct apir_session *apir_session_new(struct apir_host *host, const char *name);
/* Settles the device, releases the guest's buffers, blobs, streams and the
 * modules' state.  NULL is ignored. */
void apir_session_free(struct apir_session *s);

/* Logs where the host's time went for this guest (info level): graphs,
 * weight copies, the ops (with cfg.op_profile), the five costliest commands. */
void apir_session_log_profile(const struct apir_session *s);

/* HANDSHAKE: decodes the guest's version, writes the host's; returns the
 * command's return value (APIR_HANDSHAKE_MAGIC on success). */
uint32_t apir_session_handshake(struct apir_session *s, struct apir_decoder *req, struct apir_encoder *reply);

/*
 * Runs one backend command (the cmd_flags of a FORWARD).  Decodes from req,
 * writes reply items to reply, returns an apir_handler_result.
 */
uint32_t apir_session_forward(struct apir_session *s, uint32_t cmd, struct apir_decoder *req, struct apir_encoder *reply);

/* Computes the keyed graph accepted by the last command, if any
 * (graph_exec.h): the transport calls it after sending that command's
 * reply, so the guest goes on while the device works.
 * apir_session_forward calls it too, first. */
void apir_session_run_deferred(struct apir_session *s);

#endif
