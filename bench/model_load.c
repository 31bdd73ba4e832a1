/*
 * apir-load-bench: how long llama.cpp takes to load a model onto one device,
 * for the "model load through apir <= 1.2x native" comparison
 * (bench/llama_bench_compare.sh runs it natively and through APIR0).
 *
 *   apir-load-bench -m MODEL.gguf [-d DEVICE] [-r ROUNDS]
 *
 * DEVICE is a ggml device name (default CPU).  A CPU-type device loads with
 * no offload device, as llama.cpp's own CPU runs do; any other gets every
 * layer.  The first load warms the page cache and is not counted
 * (APIR_LOAD_NO_WARMUP=1 counts it: a first load against a host's weight
 * cache, say).
 * APIR_LOAD_NO_EXTRA_BUFTS=1 loads without the CPU's repacked weights,
 * APIR_LOAD_NO_MMAP=1 reads the file instead of mapping it.  Prints
 * "load DEVICE median_ms min_ms cpu_ms" on stdout, cpu_ms being the
 * process CPU time (user + system) of the median load.
 */
#include "ggml-backend.h"
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool no_progress(float progress, void *user)
{
    (void)progress;
    (void)user;
    return true;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *dev_name = "CPU";
    int rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model_path = argv[++i];
        else if (!strcmp(argv[i], "-d") && i + 1 < argc)
            dev_name = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: apir-load-bench -m MODEL.gguf [-d DEVICE] [-r ROUNDS]\n");
            return 2;
        }
    }
    if (!model_path || rounds < 1 || rounds > 100) {
        fprintf(stderr, "apir-load-bench: -m MODEL.gguf is required, -r 1..100\n");
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(dev_name);
    if (!dev) {
        fprintf(stderr, "apir-load-bench: no device named '%s'\n", dev_name);
        return 2;
    }
    struct llama_model_params mp = llama_model_default_params();
    ggml_backend_dev_t devs[2] = { NULL, NULL };
    mp.devices = devs;
    mp.progress_callback = no_progress;  /* llama.cpp prints dots otherwise */
    if (getenv("APIR_LOAD_NO_MMAP"))
        mp.load_mode = LLAMA_LOAD_MODE_NONE;  /* read the file instead of mapping it */
    if (getenv("APIR_LOAD_NO_EXTRA_BUFTS"))
        mp.use_extra_bufts = false;      /* natively: no repacked weights */
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        mp.n_gpu_layers = 0;
    } else {
        devs[0] = dev;
        mp.n_gpu_layers = 999;
        mp.split_mode = LLAMA_SPLIT_MODE_NONE;
    }
    double *ms = calloc((size_t)rounds, sizeof(*ms)), *cpu = calloc((size_t)rounds, sizeof(*cpu));
    if (!ms || !cpu)
        return 1;
    const int first = getenv("APIR_LOAD_NO_WARMUP") ? 0 : -1;
    for (int i = first; i < rounds; i++) {
        double t0 = now_ms(), c0 = cpu_ms();
        struct llama_model *model = llama_model_load_from_file(model_path, mp);
        double dt = now_ms() - t0, dc = cpu_ms() - c0;
        if (!model) {
            fprintf(stderr, "apir-load-bench: loading %s on %s failed\n", model_path, dev_name);
            return 1;
        }
        llama_model_free(model);
        if (i >= 0) {
            ms[i] = dt;
            cpu[i] = dc;
        }
    }
    qsort(ms, (size_t)rounds, sizeof(*ms), cmp_double);
    qsort(cpu, (size_t)rounds, sizeof(*cpu), cmp_double);
    printf("load %s %.1f %.1f %.1f\n", dev_name, ms[rounds / 2], ms[0], cpu[rounds / 2]);
    free(ms);
    free(cpu);
    return 0;
}
