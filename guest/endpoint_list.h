/*
 * APIR_HOST as a list: "unix:/run/a.sock,unix:/run/b.sock" names several
 * hosts, whose devices one program sees side by side (APIR0.. numbered
 * across the hosts in list order: frontend_reg.c).  Shared by the guest
 * library and the apir tool (tools/apir.c), so that `apir info` shows what a
 * program would see.
 *
 * Splitting is all this does: each endpoint is handed as it stands to the
 * transport (transport/transport.c), which knows the kinds of endpoint.
 * Spaces around an endpoint are dropped.  What cannot be used is reported
 * through the caller's callback, one message each, and left out; the rest
 * goes on:
 *   - an empty item ("a,,b", a trailing comma);
 *   - an endpoint longer than APIR_ENDPOINT_MAX - 1 characters (what a
 *     connection keeps to dial again: struct apir_remote's endpoint);
 *   - an endpoint listed twice (one host's devices would be offered twice);
 *   - endpoints beyond the first APIR_MAX_HOSTS.
 * An unset or empty APIR_HOST is one endpoint, "": the default socket.
 */
#ifndef APIR_ENDPOINT_LIST_H
#define APIR_ENDPOINT_LIST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define APIR_MAX_HOSTS 16
#define APIR_ENDPOINT_MAX 128  /* with its NUL */
#define APIR_MAX_DEVICES 16    /* APIR devices in one program, all hosts together */

struct apir_endpoint_list {
    uint32_t n;
    char endpoint[APIR_MAX_HOSTS][APIR_ENDPOINT_MAX];  /* "": the default socket */
};

/* Called once per item left out, with a whole sentence. */
typedef void (*apir_endpoint_problem_fn)(void *arg, const char *msg);

static inline void apir_endpoint_list_parse(const char *spec, struct apir_endpoint_list *list,
                                            apir_endpoint_problem_fn problem, void *arg)
{
    char msg[256];
    uint32_t n_items = 0, n_over = 0;
    list->n = 0;
    if (!spec || !*spec) {
        list->endpoint[0][0] = '\0';
        list->n = 1;
        return;
    }
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, ',');
        const char *stop = end ? end : p + strlen(p);
        const char *a = p, *b = stop;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        const size_t len = (size_t)(b - a);
        n_items++;
        if (len == 0) {
            snprintf(msg, sizeof(msg), "APIR_HOST: item %u is empty: left out", n_items);
            problem(arg, msg);
        } else if (len >= APIR_ENDPOINT_MAX) {
            snprintf(msg, sizeof(msg), "APIR_HOST: endpoint %u (%.40s...) is longer than %d characters: left out",
                     n_items, a, APIR_ENDPOINT_MAX - 1);
            problem(arg, msg);
        } else {
            uint32_t dup = 0;
            for (uint32_t i = 0; i < list->n && !dup; i++)
                if (strlen(list->endpoint[i]) == len && !memcmp(list->endpoint[i], a, len))
                    dup = i + 1;
            if (dup) {
                snprintf(msg, sizeof(msg), "APIR_HOST: %.*s is listed twice: left out the second time", (int)len, a);
                problem(arg, msg);
            } else if (list->n == APIR_MAX_HOSTS) {
                n_over++;
            } else {
                memcpy(list->endpoint[list->n], a, len);
                list->endpoint[list->n][len] = '\0';
                list->n++;
            }
        }
        if (!end)
            break;
        p = end + 1;
    }
    if (n_over) {
        snprintf(msg, sizeof(msg), "APIR_HOST: more than %d endpoints: the last %u left out", APIR_MAX_HOSTS,
                 n_over);
        problem(arg, msg);
    }
    if (list->n == 0) {
        snprintf(msg, sizeof(msg), "APIR_HOST names no endpoint");
        problem(arg, msg);
    }
}

#endif
