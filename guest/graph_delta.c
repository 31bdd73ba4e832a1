/*
 * A keyed graph sent as its changes against the last graph the host
 * accepted (apir 0.9, BACKEND_GRAPH_COMPUTE_DELTA; the state and why:
 * struct apir_graph_delta, frontend.h).
 *
 * Both blobs have the layout of a whole graph (guest/serialize.c): u32
 * n_nodes, the node ids, u32 n_tensors, the records, then the use counts.
 * The delta keeps the node list and the use counts as they are and puts,
 * where the records were, the changed records' count, indices and records.
 * A record counts as changed unless it is byte for byte the base's at the
 * same index: the host then takes its own copy of the base's (its memo).
 */
#include "frontend.h"

#include "apir_log.h"
#include "apir_proto.h"

#include <stdlib.h>
#include <string.h>

/* Past this many changed records (of the graph's) a delta saves little;
 * the whole goes, and becomes the next base. */
#define DELTA_MAX_SHARE 2   /* at most 1/2 of the records */

/* So many STALE answers in a row and the host is taken not to keep graphs
 * (its memo off, or graphs too large for it): deltas stop for the device,
 * each having cost a round trip. */
#define DELTA_STALE_LIMIT 4

bool apir_graph_delta_wanted(const struct apir_device *d)
{
    return !d->delta.off && apir_minor_speaks(d->remote.minor, APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA);
}

static bool grow(uint8_t **buf, size_t *cap, size_t size)
{
    if (size <= *cap)
        return true;
    size_t want = *cap ? *cap : 64 * 1024;
    while (want < size)
        want *= 2;
    uint8_t *p = realloc(*buf, want);
    if (!p)
        return false;
    *buf = p;
    *cap = want;
    return true;
}

/* Where a blob's records start and how many there are; false if the blob is
 * shorter than its counts say (only our own blobs come here). */
static bool records_of(const uint8_t *blob, size_t size, size_t *at, uint32_t *n)
{
    uint32_t n_nodes;
    if (size < 4)
        return false;
    memcpy(&n_nodes, blob, 4);
    const size_t count_at = 4 + (size_t)n_nodes * 8;
    if (count_at + 4 > size)
        return false;
    memcpy(n, blob + count_at, 4);
    *at = count_at + 4;
    return *at + (size_t)*n * APIR_TENSOR_REC_SIZE <= size;
}

bool apir_graph_delta_reserve(struct apir_graph_delta *gd, size_t size, uint32_t n)
{
    gd->cmp = NULL;
    gd->n_changed = 0;
    if (!grow(&gd->whole, &gd->whole_cap, size))
        return false;
    if (n > gd->changed_cap) {
        uint32_t *c = realloc(gd->changed, (size_t)n * sizeof(*c));
        if (!c)
            return true;  /* sent whole */
        gd->changed = c;
        gd->changed_cap = n;
    }
    size_t at;
    if (gd->base_key && records_of(gd->base, gd->base_size, &at, &gd->cmp_n))
        gd->cmp = gd->base + at;
    return true;
}

size_t apir_graph_delta_build(struct apir_device *d, size_t size)
{
    struct apir_graph_delta *gd = &d->delta;
    struct apir_remote *r = &d->remote;
    size_t at;
    uint32_t n;
    /* The records were compared as they were written (apir_graph_delta_note). */
    if (!gd->cmp || !records_of(gd->whole, size, &at, &n))
        return 0;
    const uint32_t changed = gd->n_changed;
    if (changed > n / DELTA_MAX_SHARE)
        return 0;
    const uint8_t *recs = gd->whole + at;
    const size_t tail = size - at - (size_t)n * APIR_TENSOR_REC_SIZE;
    const size_t dsize = at + 4 + (size_t)changed * (4 + APIR_TENSOR_REC_SIZE) + tail;
    if (!apir_remote_data_reserve(r, dsize))
        return 0;
    uint8_t *out = r->data;
    memcpy(out, gd->whole, at);
    memcpy(out + at, &changed, 4);
    uint8_t *index = out + at + 4, *rec_out = index + (size_t)changed * 4;
    memcpy(index, gd->changed, (size_t)changed * 4);
    for (uint32_t k = 0; k < changed; k++)
        memcpy(rec_out + (size_t)k * APIR_TENSOR_REC_SIZE, recs + (size_t)gd->changed[k] * APIR_TENSOR_REC_SIZE,
               APIR_TENSOR_REC_SIZE);
    memcpy(rec_out + (size_t)changed * APIR_TENSOR_REC_SIZE, recs + (size_t)n * APIR_TENSOR_REC_SIZE, tail);
    return dsize;
}

bool apir_graph_delta_whole_to_data(struct apir_device *d, size_t size)
{
    struct apir_remote *r = &d->remote;
    if (!apir_remote_data_reserve(r, size))
        return false;
    memcpy(r->data, d->delta.whole, size);
    return true;
}

void apir_graph_delta_done(struct apir_device *d, uint64_t key, bool to_whole, size_t size, bool as_delta, int rc)
{
    struct apir_graph_delta *gd = &d->delta;
    if (rc != APIR_HANDLER_OK || !to_whole) {
        gd->base_key = 0;
        return;
    }
    if (as_delta) {
        gd->sent++;
        gd->stale_run = 0;
    }
    /* The blob just accepted is the next base: the two buffers trade places. */
    uint8_t *p = gd->base;
    size_t cap = gd->base_cap;
    gd->base = gd->whole;
    gd->base_cap = gd->whole_cap;
    gd->base_size = size;
    gd->whole = p;
    gd->whole_cap = cap;
    gd->base_key = key;
}

void apir_graph_delta_stale(struct apir_device *d)
{
    struct apir_graph_delta *gd = &d->delta;
    gd->base_key = 0;
    gd->sent++;
    gd->stale++;
    if (++gd->stale_run >= DELTA_STALE_LIMIT && !gd->off) {
        gd->off = true;
        APIR_INFO("guest", "%s: the host kept none of the last %d graphs: graphs go whole from now on", d->name,
                  DELTA_STALE_LIMIT);
    }
}

void apir_graph_delta_forget(struct apir_device *d)
{
    d->delta.base_key = 0;
}
