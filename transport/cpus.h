/*
 * The CPUs this process may use: what a host's default thread count and
 * each side's optional threads (a tls: host's sender, a tls: guest's
 * reader: each wants a core of its own) are decided by.
 */
#ifndef APIR_CPUS_H
#define APIR_CPUS_H

/* The cores this process may run on (its affinity mask, as a container's
 * cpuset narrows it), at most the cgroup v2 CPU quota (cpu.max of its
 * cgroup and the cgroups above, rounded up).  At least 1. */
int apir_usable_cpus(void);

#endif
