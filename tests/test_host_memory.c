/*
 * Huge pages for buffers in the host's own memory (host/data/buffers.c,
 * apir_buffer_prefer_huge_pages), with buffers of a fake backend whose
 * memory the test places:
 *   - a host-memory buffer's whole huge pages are advised and get huge pages
 *     once written, where transparent_hugepage/enabled is "madvise" or
 *     "always" (with "never" the check is skipped, and says so);
 *   - only the whole huge pages inside the buffer are advised: the memory
 *     around it is left as it was (its mapping's flags are unchanged);
 *   - device memory (is_host false) and a host whose config says no
 *     (APIR_HOST_HUGEPAGES=0) are left alone; the others run with a config
 *     that asks (this machine's default may be not to ask, fdpass.h's
 *     apir_free_memory_reported);
 *   - apir_host_config_default reads APIR_HOST_HUGEPAGES: 0 no, 1 yes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "buffers.h"
#include "ggml-backend-impl.h"
#include "host.h"
#include "ggml.h"
#include "test_util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE ((size_t)2 << 20)

static void *mem_base;
static size_t mem_size;
static bool mem_is_host = true;
static const struct apir_host_config asks = { .huge_pages = true }, declines = { .huge_pages = false };

static void *fake_get_base(ggml_backend_buffer_t b) { (void)b; return mem_base; }
static const char *fake_name(ggml_backend_buffer_type_t bt) { (void)bt; return "FAKE"; }
static bool fake_is_host(ggml_backend_buffer_type_t bt) { (void)bt; return mem_is_host; }

static struct ggml_backend_buffer_type fake_buft = {
    .iface = { .get_name = fake_name, .is_host = fake_is_host },
};
static const struct ggml_backend_buffer_i fake_iface = { .get_base = fake_get_base };

static struct ggml_backend_buffer fake_buffer(void)
{
    return (struct ggml_backend_buffer){ .iface = fake_iface, .buft = &fake_buft, .size = mem_size };
}

/* The word after "[" in a transparent_hugepage file: the setting in use. */
static bool thp_setting(const char *path, char *out, size_t n)
{
    FILE *f = fopen(path, "r");
    char line[128] = "";
    if (!f)
        return false;
    const bool read = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    const char *a = read ? strchr(line, '[') : NULL, *b = a ? strchr(a, ']') : NULL;
    if (!b || (size_t)(b - a) > n)
        return false;
    memcpy(out, a + 1, (size_t)(b - a - 1));
    out[b - a - 1] = '\0';
    return true;
}

/* AnonHugePages (kB) of the mapping that holds addr; -1: not found. */
static long anon_huge_kb_at(const void *addr, char *flags, size_t flags_n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    bool in = false;
    long kb = -1;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {  /* a mapping's first line */
            if (in)
                break;
            in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
            continue;
        }
        if (!in)
            continue;
        sscanf(line, "AnonHugePages: %ld kB", &kb);
        if (flags && !strncmp(line, "VmFlags:", 8))
            snprintf(flags, flags_n, "%s", line + 8);
    }
    fclose(f);
    return kb;
}

/* 3 huge pages' room, the buffer starting half a huge page in: one whole
 * huge page in its middle (the others are cut by its ends). */
static uint8_t *map_region(void)
{
    uint8_t *raw = mmap(NULL, 6 * HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    return aligned;
}

static void test_host_buffer(void)
{
    char thp[32] = "";
    if (!thp_setting("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof(thp)) || !strcmp(thp, "never")) {
        printf("skip: transparent_hugepage/enabled is '%s': no huge pages to ask for\n", thp);
        return;
    }
    uint8_t *region = map_region();
    CHECK(region != NULL);
    if (!region)
        return;
    mem_base = region + HUGE / 2;
    mem_size = 2 * HUGE;  /* [0.5, 2.5) huge pages: the page [1, 2) is whole */
    mem_is_host = true;
    struct ggml_backend_buffer buf = fake_buffer();
    apir_buffer_prefer_huge_pages(&asks, &buf);
    memset(region, 1, 3 * HUGE);
    char flags[512] = "";
    const long inside = anon_huge_kb_at(region + HUGE, flags, sizeof(flags));
    CHECK_MSG(inside >= (long)(HUGE >> 10), "AnonHugePages %ld kB at the whole huge page", inside);
    CHECK_MSG(strstr(flags, " hg") != NULL, "VmFlags:%s", flags);
    /* Before the buffer's first whole huge page: not advised. */
    flags[0] = '\0';
    anon_huge_kb_at(region, flags, sizeof(flags));
    CHECK_MSG(strstr(flags, " hg") == NULL, "outside the buffer, VmFlags:%s", flags);
}

static void test_left_alone(void)
{
    uint8_t *region = map_region();
    CHECK(region != NULL);
    if (!region)
        return;
    mem_base = region;
    mem_size = 2 * HUGE;
    char flags[512];
    /* Device memory: its pointer is not ours to advise. */
    mem_is_host = false;
    struct ggml_backend_buffer buf = fake_buffer();
    apir_buffer_prefer_huge_pages(&asks, &buf);
    flags[0] = '\0';
    anon_huge_kb_at(region, flags, sizeof(flags));
    CHECK_MSG(strstr(flags, " hg") == NULL, "device memory advised: VmFlags:%s", flags);
    /* A host whose config declines (APIR_HOST_HUGEPAGES=0). */
    mem_is_host = true;
    buf = fake_buffer();
    apir_buffer_prefer_huge_pages(&declines, &buf);
    flags[0] = '\0';
    anon_huge_kb_at(region, flags, sizeof(flags));
    CHECK_MSG(strstr(flags, " hg") == NULL, "APIR_HOST_HUGEPAGES=0 advised anyway: VmFlags:%s", flags);
    /* A buffer smaller than a huge page: nothing whole inside it. */
    mem_is_host = true;
    mem_base = region;
    mem_size = HUGE - 4096;
    buf = fake_buffer();
    apir_buffer_prefer_huge_pages(&asks, &buf);
    flags[0] = '\0';
    anon_huge_kb_at(region, flags, sizeof(flags));
    CHECK_MSG(strstr(flags, " hg") == NULL, "a small buffer advised: VmFlags:%s", flags);
    apir_buffer_prefer_huge_pages(&asks, NULL);  /* no buffer: nothing */
}

/* apir_host_config_default takes APIR_HOST_HUGEPAGES from the environment: 0 no, 1 yes. */
static void test_config(void)
{
    struct apir_host_config cfg;
    setenv("APIR_HOST_HUGEPAGES", "0", 1);
    apir_host_config_default(&cfg);
    CHECK(!cfg.huge_pages);
    setenv("APIR_HOST_HUGEPAGES", "1", 1);
    apir_host_config_default(&cfg);
    CHECK(cfg.huge_pages);
    unsetenv("APIR_HOST_HUGEPAGES");
}

TEST_MAIN("host_memory", TEST(test_config), TEST(test_left_alone), TEST(test_host_buffer))
