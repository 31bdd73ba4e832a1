/*
 * How long each side spins before it sleeps (transport/wait.h, guest/remote.c):
 * the policy that keeps a CPU host and its guest off each other's cores.
 *   - the host's spin for the next call: long where its devices have their
 *     own memory (a GPU), APIR_SPIN_US's on a CPU host, APIR_HOST_SPIN_US
 *     over both where set;
 *   - the guest's spin on a reply: a graph whose host computes it on our
 *     cores (graph_sleeps) only glances; waits for a GPU's work spin
 *     APIR_SPIN_GRAPH_US's budget, as do commands after a graph left
 *     running; everything else takes the transport's default (0).
 */
#include "apir_commands.h"
#include "remote.h"
#include "test_util.h"
#include "transport.h"
#include "wait.h"

#include <stdlib.h>

static void test_host_spin(void)
{
    unsetenv("APIR_HOST_SPIN_US");
    unsetenv("APIR_SPIN_US");
    CHECK(apir_host_spin_us(true) == 2000);
    CHECK(apir_host_spin_us(false) == 100);
    CHECK(apir_host_spin_us(false) == apir_spin_us());
    setenv("APIR_SPIN_US", "37", 1);
    CHECK(apir_host_spin_us(false) == 37);
    CHECK(apir_host_spin_us(true) == 2000);
    setenv("APIR_HOST_SPIN_US", "300", 1);
    CHECK(apir_host_spin_us(false) == 300);
    CHECK(apir_host_spin_us(true) == 300);
    setenv("APIR_HOST_SPIN_US", "nonsense-1", 1);  /* not a number: the default */
    CHECK(apir_host_spin_us(true) == 2000);
    unsetenv("APIR_HOST_SPIN_US");
    unsetenv("APIR_SPIN_US");
}

static const uint32_t graph_cmds[] = { APIR_CMD_BACKEND_GRAPH_COMPUTE, APIR_CMD_BACKEND_GRAPH_COMPUTE_AT,
                                       APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, APIR_CMD_BACKEND_GRAPH_RECOMPUTE,
                                       APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS, APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA };

/* A CPU host over shared memory: graph_spin_ns 0 (default spins after a
 * graph), graph_sleeps (frontend_device.c). */
static void test_guest_cpu_host(void)
{
    struct apir_remote r = { .graph_spin_ns = 0, .graph_sleeps = true };
    for (size_t i = 0; i < sizeof(graph_cmds) / sizeof(graph_cmds[0]); i++) {
        CHECK_MSG(apir_remote_spin_ns(&r, apir_command_classes(graph_cmds[i])) == APIR_SPIN_GLANCE_NS, "%s",
                  apir_command_name(graph_cmds[i]));
        r.host_computing = true;  /* after one: still only a glance */
        CHECK(apir_remote_spin_ns(&r, apir_command_classes(graph_cmds[i])) == APIR_SPIN_GLANCE_NS);
        r.host_computing = false;
    }
    /* What follows a graph (a synchronize, a read) is answered at once
     * where the graph was computed before its reply: the default spin. */
    r.host_computing = true;
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_BACKEND_SYNCHRONIZE)) == 0);
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_BUFFER_GET_TENSOR_AT)) == 0);
    r.host_computing = false;
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_DEVICE_SUPPORTS_OP_L)) == 0);
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_BUFFER_SET_TENSOR_AT)) == 0);
}

/* A GPU host (or a CPU host over a stream, which answers a graph first):
 * no graph_sleeps, graph waits spin APIR_SPIN_GRAPH_US's budget. */
static void test_guest_gpu_host(void)
{
    const uint64_t budget = 20000ull * 1000;
    struct apir_remote r = { .graph_spin_ns = budget };
    for (size_t i = 0; i < sizeof(graph_cmds) / sizeof(graph_cmds[0]); i++)
        CHECK(apir_remote_spin_ns(&r, apir_command_classes(graph_cmds[i])) == budget);
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_BACKEND_SYNCHRONIZE)) == budget);
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_BUFFER_GET_TENSOR_AT)) == 0);
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_DEVICE_SUPPORTS_OP_L)) == 0);
    /* After a graph left running, a read waits for it. */
    r.host_computing = true;
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_BUFFER_GET_TENSOR_AT)) == budget);
    CHECK(apir_remote_spin_ns(&r, apir_command_classes(APIR_CMD_DEVICE_SUPPORTS_OP_L)) == budget);
}

TEST_MAIN("waits", TEST(test_host_spin), TEST(test_guest_cpu_host), TEST(test_guest_gpu_host))
