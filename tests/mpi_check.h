// mpi_check.h: the check helper of the MPI test programs (tests/mpi_*.c):
// one check over all ranks of the world, printed once by rank 0, passing
// only where it passed on every rank; and the fp32 tolerances of ring
// attention against the single-rank kernels.
#ifndef MTRAIN_MPI_CHECK_H
#define MTRAIN_MPI_CHECK_H

#include <stdarg.h>
#include <stdio.h>

#include "../dist/comm.h"
#include "check.h"

#define TOL_FWD 5e-6   // O, LSE: max relative difference
#define TOL_GRAD 2e-5  // dQ, dK, dV

static Dist dist;

static void expect_all(int passed, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void expect_all(int passed, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    if (!passed) fprintf(stderr, "rank %d: check %s failed here\n", dist.world_rank, name);
    int64_t failing = !passed;
    comm_allreduce(&dist.world, &failing, 1, DT_INT64, REDUCE_SUM);
    if (failing) check_failures++;
    if (dist.world_rank != 0) return;
    if (failing) printf("FAIL %s: failed on %lld of %d ranks\n", name, (long long)failing, dist.world_size);
    else printf("ok %s\n", name);
    fflush(stdout);
}

#endif
