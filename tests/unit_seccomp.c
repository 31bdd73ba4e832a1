/*
 * The system call side of dist/systemd/apir-host.service, outside systemd
 * (tests/run_ops.sh, case unit): runs a program under the filters systemd
 * would install for it.
 *   unit_seccomp FAMILIES SYSCALLS PROGRAM [ARGS...]
 * FAMILIES: RestrictAddressFamilies= (AF_UNIX,AF_INET...): socket() of any
 * other family fails with EAFNOSUPPORT, as systemd makes it.  SYSCALLS: the
 * system calls SystemCallFilter= allows, its @groups expanded (by
 * systemd-analyze syscall-filter): any other fails with EPERM
 * (SystemCallErrorNumber=EPERM).  No no_new_privs: the unit says
 * NoNewPrivileges=no (loading a filter without it needs root, as here).
 */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const struct { const char *name; int af; } families[] = {
    { "AF_UNIX", AF_UNIX }, { "AF_INET", AF_INET }, { "AF_INET6", AF_INET6 }, { "AF_NETLINK", AF_NETLINK },
    { "AF_PACKET", AF_PACKET }, { "AF_VSOCK", AF_VSOCK },
};

static int family(const char *name)
{
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
        if (!strcmp(families[i].name, name))
            return families[i].af;
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: unit_seccomp FAMILIES SYSCALLS PROGRAM [ARGS...]\n");
        return 2;
    }
    /* The address families: every one not listed refused. */
    char allowed[AF_MAX] = { 0 };
    char *fams = strdup(argv[1]);
    for (char *tok = strtok(fams, ","); tok; tok = strtok(NULL, ",")) {
        int af = family(tok);
        if (af < 0) {
            fprintf(stderr, "unit_seccomp: unknown family %s\n", tok);
            return 2;
        }
        allowed[af] = 1;
    }
    scmp_filter_ctx af_ctx = seccomp_init(SCMP_ACT_ALLOW);
    for (int af = 0; af < AF_MAX; af++)
        if (!allowed[af] && seccomp_rule_add(af_ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                                             SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)af)) != 0)
            return 1;
    /* The system calls: an allow list. */
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    char *calls = strdup(argv[2]);
    unsigned n = 0;
    for (char *tok = strtok(calls, ","); tok; tok = strtok(NULL, ",")) {
        int nr = seccomp_syscall_resolve_name(tok);
        if (nr == __NR_SCMP_ERROR)
            continue;  /* a name this architecture lacks */
        if (seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) == 0)
            n++;
    }
    /* execve itself, or nothing runs (systemd allows it through @process). */
    seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(execve), 0);
    seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
    seccomp_attr_set(af_ctx, SCMP_FLTATR_CTL_NNP, 0);
    if (n < 10 || seccomp_load(af_ctx) != 0 || seccomp_load(ctx) != 0) {
        fprintf(stderr, "unit_seccomp: cannot load the filters (%u system calls)\n", n);
        return 1;
    }
    execvp(argv[3], argv + 3);
    fprintf(stderr, "unit_seccomp: %s: %s\n", argv[3], strerror(errno));
    return 127;
}
