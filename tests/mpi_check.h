// mpi_check.h: the checks of the MPI test programs (tests/mpi_*.c). Each
// program sets up `dist` (dist_init) and checks with expect_all: every rank
// checks its own part, the verdicts are all-reduced over the world and rank 0
// prints "ok NAME" or "FAIL NAME: failed on N of W ranks" (check.h counts).
#ifndef MTRAIN_MPI_CHECK_H
#define MTRAIN_MPI_CHECK_H

#include <stdarg.h>

#include "../dist/comm.h"
#include "check.h"

static Dist dist;

// One check over all ranks of the world: passes when it passed everywhere.
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
