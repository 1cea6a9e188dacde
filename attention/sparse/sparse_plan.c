// sparse_plan.c: estimation -> selection -> index for one layer on a rank
// that holds the whole sequence (see sparse_plan.h).
#include "sparse_plan.h"

#include <math.h>
#include <stdlib.h>

#include "../../dist/util.h"

// Index rows for the query blocks first_block .. last_block, restricted to
// the shape's documents (sink: cfg->sink per document).
static void index_for_blocks(const SparsePattern *pattern, const AttnShape *shape, int sink,
                             int64_t first_block, int64_t last_block, SparseIndex *index) {
    int64_t count = last_block - first_block + 1;
    int64_t *blocks = xmalloc(sizeof(int64_t) * (size_t)count);
    for (int64_t i = 0; i < count; i++) blocks[i] = first_block + i;
    sparse_index_build(pattern, shape->block_size, blocks, count, index);
    sparse_index_documents(shape, sink, index);
    free(blocks);
}

void sparse_plan_local(const AttentionConfig *cfg, const AttnShape *shape, const float *q,
                       const float *k, const int64_t *pos, const int *fixed_vertical,
                       const int *fixed_slash, SparseIndex *index, SparseStats *stats) {
    int64_t T = shape->q_tokens;
    int Hq = shape->num_heads, B = shape->block_size;
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
    sparse_select(cfg, vertical, slash, Hq, T, fixed_vertical, fixed_slash, &pattern);
    sparse_index_free(index);
    index_for_blocks(&pattern, shape, cfg->sink, 0, (T - 1) / B, index);

    if (stats) {
        sparse_index_count(index, pos, T, shape->doc_starts, shape->doc_count, stats);
        SparseIndex est_index;
        index_for_blocks(&pattern, shape, cfg->sink, qe_pos[0] / B, qe_pos[Lq - 1] / B, &est_index);
        double *covered = xcalloc((size_t)Hq, sizeof(double));
        sparse_estimate_recall(&est, &est_index, qe, qe_pos, k, pos, lse_est, covered);
        for (int h = 0; h < Hq; h++) stats->covered_mass += covered[h];
        stats->estimation_rows += (double)(Hq * Lq);
        free(covered);
        sparse_index_free(&est_index);
    }
    sparse_pattern_free(&pattern);
    free(vertical);
    free(slash);
    free(lse_est);
}
