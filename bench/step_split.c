/*
 * Where a ggml program's step goes, from inside the program: an LD_PRELOAD
 * library (libapir-step-split.so, a benchmark's tool, never loaded by apir)
 * that times the program's calls of ggml's scheduler and prints, at exit,
 * medians over the graphs of the most frequent node count (a decoder's
 * steps):
 *   plan     ggml_backend_sched_alloc_graph: the scheduler's split of the
 *            graph (supports_op questions per node and pass) and its
 *            allocation - apir's question cache answers here;
 *   compute  ggml_backend_sched_graph_compute: the graph's trip through the
 *            backend (through apir: serialization, the round trip, the
 *            host's import and compute, the wake-ups);
 *   between  from one compute's end to the next plan's start: the
 *            program's own work (sampling, building the next graph).
 * Side by side, native and through APIR0, the three say which part of a
 * step a difference lies in, with far less noise than the step's own time
 * (bench/whisper_compare.sh prints them).
 *
 * Only calls that cross into libggml-base (PLT) are seen: whisper.cpp's
 * (ggml_backend_sched_graph_compute); llama.cpp computes through
 * ggml_backend_sched_graph_compute_async, timed the same way.  One thread:
 * the program's scheduler calls come from one thread at a time.
 * Output: one line on stderr, "step split: ...", or to APIR_STEP_SPLIT_FILE
 * (appended); with APIR_STEP_SPLIT_ALL=1, a line per graph before it (the
 * first steps' extra cost, which the medians leave out).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_GRAPHS 8192

/* ggml's types are opaque here: this library links nothing of ggml and
 * finds the real functions with dlsym at their first call. */
struct ggml_backend_sched;
struct ggml_cgraph;

struct sample {
    int n_nodes;
    double plan_us, compute_us, between_us;  /* < 0: not seen */
};

static struct sample samples[MAX_GRAPHS];
static int n_samples;
static double last_compute_end;
static int (*graph_n_nodes)(struct ggml_cgraph *);

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void *real(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "step split: %s not found\n", name);
        abort();
    }
    if (!graph_n_nodes)
        graph_n_nodes = (int (*)(struct ggml_cgraph *))dlsym(RTLD_DEFAULT, "ggml_graph_n_nodes");
    return f;
}

/* The sample of graph g: a plan opens one; its compute closes it. */
static struct sample *open_sample(struct ggml_cgraph *g, double start)
{
    if (n_samples == MAX_GRAPHS)
        return NULL;
    struct sample *s = &samples[n_samples++];
    *s = (struct sample){ graph_n_nodes ? graph_n_nodes(g) : 0, -1, -1, -1 };
    if (last_compute_end > 0)
        s->between_us = start - last_compute_end;
    return s;
}

static struct sample *planned;  /* the last plan, waiting for its compute */
/* ggml_backend_sched_graph_compute calls the _async form, and an unplanned
 * compute plans inside: each through the PLT, so seen here too.  Only the
 * outermost call is timed. */
static int depth;

bool ggml_backend_sched_alloc_graph(struct ggml_backend_sched *sched, struct ggml_cgraph *g)
{
    static bool (*f)(struct ggml_backend_sched *, struct ggml_cgraph *);
    if (!f)
        f = (bool (*)(struct ggml_backend_sched *, struct ggml_cgraph *))real("ggml_backend_sched_alloc_graph");
    if (depth)
        return f(sched, g);
    depth++;
    const double t0 = now_us();
    const bool ok = f(sched, g);
    depth--;
    planned = open_sample(g, t0);
    if (planned)
        planned->plan_us = now_us() - t0;
    return ok;
}

static int timed_compute(int (*f)(struct ggml_backend_sched *, struct ggml_cgraph *), struct ggml_backend_sched *sched,
                         struct ggml_cgraph *g)
{
    if (depth)
        return f(sched, g);
    depth++;
    const double t0 = now_us();
    const int status = f(sched, g);
    const double t1 = now_us();
    depth--;
    struct sample *s = planned ? planned : open_sample(g, t0);
    planned = NULL;
    if (s)
        s->compute_us = t1 - t0;
    last_compute_end = t1;
    return status;
}

int ggml_backend_sched_graph_compute(struct ggml_backend_sched *sched, struct ggml_cgraph *g)
{
    static int (*f)(struct ggml_backend_sched *, struct ggml_cgraph *);
    if (!f)
        f = (int (*)(struct ggml_backend_sched *, struct ggml_cgraph *))real("ggml_backend_sched_graph_compute");
    return timed_compute(f, sched, g);
}

int ggml_backend_sched_graph_compute_async(struct ggml_backend_sched *sched, struct ggml_cgraph *g)
{
    static int (*f)(struct ggml_backend_sched *, struct ggml_cgraph *);
    if (!f)
        f = (int (*)(struct ggml_backend_sched *, struct ggml_cgraph *))real("ggml_backend_sched_graph_compute_async");
    return timed_compute(f, sched, g);
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the field at offset `at` over the samples of n_nodes that
 * have it; -1 if none. */
static double median(int n_nodes, size_t at, int *count)
{
    static double v[MAX_GRAPHS];
    int k = 0;
    for (int i = 0; i < n_samples; i++) {
        double x;
        memcpy(&x, (const char *)&samples[i] + at, sizeof(x));
        if (samples[i].n_nodes == n_nodes && x >= 0)
            v[k++] = x;
    }
    *count = k;
    if (!k)
        return -1;
    qsort(v, (size_t)k, sizeof(v[0]), by_value);
    return (v[(k - 1) / 2] + v[k / 2]) / 2;
}

__attribute__((destructor)) static void report(void)
{
    /* The most frequent node count: a decoder's step graph. */
    int best = -1, best_count = 0;
    for (int i = 0; i < n_samples; i++) {
        int c = 0;
        for (int j = 0; j < n_samples; j++)
            c += samples[j].n_nodes == samples[i].n_nodes;
        if (c > best_count) {
            best_count = c;
            best = samples[i].n_nodes;
        }
    }
    if (best < 0)
        return;
    int np, nc, nb;
    const double plan = median(best, offsetof(struct sample, plan_us), &np);
    const double compute = median(best, offsetof(struct sample, compute_us), &nc);
    const double between = median(best, offsetof(struct sample, between_us), &nb);
    const char *path = getenv("APIR_STEP_SPLIT_FILE");
    FILE *out = path ? fopen(path, "a") : stderr;
    if (!out)
        return;
    const char *all = getenv("APIR_STEP_SPLIT_ALL");
    if (all && *all == '1')
        for (int i = 0; i < n_samples; i++)
            fprintf(out, "graph %d: %d nodes, plan %.1f us, compute %.1f us, between %.1f us\n", i,
                    samples[i].n_nodes, samples[i].plan_us, samples[i].compute_us, samples[i].between_us);
    fprintf(out, "step split: %d graphs of %d nodes, medians: plan %.1f us, compute %.1f us, between %.1f us\n",
            best_count, best, plan, compute, between);
    if (out != stderr)
        fclose(out);
}
