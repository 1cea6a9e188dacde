// check.h: the assertion helpers of the C test programs. Each check prints
// "ok NAME" or "FAIL NAME: why"; check_exit() returns non-zero when any failed.
#ifndef MTRAIN_CHECK_H
#define MTRAIN_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_failures = 0;

#define EXPECT(cond, ...) do { \
    if (cond) { printf("ok "); printf(__VA_ARGS__); printf("\n"); } \
    else { check_failures++; printf("FAIL "); printf(__VA_ARGS__); \
           printf(": %s (%s:%d)\n", #cond, __FILE__, __LINE__); } \
    fflush(stdout); } while (0)

// Max |a-b| / (max|b| + tiny): one number per tensor comparison.
static inline double max_rel_diff(const float *a, const float *b, long n) {
    double diff = 0, scale = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > diff || d != d) diff = d;
        if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    }
    return diff / (scale + 1e-30);
}

static inline int check_exit(void) { return check_failures ? 1 : 0; }

#endif
