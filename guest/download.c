/*
 * Downloads through the data area, with the guest's copy overlapping the
 * host's.
 *
 * Through shared memory a read-back costs the host's copy from the device
 * into the (page-locked) data area, then this side's copy out of it into
 * the program's memory.  One after the other they ran at 0.58 of a native
 * CUDA download on the H200 machine (6.3 against 10.5 GB/s, 256 MiB): by
 * arithmetic, about 12 ms of DMA into the data area and 30 ms of one
 * core's memcpy out of it.  With BUFFER_GET_TENSOR_CHUNKED (apir 0.6) the host copies a
 * data area's range in pieces and counts the pieces done in the data
 * area's first page; while the submit waits for the reply this side copies
 * out each piece the count covers (spread over threads, bulk_copy.h), so
 * the two copies overlap and a command costs about the slower of the two
 * plus one piece.  The reply, not the count, says the whole range is
 * there: whatever the wait left is copied after it, and the count is never
 * followed past the pieces this side asked for.
 *
 * The wait spins as long as a graph wait does (APIR_SPIN_GRAPH_US: pieces
 * come every few hundred microseconds), then sleeps on the count, which the
 * host wakes when told this side sleeps; the sleeps are bounded (a host that
 * answers without finishing, a refusal, does not touch the count), and the
 * transport checks between runs that the host is alive.
 */
#include "download.h"

#include "bulk_copy.h"
#include "calls.h"

#include "apir_proto.h"
#include "fdpass.h"
#include "wait.h"

#include <stdlib.h>
#include <string.h>

#define PIECE_DEFAULT_KB 4096u
/* How long one run of the wait work may take before the transport looks
 * at the host again (shm_client.c checks every 50 ms too). */
#define RUN_MAX_NS (50ull * 1000 * 1000)
/* Spins in slices this long, looking at the reply word between them. */
#define SPIN_SLICE_NS (50ull * 1000)
/* A sleep on the count: the host wakes it when a piece lands; the bound is
 * for a reply that comes without one. */
#define SLEEP_NS (1000ull * 1000)

size_t apir_download_piece_from_env(void)
{
    const char *v = getenv("APIR_GET_PIECE_KB");
    unsigned long kb = PIECE_DEFAULT_KB;
    if (v && *v) {
        char *end = NULL;
        kb = strtoul(v, &end, 10);
        if (!end || *end || kb > (1ul << 22))
            kb = PIECE_DEFAULT_KB;
    }
    if (kb == 0)
        return 0;
    size_t bytes = (size_t)kb << 10;
    bytes = apir_page_round_down(bytes);  /* pieces start on pages of the data area */
    return bytes < APIR_CHUNK_MIN ? APIR_CHUNK_MIN : bytes;
}

/* One command's pieces, copied from the data area into the program's memory. */
struct piece_copy {
    struct apir_wait_work work;  /* first: run gets &work */
    struct apir_chunk_progress *progress;
    const uint8_t *src;
    uint8_t *dst;
    size_t size, piece;
    uint32_t n_pieces;
    size_t copied;               /* bytes of dst done, from its start */
    uint64_t spin_ns;
    uint64_t idle_since;         /* when the last piece was copied (0: none yet) */
};

/* Copies what the host's count covers and this side has not copied; true
 * if that was anything. */
static bool copy_counted(struct piece_copy *c)
{
    uint32_t k = atomic_load_explicit(&c->progress->pieces_done, memory_order_acquire);
    if (k > c->n_pieces)
        k = c->n_pieces;  /* never past the range asked for */
    size_t upto = (size_t)k * c->piece;  /* k <= n_pieces: at most size + piece, no overflow */
    if (upto > c->size)
        upto = c->size;
    if (upto <= c->copied)
        return false;
    apir_bulk_copy(c->dst + c->copied, c->src + c->copied, upto - c->copied);
    c->copied = upto;
    return true;
}

static bool copy_while_waiting(struct apir_wait_work *w, _Atomic uint32_t *reply_word)
{
    struct piece_copy *c = (struct piece_copy *)w;
    const uint64_t start = apir_now_ns();
    if (!c->idle_since)
        c->idle_since = start;  /* kept across runs: a long wait spins once, then sleeps */
    while (c->copied < c->size) {
        if (copy_counted(c)) {
            c->idle_since = apir_now_ns();
            continue;
        }
        if (atomic_load_explicit(reply_word, memory_order_acquire))
            return false;
        const uint64_t now = apir_now_ns();
        if (now - start > RUN_MAX_NS)
            return true;
        const uint32_t seen = atomic_load_explicit(&c->progress->pieces_done, memory_order_relaxed);
        if (now - c->idle_since < c->spin_ns) {
            apir_spin_while_equal(&c->progress->pieces_done, seen, SPIN_SLICE_NS);
            continue;
        }
        /* seq_cst, paired with the host's store of the count before it
         * looks at guest_sleeping: either it sees us asleep or we see its
         * new count. */
        atomic_store(&c->progress->guest_sleeping, 1);
        if (atomic_load(&c->progress->pieces_done) == seen && !atomic_load(reply_word))
            apir_futex_wait(&c->progress->pieces_done, seen, SLEEP_NS);
        atomic_store(&c->progress->guest_sleeping, 0);
    }
    return false;
}

/* One command: n bytes from offset in pieces, into dst. */
static int get_in_pieces(struct apir_remote *r, uint64_t buffer, const struct apir_tensor_rec *rec, uint64_t offset,
                         uint8_t *dst, size_t n, size_t piece)
{
    struct apir_chunk_progress *progress = (struct apir_chunk_progress *)r->data;
    atomic_store_explicit(&progress->pieces_done, 0, memory_order_relaxed);
    atomic_store_explicit(&progress->guest_sleeping, 0, memory_order_relaxed);
    struct piece_copy c = {
        .work = { .run = copy_while_waiting },
        .progress = progress,
        .src = r->data + APIR_DOWNLOAD_AREA_OFFSET,
        .dst = dst,
        .size = n,
        .piece = piece,
        .n_pieces = (uint32_t)((n + piece - 1) / piece),
        .spin_ns = r->graph_spin_ns,
    };
    const struct apir_call_opts copy_early = { .wait_work = &c.work };
    int rc = apir_call_BUFFER_GET_TENSOR_CHUNKED_opts_locked(r, &copy_early, buffer, rec, r->data_res_id,
                                                             APIR_DOWNLOAD_AREA_OFFSET, offset, n, piece, 0);
    if (rc != APIR_HANDLER_OK)
        return rc;
    uint64_t c0 = r->profile ? apir_now_ns() : 0;
    if (c.copied < n)
        apir_bulk_copy(dst + c.copied, c.src + c.copied, n - c.copied);
    if (r->profile) {
        /* After the reply, as every other copy counted; the rest overlapped. */
        r->copy_ns += apir_now_ns() - c0;
        r->copy_bytes += n - c.copied;
        r->copy_early_bytes += c.copied;
    }
    return APIR_HANDLER_OK;
}

/* The piece size for a command of at most room bytes: at least two pieces
 * fit, or 0 (no pieces). */
static size_t piece_for(const struct apir_remote *r, size_t room)
{
    size_t piece = r->get_piece;
    size_t half = apir_page_round_down(room / 2);
    if (piece > half)
        piece = half;
    return piece >= APIR_CHUNK_MIN ? piece : 0;
}

int apir_download_locked(struct apir_remote *r, uint64_t buffer, const struct apir_tensor_rec *rec, uint64_t offset,
                         void *dst, size_t size)
{
    const bool pieces_ok = r->get_piece && r->t->runs_wait_work &&
                           apir_minor_speaks(r->minor, APIR_CMD_BUFFER_GET_TENSOR_CHUNKED) &&
                           r->data_size > APIR_DOWNLOAD_AREA_OFFSET;
    const size_t room = pieces_ok ? r->data_size - APIR_DOWNLOAD_AREA_OFFSET : 0;
    const size_t piece = pieces_ok ? piece_for(r, room) : 0;
    uint8_t *out = dst;
    size_t done = 0;
    while (done < size) {
        const size_t left = size - done;
        int rc = -1;
        size_t n;
        if (piece && left > piece) {
            n = left < room ? left : room;
            rc = get_in_pieces(r, buffer, rec, offset + done, out + done, n, piece);
        } else {
            /* One piece or less: the plain command, one round trip. */
            n = left < r->data_size ? left : r->data_size;
            const struct apir_call_opts get = { .get_dst = out + done, .get_size = n };
            rc = apir_call_BUFFER_GET_TENSOR_opts_locked(r, &get, buffer, rec, r->data_res_id, offset + done, n);
        }
        if (rc != APIR_HANDLER_OK) {
            memset(out + done, 0, left);
            return rc;
        }
        done += n;
    }
    return APIR_HANDLER_OK;
}
