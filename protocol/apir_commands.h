/*
 * The one APIR command table.
 *
 * Every backend command (the cmd_flags of a FORWARD) is listed once here with
 * its number, its name and the signature of its request and reply items.  The
 * guest's stubs (guest/apir_call.c marshals from the request signature and
 * demarshals the reply signature), the host's dispatch table (host/dispatch.c
 * names a handler host_cmd_<NAME> per row) and the name table are all derived
 * from this list, so a command cannot be half-added.
 *
 * Signature letters (each item is a multiple of 4 bytes on the wire):
 *   u  uint32         i  int32        e  enum (uint32)    r  shm res_id (uint32)
 *   b  bool (4 bytes) c  uint8 (4 bytes)
 *   q  uint64/size_t  h  host handle (uint64, opaque to the guest)
 *   s  string (uint64 length incl. NUL, bytes, zero padding to 4)
 *   t  serialized tensor (304 bytes)
 *   L  tensor list: uint32 n, n serialized tensors; the first is the subject,
 *      the others are what its src/view_src ids refer to  (apir 0.2)
 *   T  inline tensor: the reference guest's raw struct ggml_tensor plus the
 *      trailing items of APIR 0.1 section 3 (accepted, never followed)
 *
 * Numbers 0..22 are APIR 0.1 and never change.  23..34 are apir 0.2
 * extensions, 35 and above 0.3: a guest sends them only after the handshake
 * answered that minor or more (apir_command_minor).
 */
#ifndef APIR_COMMANDS_H
#define APIR_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>

/*  X(number, NAME,                         request, reply) */
#define APIR_COMMAND_LIST(X)                                              \
    X( 0, DEVICE_GET_DEVICE_COUNT,          "",      "i")                 \
    X( 1, DEVICE_GET_COUNT,                 "",      "i")                 \
    X( 2, DEVICE_GET_NAME,                  "",      "s")                 \
    X( 3, DEVICE_GET_DESCRIPTION,           "",      "s")                 \
    X( 4, DEVICE_GET_TYPE,                  "",      "e")                 \
    X( 5, DEVICE_GET_MEMORY,                "",      "qq")                \
    X( 6, DEVICE_SUPPORTS_OP,               "T",     "b")                 \
    X( 7, DEVICE_GET_BUFFER_TYPE,           "",      "h")                 \
    X( 8, DEVICE_GET_PROPS,                 "",      "bbbbb")             \
    X( 9, DEVICE_BUFFER_FROM_PTR,           "rqq",   "hh")                \
    X(10, BUFFER_TYPE_GET_NAME,             "h",     "s")                 \
    X(11, BUFFER_TYPE_GET_ALIGNMENT,        "h",     "q")                 \
    X(12, BUFFER_TYPE_GET_MAX_SIZE,         "h",     "q")                 \
    X(13, BUFFER_TYPE_IS_HOST,              "h",     "b")                 \
    X(14, BUFFER_TYPE_ALLOC_BUFFER,         "hq",    "h")                 \
    X(15, BUFFER_TYPE_GET_ALLOC_SIZE,       "hT",    "q")                 \
    X(16, BUFFER_GET_BASE,                  "h",     "q")                 \
    X(17, BUFFER_SET_TENSOR,                "htrqq", "")                  \
    X(18, BUFFER_GET_TENSOR,                "htrqq", "")                  \
    X(19, BUFFER_CPY_TENSOR,                "htt",   "b")                 \
    X(20, BUFFER_CLEAR,                     "hc",    "")                  \
    X(21, BUFFER_FREE_BUFFER,               "h",     "")                  \
    X(22, BACKEND_GRAPH_COMPUTE,            "rq",    "e")                 \
    /* apir 0.2 extensions */                                             \
    X(23, DEVICE_SELECT,                    "u",     "")                  \
    X(24, DEVICE_SUPPORTS_OP_L,             "L",     "b")                 \
    X(25, BUFFER_TYPE_GET_ALLOC_SIZE_L,     "hL",    "q")                 \
    X(26, BUFFER_MEMSET_TENSOR,             "htcqq", "")                  \
    X(27, BACKEND_SYNCHRONIZE,              "",      "")                  \
    X(28, DEVICE_OFFLOAD_OP_L,              "L",     "b")                 \
    X(29, BUFFER_SET_TENSOR_AT,             "htrqqq", "")                 \
    X(30, BUFFER_GET_TENSOR_AT,             "htrqqq", "")                 \
    X(31, BACKEND_GRAPH_COMPUTE_AT,         "rqq",   "e")                 \
    X(32, BUFFER_INIT_TENSOR,               "ht",    "e")                 \
    X(33, BACKEND_GRAPH_COMPUTE_KEYED,      "rqqq",  "e")                 \
    X(34, BACKEND_GRAPH_RECOMPUTE,          "q",     "e")                 \
    /* apir 0.3 extensions (host/weight_copies.h) */                      \
    X(35, BUFFER_NOTE_WEIGHT,               "ht",    "u")                 \
    X(36, BUFFER_WRITTEN,                   "hqq",   "")

enum apir_command {
#define APIR_X_ENUM(num, name, req, rep) APIR_CMD_##name = num,
    APIR_COMMAND_LIST(APIR_X_ENUM)
#undef APIR_X_ENUM
    APIR_CMD_COUNT
};

/* Commands of the reference protocol; 23..34 need minor >= 2, the rest 3. */
#define APIR_CMD_COUNT_0_1 23
#define APIR_CMD_COUNT_0_2 35

/* The protocol minor a command needs. */
static inline uint32_t apir_command_minor(uint32_t cmd)
{
    return cmd < APIR_CMD_COUNT_0_1 ? 1u : cmd < APIR_CMD_COUNT_0_2 ? 2u : 3u;
}

struct apir_command_info {
    const char *name;      /* "BUFFER_SET_TENSOR" */
    const char *request;   /* signature of the request items */
    const char *reply;     /* signature of the reply items */
};

/*
 * Commands a host runs while a graph or upload it queued may still be on the
 * device: queries, which touch no tensor memory, and graphs and uploads,
 * which go on the device's stream in order (an upload that cannot waits
 * itself).  Before anything else the host waits for the device.  A guest
 * therefore counts the host as still computing across these commands and
 * synchronizes before it reads shared memory a graph may be writing.
 */
static inline bool apir_command_runs_beside_device(uint32_t cmd)
{
    switch (cmd) {
    case APIR_CMD_DEVICE_GET_DEVICE_COUNT: case APIR_CMD_DEVICE_GET_COUNT: case APIR_CMD_DEVICE_GET_NAME:
    case APIR_CMD_DEVICE_GET_DESCRIPTION: case APIR_CMD_DEVICE_GET_TYPE: case APIR_CMD_DEVICE_GET_MEMORY:
    case APIR_CMD_DEVICE_SUPPORTS_OP: case APIR_CMD_DEVICE_GET_BUFFER_TYPE: case APIR_CMD_DEVICE_GET_PROPS:
    case APIR_CMD_BUFFER_TYPE_GET_NAME: case APIR_CMD_BUFFER_TYPE_GET_ALIGNMENT: case APIR_CMD_BUFFER_TYPE_GET_MAX_SIZE:
    case APIR_CMD_BUFFER_TYPE_IS_HOST: case APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE: case APIR_CMD_BUFFER_GET_BASE:
    case APIR_CMD_DEVICE_SUPPORTS_OP_L: case APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE_L: case APIR_CMD_DEVICE_OFFLOAD_OP_L:
    case APIR_CMD_BUFFER_SET_TENSOR: case APIR_CMD_BUFFER_SET_TENSOR_AT:
    case APIR_CMD_BACKEND_GRAPH_COMPUTE: case APIR_CMD_BACKEND_GRAPH_COMPUTE_AT:
    case APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED: case APIR_CMD_BACKEND_GRAPH_RECOMPUTE:
        return true;
    default:
        return false;
    }
}

/* Indexed by command number; NULL name for a number that is not a command. */
extern const struct apir_command_info apir_command_table[APIR_CMD_COUNT];

/* Name of a command number, or "UNKNOWN" (never NULL). */
const char *apir_command_name(uint32_t cmd);

#endif
