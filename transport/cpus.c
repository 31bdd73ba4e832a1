#include "cpus.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The cgroup v2 quota of this process's cgroup and those above it, in CPUs
 * rounded up; 0: no quota (or no cgroup v2). */
static int cgroup_cpu_quota(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return 0;
    char line[1024], rel[1024] = "";
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "0::", 3)) {
            snprintf(rel, sizeof(rel), "%s", line + 3);
            rel[strcspn(rel, "\n")] = '\0';
            break;
        }
    fclose(f);
    if (rel[0] != '/')
        return 0;
    const char *root = "/sys/fs/cgroup";
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s%s", root, strcmp(rel, "/") ? rel : "");
    int best = 0;
    for (;;) {
        char path[1200];
        snprintf(path, sizeof(path), "%s/cpu.max", dir);
        FILE *m = fopen(path, "r");
        if (m) {
            char quota[32] = "";
            unsigned long long period = 0;
            if (fscanf(m, "%31s %llu", quota, &period) == 2 && strcmp(quota, "max") != 0 && period > 0) {
                char *end;
                unsigned long long q = strtoull(quota, &end, 10);
                if (*end == '\0' && q > 0) {
                    unsigned long long cpus = (q + period - 1) / period;
                    int n = cpus > 4096 ? 4096 : (int)cpus;
                    if (best == 0 || n < best)
                        best = n;
                }
            }
            fclose(m);
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= strlen(root) || !slash)
            break;
        *slash = '\0';
    }
    return best;
}

int apir_usable_cpus(void)
{
    int n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    int quota = cgroup_cpu_quota();
    if (quota > 0 && quota < n)
        n = quota;
    return n > 0 ? n : 1;
}
