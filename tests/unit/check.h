/* A tiny test harness: CHECK records a failure and continues; each test binary ends with
 * check_summary(), which prints "N passed, M failed" for its checks and sets the exit code. */
#ifndef DSV4_CHECK_H
#define DSV4_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_pass_, check_fail_;

#define CHECK(cond, ...) do { \
    if (cond) check_pass_++; \
    else { check_fail_++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static inline int check_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, check_pass_, check_fail_);
    return check_fail_ ? 1 : 0;
}

/* The test data folder (tests/fixtures/README.md); the tests run from the repository root. */
#define CHECK_FIXTURES "tests/fixtures"
#endif
