/* apir-gguf-gen: write a random-weight llama-architecture GGUF model.
 *
 *   apir-gguf-gen -o OUT.gguf [--size tiny|1b|8b] [--type f16|f32|q4_0|q8_0]
 *                 [--embd-type f16|f32|q4_0|q8_0]
 *                 [--layers N --embd N --ff N --heads N --kv-heads N --vocab N --ctx N]
 *                 [--seed N] [--vocab-from VOCAB.gguf]
 *
 * The file is meant for tests and benchmarks of ggml backends (llama-bench,
 * apir-llama-greedy): it has the shape of a real llama model but its weights
 * are deterministic pseudo-random numbers (xorshift64*, seeded per tensor from
 * --seed and the tensor index, so the content does not depend on chunking).
 *
 *   - 2-D weights: uniform in [-a, a], a = 1/sqrt(fan_in) (fan_in = ne[0]), so
 *     every matmul after an RMS norm yields activations of std ~0.6 and the
 *     residual stream stays finite for any depth/width;
 *   - token_embd: uniform in [-0.05, 0.05] (it goes through RMS norm anyway);
 *   - norms: 1.0, f32.
 *
 * --type is the type of the per-layer matrices (default f16); token_embd and
 * output use --embd-type (default: the same as --type).  q4_0/q8_0 data is made
 * with ggml_quantize_chunk.
 *
 * Vocabulary: tokenizer.ggml.model = "none" plus llama.vocab_size.  At the
 * pinned llama.cpp commit this makes the loader create n_vocab dummy tokens
 * (LLAMA_VOCAB_TYPE_NONE, no BOS/EOS, add_bos = false); that is all that is
 * needed to load, llama-bench and decode by token id.  There is no tokenizer,
 * so text prompts are not possible (by design: tests feed token ids).
 *
 * --vocab-from VOCAB.gguf takes the tokenizer instead from a vocab-only GGUF
 * file (llama.cpp ships them: models/ggml-vocab-*.gguf): every tokenizer.* key
 * is copied and the vocabulary size becomes its token count, so programs that
 * take text (llama-server, llama-perplexity...) run on random weights.
 *
 * Writing is streaming: the metadata is written with gguf_write_to_file_ptr
 * (only_meta = true, which pads to general.alignment), then each tensor's data
 * is generated in chunks of rows, converted/quantized and appended, followed by
 * zero padding to the alignment -- the same layout gguf_write_to_file produces.
 * Memory use is a few tens of MiB whatever the model size.
 *
 * Output: one line "PATH: N params, M MiB".
 */
#include "apir_build.h"
#include "ggml.h"
#include "gguf.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gen_params {
    const char *out;
    enum ggml_type type;
    enum ggml_type embd_type;
    bool embd_type_set;
    int64_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, n_ctx;
    uint64_t seed;
    const char *vocab_from;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: apir-gguf-gen -o OUT.gguf [--size tiny|1b|8b] [--type f16|f32|q4_0|q8_0]\n"
            "                     [--embd-type f16|f32|q4_0|q8_0]\n"
            "                     [--layers N --embd N --ff N --heads N --kv-heads N --vocab N --ctx N]\n"
            "                     [--seed N] [--vocab-from VOCAB.gguf] [--help] [--version]\n"
            "Writes a llama-architecture GGUF model of random weights (for tests and benchmarks).\n"
            "  -o, --out OUT.gguf      the file to write\n"
            "      --size PRESET       tiny, 1b or 8b (the presets below; default tiny)\n"
            "      --type TYPE         the weights' type: f16, f32, q4_0 or q8_0\n"
            "      --embd-type TYPE    the token embedding's type (default: --type)\n"
            "      --layers N          layers (overrides the preset, as the options below)\n"
            "      --embd N            embedding width\n"
            "      --ff N              feed-forward width\n"
            "      --heads N           attention heads\n"
            "      --kv-heads N        key/value heads\n"
            "      --vocab N           vocabulary size\n"
            "      --ctx N             context length\n"
            "      --seed N            the random weights' seed\n"
            "      --vocab-from FILE   take the vocabulary of this GGUF model\n"
            "  -h, --help              this help\n"
            "      --version           apir's version, the APIR protocol version and the ggml it was built against\n"
            "presets: tiny = embd 256, 4 layers, ff 768, heads 4, kv 2, vocab 4096, ctx 2048\n"
            "         1b   = embd 2048, 16 layers, ff 8192, heads 32, kv 8, vocab 32000, ctx 4096\n"
            "         8b   = embd 4096, 32 layers, ff 14336, heads 32, kv 8, vocab 32000, ctx 8192\n"
            "exit status: 0 written; 1 the file cannot be written; 2 bad command line\n");
}

static bool set_preset(struct gen_params *p, const char *name) {
    if (strcmp(name, "tiny") == 0) {
        p->n_embd = 256; p->n_layer = 4; p->n_ff = 768; p->n_head = 4; p->n_head_kv = 2;
        p->n_vocab = 4096; p->n_ctx = 2048;
    } else if (strcmp(name, "1b") == 0) {
        p->n_embd = 2048; p->n_layer = 16; p->n_ff = 8192; p->n_head = 32; p->n_head_kv = 8;
        p->n_vocab = 32000; p->n_ctx = 4096;
    } else if (strcmp(name, "8b") == 0) {
        p->n_embd = 4096; p->n_layer = 32; p->n_ff = 14336; p->n_head = 32; p->n_head_kv = 8;
        p->n_vocab = 32000; p->n_ctx = 8192;
    } else {
        return false;
    }
    return true;
}

static bool parse_type(const char *s, enum ggml_type *t) {
    if (strcmp(s, "f32") == 0) { *t = GGML_TYPE_F32; return true; }
    if (strcmp(s, "f16") == 0) { *t = GGML_TYPE_F16; return true; }
    if (strcmp(s, "q4_0") == 0) { *t = GGML_TYPE_Q4_0; return true; }
    if (strcmp(s, "q8_0") == 0) { *t = GGML_TYPE_Q8_0; return true; }
    return false;
}

/* llama_ftype values (llama.h) for general.file_type */
static uint32_t ftype_of(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_F32: return 0;  /* LLAMA_FTYPE_ALL_F32 */
    case GGML_TYPE_F16: return 1;  /* LLAMA_FTYPE_MOSTLY_F16 */
    case GGML_TYPE_Q4_0: return 2; /* LLAMA_FTYPE_MOSTLY_Q4_0 */
    case GGML_TYPE_Q8_0: return 7; /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    default: return 0;
    }
}

static bool parse_i64(const char *s, int64_t *v) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || x <= 0) {
        return false;
    }
    *v = (int64_t)x;
    return true;
}

/* Copies the tokenizer of a vocab-only GGUF file: all its keys, then every key
 * outside tokenizer.* removed again (gguf has no per-key copy).  n_vocab
 * becomes the number of tokens. */
static bool copy_tokenizer(struct gguf_context *dst, const char *path, int64_t *n_vocab) {
    struct gguf_init_params gp = { .no_alloc = true, .ctx = NULL };
    struct gguf_context *src = gguf_init_from_file(path, gp);
    if (!src) {
        fprintf(stderr, "apir-gguf-gen: cannot read %s as GGUF\n", path);
        return false;
    }
    const int64_t tokens = gguf_find_key(src, "tokenizer.ggml.tokens");
    if (tokens < 0 || gguf_get_kv_type(src, tokens) != GGUF_TYPE_ARRAY || gguf_get_arr_n(src, tokens) == 0 ||
        gguf_get_arr_n(src, tokens) > INT32_MAX) {
        fprintf(stderr, "apir-gguf-gen: %s has no tokenizer.ggml.tokens\n", path);
        gguf_free(src);
        return false;
    }
    *n_vocab = (int64_t)gguf_get_arr_n(src, tokens);
    gguf_set_kv(dst, src);
    gguf_free(src);
    for (int64_t i = gguf_get_n_kv(dst) - 1; i >= 0; i--) {
        const char *key = gguf_get_key(dst, i);
        if (strncmp(key, "tokenizer.", strlen("tokenizer.")) != 0) {
            char name[256];
            snprintf(name, sizeof(name), "%s", key);
            gguf_remove_key(dst, name);
        }
    }
    return true;
}

/* ---- deterministic PRNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s;
};

static void rng_seed(struct rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    r->s = splitmix64(&x);
    if (r->s == 0) {
        r->s = 0x2545F4914F6CDD1Dull;
    }
}

/* xorshift64* ; uniform float in [-1, 1) from the top 24 bits */
static inline float rng_uniform(struct rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    uint32_t v = (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 40);
    return (float)v * (2.0f / 16777216.0f) - 1.0f;
}

/* ---- tensors ---- */

enum init_kind { INIT_ONES, INIT_UNIFORM };

struct tdesc {
    struct ggml_tensor *t;
    enum init_kind init;
    float scale;
};

#define MAX_TENSORS 4096

static struct tdesc g_tensors[MAX_TENSORS];
static int g_n_tensors;

static struct ggml_tensor *add_tensor(struct ggml_context *ctx, struct gguf_context *gctx, const char *name,
                                      enum ggml_type type, int64_t ne0, int64_t ne1, enum init_kind init,
                                      float scale) {
    if (g_n_tensors >= MAX_TENSORS) {
        fprintf(stderr, "apir-gguf-gen: too many tensors\n");
        exit(1);
    }
    if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && ne0 % ggml_blck_size(type) != 0) {
        fprintf(stderr, "apir-gguf-gen: %s: row size %" PRId64 " not a multiple of the %s block size %" PRId64 "\n",
                name, ne0, ggml_type_name(type), ggml_blck_size(type));
        exit(1);
    }
    struct ggml_tensor *t = ne1 > 0 ? ggml_new_tensor_2d(ctx, type, ne0, ne1) : ggml_new_tensor_1d(ctx, type, ne0);
    ggml_set_name(t, name);
    gguf_add_tensor(gctx, t);
    g_tensors[g_n_tensors].t = t;
    g_tensors[g_n_tensors].init = init;
    g_tensors[g_n_tensors].scale = scale;
    g_n_tensors++;
    return t;
}

static bool write_zeros(FILE *f, size_t n) {
    static const char zeros[64];
    while (n > 0) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        if (fwrite(zeros, 1, k, f) != k) {
            return false;
        }
        n -= k;
    }
    return true;
}

/* generate, convert and append one tensor's data; returns false on I/O error */
static bool write_tensor_data(FILE *f, const struct tdesc *d, uint64_t seed, uint64_t stream, float *fbuf,
                              void *qbuf, int64_t chunk_elems) {
    const struct ggml_tensor *t = d->t;
    const int64_t n_per_row = t->ne[0];
    const int64_t nrows = ggml_nelements(t) / n_per_row;
    int64_t rows_per_chunk = chunk_elems / n_per_row;
    if (rows_per_chunk < 1) {
        rows_per_chunk = 1;
    }
    struct rng r;
    rng_seed(&r, seed, stream);

    for (int64_t row0 = 0; row0 < nrows; row0 += rows_per_chunk) {
        const int64_t nr = (nrows - row0) < rows_per_chunk ? (nrows - row0) : rows_per_chunk;
        const int64_t n = nr * n_per_row;
        if (d->init == INIT_ONES) {
            for (int64_t i = 0; i < n; i++) {
                fbuf[i] = 1.0f;
            }
        } else {
            const float s = d->scale;
            for (int64_t i = 0; i < n; i++) {
                fbuf[i] = s * rng_uniform(&r);
            }
        }
        const void *src = fbuf;
        size_t nbytes;
        switch (t->type) {
        case GGML_TYPE_F32:
            nbytes = (size_t)n * sizeof(float);
            break;
        case GGML_TYPE_F16:
            ggml_fp32_to_fp16_row(fbuf, (ggml_fp16_t *)qbuf, n);
            src = qbuf;
            nbytes = (size_t)n * sizeof(ggml_fp16_t);
            break;
        default:
            nbytes = ggml_quantize_chunk(t->type, fbuf, qbuf, 0, nr, n_per_row, NULL);
            src = qbuf;
            break;
        }
        if (nbytes != ggml_row_size(t->type, n_per_row) * (size_t)nr) {
            fprintf(stderr, "apir-gguf-gen: %s: unexpected chunk size %zu\n", ggml_get_name(t), nbytes);
            return false;
        }
        if (fwrite(src, 1, nbytes, f) != nbytes) {
            return false;
        }
    }
    return true;
}

int main(int argc, char **argv) {
    struct gen_params p;
    memset(&p, 0, sizeof(p));
    p.type = GGML_TYPE_F16;
    p.seed = 42;
    set_preset(&p, "tiny");
    int64_t ov_layer = 0, ov_embd = 0, ov_ff = 0, ov_head = 0, ov_head_kv = 0, ov_vocab = 0, ov_ctx = 0;

    enum { O_SIZE = 256, O_TYPE, O_EMBD_TYPE, O_LAYERS, O_EMBD, O_FF, O_HEADS, O_KV_HEADS, O_VOCAB, O_CTX, O_VOCAB_FROM,
           O_SEED, O_VERSION };
    static const struct option opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, O_VERSION },
        { "out", required_argument, NULL, 'o' },
        { "size", required_argument, NULL, O_SIZE },
        { "type", required_argument, NULL, O_TYPE },
        { "embd-type", required_argument, NULL, O_EMBD_TYPE },
        { "layers", required_argument, NULL, O_LAYERS },
        { "embd", required_argument, NULL, O_EMBD },
        { "ff", required_argument, NULL, O_FF },
        { "heads", required_argument, NULL, O_HEADS },
        { "kv-heads", required_argument, NULL, O_KV_HEADS },
        { "vocab", required_argument, NULL, O_VOCAB },
        { "ctx", required_argument, NULL, O_CTX },
        { "vocab-from", required_argument, NULL, O_VOCAB_FROM },
        { "seed", required_argument, NULL, O_SEED },
        { NULL, 0, NULL, 0 },
    };
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":ho:", opts, NULL)) != -1) {
        const char *v = optarg;
        bool ok = true;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case O_VERSION:
            APIR_PRINT_VERSION(stdout, "apir-gguf-gen");
            return 0;
        case 'o': p.out = v; break;
        case O_SIZE: ok = set_preset(&p, v); break;
        case O_TYPE: ok = parse_type(v, &p.type); break;
        case O_EMBD_TYPE:
            ok = parse_type(v, &p.embd_type);
            p.embd_type_set = true;
            break;
        case O_LAYERS: ok = parse_i64(v, &ov_layer); break;
        case O_EMBD: ok = parse_i64(v, &ov_embd); break;
        case O_FF: ok = parse_i64(v, &ov_ff); break;
        case O_HEADS: ok = parse_i64(v, &ov_head); break;
        case O_KV_HEADS: ok = parse_i64(v, &ov_head_kv); break;
        case O_VOCAB: ok = parse_i64(v, &ov_vocab); break;
        case O_CTX: ok = parse_i64(v, &ov_ctx); break;
        case O_VOCAB_FROM: p.vocab_from = v; break;
        case O_SEED: {
            char *end = NULL;
            errno = 0;
            p.seed = strtoull(v, &end, 0);
            ok = errno == 0 && end != v && *end == '\0' && *v != '-';
            break;
        }
        case ':':
            fprintf(stderr, "apir-gguf-gen: missing value for %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        default:
            fprintf(stderr, "apir-gguf-gen: unknown option %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            /* the option: the word before a separate value, else "--opt=value" itself */
            const char *opt = argv[optind - 1] == v ? argv[optind - 2] : argv[optind - 1];
            fprintf(stderr, "apir-gguf-gen: bad value for %s: '%s'\n", opt, v);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "apir-gguf-gen: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    /* explicit dimensions override the preset, whatever the argument order */
    if (ov_layer) p.n_layer = ov_layer;
    if (ov_embd) p.n_embd = ov_embd;
    if (ov_ff) p.n_ff = ov_ff;
    if (ov_head) p.n_head = ov_head;
    if (ov_head_kv) p.n_head_kv = ov_head_kv;
    if (ov_vocab) p.n_vocab = ov_vocab;
    if (ov_ctx) p.n_ctx = ov_ctx;
    if (!p.embd_type_set) {
        p.embd_type = p.type;
    }

    if (!p.out) {
        fprintf(stderr, "apir-gguf-gen: -o OUT.gguf is required\n");
        usage(stderr);
        return 2;
    }
    if (p.n_embd % p.n_head != 0 || p.n_head % p.n_head_kv != 0) {
        fprintf(stderr, "apir-gguf-gen: embd (%" PRId64 ") must be a multiple of heads (%" PRId64
                        "), heads a multiple of kv-heads (%" PRId64 ")\n",
                p.n_embd, p.n_head, p.n_head_kv);
        return 2;
    }
    const int64_t head_dim = p.n_embd / p.n_head;
    if (head_dim % 2 != 0) {
        fprintf(stderr, "apir-gguf-gen: head dim %" PRId64 " must be even (rope)\n", head_dim);
        return 2;
    }
    const int64_t n_embd_kv = head_dim * p.n_head_kv;
    if (p.n_vocab > INT32_MAX || p.n_ctx > UINT32_MAX || p.n_layer > 1000) {
        fprintf(stderr, "apir-gguf-gen: dimensions out of range\n");
        return 2;
    }

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    /* ---- metadata ---- */
    struct gguf_context *gctx = gguf_init_empty();
    if (p.vocab_from && !copy_tokenizer(gctx, p.vocab_from, &p.n_vocab)) {
        return 1;
    }
    gguf_set_val_str(gctx, "general.architecture", "llama");
    gguf_set_val_str(gctx, "general.name", "apir-random-llama");
    gguf_set_val_u32(gctx, "general.file_type", ftype_of(p.type));
    gguf_set_val_u32(gctx, "general.quantization_version", 2);
    gguf_set_val_u32(gctx, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
    gguf_set_val_u32(gctx, "llama.context_length", (uint32_t)p.n_ctx);
    gguf_set_val_u32(gctx, "llama.embedding_length", (uint32_t)p.n_embd);
    gguf_set_val_u32(gctx, "llama.block_count", (uint32_t)p.n_layer);
    gguf_set_val_u32(gctx, "llama.feed_forward_length", (uint32_t)p.n_ff);
    gguf_set_val_u32(gctx, "llama.attention.head_count", (uint32_t)p.n_head);
    gguf_set_val_u32(gctx, "llama.attention.head_count_kv", (uint32_t)p.n_head_kv);
    gguf_set_val_u32(gctx, "llama.rope.dimension_count", (uint32_t)head_dim);
    gguf_set_val_f32(gctx, "llama.rope.freq_base", 10000.0f);
    gguf_set_val_f32(gctx, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_set_val_u32(gctx, "llama.vocab_size", (uint32_t)p.n_vocab);
    if (!p.vocab_from) {
        gguf_set_val_str(gctx, "tokenizer.ggml.model", "none");
    }

    /* ---- tensor infos (no data: no_alloc context) ---- */
    const size_t n_tensors_max = 3 + 9 * (size_t)p.n_layer;
    struct ggml_init_params ip = {
        .mem_size = ggml_tensor_overhead() * (n_tensors_max + 8),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    struct ggml_context *ctx = ggml_init(ip);
    if (!ctx) {
        fprintf(stderr, "apir-gguf-gen: ggml_init failed\n");
        return 1;
    }

    const float s_embd = 1.0f / sqrtf((float)p.n_embd);
    const float s_ff = 1.0f / sqrtf((float)p.n_ff);
    add_tensor(ctx, gctx, "token_embd.weight", p.embd_type, p.n_embd, p.n_vocab, INIT_UNIFORM, 0.05f);
    add_tensor(ctx, gctx, "output_norm.weight", GGML_TYPE_F32, p.n_embd, 0, INIT_ONES, 1.0f);
    add_tensor(ctx, gctx, "output.weight", p.embd_type, p.n_embd, p.n_vocab, INIT_UNIFORM, s_embd);
    char name[GGML_MAX_NAME];
    for (int64_t l = 0; l < p.n_layer; l++) {
#define LNAME(suffix) (snprintf(name, sizeof(name), "blk.%d." suffix, (int)l), name)
        add_tensor(ctx, gctx, LNAME("attn_norm.weight"), GGML_TYPE_F32, p.n_embd, 0, INIT_ONES, 1.0f);
        add_tensor(ctx, gctx, LNAME("attn_q.weight"), p.type, p.n_embd, p.n_embd, INIT_UNIFORM, s_embd);
        add_tensor(ctx, gctx, LNAME("attn_k.weight"), p.type, p.n_embd, n_embd_kv, INIT_UNIFORM, s_embd);
        add_tensor(ctx, gctx, LNAME("attn_v.weight"), p.type, p.n_embd, n_embd_kv, INIT_UNIFORM, s_embd);
        add_tensor(ctx, gctx, LNAME("attn_output.weight"), p.type, p.n_embd, p.n_embd, INIT_UNIFORM, s_embd);
        add_tensor(ctx, gctx, LNAME("ffn_norm.weight"), GGML_TYPE_F32, p.n_embd, 0, INIT_ONES, 1.0f);
        add_tensor(ctx, gctx, LNAME("ffn_gate.weight"), p.type, p.n_embd, p.n_ff, INIT_UNIFORM, s_embd);
        add_tensor(ctx, gctx, LNAME("ffn_down.weight"), p.type, p.n_ff, p.n_embd, INIT_UNIFORM, s_ff);
        add_tensor(ctx, gctx, LNAME("ffn_up.weight"), p.type, p.n_embd, p.n_ff, INIT_UNIFORM, s_embd);
#undef LNAME
    }

    /* ---- write ---- */
    FILE *f = fopen(p.out, "wb");
    if (!f) {
        fprintf(stderr, "apir-gguf-gen: cannot open %s: %s\n", p.out, strerror(errno));
        return 1;
    }
    static char iobuf[1 << 20];
    setvbuf(f, iobuf, _IOFBF, sizeof(iobuf));

    if (!gguf_write_to_file_ptr(gctx, f, /*only_meta =*/true)) {
        fprintf(stderr, "apir-gguf-gen: writing metadata to %s failed\n", p.out);
        fclose(f);
        return 1;
    }
    const size_t alignment = gguf_get_alignment(gctx);
    /* gguf_get_data_offset is only valid for contexts read from a file: the data
     * section starts right after the (padded) metadata we just wrote */
    const long meta_end = ftell(f);
    if (meta_end < 0 || (size_t)meta_end % alignment != 0) {
        fprintf(stderr, "apir-gguf-gen: unexpected metadata size %ld\n", meta_end);
        fclose(f);
        return 1;
    }
    const size_t data_offset = (size_t)meta_end;

    const int64_t chunk_elems = (int64_t)4 << 20; /* 4 Mi floats = 16 MiB per chunk */
    int64_t max_row = 0;
    for (int i = 0; i < g_n_tensors; i++) {
        if (g_tensors[i].t->ne[0] > max_row) {
            max_row = g_tensors[i].t->ne[0];
        }
    }
    const int64_t buf_elems = chunk_elems > max_row ? chunk_elems : max_row;
    float *fbuf = malloc((size_t)buf_elems * sizeof(float));
    void *qbuf = malloc((size_t)buf_elems * sizeof(float)); /* >= any of our types' sizes */
    if (!fbuf || !qbuf) {
        fprintf(stderr, "apir-gguf-gen: out of memory\n");
        fclose(f);
        return 1;
    }

    int64_t n_params = 0;
    bool ok = true;
    errno = 0;
    for (int i = 0; i < g_n_tensors && ok; i++) {
        const struct ggml_tensor *t = g_tensors[i].t;
        /* sanity: we are exactly where gguf says this tensor lives */
        const long pos = ftell(f);
        const size_t want = data_offset + gguf_get_tensor_offset(gctx, i);
        if (pos < 0 || (size_t)pos != want) {
            fprintf(stderr, "apir-gguf-gen: %s: file offset %ld, expected %zu\n", ggml_get_name(t), pos, want);
            ok = false;
            break;
        }
        ok = write_tensor_data(f, &g_tensors[i], p.seed, (uint64_t)i + 1, fbuf, qbuf, chunk_elems);
        const size_t nb = ggml_nbytes(t);
        ok = ok && write_zeros(f, GGML_PAD(nb, alignment) - nb);
        n_params += ggml_nelements(t);
    }
    free(fbuf);
    free(qbuf);
    if (fflush(f) != 0) {
        ok = false;
    }
    const long fsize = ftell(f);
    if (fclose(f) != 0) {
        ok = false;
    }
    if (!ok) {
        fprintf(stderr, "apir-gguf-gen: writing %s failed%s%s\n", p.out, errno ? ": " : "", errno ? strerror(errno) : "");
        remove(p.out);
        return 1;
    }

    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    printf("%s: %" PRId64 " params (%.3f B), %.1f MiB, type %s (embd %s), %" PRId64 " layers, embd %" PRId64
           ", ff %" PRId64 ", heads %" PRId64 "/%" PRId64 ", vocab %" PRId64 ", %.1f s\n",
           p.out, n_params, (double)n_params / 1e9, (double)fsize / (1024.0 * 1024.0), ggml_type_name(p.type),
           ggml_type_name(p.embd_type), p.n_layer, p.n_embd, p.n_ff, p.n_head, p.n_head_kv, p.n_vocab, secs);

    gguf_free(gctx);
    ggml_free(ctx);
    return 0;
}
