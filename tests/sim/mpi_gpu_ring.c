// mpi_gpu_ring.c: the CUDA attention op over a cp ring (attention/ring/ring_cuda.c,
// the schedules of ring.c on device buffers) against the same op on one GPU
// over the whole sequence, under mpirun (real NCCL on GPUs, the sim's NCCL
// over MPI; tests/sim/test_cuda_ring.sh runs it under several CUDASIM_SEEDs):
//   mpirun -np W mpi_gpu_ring INNER   (INNER = W: flat; else hierarchical)
// For each layout (zigzag, striped), ring_send (full, selected) and document
// set (none, mixed), and the contiguous layout with documents (mixed; one
// document per rank, where a ring step shares no document with the
// receiver: nothing to compute, and under ring_send selected nothing sent):
// every rank draws the whole sequence's q, k, v, dout
// (bf16, one seed for all) with sharp attention (q scaled by 3: a query's
// weight sits on a few keys, so a chunk lost, repeated or placed at the wrong
// positions moves its output by far more than the tolerance), runs the
// one-GPU op on all of it and the ring op on its own rows, and compares its
// rows of o, lse, and of the dq, dk, dv increments; and the bytes the ring
// sent (attention_cuda_ring_bytes) with those ring_send_tokens plans: K/V as
// bf16 in both passes, dK/dV as fp32.
// Sparse (N_SPARSE tokens, blocks of 64): the same checks of the sparse op
// (the pattern estimated over the ring, the sparse kernels per ring step)
// against the one-GPU sparse op, and its statistics (density counts equal,
// recall of the estimation rows and of the recall sample within 1e-4
// relative); the planned bytes use the key blocks each
// rank's index reads (its blocks only: the columns are gathered once per
// layer, their bytes counted by ring_columns_bytes), from an independent
// CPU plan of the whole sequence (sparse_plan_local on the same bf16
// inputs); and the rows whose columns lie in another rank's chunk have
// one GPU's lse (a column computed twice or not at all fails it). Inputs are planted so that the pattern has no near-ties to
// flip between the ring's and the one GPU's estimation: every query attends
// with logit +6 (through dimension 0) to PLANT_VERTICAL keys, placed where
// the estimation queries' document is (also with documents), and the fixed
// budget keeps exactly those verticals (no slash beyond the local line).
// Tolerances: o, dq, dk, dv are bf16 (each rounded once from fp32 sums that
// the ring adds in another order: 2^-9 relative per rounding, up to 2^-8 per
// element when the fp32 sums straddle a rounding boundary), so relative
// Frobenius 1e-2; lse is fp32 from the same bf16 inputs, merged by
// log-sum-exp in another order: 1e-6 relative; each element of it within
// 1e-4 (|lse| < 16: a few fp32 ulps per merge), where a column computed twice
// or not at all moves a row's lse by log(1 +- p), p the column's softmax
// share (a planted column's is ~0.1 and more, a document sink's ~1e-2).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/attention_api.h"
#include "../../attention/layout.h"
#include "../../attention/ring/ring_plan.h"
#include "../../attention/ring/ring_sparse.h"
#include "../../attention/sparse/sparse_plan.h"
#include "../../dist/comm_device.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"
#include "../lib/mpi_check.h"

#define EXPECT_ALL(...) do { checks++; expect_all(__VA_ARGS__); } while (0)

enum { N_DENSE = 128, B_DENSE = 16, N_SPARSE = 512, B_SPARSE = 64, HQ = 4, HKV = 2, D = 64 };
#define TOL_BF16 1e-2
#define TOL_LSE 1e-6
#define TOL_RECALL 1e-4
#define TOL_COLUMN_LSE 1e-4
#define PLANT_LOGIT 6.0
#define PLANT_VERTICAL 4
static const int64_t planted[PLANT_VERTICAL] = {300, 340, 390, 430};   // in [289, 448): see doc_set_starts

// One GPU's op (cp NULL) or the ring's on its rows: q, k, v, dout [tokens]
// rows of the whole sequence's; o, lse and the dq, dk, dv increments (fp32, host).
typedef struct {
    float *o, *lse, *dq, *dk, *dv;
    double bytes;              // sent in the ring
    SparseStats stats;         // the plan forward's (sparse)
} Result;

static Result run_op(const AttentionConfig *cfg, const Comm *cp, int inner, const AttnShape *shape,
                     const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                     const int64_t *pos, int64_t T) {
    const int64_t nq = T * HQ * D, nk = T * HKV * D;
    AttnState *st = attention_cuda_new(cfg, 1, HQ);
    attention_cuda_set_ring(st, cp, inner);   // cp NULL: a ring of one
    attention_cuda_sequence(st, pos, T);
    uint16_t *d_q = to_device(q, (size_t)nq * 2), *d_k = to_device(k, (size_t)nk * 2);
    uint16_t *d_v = to_device(v, (size_t)nk * 2), *d_dout = to_device(dout, (size_t)nq * 2);
    int64_t *d_pos = to_device(pos, (size_t)T * sizeof(int64_t));
    uint16_t *d_o = poisoned((size_t)nq * 2);
    float *d_lse = poisoned((size_t)(HQ * T) * sizeof(float));
    uint16_t *d_dq = poisoned((size_t)nq * 2), *d_dk = poisoned((size_t)nk * 2);
    uint16_t *d_dv = poisoned((size_t)nk * 2);
    CUDA_CHECK(cudaMemset(d_dq, 0, (size_t)nq * 2));
    CUDA_CHECK(cudaMemset(d_dk, 0, (size_t)nk * 2));
    CUDA_CHECK(cudaMemset(d_dv, 0, (size_t)nk * 2));
    SparseStats stats = {0};
    attention_cuda_forward(st, 0, true, shape, d_q, d_k, d_v, d_pos, d_o, d_lse, &stats, 0);
    attention_cuda_backward(st, 0, shape, d_q, d_k, d_v, d_pos, d_o, d_lse, d_dout, d_dq, d_dk, d_dv, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    Result r = {from_device_bf16(d_o, nq), from_device_f32(d_lse, HQ * T), from_device_bf16(d_dq, nq),
                from_device_bf16(d_dk, nk), from_device_bf16(d_dv, nk), attention_cuda_ring_bytes(st), stats};
    void *all[] = {d_q, d_k, d_v, d_dout, d_pos, d_o, d_lse, d_dq, d_dk, d_dv};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) CUDA_CHECK(cudaFree(all[i]));
    attention_cuda_free(st);
    return r;
}

static void result_free(Result *r) {
    free(r->o);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

// Rows pos [T] of x [N, width] (any element size).
static void *rows(const void *x, size_t row_bytes, const int64_t *pos, int64_t T) {
    char *out = xmalloc((size_t)T * row_bytes + 1);
    for (int64_t t = 0; t < T; t++) memcpy(out + (size_t)t * row_bytes, (const char *)x + (size_t)pos[t] * row_bytes, row_bytes);
    return out;
}

// lse [HQ, N] at positions pos [T] -> [HQ, T].
static float *lse_rows(const float *lse, int64_t N, const int64_t *pos, int64_t T) {
    float *out = xmalloc((size_t)(HQ * T) * sizeof(float) + 1);
    for (int h = 0; h < HQ; h++)
        for (int64_t t = 0; t < T; t++) out[h * T + t] = lse[h * N + pos[t]];
    return out;
}

// n normal values times `scale`, rounded to bf16.
static uint16_t *random_bits(Rng *rng, int64_t n, double scale) {
    uint16_t *x = xmalloc((size_t)n * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) x[i] = f32_to_bf16((float)(scale * rng_normal(rng)));
    return x;
}

// Sparse inputs (file comment): q, k [N, H, D] N(0, 1) in dimensions 1..D-1;
// dimension 0 of every query and of the planted keys gives their pairs logit
// PLANT_LOGIT.
static void plant(uint16_t *q, uint16_t *k, int64_t N) {
    const uint16_t c = f32_to_bf16((float)sqrt(PLANT_LOGIT * sqrt((double)D)));
    for (int64_t t = 0; t < N * HQ; t++) q[t * D] = c;
    for (int64_t t = 0; t < N * HKV; t++) k[t * D] = 0;
    for (int i = 0; i < PLANT_VERTICAL; i++)
        for (int g = 0; g < HKV; g++) k[(planted[i] * HKV + g) * D] = c;
}

// The whole sequence's sparse plan as each rank's index sees it, from
// sparse_plan_local's index of the whole sequence on the host (fp32 copies
// of the bf16 q, k): need [W, words] the key blocks each rank's index reads
// (its rows' blocks: the columns are gathered, not ringed), mark [N] 1 at
// every column of some rank's index, and remote [HQ, T] 1 at this rank's
// rows (h, local token) whose index row holds a column another rank owns.
static void sparse_need(const AttentionConfig *cfg, const AttnShape *full, const uint16_t *q, const uint16_t *k,
                        LayoutKind layout, int64_t T, int64_t words, uint64_t *need, char *mark, char *remote) {
    const int W = dist.cp.size, me = dist.cp.rank, B = full->block_size;
    const int64_t N = full->q_tokens, nb = (N + B - 1) / B, nq = N * HQ * D, nk = N * HKV * D;
    float *qf = xmalloc((size_t)nq * sizeof(float)), *kf = xmalloc((size_t)nk * sizeof(float));
    for (int64_t i = 0; i < nq; i++) qf[i] = bf16_to_f32(q[i]);
    for (int64_t i = 0; i < nk; i++) kf[i] = bf16_to_f32(k[i]);
    int64_t *iota = xmalloc((size_t)N * sizeof(int64_t)), *blocks = xmalloc((size_t)nb * sizeof(int64_t));
    int *owner = xmalloc((size_t)nb * sizeof(int));
    for (int64_t t = 0; t < N; t++) iota[t] = t;
    for (int r = 0; r < W; r++) {
        const int64_t n = layout_rank_blocks(layout, N, B, W, r, blocks);
        for (int64_t i = 0; i < n; i++) owner[blocks[i]] = r;
    }
    SparseIndex index = {0};
    sparse_plan_local(&(SparsePlanCall){.cfg = cfg, .shape = full, .q = qf, .k = kf}, iota, &index);
    memset(need, 0, (size_t)(W * words) * sizeof(uint64_t));
    memset(mark, 0, (size_t)N);
    for (int r = 0; r < W; r++) {
        const int64_t n = layout_rank_blocks(layout, N, B, W, r, blocks);
        for (int h = 0; h < HQ; h++)
            for (int64_t i = 0; i < n; i++) {
                const int64_t row = h * index.num_q_blocks + blocks[i];
                for (int64_t e = index.block_start[row]; e < index.block_start[row + 1]; e++)
                    need[r * words + index.blocks[e] / 64] |= (uint64_t)1 << (index.blocks[e] % 64);
                for (int64_t e = index.column_start[row]; e < index.column_start[row + 1]; e++) {
                    mark[index.columns[e]] = 1;
                    if (r != me || owner[index.columns[e] / B] == me) continue;
                    for (int64_t t = i * B; t < (i + 1) * B && t < T; t++) remote[h * T + t] = 1;
                }
            }
    }
    sparse_index_free(&index);
    free(qf); free(kf); free(iota); free(blocks); free(owner);
}

// The bytes this rank's ring sends for one forward and backward, by the
// byte planner (ring_send_tokens), for ring_send `send`; sparse_bits: the
// sparse index's need rows, NULL for dense attention; mark: the sparse
// index's columns (gathered: K/V bf16 forward, dK/dV fp32 backward, in
// messages held at ring_columns_bound's rows per rank for the sparse
// config cfg); *bound_holds: the bounds hold mark's columns.
static double planned_bytes(int inner, RingSend send, const AttnShape *shape, const int64_t *pos, int64_t T,
                            int64_t N, const uint64_t *sparse_bits, const AttentionConfig *cfg, const char *mark,
                            bool *bound_holds) {
    const int W = dist.cp.size, r = dist.cp.rank, B = shape->block_size;
    Ring ring;
    ring_init(&ring, &dist.cp, inner, pos, T);
    const int64_t words = ring_need_words(N, B);
    uint64_t *bits = xmalloc((size_t)(W * words) * sizeof(uint64_t));
    if (sparse_bits) memcpy(bits, sparse_bits, (size_t)(W * words) * sizeof(uint64_t));
    else ring_dense_need(&ring, shape, words, bits);
    const RingNeed need = {B, words, bits};
    int64_t *kv = xcalloc((size_t)(W * W), sizeof(int64_t)), *dkv = xcalloc((size_t)(W * W), sizeof(int64_t));
    ring_send_tokens(&ring, send == RING_SEND_SELECTED ? &need : NULL, kv, dkv);
    double bytes = 0;
    for (int s = 0; s < W; s++)
        bytes += 2.0 * (double)kv[r * W + s] * 2 * HKV * D * sizeof(uint16_t) +
                 (double)dkv[r * W + s] * 2 * HKV * D * sizeof(float);
    *bound_holds = true;
    if (mark) {
        RingColumns columns = {0};
        ring_columns_build(&ring, mark, &columns);
        const int64_t vertical_capacity = cfg->vertical + cfg->sink < N ? cfg->vertical + cfg->sink : N;
        int64_t count, owned;
        ring_columns_bound(N, HQ, vertical_capacity, shape->doc_starts ? shape->doc_count : 0, cfg->sink,
                           ring.max_count, &count, &owned);
        *bound_holds = columns.count <= count && columns.max_owned <= owned;
        bytes += (double)(ring_columns_bytes(owned, W, HKV * D, sizeof(uint16_t)) +
                          ring_columns_bytes(owned, W, HKV * D, sizeof(float)));
        ring_columns_free(&columns);
    }
    free(bits);
    free(kv);
    free(dkv);
    ring_free(&ring);
    return bytes;
}

// Largest difference of a [n] from b over the elements where mask is set
// (0 when none).
static double masked_max_diff(const float *a, const float *b, const char *mask, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (mask[i]) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

static void check_case(int inner, LayoutKind layout, RingSend send, DocSet docs, bool sparse) {
    const int W = dist.cp.size, r = dist.cp.rank, B = sparse ? B_SPARSE : B_DENSE;
    const int64_t N = sparse ? N_SPARSE : N_DENSE;
    Rng rng;
    rng_seed(&rng, 1234);
    uint16_t *q = random_bits(&rng, N * HQ * D, sparse ? 1.0 : 3.0), *k = random_bits(&rng, N * HKV * D, 1.0);
    uint16_t *v = random_bits(&rng, N * HKV * D, 1.0), *dout = random_bits(&rng, N * HQ * D, 1.0);
    if (sparse) plant(q, k, N);
    int64_t starts[64];
    const int64_t doc_count = doc_set_starts(docs, N, B, W, starts);
    AttentionConfig cfg = {.type = ATTN_DENSE, .block_size = B, .ring_send = send};
    if (sparse)
        cfg = (AttentionConfig){.type = ATTN_SPARSE, .block_size = B, .ring_send = send, .last_q = 64, .sink = 4,
                                .local = 1, .budget = BUDGET_FIXED, .vertical = PLANT_VERTICAL, .slash = 0};
    AttnShape full = {N, N, HQ, HKV, D, B, 1.0f / sqrtf((float)D), doc_count ? starts : NULL, doc_count, NULL};
    int64_t *iota = xmalloc((size_t)N * sizeof(int64_t));
    for (int64_t t = 0; t < N; t++) iota[t] = t;
    Result ref = run_op(&cfg, NULL, 1, &full, q, k, v, dout, iota, N);

    const int64_t T = layout_rank_positions(layout, N, B, W, r, NULL);
    int64_t *pos = xmalloc((size_t)(T > 0 ? T : 1) * sizeof(int64_t));
    layout_rank_positions(layout, N, B, W, r, pos);
    uint16_t *lq = rows(q, HQ * D * 2, pos, T), *lk = rows(k, HKV * D * 2, pos, T);
    uint16_t *lv = rows(v, HKV * D * 2, pos, T), *ldout = rows(dout, HQ * D * 2, pos, T);
    AttnShape shape = full;
    shape.q_tokens = shape.k_tokens = T;
    Result ring = run_op(&cfg, &dist.cp, inner, &shape, lq, lk, lv, ldout, pos, T);
    uint64_t *need = NULL;
    char *mark = NULL, *remote = xcalloc((size_t)(HQ * T + 1), 1);
    if (sparse) {
        const int64_t words = ring_need_words(N, B);
        need = xmalloc((size_t)(W * words) * sizeof(uint64_t));
        mark = xmalloc((size_t)N);
        sparse_need(&cfg, &full, q, k, layout, T, words, need, mark, remote);
    }
    bool bound_holds;
    const double planned = planned_bytes(inner, send, &shape, pos, T, N, need, &cfg, mark, &bound_holds);

    float *o = rows(ref.o, HQ * D * sizeof(float), pos, T), *lse = lse_rows(ref.lse, N, pos, T);
    float *dq = rows(ref.dq, HQ * D * sizeof(float), pos, T), *dk = rows(ref.dk, HKV * D * sizeof(float), pos, T);
    float *dv = rows(ref.dv, HKV * D * sizeof(float), pos, T);
    const double e_o = rel_frobenius(ring.o, o, T * HQ * D), e_lse = rel_frobenius(ring.lse, lse, HQ * T);
    const double e_dq = rel_frobenius(ring.dq, dq, T * HQ * D), e_dk = rel_frobenius(ring.dk, dk, T * HKV * D);
    const double e_dv = rel_frobenius(ring.dv, dv, T * HKV * D);
    double worst[5] = {e_o, e_lse, e_dq, e_dk, e_dv};
    comm_allreduce(&dist.world, worst, 5, DT_DOUBLE, REDUCE_MAX);
    char name[96];
    snprintf(name, sizeof(name), "cp%d_%s_%s_%s%s%s", W, inner == W ? "flat" : "hierarchical",
             layout_name(layout), send == RING_SEND_SELECTED ? "selected" : "full",
             doc_set_suffix(docs), sparse ? "_sparse" : "");
    EXPECT_ALL(e_o <= TOL_BF16 && e_lse <= TOL_LSE, "cuda_ring_forward_%s: o %.2e <= %.0e, lse %.2e <= %.0e",
               name, worst[0], TOL_BF16, worst[1], TOL_LSE);
    EXPECT_ALL(e_dq <= TOL_BF16 && e_dk <= TOL_BF16 && e_dv <= TOL_BF16,
               "cuda_ring_backward_%s: dq %.2e, dk %.2e, dv %.2e <= %.0e", name, worst[2], worst[3], worst[4],
               TOL_BF16);
    const bool sends_nothing = docs == DOCS_PER_RANK && send == RING_SEND_SELECTED;
    EXPECT_ALL(ring.bytes == planned && (planned > 0) != sends_nothing,
               "cuda_ring_bytes_%s: rank %d sent %.0f bytes, planned %.0f", name, r, ring.bytes, planned);
    EXPECT_ALL(bound_holds, "cuda_ring_column_bound_%s: rank %d: the gathered columns within ring_columns_bound",
               name, r);
    if (sparse) {
        // The columns in other ranks' chunks (gathered, computed once in
        // step 0): every lse of the rows that use them as one GPU's.
        double remote_rows = 0;
        for (int64_t i = 0; i < HQ * T; i++) remote_rows += remote[i];
        double column_check[2] = {remote_rows, masked_max_diff(ring.lse, lse, remote, HQ * T)};
        comm_allreduce(&dist.world, column_check, 1, DT_DOUBLE, REDUCE_SUM);
        comm_allreduce(&dist.world, column_check + 1, 1, DT_DOUBLE, REDUCE_MAX);
        EXPECT_ALL(column_check[0] > 0 && column_check[1] <= TOL_COLUMN_LSE,
                   "cuda_ring_columns_%s: lse of the %.0f rows whose columns another rank owns within %.2e <= %.0e "
                   "of one GPU's", name, column_check[0], column_check[1], TOL_COLUMN_LSE);
        const SparseStats a = ring.stats, b = ref.stats;
        const double recall = fabs(a.covered_mass - b.covered_mass) / b.covered_mass;
        EXPECT_ALL(a.computed == b.computed && a.causal == b.causal && a.estimation_rows == b.estimation_rows &&
                   a.computed < a.causal && recall <= TOL_RECALL,
                   "cuda_ring_stats_%s: density %.0f / %.0f (one GPU %.0f / %.0f), recall mass %.6f (one GPU "
                   "%.6f, %.0f rows)", name, a.computed, a.causal, b.computed, b.causal, a.covered_mass,
                   b.covered_mass, a.estimation_rows);
        const double sampled = fabs(a.sampled_mass - b.sampled_mass) / b.sampled_mass;
        EXPECT_ALL(a.sampled_rows == b.sampled_rows && a.sampled_rows > 0 && sampled <= TOL_RECALL,
                   "cuda_ring_sampled_recall_%s: mass %.6f (one GPU %.6f, %.0f rows)", name, a.sampled_mass,
                   b.sampled_mass, a.sampled_rows);
    }
    void *all[] = {q, k, v, dout, iota, pos, lq, lk, lv, ldout, o, lse, dq, dk, dv, need, mark, remote};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    result_free(&ref);
    result_free(&ring);
}

// The cases run: zigzag and striped with no or mixed documents; contiguous
// with documents only, one per rank dense only (the sparse case's planted
// verticals lie in one document of the mixed set).
static bool case_runs(LayoutKind layout, DocSet docs, bool sparse) {
    if (docs == DOCS_PER_RANK) return layout == LAYOUT_CONTIGUOUS && !sparse;
    return layout != LAYOUT_CONTIGUOUS || docs == DOCS_MIXED;
}

int main(int argc, char **argv) {
    dist_init(&dist, &argc, &argv, 60.0);
    CHECK(argc == 2, "usage: mpirun -np W %s INNER (ranks per inner ring; W: flat)", argv[0]);
    const int inner = atoi(argv[1]);
    dist_setup(&dist, 1, 0, inner, "mpi_gpu_ring");
    comm_device_join(&dist, true);
    const RingSend sends[] = {RING_SEND_FULL, RING_SEND_SELECTED};
    for (int layout = LAYOUT_CONTIGUOUS; layout <= LAYOUT_STRIPED; layout++)
        for (int s = 0; s < 2; s++)
            for (int docs = DOCS_NONE; docs < DOC_SETS; docs++)
                for (int sparse = 0; sparse < 2; sparse++)
                    if (case_runs(layout, docs, sparse)) check_case(inner, layout, sends[s], docs, sparse);
    dist_finalize(&dist);
    return check_failures > 0;
}
