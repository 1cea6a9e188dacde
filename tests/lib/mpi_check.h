// mpi_check.h: the check helper of the MPI test programs (tests/mpi/mpi_*.c, tests/sim/mpi_gpu_*.c):
// one check over all ranks of the world, printed once by rank 0, passing
// only where it passed on every rank; and the fp32 tolerances of ring
// attention against the single-rank kernels; the document sets of the ring
// tests.
#ifndef MTRAIN_MPI_CHECK_H
#define MTRAIN_MPI_CHECK_H

#include <stdarg.h>
#include <stdio.h>

#include "../../dist/comm.h"
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

// The document sets of the ring tests (AttnShape.doc_starts) over N tokens
// in blocks of B on W ranks:
//   DOCS_NONE      no documents: the causal mask only;
//   DOCS_MIXED     the first document continues one cut before position 0
//                  (no start at 0); one-token documents (at 3, 4 and N - 1);
//                  documents that cross block and rank boundaries;
//   DOCS_PER_RANK  one document per rank of the contiguous layout (a start at
//                  each rank's first block).
typedef enum { DOCS_NONE, DOCS_MIXED, DOCS_PER_RANK, DOC_SETS } DocSet;
static inline const char *doc_set_suffix(DocSet set) {
    return set == DOCS_MIXED ? "_docs_mixed" : set == DOCS_PER_RANK ? "_docs_per_rank" : "";
}

// The starts of `set` ascending into starts (room for W + 8); returns how many.
static inline int64_t doc_set_starts(DocSet set, int64_t N, int B, int W, int64_t *starts) {
    int64_t cand[64], n = 0, count = 0;
    const int64_t nb = (N + B - 1) / B;
    if (set == DOCS_MIXED) {
        const int64_t mixed[] = {3, 4, 5, N / 2 - 1, B + 5, N / 2 + B / 2 + 1, N - 1};
        for (size_t i = 0; i < sizeof(mixed) / sizeof(mixed[0]); i++) cand[n++] = mixed[i];
    } else if (set == DOCS_PER_RANK) {
        for (int r = 0; r < W && n < 64; r++) cand[n++] = nb * r / W * B;
    }
    for (int64_t i = 1; i < n; i++)           // insertion sort of the few candidates
        for (int64_t j = i; j > 0 && cand[j] < cand[j - 1]; j--) {
            const int64_t x = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = x;
        }
    for (int64_t i = 0; i < n; i++)
        if (cand[i] >= 0 && cand[i] < N && (count == 0 || cand[i] > starts[count - 1])) starts[count++] = cand[i];
    return count;
}

#endif
