// sparse_plan.c: estimation -> selection -> index for one layer on a rank
// that holds the whole sequence (see sparse_plan.h), and with statistics
// its density and recall (on the estimation rows and on the recall sample).
#include "sparse_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/util.h"

// stats->sampled_mass, sampled_rows: the recall sample's rows (not the
// estimation's Lq) against every key, their softmax mass inside the pattern.
static void count_sampled_recall(const SparsePattern *pattern, int sink, const AttnShape *shape, const float *q,
                                 const float *k, const int64_t *pos, int64_t Lq, SparseStats *stats) {
    const int Hq = shape->num_heads;
    const int64_t wq = (int64_t)Hq * shape->head_dim;
    int64_t rows[SPARSE_RECALL_ROWS];
    AttnShape rs = *shape;
    rs.q_tokens = sparse_recall_rows(shape->q_tokens, Lq, rows);
    float *qs = xmalloc(sizeof(float) * (size_t)(rs.q_tokens * wq));  // [n, Hq, D]
    float *lse = xmalloc(sizeof(float) * (size_t)(Hq * rs.q_tokens));  // [Hq, n]
    for (int64_t i = 0; i < rs.q_tokens; i++) memcpy(qs + i * wq, q + rows[i] * wq, sizeof(float) * (size_t)wq);
    for (int64_t i = 0; i < Hq * rs.q_tokens; i++) lse[i] = -INFINITY;
    sparse_estimate_lse(&rs, qs, rows, k, pos, lse);
    stats->sampled_mass += sparse_pattern_mass(pattern, sink, &rs, qs, rows, k, pos, lse);
    stats->sampled_rows += (double)(Hq * rs.q_tokens);
    free(qs);
    free(lse);
}

void sparse_plan_local(const SparsePlanCall *call, const int64_t *pos, SparseIndex *index) {
    const AttentionConfig *cfg = call->cfg;
    const AttnShape *shape = call->shape;
    const float *q = call->q, *k = call->k;
    SparseStats *stats = call->stats;
    int64_t T = shape->q_tokens;
    int Hq = shape->num_heads;
    int64_t Lq = cfg->last_q < T ? cfg->last_q : T;
    AttnShape est = *shape;
    est.q_tokens = Lq;
    const float *qe = q + (size_t)(T - Lq) * Hq * shape->head_dim;  // [Lq, Hq, D]
    const int64_t *qe_pos = pos + (T - Lq);

    float *lse_est = xmalloc(sizeof(float) * (size_t)(Hq * Lq));   // [Hq, Lq]
    for (int64_t i = 0; i < Hq * Lq; i++) lse_est[i] = -INFINITY;
    sparse_estimate_lse(&est, qe, qe_pos, k, pos, lse_est);
    float *vertical = xcalloc((size_t)(Hq * T), sizeof(float));     // [Hq, T]
    float *slash = xcalloc((size_t)(Hq * T), sizeof(float));        // [Hq, T]
    sparse_estimate_scores(&est, qe, qe_pos, k, pos, lse_est, T, vertical, slash);

    SparsePattern pattern;
    sparse_select(cfg, vertical, slash, Hq, T, call->fixed_vertical, call->fixed_slash, &pattern);
    sparse_index_free(index);
    sparse_index_for_rows(&pattern, shape, cfg->sink, pos, T, index);

    if (stats) {
        sparse_index_count(index, pos, T, shape->doc_starts, shape->doc_count, stats);
        stats->covered_mass += sparse_pattern_mass(&pattern, cfg->sink, &est, qe, qe_pos, k, pos, lse_est);
        stats->estimation_rows += (double)(Hq * Lq);
        count_sampled_recall(&pattern, cfg->sink, shape, q, k, pos, Lq, stats);
    }
    sparse_pattern_free(&pattern);
    free(vertical);
    free(slash);
    free(lse_est);
}
