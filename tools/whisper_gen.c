/* apir-whisper-gen: write a random-weight whisper model in whisper.cpp's legacy
 * ggml file format.
 *
 *   apir-whisper-gen -i for-tests-ggml-tiny.bin -o OUT.bin [--seed N] [--type f16|f32]
 *                    [--text-ctx N] [--help] [--version]
 *
 * Why: whisper.cpp's test models (models/for-tests-ggml-*.bin in its source
 * tree) carry the header, the mel filters and the vocabulary but no tensors, so
 * they load but compute nothing.  The tests that compare whisper through APIR0
 * with the CPU backend need a model that really runs every kernel of an encoder
 * and a decoder, without downloading weights: this tool copies that tensor-less
 * prefix and appends every tensor whisper_model_load (src/whisper.cpp) creates,
 * with deterministic pseudo-random contents.
 *
 * File layout (all little-endian), as the loader reads it:
 *   magic 0x67676d6c; 11 int32 hparams (n_vocab, n_audio_ctx, n_audio_state,
 *   n_audio_head, n_audio_layer, n_text_ctx, n_text_state, n_text_head,
 *   n_text_layer, n_mels, ftype); int32 n_mel, n_fft + n_mel*n_fft floats;
 *   int32 n_words + per word (uint32 len, bytes); then per tensor: int32 n_dims,
 *   int32 name length, int32 type (0 f32, 1 f16), n_dims int32 ne (ggml order,
 *   ne[0] fastest), the name, the data.
 *
 * --text-ctx N replaces the decoder's context length (448 in every released
 * model): whisper.cpp decodes at most N/2 - 4 tokens per segment, so a test can
 * bound its decoding time (a random model rarely ends a segment by itself).
 *
 * Types follow whisper.cpp's converter: matrices and convolution kernels use
 * the file type (f16 by default), everything 1-D, the convolution biases and
 * the positional embeddings are f32.
 *
 * Values (xorshift64* seeded per tensor from --seed and its index, so the output
 * depends on nothing else): linear and convolution weights uniform in
 * [-1/sqrt(fan_in), 1/sqrt(fan_in)] so activations after each layer norm stay
 * of order one through any depth; layer-norm weights 1 and biases 0; other
 * biases uniform in [-0.02, 0.02]; positional and token embeddings uniform in
 * [-0.05, 0.05] (the token embedding is also the output projection, which then
 * gives logits of standard deviation ~0.6: no ties, no overflow, a decoder
 * that is stable and never certain).
 */
#include "apir_build.h"
#include "ggml.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHISPER_MAGIC 0x67676d6cu
#define N_HPARAMS 11
#define MAX_VOCAB 1000000
#define MAX_FILTER_FLOATS (1 << 20)

enum hparam { HP_N_VOCAB, HP_N_AUDIO_CTX, HP_N_AUDIO_STATE, HP_N_AUDIO_HEAD, HP_N_AUDIO_LAYER, HP_N_TEXT_CTX,
              HP_N_TEXT_STATE, HP_N_TEXT_HEAD, HP_N_TEXT_LAYER, HP_N_MELS, HP_FTYPE };

/* ---- deterministic PRNG (the same scheme as apir-gguf-gen) ---- */

struct rng {
    uint64_t s;
};

static void rng_seed(struct rng *r, uint64_t seed, uint64_t stream) {
    uint64_t z = seed ^ (stream * 0xD1B54A32D192ED03ull);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 0x2545F4914F6CDD1Dull;
}

/* uniform float in [-1, 1) from the top 24 bits */
static float rng_uniform(struct rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    uint32_t v = (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 40);
    return (float)v * (2.0f / 16777216.0f) - 1.0f;
}

/* ---- reading the tensor-less prefix ---- */

struct prefix {
    unsigned char *bytes;
    size_t size;
    int32_t hp[N_HPARAMS];
};

static bool read_i32(const struct prefix *p, size_t *pos, int32_t *v) {
    if (p->size - *pos < 4) {
        return false;
    }
    memcpy(v, p->bytes + *pos, 4);
    *pos += 4;
    return true;
}

/* Walks the header, filters and vocabulary, checking each length against the
 * file, and requires the file to end there (a model that already has tensors
 * would get a second set). */
static bool parse_prefix(struct prefix *p, const char *path) {
    size_t pos = 0;
    int32_t magic;
    if (!read_i32(p, &pos, &magic) || (uint32_t)magic != WHISPER_MAGIC) {
        fprintf(stderr, "apir-whisper-gen: %s: not a whisper ggml model (bad magic)\n", path);
        return false;
    }
    for (int i = 0; i < N_HPARAMS; i++) {
        if (!read_i32(p, &pos, &p->hp[i]) || p->hp[i] < 0) {
            fprintf(stderr, "apir-whisper-gen: %s: truncated or negative hparams\n", path);
            return false;
        }
    }
    int32_t n_mel, n_fft;
    if (!read_i32(p, &pos, &n_mel) || !read_i32(p, &pos, &n_fft) || n_mel < 0 || n_fft < 0 ||
        (int64_t)n_mel * n_fft > MAX_FILTER_FLOATS || p->size - pos < (size_t)n_mel * (size_t)n_fft * 4) {
        fprintf(stderr, "apir-whisper-gen: %s: bad mel filters\n", path);
        return false;
    }
    pos += (size_t)n_mel * (size_t)n_fft * 4;
    int32_t n_words;
    if (!read_i32(p, &pos, &n_words) || n_words < 0 || n_words > MAX_VOCAB) {
        fprintf(stderr, "apir-whisper-gen: %s: bad vocabulary size\n", path);
        return false;
    }
    for (int32_t i = 0; i < n_words; i++) {
        int32_t len;
        if (!read_i32(p, &pos, &len) || len < 0 || p->size - pos < (size_t)len) {
            fprintf(stderr, "apir-whisper-gen: %s: truncated vocabulary at word %d\n", path, (int)i);
            return false;
        }
        pos += (size_t)len;
    }
    if (pos != p->size) {
        fprintf(stderr, "apir-whisper-gen: %s: %zu bytes after the vocabulary (already has tensors?)\n", path,
                p->size - pos);
        return false;
    }
    const int32_t *hp = p->hp;
    if (hp[HP_N_AUDIO_STATE] != hp[HP_N_TEXT_STATE] || hp[HP_N_AUDIO_STATE] == 0 || hp[HP_N_VOCAB] == 0 ||
        hp[HP_N_AUDIO_CTX] == 0 || hp[HP_N_TEXT_CTX] == 0 || hp[HP_N_MELS] == 0 || hp[HP_N_AUDIO_LAYER] > 64 ||
        hp[HP_N_TEXT_LAYER] > 64) {
        fprintf(stderr, "apir-whisper-gen: %s: unsupported hparams\n", path);
        return false;
    }
    return true;
}

static bool load_prefix(struct prefix *p, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "apir-whisper-gen: cannot open %s: %s\n", path, strerror(errno));
        return false;
    }
    bool ok = fseek(f, 0, SEEK_END) == 0;
    long size = ok ? ftell(f) : -1;
    ok = ok && size > 0 && size < (64L << 20) && fseek(f, 0, SEEK_SET) == 0;
    p->bytes = ok ? malloc((size_t)size) : NULL;
    ok = p->bytes && fread(p->bytes, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "apir-whisper-gen: cannot read %s\n", path);
        return false;
    }
    p->size = (size_t)size;
    return parse_prefix(p, path);
}

/* ---- writing tensors ---- */

enum init_kind { INIT_ONES, INIT_ZEROS, INIT_UNIFORM };

struct writer {
    FILE *f;
    uint64_t seed;
    uint64_t n_tensors;
    uint64_t n_params;
    enum ggml_type wtype; /* matrices and convolution kernels */
    float *fbuf;
    ggml_fp16_t *hbuf;
    size_t buf_elems;
    bool ok;
};

static bool write_i32(FILE *f, int32_t v) { return fwrite(&v, 4, 1, f) == 1; }

static bool ensure_buffers(struct writer *w, size_t n) {
    if (n <= w->buf_elems) {
        return true;
    }
    float *fb = realloc(w->fbuf, n * sizeof(float));
    if (fb) {
        w->fbuf = fb;
    }
    ggml_fp16_t *hb = realloc(w->hbuf, n * sizeof(ggml_fp16_t));
    if (hb) {
        w->hbuf = hb;
    }
    if (!fb || !hb) {
        return false;
    }
    w->buf_elems = n;
    return true;
}

/* One tensor record: header, name, data.  ne in ggml order; n_dims as the
 * loader's shape check expects (it compares ne[0..2] and the element count). */
static void put_tensor(struct writer *w, const char *name, enum ggml_type type, int n_dims, const int32_t *ne,
                       enum init_kind init, float scale) {
    if (!w->ok) {
        return;
    }
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) {
        n *= (size_t)ne[i];
    }
    const int32_t name_len = (int32_t)strlen(name);
    bool ok = ensure_buffers(w, n) && write_i32(w->f, n_dims) && write_i32(w->f, name_len) &&
              write_i32(w->f, type == GGML_TYPE_F16 ? 1 : 0);
    for (int i = 0; ok && i < n_dims; i++) {
        ok = write_i32(w->f, ne[i]);
    }
    ok = ok && fwrite(name, 1, (size_t)name_len, w->f) == (size_t)name_len;
    if (ok) {
        struct rng r;
        rng_seed(&r, w->seed, ++w->n_tensors);
        for (size_t i = 0; i < n; i++) {
            w->fbuf[i] = init == INIT_ONES ? 1.0f : init == INIT_ZEROS ? 0.0f : scale * rng_uniform(&r);
        }
        if (type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(w->fbuf, w->hbuf, (int64_t)n);
            ok = fwrite(w->hbuf, sizeof(ggml_fp16_t), n, w->f) == n;
        } else {
            ok = fwrite(w->fbuf, sizeof(float), n, w->f) == n;
        }
    }
    if (!ok) {
        fprintf(stderr, "apir-whisper-gen: writing %s failed\n", name);
    }
    w->n_params += n;
    w->ok = ok;
}

static void put_1d(struct writer *w, const char *name, int32_t n0, enum init_kind init, float scale) {
    const int32_t ne[1] = { n0 };
    put_tensor(w, name, GGML_TYPE_F32, 1, ne, init, scale);
}

/* a matrix of n_out rows of n_in: y = W x */
static void put_matrix(struct writer *w, const char *name, int32_t n_in, int32_t n_out, float scale) {
    const int32_t ne[2] = { n_in, n_out };
    put_tensor(w, name, w->wtype, 2, ne, INIT_UNIFORM, scale);
}

static float fan_in_scale(int32_t fan_in) { return 1.0f / sqrtf((float)fan_in); }

#define BIAS_SCALE 0.02f
#define EMBD_SCALE 0.05f

/* The blocks of one attention + MLP layer; prefix is "encoder.blocks.N" or
 * "decoder.blocks.N", attn "attn" or "cross_attn". */
static void put_attention(struct writer *w, const char *prefix, const char *attn, int32_t n_state) {
    char name[128];
    const float s = fan_in_scale(n_state);
#define NAME(suffix) (snprintf(name, sizeof(name), "%s.%s" suffix, prefix, attn), name)
    put_1d(w, NAME("_ln.weight"), n_state, INIT_ONES, 0);
    put_1d(w, NAME("_ln.bias"), n_state, INIT_ZEROS, 0);
    put_matrix(w, NAME(".query.weight"), n_state, n_state, s);
    put_1d(w, NAME(".query.bias"), n_state, INIT_UNIFORM, BIAS_SCALE);
    put_matrix(w, NAME(".key.weight"), n_state, n_state, s);
    put_matrix(w, NAME(".value.weight"), n_state, n_state, s);
    put_1d(w, NAME(".value.bias"), n_state, INIT_UNIFORM, BIAS_SCALE);
    put_matrix(w, NAME(".out.weight"), n_state, n_state, s);
    put_1d(w, NAME(".out.bias"), n_state, INIT_UNIFORM, BIAS_SCALE);
#undef NAME
}

static void put_mlp(struct writer *w, const char *prefix, int32_t n_state) {
    char name[128];
#define NAME(suffix) (snprintf(name, sizeof(name), "%s." suffix, prefix), name)
    put_1d(w, NAME("mlp_ln.weight"), n_state, INIT_ONES, 0);
    put_1d(w, NAME("mlp_ln.bias"), n_state, INIT_ZEROS, 0);
    put_matrix(w, NAME("mlp.0.weight"), n_state, 4 * n_state, fan_in_scale(n_state));
    put_1d(w, NAME("mlp.0.bias"), 4 * n_state, INIT_UNIFORM, BIAS_SCALE);
    put_matrix(w, NAME("mlp.2.weight"), 4 * n_state, n_state, fan_in_scale(4 * n_state));
    put_1d(w, NAME("mlp.2.bias"), n_state, INIT_UNIFORM, BIAS_SCALE);
#undef NAME
}

static void put_encoder(struct writer *w, const int32_t *hp) {
    const int32_t n_state = hp[HP_N_AUDIO_STATE], n_mels = hp[HP_N_MELS];
    const int32_t pe[2] = { n_state, hp[HP_N_AUDIO_CTX] };
    put_tensor(w, "encoder.positional_embedding", GGML_TYPE_F32, 2, pe, INIT_UNIFORM, EMBD_SCALE);
    /* conv kernels: ne = (kernel 3, in channels, out channels) */
    const int32_t conv1[3] = { 3, n_mels, n_state }, conv2[3] = { 3, n_state, n_state };
    const int32_t bias[2] = { 1, n_state };
    put_tensor(w, "encoder.conv1.weight", w->wtype, 3, conv1, INIT_UNIFORM, fan_in_scale(3 * n_mels));
    put_tensor(w, "encoder.conv1.bias", GGML_TYPE_F32, 2, bias, INIT_UNIFORM, BIAS_SCALE);
    put_tensor(w, "encoder.conv2.weight", w->wtype, 3, conv2, INIT_UNIFORM, fan_in_scale(3 * n_state));
    put_tensor(w, "encoder.conv2.bias", GGML_TYPE_F32, 2, bias, INIT_UNIFORM, BIAS_SCALE);
    put_1d(w, "encoder.ln_post.weight", n_state, INIT_ONES, 0);
    put_1d(w, "encoder.ln_post.bias", n_state, INIT_ZEROS, 0);
    for (int32_t i = 0; i < hp[HP_N_AUDIO_LAYER]; i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "encoder.blocks.%d", (int)i);
        put_mlp(w, prefix, n_state);
        put_attention(w, prefix, "attn", n_state);
    }
}

static void put_decoder(struct writer *w, const int32_t *hp) {
    const int32_t n_state = hp[HP_N_TEXT_STATE];
    const int32_t pe[2] = { n_state, hp[HP_N_TEXT_CTX] };
    put_tensor(w, "decoder.positional_embedding", GGML_TYPE_F32, 2, pe, INIT_UNIFORM, EMBD_SCALE);
    const int32_t te[2] = { n_state, hp[HP_N_VOCAB] };
    put_tensor(w, "decoder.token_embedding.weight", w->wtype, 2, te, INIT_UNIFORM, EMBD_SCALE);
    put_1d(w, "decoder.ln.weight", n_state, INIT_ONES, 0);
    put_1d(w, "decoder.ln.bias", n_state, INIT_ZEROS, 0);
    for (int32_t i = 0; i < hp[HP_N_TEXT_LAYER]; i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "decoder.blocks.%d", (int)i);
        put_mlp(w, prefix, n_state);
        put_attention(w, prefix, "attn", n_state);
        put_attention(w, prefix, "cross_attn", n_state);
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: apir-whisper-gen -i TENSORLESS.bin -o OUT.bin [--seed N] [--type f16|f32] [--text-ctx N]\n"
               "                        [--help] [--version]   (-i/--input, -o/--out; --opt=value works too)\n"
               "  TENSORLESS.bin: whisper.cpp's models/for-tests-ggml-*.bin (header, mel filters, vocabulary)\n");
}

int main(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    uint64_t seed = 42;
    long text_ctx = 0;
    enum ggml_type wtype = GGML_TYPE_F16;
    enum { O_SEED = 256, O_TEXT_CTX, O_TYPE, O_VERSION };
    static const struct option opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, O_VERSION },
        { "input", required_argument, NULL, 'i' },
        { "out", required_argument, NULL, 'o' },
        { "seed", required_argument, NULL, O_SEED },
        { "text-ctx", required_argument, NULL, O_TEXT_CTX },
        { "type", required_argument, NULL, O_TYPE },
        { NULL, 0, NULL, 0 },
    };
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hi:o:", opts, NULL)) != -1) {
        const char *v = optarg;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case O_VERSION:
            APIR_PRINT_VERSION(stdout, "apir-whisper-gen");
            return 0;
        case 'i':
            in = v;
            break;
        case 'o':
            out = v;
            break;
        case O_SEED: {
            char *end = NULL;
            errno = 0;
            seed = strtoull(v, &end, 0);
            if (errno != 0 || end == v || *end != '\0' || *v == '-') {
                fprintf(stderr, "apir-whisper-gen: bad seed '%s'\n", v);
                return 2;
            }
            break;
        }
        case O_TEXT_CTX: {
            char *end = NULL;
            text_ctx = strtol(v, &end, 10);
            if (end == v || *end != '\0' || text_ctx < 8 || text_ctx > 4096) {
                fprintf(stderr, "apir-whisper-gen: --text-ctx wants 8..4096, not '%s'\n", v);
                return 2;
            }
            break;
        }
        case O_TYPE:
            if (strcmp(v, "f16") != 0 && strcmp(v, "f32") != 0) {
                fprintf(stderr, "apir-whisper-gen: --type wants f16 or f32, not '%s'\n", v);
                return 2;
            }
            wtype = strcmp(v, "f16") == 0 ? GGML_TYPE_F16 : GGML_TYPE_F32;
            break;
        case ':':
            fprintf(stderr, "apir-whisper-gen: missing value for %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        default:
            fprintf(stderr, "apir-whisper-gen: unknown option %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "apir-whisper-gen: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!in || !out) {
        usage(stderr);
        return 2;
    }

    struct prefix p = { 0 };
    if (!load_prefix(&p, in)) {
        free(p.bytes);
        return 1;
    }
    /* the file type decides the type of the matrices (ftype 0 = all f32, 1 = f16) */
    const int32_t ftype = wtype == GGML_TYPE_F16 ? 1 : 0;
    memcpy(p.bytes + 4 + 4 * HP_FTYPE, &ftype, 4);
    p.hp[HP_FTYPE] = ftype;
    if (text_ctx) {
        p.hp[HP_N_TEXT_CTX] = (int32_t)text_ctx;
        memcpy(p.bytes + 4 + 4 * HP_N_TEXT_CTX, &p.hp[HP_N_TEXT_CTX], 4);
    }

    FILE *f = fopen(out, "wb");
    if (!f) {
        fprintf(stderr, "apir-whisper-gen: cannot open %s: %s\n", out, strerror(errno));
        free(p.bytes);
        return 1;
    }
    struct writer w = { .f = f, .seed = seed, .wtype = wtype, .ok = true };
    w.ok = fwrite(p.bytes, 1, p.size, f) == p.size;
    put_encoder(&w, p.hp);
    put_decoder(&w, p.hp);
    bool ok = w.ok;
    ok = fclose(f) == 0 && ok;
    free(w.fbuf);
    free(w.hbuf);
    free(p.bytes);
    if (!ok) {
        fprintf(stderr, "apir-whisper-gen: writing %s failed\n", out);
        remove(out);
        return 1;
    }
    printf("%s: %" PRIu64 " tensors, %" PRIu64 " params, type %s, %d audio + %d text layers, seed %" PRIu64 "\n", out,
           w.n_tensors, w.n_params, ggml_type_name(wtype), (int)p.hp[HP_N_AUDIO_LAYER], (int)p.hp[HP_N_TEXT_LAYER],
           seed);
    return 0;
}
