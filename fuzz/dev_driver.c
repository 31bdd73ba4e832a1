/*
 * apir-fuzz-op-dev: fuzz_op without libFuzzer, for a machine with a device
 * (FUZZ_BACKEND=CUDA) and no clang, and for CI's short run of fuzz_op's
 * device path on the CPU (FUZZ_OP_DEVICE_PATH=1).
 *
 * Why a driver of its own: on a device the node computes in the process
 * that holds the device's context (fuzz_op.c, "the device path"), so an
 * abort there ends the process; libFuzzer would stop at the first finding,
 * and a device's context takes seconds to make.  Here a child makes it
 * once and runs input after input sent to it over a pipe; when it dies (an
 * abort, a signal, or no answer within -timeout) this process saves the
 * input that ended it, names the reason from the child's log, and starts a
 * new child.  Findings are grouped by reason; the first inputs of each are
 * kept.
 *
 * No coverage feedback: the inputs are the corpus given (fuzz/corpus/fuzz_op,
 * the seeds FUZZ_OP_SEEDS writes, fuzz/findings), each run once as it is,
 * then mutations of them (bit flips, bytes set, inserted, erased, spliced
 * from another input) from a seeded generator until -seconds or -runs run
 * out.
 *
 * usage: apir-fuzz-op-dev [-seconds N] [-runs N] [-seed N] [-timeout N] [-artifacts DIR] [-selftest 1] [-chains]
 *                         PATH...
 *   PATH: a corpus directory or an input file.  -runs: stop after N inputs
 *   (with -seed, the same inputs on every machine: what CI runs; the
 *   default is -seconds 60 only).  -selftest 1: an input that starts with
 *   SELFTEST-ABORT makes the child abort through ggml, one with
 *   SELFTEST-HANG never answers (the driver's own test).  Exit status: 0 when no
 *   input ended a child, 1 when some did (each reason printed with the
 *   file its first input was saved to), 2 on a usage or setup error.
 *   -chains: fuzz_op's chain mode in the child (FUZZ_OP_CHAINS=1: chains of
 *   nodes a backend fuses, fuzz_op.c enum chain_kind); every input is a
 *   chain there, so PATH may be left out, and CHAIN_SEEDS inputs per kind of
 *   chain, made from the seed, come first.
 * FUZZ_OP_SEEDS=DIR alone: writes fuzz_op's constructible seeds and exits.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ggml.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern char fuzz_op_last_outcome;  /* fuzz_op.c: N, R, A or C */
extern const int fuzz_op_chain_kinds;  /* fuzz_op.c: its enum chain_kind's count */

#define MAX_INPUTS 8192
#define MAX_INPUT_SIZE 4096
#define MAX_KINDS 64
#define KEEP_PER_KIND 3
#define READY_SECONDS 600  /* a device's context, its kernels loaded */
/* -chains: inputs made per kind of chain (fuzz_op.c's enum chain_kind,
 * fuzz_op_chain_kinds of them: the kind is the first byte, or the second
 * after an edges input's mark), half of them edges inputs, so that every
 * kind is run whatever the corpus. */
#define CHAIN_SEEDS 16
#define CHAIN_SEED_SIZE 160
#define EDGES_MARK 0xa5  /* fuzz_op.c's */

struct input {
    uint8_t *bytes;
    size_t size;
};

static struct input corpus[MAX_INPUTS];
static int n_corpus;

struct kind {
    char reason[512];
    int count;
    char first[600];
};
static struct kind kinds[MAX_KINDS];
static int n_kinds;

static struct {
    pid_t pid;
    int to, from;  /* the child's input pipe, its answer pipe */
} child = { -1, -1, -1 };

static char log_path[600];
static bool selftest;           /* -selftest: inputs that abort or hang on purpose */
static ggml_abort_callback_t target_abort;

/* Every ggml abort in the child says so in one line the reason is taken
 * from (a CUDA error's details come in the lines before), then goes on to
 * the target's own callback. */
static void on_ggml_abort(const char *message)
{
    fprintf(stderr, "apir-fuzz-op-dev: ggml abort: %s\n", message);
    if (target_abort)
        target_abort(message);
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void add_input(const uint8_t *bytes, size_t n)
{
    if (n_corpus == MAX_INPUTS || n == 0)
        return;
    uint8_t *p = malloc(n);
    if (!p)
        return;
    memcpy(p, bytes, n);
    corpus[n_corpus].bytes = p;
    corpus[n_corpus].size = n;
    n_corpus++;
}

static void add_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    uint8_t buf[MAX_INPUT_SIZE];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    add_input(buf, n);
}

/* -chains: CHAIN_SEEDS inputs per kind of chain, random bytes after the
 * kind's, from the seeded generator (the same on every machine). */
static void add_chain_seeds(void)
{
    for (int kind = 0; kind < fuzz_op_chain_kinds; kind++)
        for (int i = 0; i < CHAIN_SEEDS; i++) {
            uint8_t in[CHAIN_SEED_SIZE];
            for (size_t k = 0; k < sizeof(in); k++)
                in[k] = (uint8_t)(rnd() >> 24);
            in[0] = (uint8_t)kind;
            if (i & 1) {
                in[0] = EDGES_MARK;
                in[1] = (uint8_t)kind;
            }
            add_input(in, sizeof(in));
        }
}

/* A directory's regular files (not its subdirectories), in name order so
 * that a seed gives the same run on every machine. */
static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static void add_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "apir-fuzz-op-dev: %s: %s\n", path, strerror(errno));
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name);
    for (int i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof(p), "%s/%s", path, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
            add_file(p);
        free(names[i]);
    }
    free(names);
}

/* All n bytes through the pipe fd (out: written, else read); false at its
 * end or on an error. */
static bool move_full(int fd, void *p, size_t n, bool out)
{
    uint8_t *b = p;
    while (n) {
        ssize_t r = out ? write(fd, b, n) : read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

static bool read_full(int fd, void *p, size_t n) { return move_full(fd, p, n, false); }
static bool write_full(int fd, const void *p, size_t n) { return move_full(fd, (void *)p, n, true); }

/* The child: the target's setup once, then each input it is sent. */
static void child_main(int in, int out)
{
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    }
    int argc = 1;
    char *argv0[] = { "apir-fuzz-op-dev", NULL };
    char **argv = argv0;
    LLVMFuzzerInitialize(&argc, &argv);
    target_abort = ggml_set_abort_callback(on_ggml_abort);
    if (!write_full(out, "R", 1))
        _exit(0);
    static uint8_t buf[MAX_INPUT_SIZE];
    for (;;) {
        uint32_t n;
        if (!read_full(in, &n, 4) || n == 0 || n > sizeof(buf) || !read_full(in, buf, n))
            _exit(0);
        fprintf(stderr, "--- input of %u bytes\n", n);
        if (selftest && n >= 14 && !memcmp(buf, "SELFTEST-ABORT", 14))
            ggml_abort(__FILE__, __LINE__, "self-test abort");
        while (selftest && n >= 13 && !memcmp(buf, "SELFTEST-HANG", 13))
            pause();
        LLVMFuzzerTestOneInput(buf, n);
        if (!write_full(out, &fuzz_op_last_outcome, 1))
            _exit(0);
    }
}

enum answer { ANSWERED, ENDED, TIMED_OUT };

/* One answer byte within seconds (into *got, if not NULL), or the pipe's
 * end (the child died), or neither in time. */
static enum answer await(int fd, double seconds, char *got)
{
    const double end = now_s() + seconds;
    for (;;) {
        double left = end - now_s();
        if (left <= 0)
            return TIMED_OUT;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return ENDED;
        if (r == 0)
            continue;  /* the loop's test says whether the time is up */
        char c;
        if (read(fd, &c, 1) != 1)
            return ENDED;
        if (got)
            *got = c;
        return ANSWERED;
    }
}

static void child_stop(bool kill_it, int *status)
{
    if (child.pid <= 0)
        return;
    if (kill_it)
        kill(child.pid, SIGKILL);
    close(child.to);
    close(child.from);
    int st = 0;
    while (waitpid(child.pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (status)
        *status = st;
    child.pid = -1;
}

static bool child_start(void)
{
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0)
        return false;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        child_main(a[0], b[1]);
        _exit(0);
    }
    close(a[0]);
    close(b[1]);
    child.pid = pid;
    child.to = a[1];
    child.from = b[0];
    if (await(child.from, READY_SECONDS, NULL) != ANSWERED) {
        fprintf(stderr, "apir-fuzz-op-dev: the child did not start (its log: %s)\n", log_path);
        child_stop(true, NULL);
        return false;
    }
    return true;
}

/* Why the child ended: fuzz_op's oracle line, or ggml's abort message, or
 * the signal; the line is kept without the log's trailing newline. */
static void reason_of(int status, bool timed_out, char *out, size_t cap)
{
    if (timed_out)
        snprintf(out, cap, "no answer within the timeout (a hang)");
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "died of signal %d", WTERMSIG(status));
    else
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    FILE *f = fopen(log_path, "r");
    if (!f)
        return;
    char line[1024], best[1024] = "", cuda[1024] = "";
    int rank = 0;  /* 3: fuzz_op's oracle, 2: a ggml abort, 1: a sanitizer's or other error line */
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "CUDA error: ", 12) && !cuda[0])
            snprintf(cuda, sizeof(cuda), "%s", line);
        int r = strstr(line, "FUZZ ORACLE") ? 3 : strstr(line, "ggml abort: ") ? 2
              : strstr(line, "ERROR") || strstr(line, "error:") ? 1 : 0;
        if (r > rank) {
            rank = r;
            snprintf(best, sizeof(best), "%s", line);
        }
    }
    fclose(f);
    size_t n = strlen(out);
    if (best[0])
        n += (size_t)snprintf(out + n, cap - n, ": %s", best);
    if (cuda[0] && n < cap)
        snprintf(out + n, cap - n, " (%s)", cuda);
}

/* The last lines of the child's log (what it ran up to its end, a CUDA
 * error's details) into path, beside a finding's first input. */
static void keep_log_tail(const char *path)
{
    enum { LINES = 40 };
    static char buf[1 << 20];
    FILE *in = fopen(log_path, "rb");
    if (!in)
        return;
    long size = fseek(in, 0, SEEK_END) == 0 ? ftell(in) : -1;
    long from = size > (long)sizeof(buf) ? size - (long)sizeof(buf) : 0;
    size_t n = size >= 0 && fseek(in, from, SEEK_SET) == 0 ? fread(buf, 1, sizeof(buf), in) : 0;
    fclose(in);
    size_t start = n;
    for (int lines = 0; start > 0; start--)
        if (buf[start - 1] == '\n' && start < n && ++lines > LINES)
            break;
    FILE *out = fopen(path, "wb");
    if (!out)
        return;
    fwrite(buf + start, 1, n - start, out);
    fclose(out);
}

static void record(const char *artifacts, const uint8_t *in, size_t size, const char *reason)
{
    int k = 0;
    while (k < n_kinds && strcmp(kinds[k].reason, reason) != 0)
        k++;
    if (k == n_kinds) {
        if (n_kinds == MAX_KINDS)
            k = MAX_KINDS - 1;  /* the rest counted with the last kind */
        else
            snprintf(kinds[n_kinds++].reason, sizeof(kinds[0].reason), "%s", reason);
    }
    struct kind *kd = &kinds[k];
    kd->count++;
    if (kd->count > KEEP_PER_KIND)
        return;
    char path[600];
    snprintf(path, sizeof(path), "%s/finding-%02d-%d.bin", artifacts, k, kd->count);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(in, 1, size, f);
        fclose(f);
    }
    if (kd->count == 1) {
        snprintf(path + strlen(path) - 4, 5, ".log");
        keep_log_tail(path);
        snprintf(path + strlen(path) - 4, 5, ".bin");
        snprintf(kd->first, sizeof(kd->first), "%s", path);
        printf("apir-fuzz-op-dev: finding %d: %s (input: %s)\n", k, reason, path);
        fflush(stdout);
    }
}

static size_t mutate(uint8_t *d, size_t n)
{
    int steps = 1 + (int)(rnd() % 4);
    for (int s = 0; s < steps; s++) {
        size_t at = n ? (size_t)(rnd() % n) : 0;
        switch (rnd() % 7) {
        case 0:
            if (n)
                d[at] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1:
            if (n)
                d[at] = (uint8_t)rnd();
            break;
        case 2: {
            static const uint8_t interesting[] = { 0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 64, 0x7f, 0x80, 0xfe, 0xff };
            if (n)
                d[at] = interesting[rnd() % sizeof(interesting)];
            break;
        }
        case 3:
            if (n < MAX_INPUT_SIZE) {
                memmove(d + at + 1, d + at, n - at);
                d[at] = (uint8_t)rnd();
                n++;
            }
            break;
        case 4:
            if (n > 2) {
                memmove(d + at, d + at + 1, n - at - 1);
                n--;
            }
            break;
        default: {  /* a piece of another input, at the same place */
            const struct input *o = &corpus[rnd() % (uint64_t)n_corpus];
            if (at < o->size) {
                size_t len = 1 + (size_t)(rnd() % 16);
                if (len > o->size - at)
                    len = o->size - at;
                if (at + len > n)
                    n = at + len;
                memcpy(d + at, o->bytes + at, len);
            }
            break;
        }
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    if (getenv("FUZZ_OP_SEEDS"))
        return LLVMFuzzerInitialize(&argc, &argv);  /* writes them and exits */
    double seconds = 60, timeout = 30;
    long max_runs = -1;
    const char *artifacts = ".";
    bool chains = false;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i += 2) {
        if (!strcmp(argv[i], "-chains")) {
            chains = true;
            i--;  /* a flag without a value */
            continue;
        }
        if (i + 1 >= argc)
            break;
        if (!strcmp(argv[i], "-seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-runs"))
            max_runs = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed"))
            rng_state = strtoull(argv[i + 1], NULL, 0) * 0x9e3779b97f4a7c15ull + 1;
        else if (!strcmp(argv[i], "-timeout"))
            timeout = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-artifacts"))
            artifacts = argv[i + 1];
        else if (!strcmp(argv[i], "-selftest"))
            selftest = atoi(argv[i + 1]) != 0;
        else
            break;
    }
    if ((i >= argc && !chains) || (i < argc && argv[i][0] == '-')) {
        fprintf(stderr,
                "usage: %s [-seconds N] [-runs N] [-seed N] [-timeout N] [-artifacts DIR] [-selftest 1] [-chains] "
                "PATH...\n",
                argv[0]);
        return 2;
    }
    if (chains) {
        setenv("FUZZ_OP_CHAINS", "1", 1);  /* for the children */
        add_chain_seeds();
    }
    for (; i < argc; i++)
        add_path(argv[i]);
    if (n_corpus == 0) {
        fprintf(stderr, "apir-fuzz-op-dev: no inputs\n");
        return 2;
    }
    mkdir(artifacts, 0755);
    snprintf(log_path, sizeof(log_path), "%s/child.log", artifacts);
    signal(SIGPIPE, SIG_IGN);

    const double start = now_s();
    long runs = 0, mutated = 0, restarts = 0, findings = 0;
    long outcomes[4] = { 0 };  /* no node built, refused, accepted, computed in a grandchild */
    static uint8_t in[MAX_INPUT_SIZE];
    while (max_runs >= 0 ? runs < max_runs : now_s() - start < seconds) {
        if (child.pid <= 0) {
            if (!child_start())
                return 2;
            restarts++;
        }
        size_t n;
        if (runs < n_corpus) {
            n = corpus[runs].size;
            memcpy(in, corpus[runs].bytes, n);
        } else {
            const struct input *base = &corpus[rnd() % (uint64_t)n_corpus];
            memcpy(in, base->bytes, base->size);
            n = mutate(in, base->size);
            mutated++;
        }
        uint32_t len = (uint32_t)n;
        runs++;
        bool ok = write_full(child.to, &len, 4) && write_full(child.to, in, n);
        char outcome = 0;
        enum answer a = ok ? await(child.from, timeout, &outcome) : ENDED;
        if (a == ANSWERED) {
            outcomes[outcome == 'N' ? 0 : outcome == 'R' ? 1 : outcome == 'A' ? 2 : 3]++;
            continue;
        }
        const bool timed_out = a == TIMED_OUT;
        int status = 0;
        child_stop(true, &status);  /* SIGKILL: the status of one that died is already set */
        char reason[512];
        reason_of(status, timed_out, reason, sizeof(reason));
        record(artifacts, in, n, reason);
        findings++;
    }
    if (child.pid > 0) {
        uint32_t zero = 0;
        if (write_full(child.to, &zero, 4))
            await(child.from, 5, NULL);  /* its end */
        child_stop(false, NULL);
    }
    printf("apir-fuzz-op-dev: %ld inputs (%ld from the corpus, %ld mutated) in %.0f s on %s%s, %ld ended the child "
           "(%ld children), %d kinds\n",
           runs, runs - mutated, mutated, now_s() - start, getenv("FUZZ_BACKEND") ? getenv("FUZZ_BACKEND") : "CPU",
           chains ? " (chains)" : "", findings, restarts, n_kinds);
    printf("  outcomes: %ld built no node, %ld refused by the host, %ld accepted and computed, "
           "%ld computed in a child of their own\n",
           outcomes[0], outcomes[1], outcomes[2], outcomes[3]);
    for (int k = 0; k < n_kinds; k++)
        printf("  %d x %s\n     first: %s\n", kinds[k].count, kinds[k].reason, kinds[k].first);
    return findings ? 1 : 0;
}
