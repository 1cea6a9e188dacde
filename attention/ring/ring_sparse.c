// ring_sparse.c: distributed pattern estimation and sparse ring attention
// with gathered vertical columns (see ring_sparse.h).
//
// Bit-identical selection inputs on every rank: the partial lse of each rank
// are all-gathered and merged in rank order locally; the partial vertical and
// slash sums are reduce-scattered (each element summed once, on one rank) and
// all-gathered, so every rank holds the same bits.
#include "ring_sparse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/util.h"
#include "ring_plan.h"

void ring_need_row(const SparseIndex *index, int64_t words, uint64_t *row) {
    memset(row, 0, (size_t)words * sizeof(uint64_t));
    const int64_t rows = (int64_t)index->num_heads * index->num_q_blocks;
    for (int64_t e = 0; e < index->block_start[rows]; e++)
        row[index->blocks[e] / 64] |= (uint64_t)1 << (index->blocks[e] % 64);
}

// ------------------------------------------------------------- estimation

// The queries at the ascending global positions rows [n] from every rank
// (this rank's T queries q [T, Hq, D]) into qe [n, Hq, D] on every rank: each row has one owner and the others
// add zeros, so the sum is exact.
static float *gather_queries(const Ring *ring, int64_t T, const AttnShape *shape, const float *q,
                             const int64_t *rows, int64_t n) {
    const int64_t wq = (int64_t)shape->num_heads * shape->head_dim;
    const int64_t *pos = ring->positions + ring->offsets[ring->cp->rank];
    float *qe = xcalloc((size_t)(n * wq + 1), sizeof(float));
    for (int64_t t = 0, i = 0; t < T && i < n; t++) {   // both ascending
        while (i < n && rows[i] < pos[t]) i++;
        if (i < n && rows[i] == pos[t]) memcpy(qe + i * wq, q + t * wq, (size_t)wq * sizeof(float));
    }
    comm_allreduce(ring->cp, qe, n * wq, DT_FLOAT, REDUCE_SUM);
    return qe;
}

// Pass 1 combined (ring_sparse.h).
void ring_sparse_combine_lse(const Comm *cp, float *lse, int64_t n) {
    float *all = xmalloc((size_t)(cp->size * n + 1) * sizeof(float));
    comm_allgather(cp, lse, all, n, DT_FLOAT);
    for (int64_t i = 0; i < n; i++) {
        float row = -INFINITY;
        for (int r = 0; r < cp->size; r++) {
            const float part = all[r * n + i];
            if (part == -INFINITY) continue;
            const float mx = fmaxf(row, part);
            row = mx + logf(expf(row - mx) + expf(part - mx));
        }
        lse[i] = row;
    }
    free(all);
}

// Pass 2 combined (ring_sparse.h).
void ring_sparse_combine_sums(const Comm *cp, float *x, int64_t n) {
    const int W = cp->size;
    const int64_t part = (n + W - 1) / W;
    float *padded = xcalloc((size_t)(W * part + 1), sizeof(float)), *mine = xmalloc((size_t)(part + 1) * sizeof(float));
    memcpy(padded, x, (size_t)n * sizeof(float));
    comm_reduce_scatter(cp, padded, mine, part, DT_FLOAT);
    comm_allgather(cp, mine, padded, part, DT_FLOAT);
    memcpy(x, padded, (size_t)n * sizeof(float));
    free(padded);
    free(mine);
}

// mark [N]: 1 at every position that some cp rank's index holds as a column
// (each rank's column bits [ceil(N / 64)], all-gathered and ORed).
static char *mark_index_columns(const Ring *ring, const SparseIndex *index) {
    const int W = ring->cp->size;
    const int64_t N = index->seq_len, words = ring_need_words(N, 1);
    const int64_t rows = (int64_t)index->num_heads * index->num_q_blocks;
    uint64_t *mine = xcalloc((size_t)words + 1, sizeof(uint64_t));
    uint64_t *all = xmalloc((size_t)(W * words + 1) * sizeof(uint64_t));
    for (int64_t e = 0; e < index->column_start[rows]; e++)
        mine[index->columns[e] / 64] |= (uint64_t)1 << (index->columns[e] % 64);
    comm_allgather(ring->cp, mine, all, words, DT_INT64);
    char *mark = xcalloc((size_t)N, 1);
    for (int r = 0; r < W; r++)
        for (int64_t x = 0; x < N; x++) mark[x] |= (char)(all[r * words + x / 64] >> (x % 64) & 1);
    free(mine);
    free(all);
    return mark;
}

void ring_columns_build(const Ring *ring, const char *mark, RingColumns *c) {
    const int W = ring->cp->size;
    const int64_t N = ring->offsets[W];
    int *owner = xmalloc((size_t)(N + 1) * sizeof(int));
    int64_t *local = xmalloc((size_t)(N + 1) * sizeof(int64_t)), *owned = xcalloc((size_t)W, sizeof(int64_t));
    for (int r = 0; r < W; r++)
        for (int64_t t = 0; t < ring->counts[r]; t++) {
            owner[ring->positions[ring->offsets[r] + t]] = r;
            local[ring->positions[ring->offsets[r] + t]] = t;
        }
    c->count = 0;
    for (int64_t x = 0; x < N; x++) c->count += mark[x] != 0;
    const size_t n = (size_t)c->count + 1;
    c->positions = xmalloc(n * sizeof(int64_t));
    c->owner = xmalloc(n * sizeof(int));
    c->local = xmalloc(n * sizeof(int64_t));
    c->slot = xmalloc(n * sizeof(int64_t));
    c->owned = xmalloc((size_t)W * sizeof(int64_t));
    c->max_owned = 0;
    for (int64_t x = 0, j = 0; x < N; x++) {
        if (!mark[x]) continue;
        c->positions[j] = x;
        c->owner[j] = owner[x];
        c->local[j] = local[x];
        c->slot[j] = owned[owner[x]]++;
        if (owned[owner[x]] > c->max_owned) c->max_owned = owned[owner[x]];
        j++;
    }
    memcpy(c->owned, owned, (size_t)W * sizeof(int64_t));
    free(owner); free(local); free(owned);
}

void ring_columns_plan(const Ring *ring, const SparseIndex *index, RingColumns *c) {
    char *mark = mark_index_columns(ring, index);
    ring_columns_free(c);
    ring_columns_build(ring, mark, c);
    free(mark);
}

int64_t ring_columns_bytes(int64_t max_owned, int W, int64_t kv, size_t element_bytes) {
    return (int64_t)(W - 1) * 2 * max_owned * kv * (int64_t)element_bytes;
}

void ring_columns_bound(int64_t seq_len, int num_heads, int64_t vertical_capacity, int64_t doc_count, int sink,
                        int64_t max_count, int64_t *count, int64_t *owned) {
    const int64_t most = (int64_t)num_heads * vertical_capacity + doc_count * sink;
    *count = most < seq_len ? most : seq_len;
    *owned = *count < max_count ? *count : max_count;
}

void ring_columns_free(RingColumns *c) {
    free(c->positions); free(c->owner); free(c->local); free(c->slot); free(c->owned);
    *c = (RingColumns){0};
}

// Dense attention's lse [Hq, n] (malloc'd) of the queries qe [n, Hq, D] at
// global positions qe_pos (rows_shape: q_tokens n, k_tokens this rank's),
// over every rank's keys: this rank's partial, combined.
static float *rows_lse(const Ring *ring, const AttnShape *rows_shape, const float *qe, const int64_t *qe_pos,
                       const float *k) {
    const int64_t n = (int64_t)rows_shape->num_heads * rows_shape->q_tokens;
    float *lse = xmalloc((size_t)(n + 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) lse[i] = -INFINITY;
    sparse_estimate_lse(rows_shape, qe, qe_pos, k, ring->positions + ring->offsets[ring->cp->rank], lse);
    ring_sparse_combine_lse(ring->cp, lse, n);
    return lse;
}

// Density and recall of the pattern summed over cp, added to stats: the
// estimation rows' mass (their combined lse given), and the recall sample's
// rows gathered from their owners against dense attention over the ring.
static void plan_stats(const Ring *ring, const RingSparse *rs, int sink, const AttnShape *est, const float *q,
                       const float *qe, const int64_t *qe_pos, const float *k, const float *lse, SparseStats *stats) {
    const int Hq = est->num_heads;
    const int64_t *pos = ring->positions + ring->offsets[ring->cp->rank], N = ring->offsets[ring->cp->size];
    SparseStats mine = {0};
    sparse_index_count(rs->index, pos, est->k_tokens, est->doc_starts, est->doc_count, &mine);
    int64_t rows[SPARSE_RECALL_ROWS];
    AttnShape sample = *est;
    sample.q_tokens = sparse_recall_rows(N, est->q_tokens, rows);
    float *qs = gather_queries(ring, est->k_tokens, est, q, rows, sample.q_tokens);   // [n, Hq, D]
    float *lse_sample = rows_lse(ring, &sample, qs, rows, k);
    double sums[4] = {mine.computed, mine.causal,
                      sparse_pattern_mass(&rs->pattern, sink, est, qe, qe_pos, k, pos, lse),
                      sparse_pattern_mass(&rs->pattern, sink, &sample, qs, rows, k, pos, lse_sample)};
    comm_allreduce(ring->cp, sums, 4, DT_DOUBLE, REDUCE_SUM);
    stats->computed += sums[0];
    stats->causal += sums[1];
    stats->covered_mass += sums[2];
    stats->estimation_rows += (double)(Hq * est->q_tokens);
    stats->sampled_mass += sums[3];
    stats->sampled_rows += (double)(Hq * sample.q_tokens);
    free(qs);
    free(lse_sample);
}

void ring_sparse_plan(const Ring *ring, const SparsePlanCall *call, SparseIndex *index, RingSparse *rs) {
    const AttentionConfig *cfg = call->cfg;
    const AttnShape *shape = call->shape;
    const float *q = call->q, *k = call->k;
    const Comm *cp = ring->cp;
    const int W = cp->size, Hq = shape->num_heads, B = shape->block_size;
    const int64_t N = ring->offsets[W], T = shape->q_tokens, *pos = ring->positions + ring->offsets[cp->rank];
    CHECK(T == ring->counts[cp->rank], "sparse ring: %lld local tokens but the ring was built for %lld",
          (long long)T, (long long)ring->counts[cp->rank]);
    ring_sparse_free(rs);
    rs->send = cfg->ring_send;

    // Estimation: the last Lq queries against this rank's keys, combined.
    const int64_t Lq = cfg->last_q < N ? cfg->last_q : N;
    AttnShape est = *shape;
    est.q_tokens = Lq;
    est.k_tokens = T;
    int64_t *qe_pos = xmalloc((size_t)Lq * sizeof(int64_t));
    for (int64_t i = 0; i < Lq; i++) qe_pos[i] = N - Lq + i;
    float *qe = gather_queries(ring, T, shape, q, qe_pos, Lq);      // [Lq, Hq, D]
    float *lse = rows_lse(ring, &est, qe, qe_pos, k);              // [Hq, Lq]
    float *scores = xcalloc((size_t)(2 * Hq * N), sizeof(float));  // vertical [Hq, N], slash [Hq, N]
    sparse_estimate_scores(&est, qe, qe_pos, k, pos, lse, N, scores, scores + Hq * N);
    ring_sparse_combine_sums(cp, scores, 2 * Hq * N);

    // Selection (identical inputs, identical pattern) and this rank's index.
    sparse_select(cfg, scores, scores + Hq * N, Hq, N, call->fixed_vertical, call->fixed_slash, &rs->pattern);
    const int64_t nqb = (T + B - 1) / B;
    int64_t *q_blocks = xmalloc((size_t)(nqb + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) q_blocks[i] = pos[i * B] / B;
    sparse_index_free(index);
    sparse_index_build(&rs->pattern, B, q_blocks, nqb, index);
    sparse_index_documents(shape, cfg->sink, index);
    rs->index = index;

    // Which key blocks every rank uses, and the gathered columns.
    rs->need.block_size = B;
    rs->need.words = ring_need_words(N, B);
    rs->need_bits = xmalloc((size_t)(W * rs->need.words) * sizeof(uint64_t));
    uint64_t *row = xmalloc((size_t)rs->need.words * sizeof(uint64_t));
    ring_need_row(index, rs->need.words, row);
    comm_allgather(cp, row, rs->need_bits, rs->need.words, DT_INT64);
    rs->need.need = rs->need_bits;
    ring_columns_plan(ring, index, &rs->columns);

    if (call->stats) plan_stats(ring, rs, cfg->sink, &est, q, qe, qe_pos, k, lse, call->stats);
    free(qe); free(qe_pos); free(lse); free(scores); free(q_blocks); free(row);
}

// ------------------------------------------------------------- attention

static void sparse_forward(void *ctx, const RingStep *step) {
    const RingSparse *rs = ctx;
    attn_sparse_forward_part_cpu(SPARSE_BLOCKS, step->shape, rs->index, step->q, step->q_pos, step->k, step->v,
                                 step->k_pos, step->out.o, step->out.lse);
}

static void sparse_backward(void *ctx, const RingStep *step) {
    const RingSparse *rs = ctx;
    const AttnGrads *g = &step->grads;
    attn_sparse_backward_part_cpu(SPARSE_BLOCKS, step->shape, rs->index, step->q, step->q_pos, step->k, step->v,
                                  step->k_pos, g->lse, g->delta, step->dout, g->dq, g->dk, g->dv);
}

// The column pass: the own step's queries against the gathered columns.
static void columns_forward(void *ctx, const RingStep *own) {
    const RingSparse *rs = ctx;
    AttnShape s = *own->shape;
    s.k_tokens = rs->columns.count;
    const int64_t kv = s.k_tokens * s.num_kv_heads * s.head_dim;
    attn_sparse_forward_part_cpu(SPARSE_COLUMNS, &s, rs->index, own->q, own->q_pos, rs->column_kv,
                                 rs->column_kv + kv, rs->columns.positions, own->out.o, own->out.lse);
}

static void columns_backward(void *ctx, const RingStep *own) {
    const RingSparse *rs = ctx;
    const AttnGrads *g = &own->grads;
    AttnShape s = *own->shape;
    s.k_tokens = rs->columns.count;
    const int64_t kv = s.k_tokens * s.num_kv_heads * s.head_dim;
    attn_sparse_backward_part_cpu(SPARSE_COLUMNS, &s, rs->index, own->q, own->q_pos, rs->column_kv,
                                  rs->column_kv + kv, rs->columns.positions, g->lse, g->delta, own->dout, g->dq,
                                  rs->column_dkv, rs->column_dkv + kv);
}

// Per-owner message layout of the columns: [W, max_owned, 2, kv] (K then V
// row of each column at its owner's block and slot).
static float *owner_slot(const RingColumns *c, float *buf, int64_t j, int64_t kv) {
    return buf + ((int64_t)c->owner[j] * c->max_owned + c->slot[j]) * 2 * kv;
}

// All-gather of this rank's K/V rows at the columns into rs->column_kv.
static void gather_columns_kv(const Ring *ring, RingSparse *rs, int64_t kv, const float *k, const float *v) {
    const int W = ring->cp->size, me = ring->cp->rank;
    const RingColumns *c = &rs->columns;
    const int64_t n = c->count, row = 2 * kv * c->max_owned;
    float *all = xmalloc((size_t)(W * row + 1) * sizeof(float));
    float *send = xcalloc((size_t)row + 1, sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        if (c->owner[j] != me) continue;
        float *dst = send + c->slot[j] * 2 * kv;
        memcpy(dst, k + c->local[j] * kv, (size_t)kv * sizeof(float));
        memcpy(dst + kv, v + c->local[j] * kv, (size_t)kv * sizeof(float));
    }
    comm_allgather(ring->cp, send, all, row, DT_FLOAT);
    rs->column_bytes += ring_columns_bytes(c->max_owned, W, kv, sizeof(float));
    free(rs->column_kv);
    rs->column_kv = xmalloc((size_t)(2 * n * kv + 1) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const float *src = owner_slot(c, all, j, kv);
        memcpy(rs->column_kv + j * kv, src, (size_t)kv * sizeof(float));
        memcpy(rs->column_kv + (n + j) * kv, src + kv, (size_t)kv * sizeof(float));
    }
    free(all);
    free(send);
}

// The column pass before a pass: the forward gathers the columns' K/V rows;
// the backward starts their dK/dV at zero.
static void columns_gather(void *ctx, const Ring *ring, const AttnShape *shape, bool backward, const void *k,
                           const void *v) {
    RingSparse *rs = ctx;
    const int64_t kv = (int64_t)shape->num_kv_heads * shape->head_dim;
    if (!backward) {
        gather_columns_kv(ring, rs, kv, k, v);
    } else {
        CHECK(rs->column_kv, "sparse ring: backward before forward");
        free(rs->column_dkv);
        rs->column_dkv = xcalloc((size_t)(2 * rs->columns.count * kv + 1), sizeof(float));
    }
}

// The column pass after the backward: the columns' dK/dV home, summed over
// ranks into each owner's dk, dv.
static void columns_home(void *ctx, const Ring *ring, const AttnShape *shape, float *dk, float *dv) {
    RingSparse *rs = ctx;
    const int W = ring->cp->size, me = ring->cp->rank;
    const RingColumns *c = &rs->columns;
    const int64_t kv = (int64_t)shape->num_kv_heads * shape->head_dim, n = c->count;
    const int64_t row = 2 * kv * c->max_owned;
    float *send = xcalloc((size_t)(W * row + 1), sizeof(float)), *home = xmalloc((size_t)(row + 1) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        float *dst = owner_slot(c, send, j, kv);
        memcpy(dst, rs->column_dkv + j * kv, (size_t)kv * sizeof(float));
        memcpy(dst + kv, rs->column_dkv + (n + j) * kv, (size_t)kv * sizeof(float));
    }
    comm_reduce_scatter(ring->cp, send, home, row, DT_FLOAT);
    rs->column_bytes += ring_columns_bytes(c->max_owned, W, kv, sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        if (c->owner[j] != me) continue;
        const float *src = home + c->slot[j] * 2 * kv;
        float *dkr = dk + c->local[j] * kv, *dvr = dv + c->local[j] * kv;
        for (int64_t x = 0; x < kv; x++) {
            dkr[x] += src[x];
            dvr[x] += src[kv + x];
        }
    }
    free(send);
    free(home);
}

RingKernels ring_sparse_kernels(RingSparse *rs) {
    return (RingKernels){.forward = sparse_forward, .backward = sparse_backward, .columns_gather = columns_gather,
                         .columns_forward = columns_forward, .columns_backward = columns_backward,
                         .columns_home = columns_home, .ctx = rs,
                         .need = rs->send == RING_SEND_SELECTED ? &rs->need : NULL, .traffic = &rs->traffic};
}

void ring_sparse_forward(const Ring *ring, RingSparse *rs, const AttnShape *shape, const RingTensors *t) {
    const RingKernels kernels = ring_sparse_kernels(rs);
    ring_attn_forward(ring, &kernels, shape, t);
}

void ring_sparse_backward(const Ring *ring, RingSparse *rs, const AttnShape *shape, const RingTensors *t) {
    const RingKernels kernels = ring_sparse_kernels(rs);
    ring_attn_backward(ring, &kernels, shape, t);
}

void ring_sparse_free(RingSparse *rs) {
    sparse_pattern_free(&rs->pattern);
    ring_columns_free(&rs->columns);
    free(rs->need_bits); free(rs->column_kv); free(rs->column_dkv);
    *rs = (RingSparse){0};
}
