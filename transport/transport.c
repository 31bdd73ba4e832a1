#include "transport.h"
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void apir_shm_default_path(char *out, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
        snprintf(out, len, "%s/apir/host.sock", xdg);
    else
        snprintf(out, len, "/run/apir/host.sock");
}

struct apir_transport *apir_virtgpu_connect(const char *node, char *err, size_t err_len) __attribute__((weak));

struct apir_transport *apir_transport_open(const char *endpoint, char *err, size_t err_len)
{
    char path[108];
    if (!endpoint || !*endpoint) {
        apir_shm_default_path(path, sizeof(path));
        return apir_shm_connect(path, err, err_len);
    }
    if (strncmp(endpoint, "unix:", 5) == 0)
        return apir_shm_connect(endpoint + 5, err, err_len);
    if (strncmp(endpoint, "virtgpu", 7) == 0) {
        if (!apir_virtgpu_connect) {
            snprintf(err, err_len, "this build has no virtgpu transport");
            return NULL;
        }
        return apir_virtgpu_connect(endpoint[7] == ':' ? endpoint + 8 : NULL, err, err_len);
    }
    if (apir_net_is_stream(endpoint))
        return apir_stream_connect(endpoint, err, err_len);
    if (endpoint[0] == '/')
        return apir_shm_connect(endpoint, err, err_len);
    snprintf(err, err_len, "unknown endpoint '%s' (use unix:PATH, tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT or virtgpu[:NODE])", endpoint);
    return NULL;
}
