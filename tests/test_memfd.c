/*
 * A blob's memfd as the guest makes it and a host takes it (transport/fdpass.c):
 *   - apir_memfd_create: sealed against shrinking and growing, every page
 *     committed (what a host's guest_committed asks of st_blocks) and
 *     resident in the guest's mapping, with huge pages asked for and not
 *     (APIR_HUGEPAGES=0);
 *   - where the kernel gives shared memory huge pages on request
 *     (transparent_hugepage/shmem_enabled "advise" or "always"), a blob of
 *     whole huge pages asked for with APIR_HUGEPAGES=1 is mapped with them
 *     (ShmemPmdMapped grows); elsewhere that check is skipped, and says so;
 *   - APIR_HUGEPAGES: 0 and 1 decide, unset asks unless free memory goes back
 *     to a hypervisor;
 *   - apir_memfd_map_checked: a host's mapping shares the guest's bytes; an
 *     unsealed memfd and a size past the file are refused.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fdpass.h"
#include "test_util.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HUGE_BYTES (2u << 20)

/* The kB of shared memory mapped with huge pages in this process. */
static long shmem_pmd_kb(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f)
        return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* Does the kernel give shared memory huge pages to a mapping that asks? */
static bool shmem_huge_on_request(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (!f)
        return false;
    char line[256] = "";
    const bool read = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    return read && (strstr(line, "[advise]") || strstr(line, "[always]") || strstr(line, "[force]"));
}

static void check_blob(const char *hugepages, size_t size)
{
    if (hugepages)
        setenv("APIR_HUGEPAGES", hugepages, 1);
    else
        unsetenv("APIR_HUGEPAGES");
    void *map = NULL;
    int fd = apir_memfd_create("test-blob", size, &map);
    CHECK_MSG(fd >= 0 && map, "APIR_HUGEPAGES=%s size %zu", hugepages ? hugepages : "(unset)", size);
    if (fd < 0 || !map)
        return;
    int seals = fcntl(fd, F_GET_SEALS);
    CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) && (seals & F_SEAL_SEAL));
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == size);
    /* Committed: what a host's guest_committed (client_shm.c) asks. */
    CHECK_MSG((uint64_t)st.st_blocks * 512u >= apir_page_round_up(size), "%lld blocks for %zu bytes",
              (long long)st.st_blocks, size);
    const size_t pages = apir_page_round_up(size) / apir_page_size();
    unsigned char *in = malloc(pages);
    size_t resident = 0;
    if (in && mincore(map, size, in) == 0)
        for (size_t i = 0; i < pages; i++)
            resident += in[i] & 1;
    CHECK_MSG(resident == pages, "%zu of %zu pages resident", resident, pages);
    free(in);
    memset(map, 0x5a, size);
    const char *why = NULL;
    unsigned char *host = apir_memfd_map_checked(fd, size, &why);
    CHECK_MSG(host != NULL, "%s", why ? why : "");
    if (host) {
        CHECK(host[0] == 0x5a && host[size - 1] == 0x5a);
        host[size / 2] = 0xa5;
        CHECK(((unsigned char *)map)[size / 2] == 0xa5);
        munmap(host, size);
    }
    /* Past the file's end: refused, not mapped. */
    why = NULL;
    CHECK(apir_memfd_map_checked(fd, size + apir_page_size(), &why) == NULL && why != NULL);
    munmap(map, size);
    close(fd);
    unsetenv("APIR_HUGEPAGES");
}

static void test_blob_committed(void)
{
    check_blob(NULL, 3 * 4096 + 17);
    check_blob("0", 3 * 4096 + 17);
    check_blob(NULL, 2 * HUGE_BYTES + 3 * 4096);
    check_blob("0", 2 * HUGE_BYTES + 3 * 4096);
}

static void test_blob_huge_pages(void)
{
    if (!shmem_huge_on_request()) {
        printf("skip: the kernel gives shared memory no huge pages (transparent_hugepage/shmem_enabled)\n");
        return;
    }
    const size_t size = 4 * HUGE_BYTES;
    const long before = shmem_pmd_kb();
    void *map = NULL;
    setenv("APIR_HUGEPAGES", "1", 1);  /* asked for even where free memory is reported */
    int fd = apir_memfd_create("test-huge", size, &map);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    const long after = shmem_pmd_kb();
    /* At least one huge page: a fragmented machine may have fewer free. */
    CHECK_MSG(before >= 0 && after >= before + (long)(HUGE_BYTES >> 10), "ShmemPmdMapped %ld -> %ld kB", before,
              after);
    munmap(map, size);
    close(fd);
    unsetenv("APIR_HUGEPAGES");
}

/* The setting: 0 and 1 decide; unset, what the machine's memory says. */
static void test_wanted(void)
{
    setenv("APIR_TEST_HUGE", "0", 1);
    CHECK(!apir_huge_pages_wanted("APIR_TEST_HUGE"));
    setenv("APIR_TEST_HUGE", "1", 1);
    CHECK(apir_huge_pages_wanted("APIR_TEST_HUGE"));
    unsetenv("APIR_TEST_HUGE");
    CHECK(apir_huge_pages_wanted("APIR_TEST_HUGE") == !apir_free_memory_reported());
    printf("free memory reported to a hypervisor: %s\n", apir_free_memory_reported() ? "yes" : "no");
}

static void test_unsealed_refused(void)
{
    int fd = memfd_create("test-unsealed", MFD_CLOEXEC);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(ftruncate(fd, 65536) == 0);
    const char *why = NULL;
    CHECK(apir_memfd_map_checked(fd, 65536, &why) == NULL && why && strstr(why, "sealed"));
    close(fd);
}

TEST_MAIN("memfd", TEST(test_wanted), TEST(test_blob_committed), TEST(test_blob_huge_pages), TEST(test_unsealed_refused))
