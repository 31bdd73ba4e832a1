/*
 * Host copies of weights in the host device's own layouts (apir 0.3).
 *
 * Natively, llama.cpp stores a CPU's matrix weights in the CPU backend's
 * extra buffer types (CPU_REPACK, AMX, KleidiAI): the bytes are rearranged
 * at load for that CPU's kernels, roughly twice the matrix speed for Q4_0.
 * A remote device cannot offer those buffer types the same way: llama.cpp
 * prefers a GPU-type device's default buffer type, and a repacked buffer
 * cannot be read back or written in parts.
 *
 * So the host keeps a second copy.  The guest says when it has written a
 * weight whole (BUFFER_NOTE_WEIGHT); the host repacks it into the first
 * extra buffer type whose kernels take it, the way llama.cpp picks one.
 * A graph's MUL_MAT or MUL_MAT_ID that reads the original then reads the
 * copy instead, when the backend supports that node with it.  The original
 * stays as it was: reads and every other use see the guest's bytes.
 *
 * A copy is dropped when its range may change: any write the host sees
 * (set, memset, clear, copy, a graph node writing into it), a write the
 * guest reports (BUFFER_WRITTEN, for shared-memory buffers it writes
 * itself), or the buffer being freed.  Creating or dropping a copy
 * invalidates kept graphs (buffers_epoch), which may point at it.
 *
 * Copies count against the session's byte quota.  APIR_HOST_WEIGHT_COPIES=0
 * turns them off.
 */
#ifndef APIR_WEIGHT_COPIES_H
#define APIR_WEIGHT_COPIES_H

#include "apir_proto.h"
#include "session.h"

/* The session's copies (s->weights); NULL when memory cannot be had. */
struct apir_weights *apir_weights_new(void);
/* Frees the copies left without charging the session (it is ending). */
void apir_weights_free(struct apir_weights *w);

/* Whether the current device has extra buffer types worth a copy. */
bool apir_weights_offered(struct apir_session *s);
/* The guest wrote t (in hb, checked) whole: keep a copy if one fits. */
enum apir_weight_note apir_weights_note(struct apir_session *s, struct apir_host_buffer *hb, const struct ggml_tensor *t);
/* [data, data+len) may change: drop the copies it overlaps. */
void apir_weights_forget_range(struct apir_session *s, const void *data, size_t len);
void apir_weights_forget_buffer(struct apir_session *s, ggml_backend_buffer_t buf);
/* Before a graph is computed: drops the copies of ranges it writes, then
 * points each MUL_MAT/MUL_MAT_ID at the copy of its weight where the
 * backend supports that. */
void apir_weights_apply(struct apir_session *s, struct ggml_cgraph *graph);
/* The profile line of the copies made (apir_session_log_profile). */
void apir_weights_log_profile(const struct apir_session *s);
/* For tests and fuzzers: how many copies are kept; whether they are sorted,
 * disjoint, each copy whole. */
uint32_t apir_weights_count(const struct apir_session *s);
bool apir_weights_consistent(const struct apir_session *s);

#endif
