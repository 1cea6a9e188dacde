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

#include "layout.h"
#include "sparse.h"

// work [W, W]: work[r * W + s] = score elements rank r computes in ring step
// s, for an index over every query block of the sequence (q_blocks 0..n-1).
// gathered_columns: the vertical columns' K/V are gathered to every rank up
// front and computed in step 0; otherwise in the step their chunk arrives.
void balance_work(const SparseIndex *index, LayoutKind layout, int world, bool gathered_columns,
                  double *work);

double balance_rank_imbalance(const double *work, int world);
double balance_step_imbalance(const double *work, int world);

#endif
