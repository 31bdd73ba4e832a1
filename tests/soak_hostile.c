/*
 * apir-soak-hostile: one hostile guest for scripts/soak.sh, beside honest
 * ones, for a while.  It repeats, in a random order from a seed, what a
 * hostile or broken guest does to a host:
 *   hangup     connects and hangs up at once
 *   garbage    connects and sends random bytes for a hello
 *   silent     connects and says nothing for 1-3 s
 *   commands   a real session, then random command numbers with random
 *              items, and real commands with random handles and sizes
 *   hog        a real session asking for more memory than any quota gives
 *   vanish     a real session in a child killed mid-way (SIGKILL)
 * It never expects anything of the host beyond not taking it down: each
 * step's outcome is counted, and the count printed at the end.  Exit 0
 * unless it could not run at all (a bad command line).
 *
 * usage: apir-soak-hostile unix:PATH SECONDS SEED
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "calls.h"
#include "fdpass.h"
#include "remote.h"
#include "shm_proto.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *endpoint, *sock_path;
static uint64_t rng;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int raw_connect(void)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static int step_hangup(void)
{
    int fd = raw_connect();
    if (fd < 0)
        return 1;
    close(fd);
    return 0;
}

static int step_garbage(void)
{
    int fd = raw_connect();
    if (fd < 0)
        return 1;
    uint8_t junk[256];
    size_t n = 1 + rnd() % sizeof(junk);
    for (size_t i = 0; i < n; i++)
        junk[i] = (uint8_t)rnd();
    if (rnd() % 2) {
        /* a hello with the right magic and wrong sizes */
        struct apir_shm_hello h = { .magic = APIR_SHM_MAGIC, .version = APIR_SHM_VERSION,
                                    .ctrl_size = rnd(), .reply_size = (uint64_t)rnd() << 20 };
        memcpy(junk, &h, sizeof(h) < n ? sizeof(h) : n);
    }
    (void)!send(fd, junk, n, MSG_NOSIGNAL);
    usleep(1000 * (rnd() % 50));
    close(fd);
    return 0;
}

static int step_silent(void)
{
    int fd = raw_connect();
    if (fd < 0)
        return 1;
    usleep(1000 * (1000 + rnd() % 2000));
    close(fd);
    return 0;
}

static bool open_session(struct apir_remote *r)
{
    char err[256];
    return apir_remote_open(r, endpoint, 0, err, sizeof(err));
}

/* One command with random items: numbers past the table, truncated and
 * oversized items, handles nobody gave out. */
static void random_command(struct apir_remote *r)
{
    uint32_t cmd = rnd() % (APIR_CMD_COUNT + 8);
    uint8_t items[512];
    size_t n = rnd() % sizeof(items);
    for (size_t i = 0; i < n; i++)
        items[i] = (uint8_t)rnd();
    pthread_mutex_lock(&r->lock);
    struct apir_encoder *e = r->t->ops->begin(r->t);
    apir_encode_bytes(e, items, n);
    struct apir_decoder dec;
    (void)apir_remote_submit_locked(r, (enum apir_command)cmd, NULL, &dec);
    pthread_mutex_unlock(&r->lock);
}

static int step_commands(void)
{
    struct apir_remote r;
    if (!open_session(&r))
        return 1;
    uint64_t buft = 0, buf = 0;
    (void)apir_call_DEVICE_GET_BUFFER_TYPE(&r, &buft);
    (void)apir_call_BUFFER_TYPE_ALLOC_BUFFER(&r, buft, 1 << 16, &buf);
    int n = 10 + (int)(rnd() % 200);
    for (int i = 0; i < n && !apir_remote_gone_locked(&r); i++) {
        if (rnd() % 4 == 0) {
            /* a real command on a real or forged buffer, with wild sizes */
            struct apir_tensor_rec rec;
            memset(&rec, 0, sizeof(rec));
            rec.id = 1;
            rec.type = rnd() % 40;
            rec.buffer = rnd() % 2 ? buf : ((uint64_t)rnd() << 32 | rnd());
            for (int d = 0; d < 4; d++) {
                rec.ne[d] = rnd() % 3 == 0 ? rnd() : 1 + rnd() % 64;
                rec.nb[d] = rnd() % 3 == 0 ? rnd() : 4u << d;
            }
            rec.data = rnd() % 2 ? rnd() % (1 << 16) : ((uint64_t)rnd() << 32);
            (void)apir_call_BUFFER_MEMSET_TENSOR(&r, rec.buffer, &rec, (uint8_t)rnd(), rnd() % 4096, rnd() % 65536);
        } else {
            random_command(&r);
        }
    }
    apir_remote_close(&r);
    return 0;
}

static int step_hog(void)
{
    struct apir_remote r;
    if (!open_session(&r))
        return 1;
    uint64_t buft = 0, buf = 0;
    (void)apir_call_DEVICE_GET_BUFFER_TYPE(&r, &buft);
    for (int i = 0; i < 8; i++)
        (void)apir_call_BUFFER_TYPE_ALLOC_BUFFER(&r, buft, (uint64_t)1 << (36 + rnd() % 8), &buf);
    apir_remote_close(&r);
    return 0;
}

static int step_vanish(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        struct apir_remote r;
        if (open_session(&r))
            for (;;)
                random_command(&r);
        _exit(0);
    }
    usleep(1000 * (20 + rnd() % 300));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4 || strncmp(argv[1], "unix:", 5) != 0) {
        fprintf(stderr, "usage: apir-soak-hostile unix:PATH SECONDS SEED\n");
        return 2;
    }
    endpoint = argv[1];
    sock_path = argv[1] + 5;
    double end = now_s() + atof(argv[2]);
    rng = strtoull(argv[3], NULL, 10) * 2654435761u + 1;
    signal(SIGPIPE, SIG_IGN);
    static const struct {
        const char *name;
        int (*fn)(void);
    } steps[] = {
        { "hangup", step_hangup }, { "garbage", step_garbage }, { "silent", step_silent },
        { "commands", step_commands }, { "hog", step_hog }, { "vanish", step_vanish },
    };
    enum { N_STEPS = sizeof(steps) / sizeof(steps[0]) };
    unsigned done[N_STEPS] = { 0 }, unreachable[N_STEPS] = { 0 };
    while (now_s() < end) {
        unsigned k = rnd() % N_STEPS;
        if (steps[k].fn())
            unreachable[k]++;
        else
            done[k]++;
    }
    printf("hostile:");
    for (unsigned k = 0; k < N_STEPS; k++)
        printf(" %s %u (%u refused)", steps[k].name, done[k], unreachable[k]);
    printf("\n");
    return 0;
}
