/*
 * A ggml "backend library" that fails on purpose, for the return codes of
 * apir_backend_initialize (test_virgl_abi.c):
 *   ggml_backend_init   a backend with no device              -> 6 + 8
 *   fake_reg_null       registers nothing                      -> 6 + 6
 *   fake_reg_old_api    a backend of another API version       -> 6 + 6
 *   fake_reg_apir       a backend named APIR (our own frontend) -> 6 + 8
 */
#include "ggml-backend-impl.h"

#include <stddef.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

static const char *fake_name(ggml_backend_reg_t reg)
{
    return reg->context ? "APIR" : "FAKE";
}

static size_t fake_count(ggml_backend_reg_t reg)
{
    return reg->context ? 1 : 0;
}

static ggml_backend_dev_t fake_get(ggml_backend_reg_t reg, size_t i)
{
    (void)reg;
    (void)i;
    return NULL;
}

static struct ggml_backend_reg fake = {
    .api_version = GGML_BACKEND_API_VERSION,
    .iface = { .get_name = fake_name, .get_device_count = fake_count, .get_device = fake_get },
    .context = NULL,
};

static struct ggml_backend_reg fake_old = {
    .api_version = GGML_BACKEND_API_VERSION - 1,
    .iface = { .get_name = fake_name, .get_device_count = fake_count, .get_device = fake_get },
    .context = NULL,
};

static int apir_marker;
static struct ggml_backend_reg fake_apir = {
    .api_version = GGML_BACKEND_API_VERSION,
    .iface = { .get_name = fake_name, .get_device_count = fake_count, .get_device = fake_get },
    .context = &apir_marker,
};

FAKE_EXPORT ggml_backend_reg_t ggml_backend_init(void);
FAKE_EXPORT ggml_backend_reg_t fake_reg_null(void);
FAKE_EXPORT ggml_backend_reg_t fake_reg_old_api(void);
FAKE_EXPORT ggml_backend_reg_t fake_reg_apir(void);

ggml_backend_reg_t ggml_backend_init(void) { return &fake; }
ggml_backend_reg_t fake_reg_null(void) { return NULL; }
ggml_backend_reg_t fake_reg_old_api(void) { return &fake_old; }
ggml_backend_reg_t fake_reg_apir(void) { return &fake_apir; }
