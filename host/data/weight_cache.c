/*
 * The weight cache: the directory, the links a session reaches it through,
 * the daemon's service thread, and the two handlers' work.  What it
 * guarantees and who may touch the directory: weight_cache.h.
 */
#include "weight_cache.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "apir_tree_digest.h"
#include "buffers.h"
#include "upload_mirror.h"
#include "ggml-backend.h"
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Bytes read or written per step: bounds the memory a fill or a store uses. */
#define WCACHE_CHUNK (4u << 20)

/* ---- hashing ------------------------------------------------------------------ */

bool apir_sha256(const void *data, size_t size, struct apir_digest *out)
{
    return gnutls_hash_fast(GNUTLS_DIG_SHA256, data, size, out->b) == 0;
}

/* The tree digest's SHA-256 (apir_tree_digest.h). */
static bool sha256_parts(const void *const *parts, const size_t *lens, int n, uint8_t out[32])
{
    gnutls_hash_hd_t hh;
    if (gnutls_hash_init(&hh, GNUTLS_DIG_SHA256) != 0)
        return false;
    bool ok = true;
    for (int i = 0; i < n; i++)
        ok = ok && gnutls_hash(hh, parts[i], lens[i]) == 0;
    gnutls_hash_deinit(hh, out);
    return ok;
}

uint32_t apir_wcache_kind_of(uint32_t minor)
{
    return minor >= APIR_WCACHE_TREE_MINOR ? APIR_DIGEST_TREE : APIR_DIGEST_SHA256;
}

bool apir_wcache_digest(uint32_t kind, const void *data, uint64_t size, unsigned threads, struct apir_digest *out)
{
    if (kind == APIR_DIGEST_TREE)
        return apir_tree_digest(sha256_parts, data, -1, -1, size, threads, out->b);
    return kind == APIR_DIGEST_SHA256 && size <= SIZE_MAX && apir_sha256(data, (size_t)size, out);
}

/* The digest of kind of src_fd's first size bytes (pread: its offset is
 * left alone), each byte also written to dst_fd (-1: none) from the same
 * private copy it was hashed from, so a sender changing its memfd
 * meanwhile cannot make the file hold bytes other than those hashed.  Plain
 * SHA-256 is one chain, one thread; the tree's leaves go to
 * apir_hash_threads() threads. */
static bool digest_fd(uint32_t kind, int src_fd, int dst_fd, uint64_t size, struct apir_digest *out)
{
    if (kind == APIR_DIGEST_TREE)
        return apir_tree_digest(sha256_parts, NULL, src_fd, dst_fd, size, apir_hash_threads(), out->b);
    uint8_t *buf = malloc(WCACHE_CHUNK);
    gnutls_hash_hd_t hh;
    if (!buf || gnutls_hash_init(&hh, GNUTLS_DIG_SHA256) != 0) {
        free(buf);
        return false;
    }
    bool ok = true;
    for (uint64_t off = 0; ok && off < size;) {
        size_t want = size - off < WCACHE_CHUNK ? (size_t)(size - off) : WCACHE_CHUNK;
        ok = apir_tree_io(src_fd, buf, want, off, false) && gnutls_hash(hh, buf, want) == 0 &&
             (dst_fd < 0 || apir_tree_io(dst_fd, buf, want, off, true));
        off += want;
    }
    gnutls_hash_deinit(hh, out->b);
    free(buf);
    return ok;
}

void apir_digest_hex(const struct apir_digest *d, char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d->b[i] >> 4];
        hex[2 * i + 1] = digits[d->b[i] & 15];
    }
    hex[64] = '\0';
}

/* An entry's name: the hex digest, "t-" before it for the tree digest, so
 * a digest is only ever compared with one of its own kind. */
#define ENTRY_NAME_MAX 67
static void entry_name(uint32_t kind, const struct apir_digest *h, char name[ENTRY_NAME_MAX])
{
    const size_t p = kind == APIR_DIGEST_TREE ? 2 : 0;
    memcpy(name, "t-", p);
    apir_digest_hex(h, name + p);
}

static bool is_entry_name(const char *name)
{
    if (!strncmp(name, "t-", 2))
        name += 2;
    size_t n = 0;
    for (; name[n]; n++)
        if (!((name[n] >= '0' && name[n] <= '9') || (name[n] >= 'a' && name[n] <= 'f')))
            return false;
    return n == 64;
}

/* ---- the directory ---------------------------------------------------------------- */

/* Entries this process hashed (stored, or read back and checked), by
 * their file's identity: while the file is the same (device, inode, size,
 * modification and change times), a hit need not read it twice.  What this
 * trusts (the directory is the host's own): docs/SECURITY.md.  Bounded: when
 * all are used the slots are reused in turn; an entry not remembered is only
 * hashed again. */
#define WCACHE_VERIFIED_MAX 4096
struct wc_verified {
    bool used;
    uint32_t kind;
    struct apir_digest h;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim, ctim;
};

struct apir_wcache {
    int dirfd;
    uint64_t max_bytes;
    pthread_mutex_t lock;           /* the counters, eviction, `verified` (threads of a thread-mode host) */
    struct apir_wcache_counters n;
    _Atomic uint64_t tmp_serial;
    struct wc_verified *verified;   /* WCACHE_VERIFIED_MAX slots; NULL: every hit is hashed */
    unsigned verified_next;
    /* Stores written by a thread of their own (store_queue): the guest's
     * next upload goes on meanwhile.  At most backlog_max bytes wait (their
     * memfds, the tensors' copies), so memory stays bounded. */
    pthread_mutex_t qlock;
    pthread_cond_t qwork, qroom;
    struct wc_job *head, *tail;
    uint64_t backlog, backlog_max;
    pthread_t store_thread;
    bool store_running, stopping;
};

struct wc_job {
    struct wc_job *next;
    uint32_t kind;
    struct apir_digest h;
    uint64_t size;
    int fd;
    bool replace;
};

static bool same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* The slot of (kind, h), or NULL (lock held). */
static struct wc_verified *verified_find(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h)
{
    for (unsigned i = 0; c->verified && i < WCACHE_VERIFIED_MAX; i++)
        if (c->verified[i].used && c->verified[i].kind == kind && !memcmp(&c->verified[i].h, h, sizeof(*h)))
            return &c->verified[i];
    return NULL;
}

/* True when (kind, h) was hashed by this process as the file st is now. */
static bool verified_is(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, const struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    const struct wc_verified *v = verified_find(c, kind, h);
    bool yes = v && v->dev == st->st_dev && v->ino == st->st_ino && v->size == st->st_size &&
               same_time(&v->mtim, &st->st_mtim) && same_time(&v->ctim, &st->st_ctim);
    pthread_mutex_unlock(&c->lock);
    return yes;
}

/* Remembers (kind, h) as the file st (hashed by this process), or with st
 * NULL forgets it. */
static void verified_set(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, const struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    struct wc_verified *v = verified_find(c, kind, h);
    if (!st) {
        if (v)
            v->used = false;
    } else if (c->verified) {
        if (!v) {
            for (unsigned i = 0; !v && i < WCACHE_VERIFIED_MAX; i++)
                if (!c->verified[i].used)
                    v = &c->verified[i];
            if (!v)
                v = &c->verified[c->verified_next++ % WCACHE_VERIFIED_MAX];
        }
        *v = (struct wc_verified){ .used = true, .kind = kind, .h = *h, .dev = st->st_dev, .ino = st->st_ino,
                                   .size = st->st_size, .mtim = st->st_mtim, .ctim = st->st_ctim };
    }
    pthread_mutex_unlock(&c->lock);
}

struct apir_wcache *apir_wcache_open(const char *dir, uint64_t max_bytes, char *err, size_t err_len)
{
    if (!dir || !*dir) {
        snprintf(err, err_len, "--weight-cache: no directory given");
        return NULL;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "--weight-cache %s: cannot create it: %s", dir, strerror(errno));
        return NULL;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, err_len, "--weight-cache %s: %s", dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    /* Another user able to write here could plant entries (they are still
     * hashed when read, but could fill the disk or race the renames). */
    if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
        snprintf(err, err_len, "--weight-cache %s: must be this user's own and writable by no one else "
                 "(owner %u, mode %04o)", dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        close(fd);
        return NULL;
    }
    struct apir_wcache *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, err_len, "out of memory");
        close(fd);
        return NULL;
    }
    c->dirfd = fd;
    c->max_bytes = max_bytes;
    c->verified = calloc(WCACHE_VERIFIED_MAX, sizeof(*c->verified));
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->qlock, NULL);
    pthread_cond_init(&c->qwork, NULL);
    pthread_cond_init(&c->qroom, NULL);
    /* APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB: how much may wait to be written
     * (default 512; 0: every store is written before it is answered). */
    const char *bl = getenv("APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB");
    char *bl_end = NULL;
    unsigned long long bl_mib = bl && *bl ? strtoull(bl, &bl_end, 10) : 512;
    c->backlog_max = (bl && *bl && (!bl_end || *bl_end)) || bl_mib > (1ull << 20) ? 512ull << 20 : bl_mib << 20;
    /* What is there: entries counted, temporary files of a host that died
     * removed, anything else left alone. */
    int scan_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = scan_fd >= 0 ? fdopendir(scan_fd) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strncmp(e->d_name, ".tmp-", 5)) {
                unlinkat(fd, e->d_name, 0);
                continue;
            }
            if (!is_entry_name(e->d_name) || fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(st.st_mode))
                continue;
            c->n.entries++;
            c->n.bytes += (uint64_t)st.st_size;
        }
        closedir(d);
    } else if (scan_fd >= 0) {
        close(scan_fd);
    }
    APIR_INFO("host", "weight cache %s: %llu entries, %.1f MiB (bound: %.1f GiB%s)", dir,
              (unsigned long long)c->n.entries, (double)c->n.bytes / (1024.0 * 1024.0),
              (double)max_bytes / (1024.0 * 1024.0 * 1024.0), max_bytes ? "" : ", none");
    return c;
}

void apir_wcache_close(struct apir_wcache *c)
{
    if (!c)
        return;
    /* The stores waiting are written first. */
    pthread_mutex_lock(&c->qlock);
    c->stopping = true;
    pthread_cond_broadcast(&c->qwork);
    pthread_mutex_unlock(&c->qlock);
    if (c->store_running)
        pthread_join(c->store_thread, NULL);
    close(c->dirfd);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->qlock);
    pthread_cond_destroy(&c->qwork);
    pthread_cond_destroy(&c->qroom);
    free(c->verified);
    free(c);
}

void apir_wcache_counters(struct apir_wcache *c, struct apir_wcache_counters *out)
{
    pthread_mutex_lock(&c->lock);
    *out = c->n;
    pthread_mutex_unlock(&c->lock);
}

int apir_wcache_lookup(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, bool *bad)
{
    *bad = false;
    char name[ENTRY_NAME_MAX];
    entry_name(kind, h, name);
    int fd = size ? openat(c->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)) {
        APIR_DEBUG("host", "weight cache: entry %.20s... is not %llu bytes: a miss", name, (unsigned long long)size);
        close(fd);
        fd = -1;
        verified_set(c, kind, h, NULL);  /* changed: hashed again when it comes back */
    }
    /* Hashed here, by the directory's owner, before a descriptor is given
     * out: the session (a sandboxed worker) then only copies.  Not again
     * while the file is the one this process hashed. */
    struct apir_digest got;
    const bool check = fd >= 0 && !verified_is(c, kind, h, &st);
    if (check && (!digest_fd(kind, fd, -1, size, &got) || memcmp(&got, h, sizeof(got)))) {
        APIR_WARN("host", "weight cache: entry %.20s... does not hold what its name says: a miss (the guest's upload "
                  "replaces it)", name);
        close(fd);
        fd = -1;
        *bad = true;
        verified_set(c, kind, h, NULL);
    }
    if (fd >= 0) {
        futimens(fd, NULL);  /* recently used: evicted last */
        /* Its times as this process left them: a later change shows. */
        if (fstat(fd, &st) == 0)
            verified_set(c, kind, h, &st);
        else
            verified_set(c, kind, h, NULL);
    }
    pthread_mutex_lock(&c->lock);
    c->n.lookups++;
    c->n.checked += check;
    if (fd >= 0)
        c->n.hits++;
    pthread_mutex_unlock(&c->lock);
    return fd;
}

/* Removes least recently used entries, but `keep` (being replaced), until
 * `need` more bytes fit (lock held).  The directory is read whole: eviction is rare and the entries
 * few (weights of at least APIR_HASH_MIN_KB each). */
static void make_room(struct apir_wcache *c, uint64_t need, const char *keep)
{
    while (c->max_bytes && c->n.bytes + need > c->max_bytes && c->n.entries > 0) {
        int scan_fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = scan_fd >= 0 ? fdopendir(scan_fd) : NULL;
        if (!d) {
            if (scan_fd >= 0)
                close(scan_fd);
            return;
        }
        char oldest[ENTRY_NAME_MAX] = "";
        struct timespec t_old = { 0, 0 };
        uint64_t old_size = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            struct stat st;
            if (!is_entry_name(e->d_name) || !strcmp(e->d_name, keep) ||
                fstatat(c->dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
                continue;
            if (!oldest[0] || st.st_mtim.tv_sec < t_old.tv_sec ||
                (st.st_mtim.tv_sec == t_old.tv_sec && st.st_mtim.tv_nsec < t_old.tv_nsec)) {
                memcpy(oldest, e->d_name, strlen(e->d_name) + 1);  /* an entry name: it fits */
                t_old = st.st_mtim;
                old_size = (uint64_t)st.st_size;
            }
        }
        closedir(d);
        if (!oldest[0] || unlinkat(c->dirfd, oldest, 0) != 0) {
            c->n.entries = 0;  /* the count was off: nothing left to evict */
            c->n.bytes = 0;
            return;
        }
        APIR_INFO("host", "weight cache: evicted %.16s... (%llu bytes) to make room", oldest,
                  (unsigned long long)old_size);
        c->n.entries--;
        c->n.bytes = c->n.bytes > old_size ? c->n.bytes - old_size : 0;
        c->n.evicted++;
    }
}

static bool write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static int store_refused(struct apir_wcache *c, int result)
{
    pthread_mutex_lock(&c->lock);
    c->n.refused++;
    pthread_mutex_unlock(&c->lock);
    return result;
}

static int store_now(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, int src_fd,
                     const char *name);

/* The store thread: the queue's jobs in order; a job whose entry is there
 * by now (two sessions kept the same weight) is not written twice. */
static void *store_main(void *arg)
{
    struct apir_wcache *c = arg;
    pthread_mutex_lock(&c->qlock);
    for (;;) {
        while (!c->head && !c->stopping)
            pthread_cond_wait(&c->qwork, &c->qlock);
        struct wc_job *j = c->head;
        if (!j)
            break;
        c->head = j->next;
        if (!c->head)
            c->tail = NULL;
        pthread_mutex_unlock(&c->qlock);
        char name[ENTRY_NAME_MAX];
        entry_name(j->kind, &j->h, name);
        struct stat st;
        if (j->replace || fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            (uint64_t)st.st_size != j->size)
            store_now(c, j->kind, &j->h, j->size, j->fd, name);
        close(j->fd);
        pthread_mutex_lock(&c->qlock);
        c->backlog -= j->size;
        pthread_cond_broadcast(&c->qroom);
        free(j);
    }
    pthread_mutex_unlock(&c->qlock);
    return NULL;
}

/* Queues a store for the store thread (started on first use), waiting
 * while the backlog is full; false: write it now (no backlog allowed, no
 * memory, no thread). */
static bool store_queue(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, int src_fd,
                        bool replace)
{
    if (!c->backlog_max)
        return false;
    struct wc_job *j = malloc(sizeof(*j));
    int fd = j ? fcntl(src_fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd < 0) {
        free(j);
        return false;
    }
    *j = (struct wc_job){ .kind = kind, .h = *h, .size = size, .fd = fd, .replace = replace };
    pthread_mutex_lock(&c->qlock);
    if (!c->store_running && !c->stopping)
        c->store_running = pthread_create(&c->store_thread, NULL, store_main, c) == 0;
    if (!c->store_running || c->stopping) {
        pthread_mutex_unlock(&c->qlock);
        close(fd);
        free(j);
        return false;
    }
    /* One store larger than the bound still goes, alone. */
    while (c->backlog && c->backlog + size > c->backlog_max)
        pthread_cond_wait(&c->qroom, &c->qlock);
    c->backlog += size;
    if (c->tail)
        c->tail->next = j;
    else
        c->head = j;
    c->tail = j;
    pthread_cond_signal(&c->qwork);
    pthread_mutex_unlock(&c->qlock);
    return true;
}

void apir_wcache_flush(struct apir_wcache *c)
{
    pthread_mutex_lock(&c->qlock);
    while (c->backlog)
        pthread_cond_wait(&c->qroom, &c->qlock);
    pthread_mutex_unlock(&c->qlock);
}

int apir_wcache_store_fd(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, int src_fd,
                         bool replace)
{
    char name[ENTRY_NAME_MAX];
    entry_name(kind, h, name);
    struct stat st;
    /* The source must hold its bytes: a sparse memfd (a worker can seek and
     * write one byte) would make this read and write terabytes of zeros. */
    if (size == 0 || fstat(src_fd, &st) != 0 || (uint64_t)st.st_size < size ||
        (uint64_t)st.st_blocks * 512u < size)
        return store_refused(c, APIR_WCACHE_FAILED);
    if (c->max_bytes && size > c->max_bytes)
        return store_refused(c, APIR_WCACHE_TOO_LARGE);
    /* Whatever the bound, the filesystem keeps some room: 5% of it, at most
     * 1 GiB (what else the host writes there). */
    struct statvfs vfs;
    if (fstatvfs(c->dirfd, &vfs) == 0) {
        uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize, avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        uint64_t reserve = total / 20 < (1ull << 30) ? total / 20 : (1ull << 30);
        if (avail < reserve || avail - reserve < size) {
            APIR_WARN("host", "weight cache: %llu bytes not kept: the filesystem is nearly full",
                      (unsigned long long)size);
            return store_refused(c, APIR_WCACHE_TOO_LARGE);
        }
    }
    if (!replace && fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size == size)
        return APIR_WCACHE_PRESENT;
    if (store_queue(c, kind, h, size, src_fd, replace))
        return APIR_WCACHE_QUEUED;
    return store_now(c, kind, h, size, src_fd, name);
}

/* The store itself, its source checked (apir_wcache_store_fd). */
static int store_now(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, int src_fd,
                     const char *name)
{
    struct stat st;
    char tmp[64];
    snprintf(tmp, sizeof(tmp), ".tmp-%d-%llu", (int)getpid(),
             (unsigned long long)atomic_fetch_add(&c->tmp_serial, 1));
    int out = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    /* Each piece is copied once into a private buffer, then hashed and
     * written from that copy (digest_fd): what the file holds is what was
     * hashed, whatever the sender does to its memfd meanwhile. */
    struct apir_digest got;
    bool ok = out >= 0 && digest_fd(kind, src_fd, out, size, &got);
    int result = !ok ? APIR_WCACHE_FAILED : memcmp(&got, h, sizeof(got)) != 0 ? APIR_WCACHE_MISMATCH : APIR_WCACHE_STORED;
    if (result != APIR_WCACHE_STORED) {
        if (out >= 0) {
            close(out);
            unlinkat(c->dirfd, tmp, 0);
        }
        if (result == APIR_WCACHE_MISMATCH)
            APIR_WARN("host", "weight cache: bytes offered as %.16s... hash otherwise: not kept", name);
        return store_refused(c, result);
    }
    pthread_mutex_lock(&c->lock);
    /* An entry there now (replaced, or stored meanwhile by another
     * session) goes with the rename. */
    if (fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        c->n.entries = c->n.entries ? c->n.entries - 1 : 0;
        c->n.bytes = c->n.bytes > (uint64_t)st.st_size ? c->n.bytes - (uint64_t)st.st_size : 0;
    }
    make_room(c, size, name);
    if (renameat(c->dirfd, tmp, c->dirfd, name) != 0) {
        pthread_mutex_unlock(&c->lock);
        close(out);
        unlinkat(c->dirfd, tmp, 0);
        return store_refused(c, APIR_WCACHE_FAILED);
    }
    c->n.entries++;
    c->n.bytes += size;
    c->n.stored++;
    pthread_mutex_unlock(&c->lock);
    /* Hashed as written: the first hit need not read it again (its times
     * after the rename, which changes the change time). */
    bool kept = fstat(out, &st) == 0;
    verified_set(c, kind, h, kept ? &st : NULL);
    close(out);
    return APIR_WCACHE_STORED;
}

/* ---- the daemon's service and the worker's side of it -------------------------- */

/* One request, one reply, fixed sizes (SOCK_SEQPACKET): all the daemon ever
 * reads from a worker, never with a descriptor (a worker may not send one:
 * host/server/sandbox.c).  A store is two calls: WC_STAGE gets the worker a memfd
 * the daemon made and keeps a descriptor of, the worker writes the tensor
 * into it, and WC_STORE stores what the daemon's descriptor holds.  The
 * op's bits 8 and up are the digest kind (WC_KIND_SHIFT). */
enum { WC_LOOKUP = 1, WC_STORE = 2, WC_STORE_REPLACE = 3, WC_STAGE = 4 };
#define WC_KIND_SHIFT 8
struct wc_request {
    uint32_t op;
    uint32_t seq;
    uint64_t size;
    struct apir_digest hash;
};
struct wc_reply {
    uint32_t seq;
    int32_t result;     /* lookup: 1 found (a descriptor follows), 0 not, 2 there but not what its name
                         * says; store: an apir_wcache_store */
};

/* How long a worker waits for the daemon (another worker's store may be
 * under way); past it, a miss. */
#define WC_REPLY_TIMEOUT_MS 60000

/* One message, with fd if >= 0 (the daemon's replies only; a worker may
 * not call sendmsg at all: send()). */
static ssize_t send_msg(int sock, const void *buf, size_t len, int fd, int flags)
{
    if (fd < 0) {
        ssize_t r;
        do
            r = send(sock, buf, len, MSG_NOSIGNAL | flags);
        while (r < 0 && errno == EINTR);
        return r;
    }
    struct iovec iov = { (void *)buf, len };
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof(ctl.b);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t r;
    do
        r = sendmsg(sock, &m, MSG_NOSIGNAL | flags);
    while (r < 0 && errno == EINTR);
    return r;
}

/* One message; *fd the one descriptor it carried (others closed), or -1. */
static ssize_t recv_msg(int sock, void *buf, size_t len, int *fd, int flags)
{
    struct iovec iov = { buf, len };
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
    *fd = -1;
    ssize_t r;
    do
        r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | flags);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return r;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*fd < 0)
                *fd = got;
            else
                close(got);
        }
    }
    if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        return -2;  /* not a message of ours */
    return r;
}

struct apir_wcache_link {
    struct apir_wcache *local;
    int fd;                 /* remote: the socket to the daemon */
    uint32_t seq;
    pthread_mutex_t lock;
};

static struct apir_wcache_link *link_new(struct apir_wcache *local, int fd)
{
    struct apir_wcache_link *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->local = local;
    l->fd = fd;
    pthread_mutex_init(&l->lock, NULL);
    return l;
}

struct apir_wcache_link *apir_wcache_link_local(struct apir_wcache *c) { return c ? link_new(c, -1) : NULL; }
struct apir_wcache_link *apir_wcache_link_remote(int fd) { return fd >= 0 ? link_new(NULL, fd) : NULL; }

void apir_wcache_link_free(struct apir_wcache_link *l)
{
    if (!l)
        return;
    if (l->fd >= 0)
        close(l->fd);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* One round trip to the daemon; the reply's result, *fd a descriptor it
 * carried.  -1 when the daemon does not answer in time (replies to older
 * requests, late, are skipped by their sequence number). */
static int remote_call(struct apir_wcache_link *l, uint32_t op, const struct apir_digest *h, uint64_t size, int *fd)
{
    *fd = -1;
    pthread_mutex_lock(&l->lock);
    struct wc_request rq = { .op = op, .seq = ++l->seq, .size = size, .hash = *h };
    int result = -1;
    if (l->fd >= 0 && send_msg(l->fd, &rq, sizeof(rq), -1, 0) == (ssize_t)sizeof(rq)) {
        for (;;) {
            struct pollfd p = { l->fd, POLLIN, 0 };
            int pr = poll(&p, 1, WC_REPLY_TIMEOUT_MS);
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr <= 0)
                break;
            struct wc_reply rp;
            int got_fd;
            ssize_t r = recv_msg(l->fd, &rp, sizeof(rp), &got_fd, 0);
            if (r != (ssize_t)sizeof(rp)) {
                if (got_fd >= 0)
                    close(got_fd);
                break;
            }
            if (rp.seq != rq.seq) {
                if (got_fd >= 0)
                    close(got_fd);
                continue;
            }
            result = rp.result;
            *fd = got_fd;
            break;
        }
    }
    pthread_mutex_unlock(&l->lock);
    if (result < 0)
        APIR_WARN("host", "weight cache: the daemon did not answer: a miss");
    return result;
}

int apir_wcache_link_lookup(struct apir_wcache_link *l, uint32_t kind, const struct apir_digest *h, uint64_t size,
                            bool *bad)
{
    if (l->local)
        return apir_wcache_lookup(l->local, kind, h, size, bad);
    int fd;
    int r = remote_call(l, WC_LOOKUP | kind << WC_KIND_SHIFT, h, size, &fd);
    *bad = r == 2;
    if (r != 1 && fd >= 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int apir_wcache_link_stage(struct apir_wcache_link *l)
{
    if (l->local)
        return memfd_create("apir-wcache", MFD_CLOEXEC);
    int fd;
    const struct apir_digest none = { { 0 } };
    int r = remote_call(l, WC_STAGE, &none, 0, &fd);
    if (r != 1 && fd >= 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int apir_wcache_link_store(struct apir_wcache_link *l, uint32_t kind, const struct apir_digest *h, uint64_t size,
                           int stage_fd, bool replace)
{
    if (l->local)
        return apir_wcache_store_fd(l->local, kind, h, size, stage_fd, replace);
    int fd;
    int r = remote_call(l, (replace ? WC_STORE_REPLACE : WC_STORE) | kind << WC_KIND_SHIFT, h, size, &fd);
    if (fd >= 0)
        close(fd);
    return r < 0 ? APIR_WCACHE_FAILED : r;
}

/* The service: one thread of the daemon, polling its workers' sockets.  A
 * new worker's socket comes through a pipe (apir_wcache_service_connect
 * runs on the accept loop's thread and only writes an int). */
#define WC_MAX_WORKERS 4096

static struct {
    struct apir_wcache *c;
    int add_pipe[2];
    pthread_t thread;
    bool running;
} service = { NULL, { -1, -1 }, 0, false };

/* Answers one request; false when the worker is gone (its socket goes).
 * *staged: the memfd of the worker's store under way (WC_STAGE), or -1. */
static bool serve_one(int sock, int *staged)
{
    struct wc_request rq;
    memset(&rq, 0, sizeof(rq));
    int fd;
    ssize_t r = recv_msg(sock, &rq, sizeof(rq), &fd, MSG_DONTWAIT);
    if (r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return true;
    if (r == 0 || r == -1)
        return false;
    struct wc_reply rp = { .seq = rq.seq, .result = -1 };
    int reply_fd = -1;
    const uint32_t op = rq.op & ((1u << WC_KIND_SHIFT) - 1), kind = rq.op >> WC_KIND_SHIFT;
    const bool known = r == (ssize_t)sizeof(rq) && (kind == APIR_DIGEST_SHA256 || kind == APIR_DIGEST_TREE);
    if (known && op == WC_LOOKUP && fd < 0) {
        bool bad;
        reply_fd = apir_wcache_lookup(service.c, kind, &rq.hash, rq.size, &bad);
        rp.result = reply_fd >= 0 ? 1 : bad ? 2 : 0;
    } else if (r == (ssize_t)sizeof(rq) && rq.op == WC_STAGE && fd < 0) {
        if (*staged >= 0)
            close(*staged);
        *staged = memfd_create("apir-wcache", MFD_CLOEXEC);
        reply_fd = *staged >= 0 ? fcntl(*staged, F_DUPFD_CLOEXEC, 0) : -1;
        rp.result = reply_fd >= 0 ? 1 : 0;
    } else if (known && (op == WC_STORE || op == WC_STORE_REPLACE) && fd < 0 && *staged >= 0) {
        rp.result = apir_wcache_store_fd(service.c, kind, &rq.hash, rq.size, *staged, op == WC_STORE_REPLACE);
        close(*staged);
        *staged = -1;
    } else {
        APIR_WARN("host", "weight cache: a malformed request from a worker (%zd bytes): refused", r);
    }
    if (fd >= 0)
        close(fd);
    send_msg(sock, &rp, sizeof(rp), reply_fd, MSG_DONTWAIT);
    if (reply_fd >= 0)
        close(reply_fd);
    return true;
}

static void *service_main(void *arg)
{
    (void)arg;
    static struct pollfd p[WC_MAX_WORKERS + 1];
    static int staged[WC_MAX_WORKERS + 1];  /* per worker: serve_one's *staged */
    nfds_t n = 1;
    p[0] = (struct pollfd){ service.add_pipe[0], POLLIN, 0 };
    for (;;) {
        if (poll(p, n, -1) < 0) {
            if (errno == EINTR)
                continue;
            APIR_ERROR("host", "weight cache service: poll: %s; the cache is off from now on", strerror(errno));
            return NULL;
        }
        for (nfds_t i = 1; i < n; i++) {
            if (!p[i].revents)
                continue;
            bool keep = !(p[i].revents & POLLIN) || serve_one(p[i].fd, &staged[i]);
            if (!keep || ((p[i].revents & (POLLHUP | POLLERR | POLLNVAL)) && !(p[i].revents & POLLIN))) {
                close(p[i].fd);
                if (staged[i] >= 0)
                    close(staged[i]);
                staged[i] = staged[n - 1];
                p[i--] = p[--n];
            }
        }
        if (p[0].revents & POLLIN) {
            int fd;
            while (read(service.add_pipe[0], &fd, sizeof(fd)) == (ssize_t)sizeof(fd)) {
                if (n < WC_MAX_WORKERS + 1) {
                    staged[n] = -1;
                    p[n++] = (struct pollfd){ fd, POLLIN, 0 };
                }
                else
                    close(fd);
            }
        }
    }
    return NULL;
}

bool apir_wcache_service_start(struct apir_wcache *c, char *err, size_t err_len)
{
    if (pipe2(service.add_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, err_len, "weight cache service: pipe: %s", strerror(errno));
        return false;
    }
    service.c = c;
    int e = pthread_create(&service.thread, NULL, service_main, NULL);
    if (e != 0) {
        snprintf(err, err_len, "weight cache service: thread: %s", strerror(e));
        close(service.add_pipe[0]);
        close(service.add_pipe[1]);
        return false;
    }
    pthread_detach(service.thread);
    service.running = true;
    return true;
}

int apir_wcache_service_connect(void)
{
    if (!service.running)
        return -1;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    if (write(service.add_pipe[1], &sv[0], sizeof(int)) != (ssize_t)sizeof(int)) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    return sv[1];
}

/* ---- the handlers' work ------------------------------------------------------------ */

uint32_t apir_wcache_fill(struct apir_session *s, struct apir_host_buffer *hb, struct ggml_tensor *t, uint64_t offset,
                          uint64_t size, const struct apir_digest *h)
{
    struct apir_wcache_link *l = s->host->weight_cache;
    if (!l)
        return APIR_WCACHE_NONE;
    bool bad = false;
    int fd = size ? apir_wcache_link_lookup(l, apir_wcache_kind_of(s->minor), h, size, &bad) : -1;
    if (fd < 0) {
        if (bad) {
            s->wcache_bad = *h;  /* the guest's keep replaces it */
            s->wcache_bad_set = true;
        }
        s->stats.wcache_misses++;
        return APIR_WCACHE_MISS;
    }
    /* A buffer in host memory is read into directly: one copy, not two. */
    uint8_t *direct = ggml_backend_buffer_is_host(t->buffer) ? (uint8_t *)t->data + offset : NULL;
    uint8_t *buf = direct ? NULL : malloc(WCACHE_CHUNK);
    if (!direct && !buf) {
        close(fd);
        s->stats.wcache_misses++;
        return APIR_WCACHE_MISS;
    }
    apir_session_settle(s);
    apir_buffer_forget_copies(s, hb, (uint8_t *)t->data + offset, (size_t)size);
    /* The cache's owner hashed the entry before handing it out (lookup):
     * here it is only read (the descriptor is fresh: read() from 0; a
     * worker may not pread) and uploaded.  A short read is a miss, which
     * leaves the range half-written: the guest's upload then overwrites it. */
    bool ok = true;
    for (uint64_t off = 0; ok && off < size;) {
        size_t want = size - off < WCACHE_CHUNK ? (size_t)(size - off) : WCACHE_CHUNK;
        ssize_t r = read(fd, direct ? direct + off : buf, want);
        if (r < 0 && errno == EINTR)
            continue;
        ok = r > 0;
        if (ok && !direct)
            ggml_backend_tensor_set(t, buf, (size_t)(offset + off), (size_t)r);
        off += r > 0 ? (uint64_t)r : 0;
    }
    free(buf);
    close(fd);
    if (!ok) {
        APIR_WARN("host", "%s: weight cache entry of %llu bytes read short: a miss", s->name, (unsigned long long)size);
        s->stats.wcache_misses++;
        return APIR_WCACHE_MISS;
    }
    s->stats.wcache_hits++;
    s->stats.wcache_hit_bytes += size;
    return APIR_WCACHE_DONE;
}

uint32_t apir_wcache_keep(struct apir_session *s, struct ggml_tensor *t, const struct apir_digest *h)
{
    struct apir_wcache_link *l = s->host->weight_cache;
    if (!l)
        return APIR_WCACHE_NONE;
    const size_t size = ggml_nbytes(t);
    if (!size)
        return APIR_WCACHE_MISS;
    /* A buffer in host memory is written from directly: one copy, not two. */
    const uint8_t *direct = ggml_backend_buffer_is_host(t->buffer) ? (const uint8_t *)t->data : NULL;
    uint8_t *buf = direct ? NULL : malloc(WCACHE_CHUNK);
    int fd = direct || buf ? apir_wcache_link_stage(l) : -1;
    bool ok = fd >= 0;
    if (ok)
        apir_session_settle(s);
    /* The tensor as the device holds it, into a memfd the store reads
     * (one the daemon made, through the worker's socket, or this
     * process's). */
    for (size_t off = 0; ok && off < size; off += WCACHE_CHUNK) {
        size_t n = size - off < WCACHE_CHUNK ? size - off : WCACHE_CHUNK;
        if (!direct)
            ggml_backend_tensor_get(t, buf, off, n);
        ok = write_all(fd, direct ? direct + off : buf, n);
    }
    free(buf);
    const bool replace = s->wcache_bad_set && !memcmp(&s->wcache_bad, h, sizeof(*h));
    int r = ok ? apir_wcache_link_store(l, apir_wcache_kind_of(s->minor), h, size, fd, replace) : APIR_WCACHE_FAILED;
    if (fd >= 0)
        close(fd);
    if (r == APIR_WCACHE_STORED || r == APIR_WCACHE_PRESENT || r == APIR_WCACHE_QUEUED) {
        if (replace)
            s->wcache_bad_set = false;
        s->stats.wcache_kept++;
        return APIR_WCACHE_DONE;
    }
    char hex[65];
    apir_digest_hex(h, hex);
    APIR_DEBUG("host", "%s: weight cache: %.16s... (%zu bytes) not kept (%d)", s->name, hex, size, r);
    return APIR_WCACHE_MISS;
}

void apir_wcache_log_session(const struct apir_session *s)
{
    const struct apir_session_stats *st = &s->stats;
    if (st->wcache_hits || st->wcache_misses || st->wcache_kept)
        APIR_INFO("host", "%s: weight cache: %llu hits (%.1f MiB not sent), %llu misses, %llu kept", s->name,
                  (unsigned long long)st->wcache_hits, (double)st->wcache_hit_bytes / (1024.0 * 1024.0),
                  (unsigned long long)st->wcache_misses, (unsigned long long)st->wcache_kept);
}
