/*
 * fuzz_dispatch: sequences of backend commands through apir_session_forward,
 * on a real CPU backend (graphs are really computed).
 *
 * Input format: fuzz_format.h.  Per input: a fresh session (0.2, a 1 MiB
 * data blob whose first bytes come from the input, one 64 KiB buffer), the
 * commands in order, then the session is freed: anything it leaks is a
 * finding (LeakSanitizer).  Each request is copied to an exact-size heap
 * block so that ASan sees a read past its end; the reply area is exact-size
 * too.  Oracles: handler results are in range, an OK result never comes
 * with an overflowed reply, and an OK reply holds exactly the items of its
 * signature.
 */
#include "fuzz_host.h"
#include "weight_copies.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * Graphs are computed as apir-host computes them for a guest: in a process
 * of their own.  A backend kernel that asserts on an odd (but in-bounds)
 * node aborts through ggml_abort, which ends that process only - the
 * containment process isolation gives, and not a finding.  Anything else
 * that kills the child (a fault, a sanitizer report) is one.
 */
#define CONTAINED_ABORT_EXIT 42

static void contained_abort(const char *message)
{
    (void)message;
    _exit(CONTAINED_ABORT_EXIT);
}

static uint32_t forward_isolated(struct apir_session *s, uint32_t cmd, struct apir_decoder *dec,
                                 struct apir_encoder *enc)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ggml_set_abort_callback(contained_abort);
        uint32_t r = apir_session_forward(s, cmd, dec, enc);
        _exit(r > 100 ? 100 : (int)r);
    }
    int status = 0;
    pid_t w = fz_wait_child(pid, &status);
    FZ_ASSERT(pid > 0 && w == pid, "fork/wait failed (errno %d)", errno);
    if (WIFEXITED(status) && WEXITSTATUS(status) == CONTAINED_ABORT_EXIT)
        return APIR_HANDLER_FAILED;
    FZ_ASSERT(WIFEXITED(status), "%s: the computing process died of signal %d", apir_command_name(cmd),
              WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    FZ_ASSERT(WEXITSTATUS(status) <= APIR_HANDLER_STALE, "%s: child exit %d", apir_command_name(cmd),
              WEXITSTATUS(status));
    /* The reply was written in the child; the checks below then see an
     * empty one, which is what a failed call looks like. */
    return APIR_HANDLER_FAILED;
}

static bool verbose;

/*
 * The data blob: one mapping for the process, zeroed per input (a fresh
 * 1 MiB heap block per input cost ~10 ms of page faults).  Page-aligned
 * like a real blob (BUFFER_FROM_PTR wraps it; the CPU backend wants aligned
 * host pointers), and followed by a PROT_NONE page: a buffer made from the
 * blob ends right there, so a read past it faults even from ggml's own,
 * uninstrumented kernels, which ASan cannot watch.
 */
static uint8_t *blob;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    fz_host_init();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, FZ_BLOB_SIZE + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect((uint8_t *)p + FZ_BLOB_SIZE, page, PROT_NONE) != 0)
        abort();
    blob = p;
    return 0;
}

/* A graph command (the table's APIR_GRAPH class: COMPUTE, _AT, _KEYED,
 * RECOMPUTE, COMPUTE_INPUTS, COMPUTE_DELTA). */
static bool is_graph_cmd(uint32_t cmd)
{
    return (apir_command_classes(cmd) & APIR_GRAPH) == APIR_GRAPH;
}

/* The graph a graph command names gets its handle numbers rewritten: the
 * request starts res, [blob_offset,] size (COMPUTE_INPUTS and
 * COMPUTE_DELTA: res, the uploads' offset and size, then the graph's; a
 * delta's records are patched as if whole, which is as good a mutation). */
static void patch_graph_of(uint32_t cmd, const uint8_t *req, size_t len, const struct fz_known *k, bool *known_hit)
{
    struct apir_decoder dec;
    apir_decoder_init(&dec, req, len);
    uint32_t res_id = apir_decode_u32(&dec);
    if (cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS || cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA) {
        apir_decode_u64(&dec);
        apir_decode_u64(&dec);
    }
    uint64_t offset = cmd != APIR_CMD_BACKEND_GRAPH_COMPUTE ? apir_decode_u64(&dec) : 0;
    uint64_t size = apir_decode_u64(&dec);
    if (dec.fatal || res_id != FZ_BLOB_RES_ID || offset >= FZ_BLOB_SIZE)
        return;
    if (size > FZ_BLOB_SIZE - offset)
        size = FZ_BLOB_SIZE - offset;
    fz_patch_graph(blob + offset, (size_t)size, k, known_hit);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_reader r = { data, size };
    memset(blob, 0, FZ_BLOB_SIZE);
    size_t got;
    const uint8_t *init = fz_take(&r, (size_t)fz_read_le(&r, 2), &got);
    memcpy(blob, init, got);

    struct fz_known k;
    struct apir_session *s = fz_session_new(&k);
    if (!apir_session_blob_add(s, FZ_BLOB_RES_ID, blob, FZ_BLOB_SIZE, NULL, NULL))
        abort();
    fz_alloc_buffer(s, FZ_BUF_A_SIZE, &k);

    const size_t reply_cap = APIR_REPLY_BLOB_SIZE - 4;  /* the reply page minus its word */
    uint8_t *reply = malloc(reply_cap);
    uint8_t *small_reply = malloc(8);
    for (int n = 0; n < FZ_MAX_CMDS && r.left >= 3; n++) {
        uint8_t op = (uint8_t)fz_read_le(&r, 1);
        size_t len = (size_t)fz_read_le(&r, 2);
        const uint8_t *src = fz_take(&r, len, &len);
        uint8_t *req = fz_copy(src, len);
        uint32_t cmd = op & 0x7fu;
        bool small = (op & FZ_OP_SMALL_REPLY) != 0;

        struct apir_decoder dec;
        struct apir_encoder enc;
        apir_decoder_init(&dec, req, len);
        apir_encoder_init(&enc, small ? small_reply : reply, small ? 8 : reply_cap);
        if (cmd == FZ_OP_HANDSHAKE) {
            uint32_t ret = apir_session_handshake(s, &dec, &enc);
            FZ_ASSERT(ret == 0 || ret == APIR_HANDSHAKE_MAGIC, "handshake returned %u", ret);
            FZ_ASSERT(s->minor <= APIR_VERSION_MINOR, "negotiated minor %u", s->minor);
            free(req);
            continue;
        }
        bool known_hit = false;
        if (cmd < APIR_CMD_COUNT) {
            fz_patch_request(req, len, apir_command_table[cmd].request, &k, &known_hit);
            if (is_graph_cmd(cmd) && cmd != APIR_CMD_BACKEND_GRAPH_RECOMPUTE)
                patch_graph_of(cmd, req, len, &k, &known_hit);
        }
        if (known_hit && fz_skipping_known()) {
            free(req);
            continue;
        }
        uint32_t res;
        if (is_graph_cmd(cmd)) {
            res = forward_isolated(s, cmd, &dec, &enc);
        } else {
            res = apir_session_forward(s, cmd, &dec, &enc);
        }
        if (verbose) {
            uint32_t first = 0;
            if (apir_encoder_used(&enc) >= 4)
                memcpy(&first, enc.start, 4);
            fprintf(stderr, "fuzz_dispatch: %s (%zu bytes) -> %u, reply %zu bytes (first word %u)\n",
                    apir_command_name(cmd), len, res, apir_encoder_used(&enc), first);
        }
        /* APIR_HANDLER_STALE is the last enumerator of apir_handler_result. */
        FZ_ASSERT(res <= APIR_HANDLER_STALE, "%s: handler result %u", apir_command_name(cmd), res);
        if (cmd >= APIR_CMD_COUNT)
            FZ_ASSERT(res == APIR_HANDLER_INVALID_INDEX, "unknown command %u gave %u", cmd, res);
        if (res == APIR_HANDLER_OK) {
            FZ_ASSERT(!enc.fatal, "%s: OK with an overflowed reply", apir_command_name(cmd));
            fz_check_reply(cmd, enc.start, apir_encoder_used(&enc), &k);
        }
        FZ_ASSERT(s->device < s->host->n_devices, "current device %u out of range", s->device);
        FZ_ASSERT(apir_weights_consistent(s), "%s: weight copies overlap or are broken", apir_command_name(cmd));
        free(req);
    }
    free(reply);
    free(small_reply);
    apir_session_free(s);
    return 0;
}
