/*
 * A minimal test harness: CHECK records a failure with its line and goes on;
 * TEST_MAIN runs the listed test functions and ends with the line
 * "N passed, M failed" (checks), exiting non-zero on any failure.
 */
#ifndef APIR_TEST_UTIL_H
#define APIR_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

static int test_passed, test_failed;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (cond) {                                                                     \
            test_passed++;                                                              \
        } else {                                                                        \
            test_failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
        }                                                                               \
    } while (0)

#define CHECK_MSG(cond, ...)                                                            \
    do {                                                                                \
        if (cond) {                                                                     \
            test_passed++;                                                              \
        } else {                                                                        \
            test_failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
        }                                                                               \
    } while (0)

typedef void (*test_fn)(void);
struct test_case {
    const char *name;
    test_fn fn;
};

#define TEST(fn) { #fn, fn }

static inline int test_run(const char *suite, const struct test_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        int before = test_failed;
        cases[i].fn();
        printf("%s %s: %s\n", test_failed == before ? "ok  " : "FAIL", suite, cases[i].name);
    }
    printf("%s: %d passed, %d failed\n", suite, test_passed, test_failed);
    return test_failed ? 1 : 0;
}

#define TEST_MAIN(suite, ...)                                                           \
    int main(void)                                                                      \
    {                                                                                   \
        static const struct test_case cases[] = { __VA_ARGS__ };                        \
        return test_run(suite, cases, (int)(sizeof(cases) / sizeof(cases[0])));        \
    }

#endif
