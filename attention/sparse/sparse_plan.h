// sparse_plan.h: a layer's sparse attention pattern when one rank holds the
// whole sequence: estimation, selection and index in one call. The ring
// (ring_sparse.h) composes the same steps of sparse.h with collectives.
#ifndef MTRAIN_SPARSE_PLAN_H
#define MTRAIN_SPARSE_PLAN_H

#include "sparse.h"

// q [T, Hq, D] and k [T, Hkv, D] after RoPE at positions pos [T] = 0..T-1
// (shape: q_tokens = k_tokens = T). The estimation uses the last
// min(cfg->last_q, T) queries. fixed_vertical / fixed_slash [Hq] are this
// layer's budgets (NULL unless cfg->budget is "fixed"). The previous index is
// freed and replaced. stats, when not NULL, gets this layer's density and
// recall counts added (the estimation rows' and the recall sample's).
void sparse_plan_local(const AttentionConfig *cfg, const AttnShape *shape, const float *q,
                       const float *k, const int64_t *pos, const int *fixed_vertical,
                       const int *fixed_slash, SparseIndex *index, SparseStats *stats);

#endif
