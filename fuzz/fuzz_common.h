/*
 * What every fuzz target and the seed generator share, whether they drive
 * a host (fuzz_host.h) or only the codec (fuzz_codec.c, make_seeds.c):
 * libFuzzer's entry points, the oracle macro, and per-command calls of the
 * typed messages (apir_messages.h) generated from the command table.
 */
#ifndef APIR_FUZZ_COMMON_H
#define APIR_FUZZ_COMMON_H

#include "apir_messages.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A finding of the harness's own oracles: abort so libFuzzer saves the
 * input, with a line that says which rule broke. */
#define FZ_ASSERT(cond, ...)                                                           \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "FUZZ ORACLE: %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/*
 * waitpid for a harness's computing child, again after a signal.  Not
 * coverage-instrumented: libFuzzer's own timer (-timeout) interrupts the
 * wait now and then, and the retries would be new coverage in one run and
 * not in another, so that a fixed seed and run count (fuzz/run.sh --gate)
 * would not give the same run on every machine.
 */
#if defined(__clang__)
#define FZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define FZ_NO_COVERAGE /* gcc (apir-fuzz-op-dev): no coverage to leave out */
#endif
FZ_NO_COVERAGE static inline pid_t fz_wait_child(pid_t pid, int *status)
{
    pid_t w;
    do
        w = pid > 0 ? waitpid(pid, status, 0) : -1;
    while (w < 0 && errno == EINTR);
    return w;
}

/* An exact-size heap copy of an input (a real message or blob ends where
 * its size says: ASan then reports a read past it); free() it. */
static inline uint8_t *fz_copy(const uint8_t *data, size_t size)
{
    uint8_t *p = malloc(size ? size : 1);
    if (!p)
        abort();
    if (size)
        memcpy(p, data, size);
    return p;
}

/*
 * FZ_DEFINE_TYPED_ENCODE(name, ctx_type) defines
 *
 *   static inline void name(const ctx_type *ctx, uint32_t cmd, bool reply, struct apir_encoder *enc)
 *
 * which encodes cmd's request (or reply) with its typed encoder,
 * apir_encode_request_<NAME> (apir_encode_reply_<NAME>), item p (counted
 * from 0) being fz_in_<kind>(ctx, p).  The file defines those, one per item
 * kind, before it uses the macro.  A number that is no command makes enc
 * fatal.
 */
#define FZ_ITEM_IN_DECL(kind, field) APIR_IN_##kind a_##field = fz_in_##kind(ctx, x_p); x_p++;
#define FZ_ITEM_IN_ARG(kind, field) , a_##field
#define FZ_ITEM_IN_SET(kind, field) x_rep.field = fz_in_##kind(ctx, x_p); x_p++;
#define FZ_X_TYPED_ENCODE(num, NAME, since, classes)                                   \
    case APIR_CMD_##NAME:                                                              \
        if (!reply) {                                                                  \
            APIR_REQ_##NAME(FZ_ITEM_IN_DECL)                                           \
            apir_encode_request_##NAME(enc APIR_REQ_##NAME(FZ_ITEM_IN_ARG));           \
        } else {                                                                       \
            struct apir_reply_##NAME x_rep;                                            \
            memset(&x_rep, 0, sizeof(x_rep));                                          \
            APIR_REP_##NAME(FZ_ITEM_IN_SET)                                            \
            apir_encode_reply_##NAME(enc, &x_rep);                                     \
        }                                                                              \
        break;
#define FZ_DEFINE_TYPED_ENCODE(name, ctx_type)                                         \
    static inline void name(const ctx_type *ctx, uint32_t cmd, bool reply, struct apir_encoder *enc) \
    {                                                                                  \
        size_t x_p = 0;                                                                \
        (void)ctx;                                                                     \
        (void)x_p;                                                                     \
        switch (cmd) {                                                                 \
            APIR_COMMAND_LIST(FZ_X_TYPED_ENCODE)                                       \
        default:                                                                       \
            enc->fatal = true;                                                         \
            break;                                                                     \
        }                                                                              \
    }

/*
 * FZ_DEFINE_TYPED_DECODE_REPLY(name, ctx_type) defines
 *
 *   static inline bool name(ctx_type *ctx, uint32_t cmd, struct apir_decoder *dec)
 *
 * which decodes cmd's reply with apir_decode_reply_<NAME> (what a guest
 * does) and returns its verdict (false for a number that is no command),
 * then hands each reply item p, decoded or zeroed, to
 * fz_seen_<kind>(ctx, p, const APIR_OUT_<kind> *): functions or macros the
 * file defines before, one per kind a reply can hold.
 */
#define FZ_ITEM_OUT_DECL(kind, field) static APIR_OUT_##kind o_##field;
#define FZ_ITEM_OUT_ADDR(kind, field) , &o_##field
#define FZ_ITEM_OUT_SEEN(kind, field) fz_seen_##kind(ctx, x_p, &o_##field); x_p++;
#define FZ_X_TYPED_DECODE_REPLY(num, NAME, since, classes)                             \
    case APIR_CMD_##NAME: {                                                            \
        APIR_REP_##NAME(FZ_ITEM_OUT_DECL)                                              \
        ok = apir_decode_reply_##NAME(dec APIR_REP_##NAME(FZ_ITEM_OUT_ADDR));          \
        APIR_REP_##NAME(FZ_ITEM_OUT_SEEN)                                              \
        break;                                                                         \
    }
#define FZ_DEFINE_TYPED_DECODE_REPLY(name, ctx_type)                                   \
    static inline bool name(ctx_type *ctx, uint32_t cmd, struct apir_decoder *dec)     \
    {                                                                                  \
        bool ok = false;                                                               \
        size_t x_p = 0;                                                                \
        (void)ctx;                                                                     \
        (void)x_p;                                                                     \
        switch (cmd) {                                                                 \
            APIR_COMMAND_LIST(FZ_X_TYPED_DECODE_REPLY)                                 \
        default:                                                                       \
            break;                                                                     \
        }                                                                              \
        return ok;                                                                     \
    }

#endif
