/* apir-llama-greedy: load a GGUF model on one ggml device and decode greedily.
 *
 *   apir-llama-greedy -m MODEL.gguf [-d DEVICE_NAME[,DEVICE_NAME...]] [-n N_TOKENS] [-t THREADS]
 *                     [-c N_CTX] [-u N_UBATCH] [--prompt-ids 1,2,3,...] [--dump-logits FILE]
 *                     [--window FILE] [-v]
 *   apir-llama-greedy --compare FILE_A FILE_B [--tol X]
 *   apir-llama-greedy --list-devices
 *
 * Decode mode
 *   Backends are loaded with ggml_backend_load_all() (GGML_BACKEND_PATH, if set,
 *   adds one more backend library: that is how the remote device APIR0 shows
 *   up); if that finds no CPU backend, libggml-cpu.so is loaded from
 *   APIR_GGML_BIN (compile-time definition, the pinned build's bin/).
 *   -d NAME selects the device by its ggml name (default "CPU").  A CPU-type
 *   device means "everything on the CPU": an empty device list and
 *   n_gpu_layers = 0.  Any other device is passed as the only entry of
 *   llama_model_params.devices with n_gpu_layers = 999 (all layers and the
 *   output layer offloaded; the token-embedding lookup stays on the CPU, as
 *   llama.cpp always does).  -d NAME,NAME,... (up to 8 non-CPU devices)
 *   splits the layers across them (LLAMA_SPLIT_MODE_LAYER, in proportion to
 *   their free memory, as llama.cpp's -dev A,B does).  An unknown name prints
 *   the existing devices and exits 2.
 *   Token ids are fed directly (no tokenizer): the prompt (--prompt-ids, or a
 *   fixed default list reduced modulo n_vocab) is decoded as one batch (in
 *   micro-batches of N_UBATCH tokens with -u: on several devices llama.cpp
 *   then pipelines them, if every device offers async compute and events), then
 *   N_TOKENS (default 16) tokens are picked by argmax of the logits (lowest id
 *   wins a tie), each fed back for the next step.  Prints
 *       tokens: ID ID ...
 *   (the N generated ids) on stdout.  --window FILE writes "from NS" once the
 *   step a third of the way in has its logits and "to NS" after the last
 *   (CLOCK_MONOTONIC): the warmed-up steps, for tests/run_token_heap.sh.
 *
 * Logits dump format (--dump-logits FILE), binary, little-endian (host order):
 *   header:  char magic[8] = "APIRLGT1"; uint32 n_vocab; uint32 n_steps;
 *            uint32 n_prompt; int32 prompt_ids[n_prompt]
 *   then n_steps records: int32 token; float32 logits[n_vocab]
 *   Record k holds the logits that chose generated token k (record 0: after
 *   the prompt; record k: after feeding generated token k-1) and that token.
 *
 * Compare mode (--compare A B [--tol X], default tol 1e-3)
 *   Compares two dumps: prompts, n_vocab and step counts must match; prints
 *   the maximum absolute logit difference (over the steps whose inputs are
 *   identical, i.e. up to and including the first step whose chosen token
 *   differs) and whether the token sequences are equal.  Exit 0 when the
 *   tokens are equal and max diff <= tol, 1 when they differ, 2 on usage or
 *   I/O errors.  A token mismatch caused by a near tie (the top-2 gap within
 *   tol) is reported as such, but still fails.
 *
 * Exit codes: 0 ok, 1 runtime failure / dumps differ, 2 usage error, bad
 * input or missing device.
 */
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DUMP_MAGIC "APIRLGT1"

static const int32_t k_default_prompt[] = {1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889};

static bool g_verbose;

static void usage(FILE *f) {
    fprintf(f,
            "usage: apir-llama-greedy -m MODEL.gguf [-d DEVICE[,DEVICE...]] [-n N_TOKENS] [-t THREADS] [-c N_CTX]\n"
            "                         [-u N_UBATCH] [--prompt-ids 1,2,3,...] [--dump-logits FILE] [--window FILE] [-v]\n"
            "       apir-llama-greedy --compare FILE_A FILE_B [--tol X]\n"
            "       apir-llama-greedy --list-devices\n");
}

static void log_cb(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    static enum ggml_log_level last = GGML_LOG_LEVEL_INFO;
    if (level == GGML_LOG_LEVEL_CONT) {
        level = last;
    } else {
        last = level;
    }
    if (g_verbose || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static void list_devices(FILE *f) {
    const size_t n = ggml_backend_dev_count();
    fprintf(f, "available devices (%zu):\n", n);
    for (size_t i = 0; i < n; i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const char *type = "?";
        switch (ggml_backend_dev_type(dev)) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: type = "cpu"; break;
        case GGML_BACKEND_DEVICE_TYPE_GPU: type = "gpu"; break;
        case GGML_BACKEND_DEVICE_TYPE_IGPU: type = "igpu"; break;
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: type = "accel"; break;
        default: break;
        }
        fprintf(f, "  %-12s %-6s %s\n", ggml_backend_dev_name(dev), type, ggml_backend_dev_description(dev));
    }
}

static void load_backends(void) {
    ggml_backend_load_all();
#ifdef APIR_GGML_BIN
    if (ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) == NULL) {
        /* only the CPU library: load_all_from_path would load GGML_BACKEND_PATH a second time */
        ggml_backend_load(APIR_GGML_BIN "/libggml-cpu.so");
    }
#endif
}

/* ---- dump files ---- */

struct dump {
    uint32_t n_vocab, n_steps, n_prompt;
    int32_t *prompt;
    int32_t *tokens; /* n_steps */
    float *logits;   /* n_steps * n_vocab */
};

static void dump_free(struct dump *d) {
    free(d->prompt);
    free(d->tokens);
    free(d->logits);
    memset(d, 0, sizeof(*d));
}

static bool read_exact(FILE *f, void *p, size_t n) {
    return fread(p, 1, n, f) == n;
}

static bool dump_read(const char *path, struct dump *d) {
    memset(d, 0, sizeof(*d));
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "apir-llama-greedy: cannot open %s: %s\n", path, strerror(errno));
        return false;
    }
    char magic[8];
    bool ok = read_exact(f, magic, 8) && memcmp(magic, DUMP_MAGIC, 8) == 0;
    if (!ok) {
        fprintf(stderr, "apir-llama-greedy: %s: not a logits dump (bad magic)\n", path);
        fclose(f);
        return false;
    }
    ok = read_exact(f, &d->n_vocab, 4) && read_exact(f, &d->n_steps, 4) && read_exact(f, &d->n_prompt, 4);
    if (ok && (d->n_vocab == 0 || d->n_vocab > (1u << 24) || d->n_steps > (1u << 20) || d->n_prompt > (1u << 20) ||
               (uint64_t)d->n_vocab * d->n_steps > ((uint64_t)1 << 32))) {
        ok = false;
    }
    if (ok) {
        d->prompt = malloc((size_t)d->n_prompt * sizeof(int32_t) + 1);
        d->tokens = malloc((size_t)d->n_steps * sizeof(int32_t) + 1);
        d->logits = malloc((size_t)d->n_steps * d->n_vocab * sizeof(float) + 1);
        ok = d->prompt && d->tokens && d->logits;
    }
    ok = ok && read_exact(f, d->prompt, (size_t)d->n_prompt * sizeof(int32_t));
    for (uint32_t s = 0; ok && s < d->n_steps; s++) {
        ok = read_exact(f, &d->tokens[s], sizeof(int32_t)) &&
             read_exact(f, d->logits + (size_t)s * d->n_vocab, (size_t)d->n_vocab * sizeof(float));
    }
    char extra;
    if (ok && fread(&extra, 1, 1, f) != 0) {
        ok = false;
    }
    fclose(f);
    if (!ok) {
        fprintf(stderr, "apir-llama-greedy: %s: truncated or malformed logits dump\n", path);
        dump_free(d);
    }
    return ok;
}

static int32_t argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

static int do_compare(const char *pa, const char *pb, double tol) {
    struct dump a, b;
    if (!dump_read(pa, &a)) {
        return 2;
    }
    if (!dump_read(pb, &b)) {
        dump_free(&a);
        return 2;
    }
    int rc = 0;
    if (a.n_vocab != b.n_vocab || a.n_prompt != b.n_prompt ||
        memcmp(a.prompt, b.prompt, (size_t)a.n_prompt * sizeof(int32_t)) != 0) {
        fprintf(stderr, "compare: dumps are not comparable (n_vocab %u vs %u, prompt of %u vs %u ids%s)\n",
                a.n_vocab, b.n_vocab, a.n_prompt, b.n_prompt,
                a.n_prompt == b.n_prompt ? ", different ids" : "");
        dump_free(&a);
        dump_free(&b);
        return 2;
    }
    const uint32_t n_steps = a.n_steps < b.n_steps ? a.n_steps : b.n_steps;
    double max_diff = 0.0;
    uint32_t max_step = 0, max_idx = 0;
    int64_t first_mismatch = -1;
    bool nonfinite = false;
    for (uint32_t s = 0; s < n_steps; s++) {
        const float *la = a.logits + (size_t)s * a.n_vocab;
        const float *lb = b.logits + (size_t)s * b.n_vocab;
        for (uint32_t i = 0; i < a.n_vocab; i++) {
            if (!isfinite(la[i]) || !isfinite(lb[i])) {
                if (!nonfinite) {
                    fprintf(stderr, "compare: non-finite logit at step %u id %u: %g vs %g\n", s, i, (double)la[i],
                            (double)lb[i]);
                }
                nonfinite = true;
                continue;
            }
            const double dd = fabs((double)la[i] - (double)lb[i]);
            if (dd > max_diff) {
                max_diff = dd;
                max_step = s;
                max_idx = i;
            }
        }
        if (a.tokens[s] != b.tokens[s]) {
            first_mismatch = s;
            break; /* later steps have different inputs */
        }
    }
    printf("compare: %u vs %u steps, n_vocab %u, max abs diff %.6g (step %u, id %u), tol %g\n", a.n_steps,
           b.n_steps, a.n_vocab, max_diff, max_step, max_idx, tol);
    if (a.n_steps != b.n_steps) {
        printf("compare: FAIL: different number of steps\n");
        rc = 1;
    }
    if (first_mismatch >= 0) {
        const uint32_t s = (uint32_t)first_mismatch;
        const float *la = a.logits + (size_t)s * a.n_vocab;
        const float *lb = b.logits + (size_t)s * b.n_vocab;
        const int32_t ta = a.tokens[s], tb = b.tokens[s];
        const double gap_a = fabs((double)la[ta] - (double)la[tb]);
        const double gap_b = fabs((double)lb[ta] - (double)lb[tb]);
        printf("compare: FAIL: tokens differ at step %u: %d vs %d (gap between them: %.6g in A, %.6g in B%s)\n", s,
               ta, tb, gap_a, gap_b, (gap_a <= tol && gap_b <= tol) ? "; a near tie within tol" : "");
        rc = 1;
    } else if (a.n_steps == b.n_steps) {
        printf("compare: tokens equal (%u)\n", n_steps);
    }
    if (nonfinite) {
        printf("compare: FAIL: non-finite logits\n");
        rc = 1;
    }
    if (max_diff > tol) {
        printf("compare: FAIL: max abs diff %.6g > tol %g\n", max_diff, tol);
        rc = 1;
    }
    if (rc == 0) {
        printf("compare: OK\n");
    }
    dump_free(&a);
    dump_free(&b);
    return rc;
}

/* ---- argument parsing helpers ---- */

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

/* "1,2,3" -> ids; returns count or -1 */
static int parse_ids(const char *s, int32_t **out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids) {
        return -1;
    }
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno != 0 || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *nids = realloc(ids, cap * sizeof(int32_t));
            if (!nids) {
                free(ids);
                return -1;
            }
            ids = nids;
        }
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (n == 0 || n > (1u << 20)) {
        free(ids);
        return -1;
    }
    *out = ids;
    return (int)n;
}

/* --window FILE: "from NS" after the step a third of the way in, "to NS" after
 * the last (CLOCK_MONOTONIC; tests/run_token_heap.sh counts what both sides
 * allocated in between). */
static bool write_window(const char *path, bool from) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    FILE *f = fopen(path, from ? "w" : "a");
    if (!f) {
        fprintf(stderr, "apir-llama-greedy: cannot write %s\n", path);
        return false;
    }
    fprintf(f, "%s %lld\n", from ? "from" : "to", (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec);
    return fclose(f) == 0;
}

static bool write_all(FILE *f, const void *p, size_t n) {
    return fwrite(p, 1, n, f) == n;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    const char *dev_name = "CPU";
    const char *dump_path = NULL;
    const char *cmp_a = NULL, *cmp_b = NULL;
    const char *prompt_arg = NULL;
    const char *window_path = NULL;
    bool list_only = false;
    long n_gen = 16, n_threads = 2, n_ctx_arg = 0, n_ubatch_arg = 0;
    double tol = 1e-3;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool has_val = i + 1 < argc;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            g_verbose = true;
        } else if (strcmp(a, "--list-devices") == 0) {
            list_only = true;
        } else if (strcmp(a, "--compare") == 0) {
            if (i + 2 >= argc) {
                fprintf(stderr, "apir-llama-greedy: --compare needs two files\n");
                return 2;
            }
            cmp_a = argv[++i];
            cmp_b = argv[++i];
        } else if (!has_val) {
            fprintf(stderr, "apir-llama-greedy: missing value for %s\n", a);
            usage(stderr);
            return 2;
        } else if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) {
            model_path = argv[++i];
        } else if (strcmp(a, "-d") == 0 || strcmp(a, "--device") == 0) {
            dev_name = argv[++i];
        } else if (strcmp(a, "--dump-logits") == 0) {
            dump_path = argv[++i];
        } else if (strcmp(a, "--prompt-ids") == 0) {
            prompt_arg = argv[++i];
        } else if (strcmp(a, "--window") == 0) {
            window_path = argv[++i];
        } else if (strcmp(a, "--tol") == 0) {
            char *end = NULL;
            const char *v = argv[++i];
            errno = 0;
            tol = strtod(v, &end);
            if (errno != 0 || end == v || *end != '\0' || !(tol >= 0.0)) {
                fprintf(stderr, "apir-llama-greedy: bad --tol '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "-t") == 0 || strcmp(a, "-c") == 0 || strcmp(a, "-u") == 0) {
            long *dst = a[1] == 'n' ? &n_gen : a[1] == 't' ? &n_threads : a[1] == 'c' ? &n_ctx_arg : &n_ubatch_arg;
            const long lo = a[1] == 't' ? 1 : 0;
            if (!parse_int(argv[++i], lo, 1 << 20, dst)) {
                fprintf(stderr, "apir-llama-greedy: bad value for %s: '%s'\n", a, argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "apir-llama-greedy: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }

    if (cmp_a) {
        return do_compare(cmp_a, cmp_b, tol);
    }

    llama_log_set(log_cb, NULL);
    load_backends();
    llama_backend_init();

    if (list_only) {
        list_devices(stdout);
        return 0;
    }
    if (!model_path) {
        fprintf(stderr, "apir-llama-greedy: -m MODEL.gguf is required\n");
        usage(stderr);
        return 2;
    }

    /* -d NAME or NAME,NAME,...: the devices, in order */
    enum { MAX_DEVS = 8 };
    ggml_backend_dev_t devs[MAX_DEVS + 1] = {NULL};
    int n_devs = 0;
    for (const char *p = dev_name; ; ) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char one[64];
        if (len == 0 || len >= sizeof(one) || n_devs == MAX_DEVS) {
            fprintf(stderr, "apir-llama-greedy: bad -d '%s' (a device name, or up to %d names, comma-separated)\n",
                    dev_name, MAX_DEVS);
            return 2;
        }
        memcpy(one, p, len);
        one[len] = '\0';
        devs[n_devs] = ggml_backend_dev_by_name(one);
        if (!devs[n_devs]) {
            fprintf(stderr, "apir-llama-greedy: no ggml device named '%s'\n", one);
            list_devices(stderr);
            if (!getenv("GGML_BACKEND_PATH")) {
                fprintf(stderr, "(GGML_BACKEND_PATH is not set: remote devices such as APIR0 need it)\n");
            }
            return 2;
        }
        n_devs++;
        if (!comma) {
            break;
        }
        p = comma + 1;
    }
    ggml_backend_dev_t dev = devs[0];
    const bool on_cpu = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    for (int i = 0; i < n_devs; i++) {
        if (n_devs > 1 && ggml_backend_dev_type(devs[i]) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            fprintf(stderr, "apir-llama-greedy: -d %s: a split takes no CPU device\n", dev_name);
            return 2;
        }
    }

    struct llama_model_params mp = llama_model_default_params();
    if (on_cpu) {
        devs[0] = NULL;
        mp.devices = devs; /* empty list: no offload devices at all */
        mp.n_gpu_layers = 0;
    } else {
        mp.devices = devs;
        mp.n_gpu_layers = 999;
        mp.split_mode = n_devs > 1 ? LLAMA_SPLIT_MODE_LAYER : LLAMA_SPLIT_MODE_NONE;
        mp.main_gpu = 0;
    }

    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "apir-llama-greedy: failed to load model %s on %s\n", model_path, dev_name);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    if (n_vocab <= 0) {
        fprintf(stderr, "apir-llama-greedy: model has no vocabulary size\n");
        llama_model_free(model);
        return 1;
    }

    int32_t *prompt = NULL;
    int n_prompt;
    if (prompt_arg) {
        n_prompt = parse_ids(prompt_arg, &prompt);
        if (n_prompt < 0) {
            fprintf(stderr, "apir-llama-greedy: bad --prompt-ids '%s' (want e.g. 1,2,3)\n", prompt_arg);
            llama_model_free(model);
            return 2;
        }
        for (int i = 0; i < n_prompt; i++) {
            if (prompt[i] >= n_vocab) {
                fprintf(stderr, "apir-llama-greedy: prompt id %d out of range (n_vocab %d)\n", prompt[i], n_vocab);
                free(prompt);
                llama_model_free(model);
                return 2;
            }
        }
    } else {
        n_prompt = (int)(sizeof(k_default_prompt) / sizeof(k_default_prompt[0]));
        prompt = malloc(sizeof(k_default_prompt));
        if (!prompt) {
            llama_model_free(model);
            return 1;
        }
        for (int i = 0; i < n_prompt; i++) {
            prompt[i] = k_default_prompt[i] % n_vocab;
        }
    }

    struct llama_context_params cp = llama_context_default_params();
    const long n_need = (long)n_prompt + n_gen + 1;
    cp.n_ctx = (uint32_t)(n_ctx_arg > 0 ? n_ctx_arg : (n_need + 255) / 256 * 256);
    if ((long)cp.n_ctx < n_need) {
        fprintf(stderr, "apir-llama-greedy: -c %ld is too small for %d prompt + %ld generated tokens\n", n_ctx_arg,
                n_prompt, n_gen);
        free(prompt);
        llama_model_free(model);
        return 2;
    }
    cp.n_batch = (uint32_t)(n_prompt > 512 ? n_prompt : 512);
    cp.n_ubatch = n_ubatch_arg > 0 && n_ubatch_arg < (long)cp.n_batch ? (uint32_t)n_ubatch_arg : cp.n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = (int32_t)n_threads;
    cp.n_threads_batch = (int32_t)n_threads;
    cp.no_perf = true;

    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "apir-llama-greedy: failed to create a context on %s\n", dev_name);
        free(prompt);
        llama_model_free(model);
        return 1;
    }

    FILE *df = NULL;
    int rc = 0;
    if (dump_path) {
        df = fopen(dump_path, "wb");
        if (!df) {
            fprintf(stderr, "apir-llama-greedy: cannot open %s: %s\n", dump_path, strerror(errno));
            rc = 1;
            goto out;
        }
        const uint32_t hdr[3] = {(uint32_t)n_vocab, (uint32_t)n_gen, (uint32_t)n_prompt};
        if (!write_all(df, DUMP_MAGIC, 8) || !write_all(df, hdr, sizeof(hdr)) ||
            !write_all(df, prompt, (size_t)n_prompt * sizeof(int32_t))) {
            fprintf(stderr, "apir-llama-greedy: writing %s failed\n", dump_path);
            rc = 1;
            goto out;
        }
    }

    fprintf(stderr, "apir-llama-greedy: model %s, device %s%s, n_vocab %d, prompt %d ids, %ld tokens\n", model_path,
            dev_name, on_cpu ? " (all on CPU)" : n_devs > 1 ? " (layers split across them)" : " (all layers offloaded)", n_vocab, n_prompt,
            n_gen);

    int32_t *generated = malloc((size_t)(n_gen > 0 ? n_gen : 1) * sizeof(int32_t));
    if (!generated) {
        rc = 1;
        goto out;
    }
    int32_t next = 0;
    for (long step = 0; step < n_gen; step++) {
        struct llama_batch batch = step == 0 ? llama_batch_get_one(prompt, n_prompt) : llama_batch_get_one(&next, 1);
        const int32_t dr = llama_decode(ctx, batch);
        if (dr != 0) {
            fprintf(stderr, "apir-llama-greedy: llama_decode failed at step %ld (rc %d)\n", step, dr);
            rc = 1;
            break;
        }
        const float *logits = llama_get_logits_ith(ctx, -1);
        if (!logits) {
            fprintf(stderr, "apir-llama-greedy: no logits at step %ld\n", step);
            rc = 1;
            break;
        }
        for (int32_t i = 0; i < n_vocab; i++) {
            if (!isfinite(logits[i])) {
                fprintf(stderr, "apir-llama-greedy: non-finite logit at step %ld id %d: %g\n", step, i,
                        (double)logits[i]);
                rc = 1;
                break;
            }
        }
        next = argmax(logits, n_vocab);
        generated[step] = next;
        if (df && (!write_all(df, &next, sizeof(next)) || !write_all(df, logits, (size_t)n_vocab * sizeof(float)))) {
            fprintf(stderr, "apir-llama-greedy: writing %s failed\n", dump_path);
            rc = 1;
            break;
        }
        if (rc != 0) {
            break;
        }
        /* --window: the warmed-up steps, a third of them in, to the last:
         * each step's logits have been read, so both sides are done with it. */
        if (window_path && (step == n_gen / 3 || step == n_gen - 1) && !write_window(window_path, step == n_gen / 3)) {
            rc = 1;
            break;
        }
    }
    if (rc == 0) {
        printf("tokens:");
        for (long i = 0; i < n_gen; i++) {
            printf(" %d", generated[i]);
        }
        printf("\n");
    }
    free(generated);

out:
    if (df && fclose(df) != 0 && rc == 0) {
        fprintf(stderr, "apir-llama-greedy: writing %s failed\n", dump_path);
        rc = 1;
    }
    if (rc != 0 && dump_path) {
        remove(dump_path);
    }
    llama_free(ctx);
    llama_model_free(model);
    free(prompt);
    llama_backend_free();
    return rc;
}
