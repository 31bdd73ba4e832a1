/* Sending and receiving small messages with file descriptors (SCM_RIGHTS). */
#ifndef APIR_FDPASS_H
#define APIR_FDPASS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* One message with up to 4 fds; returns bytes sent or -1. */
ssize_t apir_send_fds(int sock, const void *buf, size_t len, const int *fds, int n_fds);
/* One message; received fds go to fds[0..*n_fds) (max_fds at most, the rest
 * are closed).  timeout_ms < 0 waits forever.  Returns bytes or -1. */
ssize_t apir_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *n_fds, int timeout_ms);

/* The page size (sysconf, read once), and sizes rounded to it: blobs are
 * whole pages on both sides, and a mapping's offset must be page-aligned. */
size_t apir_page_size(void);
static inline size_t apir_page_round_up(size_t size)
{
    const size_t page = apir_page_size();
    return (size + page - 1) & ~(page - 1);
}
static inline size_t apir_page_round_down(size_t size)
{
    return size & ~(apir_page_size() - 1);
}

/* Whether this machine's free memory is reported to a hypervisor (a virtio
 * balloon's free page reporting), which makes fresh huge pages slow. */
bool apir_free_memory_reported(void);
/* Whether to ask for huge pages, by the setting env_name: "0" no, "1" yes,
 * otherwise yes unless apir_free_memory_reported(). */
bool apir_huge_pages_wanted(const char *env_name);

/* A sealed memfd of `size` bytes (it cannot shrink or grow), mapped shared.
 * Returns the fd, or -1; *map receives the mapping. */
int apir_memfd_create(const char *name, size_t size, void **map);
/* Checks an fd from a peer: a memfd sealed against shrinking and at least
 * `size` bytes long; maps it.  NULL with a reason in *why otherwise. */
void *apir_memfd_map_checked(int fd, size_t size, const char **why);

#endif
