// sparse_plan.h: a layer's sparse attention pattern when one rank holds the
// whole sequence: estimation, selection and index in one call. The ring
// (ring_sparse.h) composes the same steps of sparse.h with collectives.
#ifndef MTRAIN_SPARSE_PLAN_H
#define MTRAIN_SPARSE_PLAN_H

#include "sparse.h"

// The plan of call (SparsePlanCall: q, k fp32) on the rank that holds the
// whole sequence at positions pos [T] = 0..T-1. The estimation uses the last
// min(cfg->last_q, T) queries. *index (freed first) gets the index; stats
// the layer's density and recall counts (the estimation rows' and the
// recall sample's).
void sparse_plan_local(const SparsePlanCall *call, const int64_t *pos, SparseIndex *index);

#endif
