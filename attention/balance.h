// balance.h: how evenly a sparse pattern's work spreads over the ranks of a
// ring (DESIGN §5.1, §5.5). In ring step s, rank r computes its queries
// against the key chunk of rank (r - s) mod W; the step lasts as long as its
// busiest rank, so the imbalance of a layout is
//   sum over steps of max over ranks of work / sum over steps of mean work,
// with work = causal score elements inside the pattern (token-exact).
#ifndef MTRAIN_BALANCE_H
#define MTRAIN_BALANCE_H

#include "layout.h"
#include "sparse.h"

// work [W, W]: work[r * W + s] = score elements rank r computes in ring step
// s, for an index over every query block of the sequence (q_blocks 0..n-1).
void balance_work(const SparseIndex *index, LayoutKind layout, int world, double *work);

// The imbalance of work [W, W] (1.0 = perfect).
double balance_imbalance(const double *work, int world);

#endif
