/*
 * fuzz_text: the host's decoders of text that others write.
 *
 *   - the metrics listener's request head (apir_metrics_http_status,
 *     host/server/metrics_http.c): any local process may connect to it;
 *   - the escaping of guest-supplied strings (apir_log_escape) and of the
 *     lines a worker writes on its stderr, which the daemon relays
 *     (apir_log_escape_line, host/server/worker_log.c): a worker may run a
 *     guest's code.
 *
 * The first input byte picks the decoder, the rest is its input, in an
 * exact-size heap copy (ASan reports any read past it).  Oracles:
 *   - the request head's verdict is one the listener answers (0: more
 *     bytes needed, 200, 400, 404, 405, 431), a body only with 200, and a
 *     verdict of 0 only while the head is shorter than its limit;
 *   - an escaped string is NUL-terminated inside its buffer, holds
 *     printable ASCII only (a guest can neither end a log line nor send the
 *     terminal an escape sequence), no raw quote or backslash where they are
 *     escaped, and, when it fits, decodes back to the input up to its first
 *     NUL (\xNN; a C string ends there, and so does what is logged).
 */
#include "apir_log.h"
#include "fuzz_common.h"
#include "metrics_http.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* out decoded back: every \xNN to its byte; false when out was cut. */
static bool unescape(const char *out, char *back, size_t cap, size_t *n)
{
    size_t len = strlen(out), k = 0;
    if (len >= 3 && !strcmp(out + len - 3, "..."))
        return false;
    for (size_t i = 0; i < len; i++) {
        if (k == cap)
            return false;
        if (out[i] == '\\' && i + 3 < len && out[i + 1] == 'x') {
            unsigned v;
            if (sscanf(out + i + 2, "%2x", &v) != 1)
                return false;
            back[k++] = (char)v;
            i += 3;
        } else {
            back[k++] = out[i];
        }
    }
    *n = k;
    return true;
}

static void check_escaped(const char *in, size_t in_len, bool line)
{
    char out[APIR_LOG_ESCAPED_SIZE(256)];
    /* sometimes a buffer too small, to reach the cut */
    const size_t out_len = in_len % 3 == 0 ? 16 : sizeof(out);
    memset(out, 'Z', sizeof(out));
    const char *r = line ? apir_log_escape_line(in, in_len, out, out_len) : apir_log_escape(in, in_len, out, out_len);
    FZ_ASSERT(r == out, "escape returned another buffer");
    const char *nul = memchr(out, '\0', out_len);
    FZ_ASSERT(nul != NULL, "escaped string not terminated inside its %zu bytes", out_len);
    for (const char *p = out; p < nul; p++) {
        FZ_ASSERT(*p >= 0x20 && *p < 0x7f, "byte 0x%02x left in an escaped string", (unsigned)(uint8_t)*p);
        FZ_ASSERT(line || *p != '"', "a raw quote left by apir_log_escape");
    }
    if (line)
        return;  /* a line keeps the worker's own backslashes: not invertible */
    char back[256];
    size_t n;
    if (unescape(out, back, sizeof(back), &n))
        FZ_ASSERT(n == strnlen(in, in_len) && !memcmp(back, in, n), "escaped string does not read back as its input");
}

static void check_http(const char *req, size_t len)
{
    /* The listener hands over at most its buffer, NUL-terminated. */
    if (len > APIR_METRICS_HTTP_MAX_REQUEST - 1)
        len = APIR_METRICS_HTTP_MAX_REQUEST - 1;
    char *buf = malloc(len + 1);
    memcpy(buf, req, len);
    buf[len] = '\0';
    bool with_body = true;
    const int status = apir_metrics_http_status(buf, len, &with_body);
    FZ_ASSERT(status == 0 || status == 200 || status == 400 || status == 404 || status == 405 || status == 431,
              "request head verdict %d", status);
    FZ_ASSERT(!with_body || status == 200, "a body with verdict %d", status);
    FZ_ASSERT(status != 0 || len < APIR_METRICS_HTTP_MAX_REQUEST - 1, "a full head still waiting for more");
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const size_t len = size - 1 > 256 ? 256 : size - 1;
    char *in = (char *)fz_copy(data + 1, size - 1);
    switch (data[0] % 3) {
    case 0:
        check_http(in, size - 1);
        break;
    case 1:
        check_escaped(in, len, false);
        break;
    default:
        check_escaped(in, len, true);
        break;
    }
    free(in);
    return 0;
}
