/*
 * The simulated hypervisor ("virgl rig"): what its two halves say to each
 * other.
 *
 * No VM, virtio-gpu device or patched virglrenderer exists on the machines
 * this project is tested on, so the rig plays them:
 *
 *   guest process                          rig process (apir-virgl-rig)
 *   ┌──────────────────────────────┐      ┌──────────────────────────────────┐
 *   │ libggml-apir.so              │      │ "virglrenderer": contexts, blob  │
 *   │  └ transport/virtgpu.c       │      │  resources (sealed memfds),      │
 *   │     open/ioctl/mmap of       │ Unix │  HANDSHAKE, LOADLIBRARY, FORWARD │
 *   │     /dev/dri/renderD128      │ sock │  └ dlopen(host library):         │
 *   │  └ libapir-virgl-shim.so     │ ───▶ │     apir_backend_initialize,     │
 *   │     (LD_PRELOAD: plays the   │      │     _dispatcher, _deinit         │
 *   │      virtio-gpu kernel driver)│      │     (libapir-virgl.so or the     │
 *   └──────────────────────────────┘      │      reference's)                │
 *                                          └──────────────────────────────────┘
 *
 * One connection is one open of the fake render node, i.e. one DRM file
 * description; the rig gives it one virgl context (ctx_id) once it is
 * initialized.  Blob memory is created by the rig (the host allocates HOST3D
 * blobs) and passed to the shim as a file descriptor, which the shim maps
 * where the guest calls mmap.  Commands (EXEC) are one-way, like a virtqueue
 * submission: the guest learns the result from the reply word in shared
 * memory, exactly as in a VM.  Every other request gets exactly one reply,
 * in order.
 *
 * SOCK_SEQPACKET: one message per send, fds ride along with SCM_RIGHTS.
 */
#ifndef APIR_RIG_PROTO_H
#define APIR_RIG_PROTO_H

#include <stdint.h>

enum rig_msg_type {
    RIG_GET_CAPS     = 1,  /* a = capset id, b = version               -> data */
    RIG_CONTEXT_INIT = 2,  /* a = capset id, b = num_rings, c = poll mask */
    RIG_CREATE_BLOB  = 3,  /* a = blob_mem, b = blob_flags, q = size, q2 = blob_id -> a = res_id, fd */
    RIG_DESTROY_BLOB = 4,  /* a = res_id */
    RIG_EXEC         = 5,  /* a = ring index; payload: the command bytes; no reply */
};

struct rig_msg {
    uint32_t type;
    uint32_t a, b, c;
    uint64_t q, q2;
    /* RIG_EXEC: the command follows */
};

struct rig_reply {
    int32_t status;        /* 0, or a negative errno the shim returns */
    uint32_t a;
    uint32_t data_size;    /* RIG_GET_CAPS: bytes of data */
    uint32_t pad;
    uint8_t data[32];
};

/* Capsets the rig offers (virtio-gpu capset ids). */
#define RIG_CAPSET_VENUS 4u
#define RIG_CAPSET_APIR  10u

/* Largest command the rig takes (the kernel has no such limit; the APIR
 * guests send at most 64 KiB). */
#define RIG_MAX_COMMAND (256u * 1024u)

#endif
