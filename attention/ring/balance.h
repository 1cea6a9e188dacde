// balance.h: how evenly a sparse pattern's work spreads over the ranks of a
// ring (docs/ARCHITECTURE.md, Attention). In ring step s, rank r computes its queries
// against the key chunk of rank (r - s) mod W. Work = causal score elements
// inside the pattern (token-exact). Two measures, 1.0 = perfect:
//   rank imbalance  max over ranks of total work / mean (MTraining's measure:
//                   right when compute never waits for a neighbour)
//   step imbalance  sum over steps of the busiest rank's work / mean total
//                   (the bound when every step waits for the slowest rank)
#ifndef MTRAIN_BALANCE_H
#define MTRAIN_BALANCE_H

#include <stdbool.h>

#include "../layout.h"
#include "../sparse/sparse.h"

// work [W, W]: work[r * W + s] = score elements rank r computes in ring step
// s, for an index over every query block of the sequence (q_blocks 0..n-1).
// gathered_columns: the vertical columns' K/V are gathered to every rank up
// front and computed in step 0; otherwise in the step their chunk arrives.
void balance_work(const SparseIndex *index, LayoutKind layout, int world, bool gathered_columns,
                  double *work);

// work [world]: score elements of dense causal attention masked by document
// (a query sees the keys from its document's start to itself) that each
// rank's queries compute, for N tokens in blocks of B with documents
// beginning at doc_starts [count] (ascending; tokens before the first start
// form one document).
void balance_document_work(LayoutKind layout, int64_t N, int B, int world, const int64_t *doc_starts,
                           int64_t count, double *work);
// max over ranks / mean of work [world] (1.0 = perfect).
double balance_max_over_mean(const double *work, int world);

double balance_rank_imbalance(const double *work, int world);
double balance_step_imbalance(const double *work, int world);

#endif
