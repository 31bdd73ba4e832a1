/*
 * HOST_CHECK_GGML against a real apir-host (apir 0.7, issue 25): the guest
 * names its ggml's op, unary op, GLU op and type tables and the host says
 * whether it computes them with the same numbers.  The tables sent here are
 * the pinned ggml's own (what this test links), then altered as another
 * ggml's would be.
 *
 * usage: test_ggml_check PATH/TO/apir-host
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "calls.h"
#include "remote.h"
#include "test_host.h"
#include "test_util.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tables[4][APIR_MAX_STRING];

static void table_text(char *out, size_t cap, int table)
{
    static const int counts[] = { GGML_OP_COUNT, GGML_UNARY_OP_COUNT, GGML_GLU_OP_COUNT, GGML_TYPE_COUNT };
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < counts[table]; i++) {
        const char *n = table == 0   ? ggml_op_name((enum ggml_op)i)
                        : table == 1 ? ggml_unary_op_name((enum ggml_unary_op)i)
                        : table == 2 ? ggml_glu_op_name((enum ggml_glu_op)i)
                                     : ggml_type_name((enum ggml_type)i);
        used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? "\n" : "", n);
    }
}

struct verdict {
    int rc;
    uint32_t verdict;
    struct apir_string reason, host_ggml;
};

static struct verdict ask(struct apir_remote *r, const char *version, const char *commit, const char *ops,
                          const char *unary, const char *glu, const char *types)
{
    struct verdict v = { .verdict = 99 };
    v.rc = apir_call_HOST_CHECK_GGML(r, version, commit, ops, unary, glu, types, &v.verdict, &v.reason, &v.host_ggml);
    return v;
}

/* Swaps entries a and b (a < b) of a '\n'-separated table. */
static void swap_entries(char *out, const char *in, int a, int b)
{
    char copy[APIR_MAX_STRING], *names[512];
    int n = 0;
    snprintf(copy, sizeof(copy), "%s", in);
    for (char *save = NULL, *p = strtok_r(copy, "\n", &save); p && n < 512; p = strtok_r(NULL, "\n", &save))
        names[n++] = p;
    char *t = names[a];
    names[a] = names[b];
    names[b] = t;
    size_t used = 0;
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(out + used, APIR_MAX_STRING - used, "%s%s", i ? "\n" : "", names[i]);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/apir-host\n", argv[0]);
        return 2;
    }
    char dir[] = "/tmp/apir-ggmlcheck-XXXXXX", sock[96], endpoint[112], log[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(sock, sizeof(sock), "%s/h.sock", dir);
    snprintf(endpoint, sizeof(endpoint), "unix:%s", sock);
    snprintf(log, sizeof(log), "%s/host.log", dir);
    const char *hargv[] = { argv[1], "--listen", endpoint, "--threads", "1", "--log-level", "info", NULL };
    pid_t host = host_spawn(hargv, log);
    CHECK(wait_for_path(sock, 5000));
    for (int t = 0; t < 4; t++)
        table_text(tables[t], sizeof(tables[t]), t);

    struct apir_remote r;
    CHECK(guest_open(&r, endpoint, NULL, 0));
    CHECK(apir_minor_speaks(r.minor, APIR_CMD_HOST_CHECK_GGML));

    /* The host's own ggml: the same. */
    struct verdict v = ask(&r, ggml_version(), ggml_commit(), tables[0], tables[1], tables[2], tables[3]);
    CHECK(v.rc == APIR_HANDLER_OK && v.verdict == APIR_GGML_SAME);
    CHECK_MSG(strstr(v.host_ggml.s, ggml_version()) && strstr(v.host_ggml.s, ggml_commit()), "host_ggml '%s'",
              v.host_ggml.s);

    /* Another commit, the same tables: computed, and said so. */
    v = ask(&r, "0.99.0", "0123456789", tables[0], tables[1], tables[2], tables[3]);
    CHECK(v.rc == APIR_HANDLER_OK && v.verdict == APIR_GGML_TABLES_EQUAL);

    /* A guest with an op the host lacks at the end: its numbers before it
     * mean the same; records with the new one are refused one by one. */
    char more[APIR_MAX_STRING + 16];
    snprintf(more, sizeof(more), "%s\nA_FUTURE_OP", tables[0]);
    CHECK(strlen(more) < APIR_MAX_STRING);
    v = ask(&r, ggml_version(), ggml_commit(), more, tables[1], tables[2], tables[3]);
    CHECK(v.rc == APIR_HANDLER_OK && v.verdict == APIR_GGML_SAME);

    /* An op inserted before others (ggml 0.9.4 against 0.23.0): refused,
     * naming the first number that differs and both names. */
    char swapped[APIR_MAX_STRING], want[160];
    swap_entries(swapped, tables[0], GGML_OP_MUL_MAT, GGML_OP_MUL_MAT + 1);
    v = ask(&r, "0.9.4", "50d26e8", swapped, tables[1], tables[2], tables[3]);
    CHECK(v.rc == APIR_HANDLER_OK && v.verdict == APIR_GGML_REFUSED);
    snprintf(want, sizeof(want), "its op %d is %s, the host's %s", GGML_OP_MUL_MAT, ggml_op_name(GGML_OP_MUL_MAT + 1),
             ggml_op_name(GGML_OP_MUL_MAT));
    CHECK_MSG(strstr(v.reason.s, want), "reason '%s', expected '%s'", v.reason.s, want);

    /* Renumbered unary ops (UNARY's first parameter) and types likewise. */
    swap_entries(swapped, tables[1], GGML_UNARY_OP_RELU, GGML_UNARY_OP_SIGMOID);
    v = ask(&r, ggml_version(), ggml_commit(), tables[0], swapped, tables[2], tables[3]);
    CHECK(v.verdict == APIR_GGML_REFUSED && strstr(v.reason.s, "unary op"));
    swap_entries(swapped, tables[2], 0, 1);
    v = ask(&r, ggml_version(), ggml_commit(), tables[0], tables[1], swapped, tables[3]);
    CHECK(v.verdict == APIR_GGML_REFUSED && strstr(v.reason.s, "GLU op"));
    swap_entries(swapped, tables[3], GGML_TYPE_F32, GGML_TYPE_F16);
    v = ask(&r, ggml_version(), ggml_commit(), tables[0], tables[1], tables[2], swapped);
    CHECK(v.verdict == APIR_GGML_REFUSED && strstr(v.reason.s, "tensor type 0 is f16, the host's f32"));
    /* No table at all is no answer to the question. */
    v = ask(&r, ggml_version(), ggml_commit(), "", tables[1], tables[2], tables[3]);
    CHECK(v.verdict == APIR_GGML_REFUSED && strstr(v.reason.s, "no op table"));

    /* The host goes on serving the connection (a refusal is an answer). */
    int32_t n = 0;
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n >= 1);
    apir_remote_close(&r);
    CHECK(host_reap(host, SIGTERM) == 0);

    /* The host's log says what it refused and why. */
    char cmd[256], line[512] = "";
    snprintf(cmd, sizeof(cmd), "grep -m1 'guest ggml 0.9.4 (llama.cpp 50d26e8) refused: its op' %s", log);
    FILE *p = popen(cmd, "r");
    CHECK(p && fgets(line, sizeof(line), p));
    if (p)
        pclose(p);
    CHECK_MSG(strstr(line, want), "host log line '%s'", line);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
    printf("ggml_check: %d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}
