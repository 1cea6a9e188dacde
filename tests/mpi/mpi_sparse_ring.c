// mpi_sparse_ring.c: the MPI test program of attention/ring/ring_sparse.c, run
// under mpirun by tests/mpi/test_dist.sh. Every rank checks its own part;
// each check is all-reduced and rank 0 prints "ok NAME" or "FAIL NAME: why".
//   mpi_sparse_ring check flat|hierarchical INNER
//       per layout, budget (fixed, topp) and length, without and with
//       documents (tests/lib/mpi_check.h): the distributed pattern
//       equals sparse_plan_local's on the whole sequence (every index row,
//       exactly) and its density counts; O, LSE, dQ, dK, dV of the sparse
//       ring equal the single-rank sparse kernel with that pattern, for
//       ring_send full and selected; selected gives bit-identical results
//       and sends fewer K/V bytes than full; ring_send_tokens counts the
//       bytes each rank sent (0 for chunks not sent); top_p 1 equals the dense
//       kernel; with one document per rank (contiguous) selected sends
//       nothing.
//   mpi_sparse_ring bench N MEDIAN_DOC   (timing, not a check) per layout,
//       dense (ring_send full, selected) and sparse (selected) ring attention
//       (flat) without and with documents of log-normal lengths: forward and
//       backward time, bytes sent per rank.
//   mpi_sparse_ring plan N B shared|independent   (one process, no
//       communication) byte model and balance of a planted vertical-slash
//       pattern (the same lines in every head, or drawn per head) at ~90% and
//       ~95% sparsity: K/V bytes per ring step with full and selected for
//       W = 4, 8, 32, and the imbalance of each layout for 32 ranks.
// Environment: MTRAIN_TIMEOUT_S (default 60) is the deadline of every wait.
//
// Tolerances (fp32 against fp32, only the merge order differs): max |ring -
// ref| / max |ref| per tensor below 5e-6 for O and LSE, 2e-5 for dQ, dK, dV;
// recall masses (estimation rows, recall sample) within 1e-5 relative.
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/ring/balance.h"
#include "../../attention/layout.h"
#include "../../attention/ring/ring_cpu.h"
#include "../../attention/ring/ring_plan.h"
#include "../../attention/ring/ring_sparse.h"
#include "../../attention/sparse/sparse_plan.h"
#include "../../dist/comm.h"
#include "../../dist/util.h"
#include "../lib/mpi_check.h"

static float *randn(Rng *rng, int64_t n) {
    float *x = xmalloc((size_t)(n + 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_normal(rng);
    return x;
}

// Rows of x [N, width] at positions pos [T] into out [T, width].
static float *gather_rows(const float *x, int64_t width, const int64_t *pos, int64_t T) {
    float *out = xmalloc((size_t)(T * width + 1) * sizeof(float));
    for (int64_t t = 0; t < T; t++) memcpy(out + t * width, x + pos[t] * width, (size_t)width * sizeof(float));
    return out;
}

// Columns of lse [H, N] at positions pos [T] into out [H, T].
static float *gather_cols(const float *lse, int H, int64_t N, const int64_t *pos, int64_t T) {
    float *out = xmalloc((size_t)(H * T + 1) * sizeof(float));
    for (int h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++) out[h * T + t] = lse[h * N + pos[t]];
    return out;
}

static int same_ints(const int64_t *a, const int64_t *b, int64_t n) {
    return n == 0 || !memcmp(a, b, (size_t)n * sizeof(int64_t));
}

// Row r of index x equals row s of index y (blocks and columns).
static int same_row(const SparseIndex *x, int64_t r, const SparseIndex *y, int64_t s) {
    const int64_t nb = x->block_start[r + 1] - x->block_start[r], nc = x->column_start[r + 1] - x->column_start[r];
    return nb == y->block_start[s + 1] - y->block_start[s] && nc == y->column_start[s + 1] - y->column_start[s] &&
           same_ints(x->blocks + x->block_start[r], y->blocks + y->block_start[s], nb) &&
           same_ints(x->columns + x->column_start[r], y->columns + y->column_start[s], nc);
}

// The sparse test configuration: small lines so that the pattern is sparse.
static AttentionConfig sparse_cfg(const char *budget) {
    AttentionConfig c = {0};
    c.type = ATTN_SPARSE;
    c.budget = strcmp(budget, "fixed") ? BUDGET_TOPP : BUDGET_FIXED;
    c.block_size = 16;
    c.last_q = 24;
    c.top_p = 0.5;
    c.max_vertical = 6;
    c.max_slash = 4;
    c.sink = 2;
    c.local = 3;
    c.vertical = 3;
    c.slash = 2;
    return c;
}

typedef struct {
    float *o, *lse, *dq, *dk, *dv;
} Grads;

static Grads grads_new(int64_t T, int64_t wq, int64_t wk, int Hq) {
    return (Grads){xmalloc((size_t)(T * wq + 1) * sizeof(float)), xmalloc((size_t)(Hq * T + 1) * sizeof(float)),
                   xcalloc((size_t)(T * wq + 1), sizeof(float)), xcalloc((size_t)(T * wk + 1), sizeof(float)),
                   xcalloc((size_t)(T * wk + 1), sizeof(float))};
}

static void grads_free(Grads *g) { free(g->o); free(g->lse); free(g->dq); free(g->dk); free(g->dv); }

// One sequence of N tokens in `layout` on the cp ranks with the documents of
// `docs`. budget "dense": top_p 1 with caps >= N and every query estimating,
// so the pattern keeps every visible line and the ring must also equal the
// dense single-rank kernel. Returns the K/V + dK/dV ring bytes of ring_send
// selected, summed over ranks.
static int64_t check_case(LayoutKind layout, int64_t N, const char *budget, int inner, const char *schedule,
                          DocSet docs) {
    const int Hq = 4, Hkv = 2, D = 8, B = 16;
    const int W = dist.cp.size, r = dist.cp.rank;
    const int64_t wq = (int64_t)Hq * D, wk = (int64_t)Hkv * D, nb = (N + B - 1) / B;
    const bool dense = !strcmp(budget, "dense");
    AttentionConfig cfg = sparse_cfg(dense ? "topp" : budget);
    if (dense) {
        cfg.top_p = 1.0;
        cfg.max_vertical = cfg.max_slash = cfg.last_q = (int)N;
    }
    int64_t starts[64];
    const int64_t doc_count = doc_set_starts(docs, N, B, W, starts);
    Rng rng;
    rng_seed(&rng, 2000 + (uint64_t)N);
    float *q = randn(&rng, N * wq), *k = randn(&rng, N * wk), *v = randn(&rng, N * wk), *w = randn(&rng, N * wq);
    int64_t *all_pos = xmalloc((size_t)N * sizeof(int64_t));
    for (int64_t t = 0; t < N; t++) all_pos[t] = t;
    char tag[128];
    snprintf(tag, sizeof(tag), "%s_%s_%s_W%d_inner%d_N%lld%s", schedule, layout_name(layout), budget, W, inner,
             (long long)N, doc_set_suffix(docs));

    // Reference: the single-rank plan and kernels on the whole sequence.
    AttnShape full = {N, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), doc_count ? starts : NULL, doc_count, NULL};
    SparseIndex ref = {0};
    SparseStats ref_stats = {0};
    sparse_plan_local(&(SparsePlanCall){.cfg = &cfg, .shape = &full, .q = q, .k = k, .stats = &ref_stats}, all_pos,
                      &ref);
    Grads e = grads_new(N, wq, wk, Hq);
    float *delta = xmalloc((size_t)(Hq * N) * sizeof(float));
    attn_forward_init(&full, e.o, e.lse);
    attn_sparse_forward_cpu(&full, &ref, q, all_pos, k, v, all_pos, e.o, e.lse);
    attn_backward_delta(&full, e.o, w, delta);
    attn_sparse_backward_cpu(&full, &ref, q, all_pos, k, v, all_pos, e.lse, delta, w, e.dq, e.dk, e.dv);
    Grads x = grads_new(N, wq, wk, Hq);        // budget dense: the dense kernel
    if (dense) {
        attn_forward_init(&full, x.o, x.lse);
        attn_dense_forward_cpu(&full, q, all_pos, k, v, all_pos, x.o, x.lse);
        attn_backward_delta(&full, x.o, w, delta);
        attn_dense_backward_cpu(&full, q, all_pos, k, v, all_pos, x.lse, delta, w, x.dq, x.dk, x.dv);
    }

    // This rank's slice and the ring.
    int64_t T = layout_rank_positions(layout, N, B, W, r, NULL);
    int64_t *pos = xmalloc((size_t)(T + 1) * sizeof(int64_t));
    layout_rank_positions(layout, N, B, W, r, pos);
    float *lq = gather_rows(q, wq, pos, T), *lk = gather_rows(k, wk, pos, T), *lv = gather_rows(v, wk, pos, T);
    float *lw = gather_rows(w, wq, pos, T);
    float *eo = gather_rows(e.o, wq, pos, T), *e_lse = gather_cols(e.lse, Hq, N, pos, T);
    float *edq = gather_rows(e.dq, wq, pos, T), *edk = gather_rows(e.dk, wk, pos, T), *edv = gather_rows(e.dv, wk, pos, T);
    Ring ring;
    ring_init(&ring, &dist.cp, inner, pos, T);
    AttnShape shape = {T, 0, Hq, Hkv, D, B, full.scale, full.doc_starts, full.doc_count, NULL};
    float *xo = gather_rows(x.o, wq, pos, T), *x_lse = gather_cols(x.lse, Hq, N, pos, T);
    float *xdq = gather_rows(x.dq, wq, pos, T), *xdk = gather_rows(x.dk, wk, pos, T), *xdv = gather_rows(x.dv, wk, pos, T);
    Grads got[2];
    int64_t bytes[2][2];       // [full, selected][K/V, dK/dV]
    for (int send = 0; send < 2; send++) {
        RingSparse rs = {0};
        SparseIndex index = {0};
        SparseStats stats = {0};
        cfg.ring_send = (RingSend)send;
        ring_sparse_plan(&ring, &(SparsePlanCall){.cfg = &cfg, .shape = &shape, .q = lq, .k = lk, .stats = &stats},
                         &index, &rs);
        if (send == 0) {
            // The pattern: this rank's rows and the whole index from its pattern.
            int same = 1;
            for (int h = 0; h < Hq; h++)
                for (int64_t i = 0; i < index.num_q_blocks; i++)
                    same &= same_row(&index, h * index.num_q_blocks + i, &ref, h * nb + index.q_blocks[i]);
            SparseIndex whole;
            sparse_index_build(&rs.pattern, B, ref.q_blocks, nb, &whole);
            sparse_index_documents(&full, cfg.sink, &whole);
            for (int64_t row = 0; row < Hq * nb; row++) same &= same_row(&whole, row, &ref, row);
            sparse_index_free(&whole);
            expect_all(same, "sparse_ring_pattern_%s", tag);
            expect_all(stats.computed == ref_stats.computed && stats.causal == ref_stats.causal &&
                       stats.estimation_rows == ref_stats.estimation_rows &&
                       fabs(stats.covered_mass - ref_stats.covered_mass) <= 1e-5 * ref_stats.covered_mass &&
                       stats.sampled_rows == ref_stats.sampled_rows && stats.sampled_rows > 0 &&
                       fabs(stats.sampled_mass - ref_stats.sampled_mass) <= 1e-5 * ref_stats.sampled_mass,
                       "sparse_ring_stats_%s (density %.3f, recall %.4f, estimation rows %.4f; one rank %.4f)", tag,
                       stats.computed / stats.causal, stats.sampled_mass / stats.sampled_rows,
                       stats.covered_mass / stats.estimation_rows, ref_stats.sampled_mass / ref_stats.sampled_rows);
        }
        got[send] = grads_new(T, wq, wk, Hq);
        Grads *g = &got[send];
        const RingTensors forward = {.q = lq, .k = lk, .v = lv, .out = {.o = g->o, .lse = g->lse}};
        const RingTensors backward = {.q = lq, .k = lk, .v = lv, .o = g->o, .dout = lw,
                                      .grads = {.lse = g->lse, .dq = g->dq, .dk = g->dk, .dv = g->dv}};
        ring_sparse_forward(&ring, &rs, &shape, &forward);
        ring_sparse_backward(&ring, &rs, &shape, &backward);
        double errs[2] = {fmax(max_rel_diff(g->o, eo, T * wq), max_rel_diff(g->lse, e_lse, Hq * T)),
                          fmax(max_rel_diff(g->dq, edq, T * wq),
                               fmax(max_rel_diff(g->dk, edk, T * wk), max_rel_diff(g->dv, edv, T * wk)))};
        double mine[2] = {errs[0], errs[1]};
        comm_allreduce(&dist.world, errs, 2, DT_DOUBLE, REDUCE_MAX);
        const char *mode = send ? "selected" : "full";
        expect_all(mine[0] < TOL_FWD, "sparse_ring_%s_%s_forward (max rel err %.2e)", mode, tag, errs[0]);
        expect_all(mine[1] < TOL_GRAD, "sparse_ring_%s_%s_backward (max rel err %.2e)", mode, tag, errs[1]);
        if (dense) {
            double derr[2] = {fmax(max_rel_diff(g->o, xo, T * wq), max_rel_diff(g->lse, x_lse, Hq * T)),
                              fmax(max_rel_diff(g->dq, xdq, T * wq),
                                   fmax(max_rel_diff(g->dk, xdk, T * wk), max_rel_diff(g->dv, xdv, T * wk)))};
            const double dmine[2] = {derr[0], derr[1]};
            comm_allreduce(&dist.world, derr, 2, DT_DOUBLE, REDUCE_MAX);
            expect_all(dmine[0] < TOL_FWD && dmine[1] < TOL_GRAD,
                       "sparse_ring_%s_%s_equals_dense (max rel err forward %.2e, backward %.2e)", mode, tag, derr[0],
                       derr[1]);
        }
        bytes[send][0] = rs.traffic.kv_bytes;
        bytes[send][1] = rs.traffic.dkv_bytes;
        // The byte planner (no MPI) counts what the passes sent: K/V in both.
        int64_t *kv_tokens = xmalloc((size_t)(W * W) * sizeof(int64_t));
        int64_t *dkv_tokens = xmalloc((size_t)(W * W) * sizeof(int64_t));
        ring_send_tokens(&ring, send ? &rs.need : NULL, kv_tokens, dkv_tokens);
        int64_t planned[2] = {0, 0};
        for (int s = 0; s < W; s++) {
            planned[0] += 2 * kv_tokens[r * W + s] * 2 * wk * (int64_t)sizeof(float);
            planned[1] += dkv_tokens[r * W + s] * 2 * wk * (int64_t)sizeof(float);
        }
        expect_all(planned[0] == bytes[send][0] && planned[1] == bytes[send][1],
                   "sparse_ring_%s_%s_byte_planner (rank %d: planned %lld + %lld, sent %lld + %lld)", mode, tag, r,
                   (long long)planned[0], (long long)planned[1], (long long)bytes[send][0],
                   (long long)bytes[send][1]);
        free(kv_tokens);
        free(dkv_tokens);
        comm_allreduce(&dist.world, bytes[send], 2, DT_INT64, REDUCE_SUM);
        ring_sparse_free(&rs);
        sparse_index_free(&index);
    }
    int identical = 1;
    identical &= !memcmp(got[0].o, got[1].o, (size_t)(T * wq) * sizeof(float));
    identical &= !memcmp(got[0].lse, got[1].lse, (size_t)(Hq * T) * sizeof(float));
    identical &= !memcmp(got[0].dq, got[1].dq, (size_t)(T * wq) * sizeof(float));
    identical &= !memcmp(got[0].dk, got[1].dk, (size_t)(T * wk) * sizeof(float));
    identical &= !memcmp(got[0].dv, got[1].dv, (size_t)(T * wk) * sizeof(float));
    expect_all(identical, "sparse_ring_selected_identical_%s", tag);
    // Selected never sends more; with several ranks and blocks it sends less.
    const int must_save = W > 1 && nb >= 2 * W;
    for (int m = 0; m < 2; m++)
        expect_all(bytes[1][m] <= bytes[0][m] && (!must_save || bytes[1][m] < bytes[0][m]),
                   "sparse_ring_selected_%s_bytes_%s (full %lld, selected %lld)", m ? "dkv" : "kv", tag,
                   (long long)bytes[0][m], (long long)bytes[1][m]);

    ring_free(&ring);
    grads_free(&got[0]); grads_free(&got[1]); grads_free(&e); grads_free(&x);
    sparse_index_free(&ref);
    free(q); free(k); free(v); free(w); free(all_pos); free(delta); free(pos);
    free(lq); free(lk); free(lv); free(lw); free(eo); free(e_lse); free(edq); free(edk); free(edv);
    free(xo); free(x_lse); free(xdq); free(xdk); free(xdv);
    return bytes[1][0] + bytes[1][1];
}

static void check(const char *schedule, int cp_inner) {
    dist_setup(&dist, 1, 0, cp_inner, "mpi_sparse_ring");
    int inner = ring_inner_size(strcmp(schedule, "flat") ? RING_HIERARCHICAL : RING_FLAT, dist.cp.size, dist.grid.cp_inner);
    const int B = 16, W = dist.cp.size;
    // Ranks with different block counts and a short last block; a short
    // sequence where some ranks hold nothing.
    const int64_t lengths[] = {(int64_t)W * B * 4 + 7, 40};
    for (int docs = 0; docs < DOC_SETS; docs++) {
        for (int l = 0; l < 3; l++)
            for (size_t n = 0; n < sizeof(lengths) / sizeof(lengths[0]); n++)
                check_case((LayoutKind)l, lengths[n], n == 0 ? "fixed" : "topp", inner, schedule, (DocSet)docs);
        check_case(LAYOUT_STRIPED, lengths[0], "topp", inner, schedule, (DocSet)docs);
        check_case(LAYOUT_ZIGZAG, lengths[0], "dense", inner, schedule, (DocSet)docs);
    }
    // One document per rank of the contiguous layout: no rank's queries see
    // another's keys, so ring_send selected sends no K/V and no dK/dV at all.
    const int64_t without = check_case(LAYOUT_CONTIGUOUS, lengths[0], "topp", inner, schedule, DOCS_NONE);
    const int64_t with = check_case(LAYOUT_CONTIGUOUS, lengths[0], "topp", inner, schedule, DOCS_PER_RANK);
    expect_all(with == 0 && (W == 1 || without > 0),
               "sparse_ring_%s_W%d_docs_per_rank_selected_sends_nothing (%lld bytes, %lld without documents)",
               schedule, W, (long long)with, (long long)without);
}

// ----------------------------------------------------------------------------
// Byte model and balance of a planted pattern (no communication).

// Per q head: the sink positions and `vertical` random positions; the local
// offsets and `slash` random offsets, drawn near the diagonal (N * u^3);
// shared: every head draws the same lines.
static void planted_pattern(int Hq, int64_t N, int sink, int local, int vertical, int slash, bool shared,
                            uint64_t seed, SparsePattern *p) {
    Rng rng;
    rng_seed(&rng, seed);
    char *mark = xmalloc((size_t)N);
    int64_t *lists[2] = {xmalloc((size_t)(Hq * N) * sizeof(int64_t)), xmalloc((size_t)(Hq * N) * sizeof(int64_t))};
    int64_t *starts[2] = {xmalloc((size_t)(Hq + 1) * sizeof(int64_t)), xmalloc((size_t)(Hq + 1) * sizeof(int64_t))};
    for (int kind = 0; kind < 2; kind++) {
        starts[kind][0] = 0;
        for (int h = 0; h < Hq; h++) {
            if (shared) rng_seed(&rng, seed + (uint64_t)kind);
            memset(mark, 0, (size_t)N);
            for (int64_t x = 0; x < (kind ? local : sink) && x < N; x++) mark[x] = 1;
            for (int n = 0; n < (kind ? slash : vertical); n++) {
                const double u = rng_uniform(&rng);
                mark[(int64_t)(N * (kind ? u * u * u : u)) % N] = 1;
            }
            int64_t c = starts[kind][h];
            for (int64_t x = 0; x < N; x++)
                if (mark[x]) lists[kind][c++] = x;
            starts[kind][h + 1] = c;
        }
    }
    *p = (SparsePattern){Hq, N, starts[0], lists[0], starts[1], lists[1]};
    free(mark);
}

// Index over every query block of the pattern.
static void whole_index(const SparsePattern *p, int B, SparseIndex *x) {
    const int64_t nb = (p->seq_len + B - 1) / B;
    int64_t *blocks = xmalloc((size_t)nb * sizeof(int64_t));
    for (int64_t b = 0; b < nb; b++) blocks[b] = b;
    sparse_index_build(p, B, blocks, nb, x);
    free(blocks);
}

// K/V bytes of a ring of W ranks (inner per inner ring) over `layout`, whole
// chunks and selected: mean per rank and sending step, the total, and the
// gathered columns' bytes per rank.
static void plan_bytes(const SparsePattern *p, int B, LayoutKind layout, int W, int inner, int64_t token_bytes) {
    const int64_t N = p->seq_len, words = ring_need_words(N, B);
    Comm comm;
    Ring ring;
    ring_init_layout(&ring, &comm, layout, N, B, W, inner);
    uint64_t *bits = xmalloc((size_t)(W * words) * sizeof(uint64_t));
    for (int r = 0; r < W; r++) {
        const int64_t nqb = (ring.counts[r] + B - 1) / B;
        int64_t *qb = xmalloc((size_t)(nqb + 1) * sizeof(int64_t));
        for (int64_t i = 0; i < nqb; i++) qb[i] = ring.positions[ring.offsets[r] + i * B] / B;
        SparseIndex x;
        sparse_index_build(p, B, qb, nqb, &x);
        ring_need_row(&x, words, bits + r * words);
        sparse_index_free(&x);
        free(qb);
    }
    RingNeed need = {B, words, bits};
    int64_t *kv = xmalloc((size_t)(W * W) * sizeof(int64_t)), *dkv = xmalloc((size_t)(W * W) * sizeof(int64_t));
    double fwd[2] = {0, 0}, bwd[2] = {0, 0};   // bytes of a whole pass, full and selected
    for (int sel = 0; sel < 2; sel++) {
        ring_send_tokens(&ring, sel ? &need : NULL, kv, dkv);
        for (int64_t i = 0; i < (int64_t)W * W; i++) {
            fwd[sel] += (double)kv[i] * token_bytes;
            bwd[sel] += (double)(kv[i] + dkv[i]) * token_bytes;
        }
    }
    int64_t columns = 0;
    char *col = xcalloc((size_t)N, 1);
    for (int64_t e = 0; e < p->vertical_start[p->num_heads]; e++) col[p->vertical[e]] = 1;
    for (int64_t x = 0; x < N; x++) columns += col[x];
    const double mib = 1048576.0 * W;          // per rank
    printf("| %s | %d (%dx%d) | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f | %.3f | %.2f |\n", layout_name(layout), W,
           W / inner, inner, fwd[0] / mib, fwd[1] / mib, fwd[1] / fwd[0], bwd[0] / mib, bwd[1] / mib, bwd[1] / bwd[0],
           (fwd[1] + bwd[1]) / (fwd[0] + bwd[0]), (double)columns * token_bytes * (W - 1) / W / 1048576);
    free(col); free(kv); free(dkv); free(bits);
    ring_free(&ring);
}

static void plan(int64_t N, int B, bool shared) {
    const int Hq = 28, Hkv = 4, D = 128, sink = 64, local = 128, vertical = 256;
    const int64_t token_bytes = 2 * (int64_t)Hkv * D * (int64_t)sizeof(float);
    printf("planted vertical-slash pattern: N=%lld B=%d Hq=%d Hkv=%d D=%d fp32, sink %d, local %d, %d random vertical "
           "and S random slash lines per head (offsets N*u^3), %s\n", (long long)N, B, Hq, Hkv, D, sink, local, vertical,
           shared ? "the same lines in every head" : "independent per head");
    const double targets[] = {0.90, 0.95};
    for (int t = 0; t < 2; t++) {
        // The slash count S giving the target sparsity (bisection).
        int lo = 0, hi = (int)(N / 2);
        SparsePattern p;
        SparseIndex x;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            planted_pattern(Hq, N, sink, local, vertical, mid, shared, 11, &p);
            whole_index(&p, B, &x);
            int64_t *pos = xmalloc((size_t)N * sizeof(int64_t));
            for (int64_t i = 0; i < N; i++) pos[i] = i;
            SparseStats s = {0};
            sparse_index_count(&x, pos, N, NULL, 0, &s);
            if (1.0 - s.computed / s.causal >= targets[t]) lo = mid; else hi = mid - 1;
            free(pos);
            sparse_index_free(&x);
            sparse_pattern_free(&p);
        }
        planted_pattern(Hq, N, sink, local, vertical, lo, shared, 11, &p);
        whole_index(&p, B, &x);
        int64_t *pos = xmalloc((size_t)N * sizeof(int64_t));
        for (int64_t i = 0; i < N; i++) pos[i] = i;
        SparseStats s = {0};
        sparse_index_count(&x, pos, N, NULL, 0, &s);
        printf("\nsparsity %.3f (S = %d slash lines per head)\n\n", 1.0 - s.computed / s.causal, lo);
        printf("MiB per rank and layer; forward: K/V; backward: K/V and dK/dV accumulators\n\n"
               "| layout | W (outer x inner) | forward full | forward selected | ratio | backward full | "
               "backward selected | ratio | both passes ratio | columns MiB/rank |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n");
        for (int l = 0; l < 3; l++) {
            plan_bytes(&p, B, (LayoutKind)l, 4, 4, token_bytes);
            plan_bytes(&p, B, (LayoutKind)l, 8, 8, token_bytes);
            plan_bytes(&p, B, (LayoutKind)l, 32, 32, token_bytes);
            plan_bytes(&p, B, (LayoutKind)l, 32, 8, token_bytes);
        }
        printf("\nimbalance, 32 ranks (rank / step; 1.0 = perfect)\n\n"
               "| layout | columns gathered | columns in ring |\n|---|---|---|\n");
        double *work = xmalloc(32 * 32 * sizeof(double));
        for (int l = 0; l < 3; l++) {
            double m[4];
            for (int g = 0; g < 2; g++) {
                balance_work(&x, (LayoutKind)l, 32, g == 0, work);
                m[2 * g] = balance_rank_imbalance(work, 32);
                m[2 * g + 1] = balance_step_imbalance(work, 32);
            }
            printf("| %s | %.2f / %.2f | %.2f / %.2f |\n", layout_name((LayoutKind)l), m[0], m[1], m[2], m[3]);
        }
        free(work); free(pos);
        sparse_index_free(&x);
        sparse_pattern_free(&p);
    }
}

// ----------------------------------------------------------------------------
// Ring time and bytes with documents (timing, not a check).

// Document starts of a log-normal length mix over N tokens (median `median`,
// sigma 1.2 in log space, at least 16 tokens; seeded, the same on every
// rank) into starts [N]; returns how many. *ideal = sum len^2 / N^2.
static int64_t lognormal_documents(int64_t N, double median, int64_t *starts, double *ideal) {
    Rng rng;
    rng_seed(&rng, 42);
    int64_t count = 0;
    *ideal = 0;
    for (int64_t at = 0; at < N;) {
        int64_t len = (int64_t)(median * exp(1.2 * rng_normal(&rng)));
        len = len < 16 ? 16 : len > N - at ? N - at : len;
        starts[count++] = at;
        *ideal += (double)len * (double)len / ((double)N * (double)N);
        at += len;
    }
    return count;
}

// Best of `reps` of one ring pass pair over the cp ranks: forward and
// backward seconds (slowest rank) into t [2]; sparse: rs planned inside the
// forward's time. The kernels' traffic is zeroed first and so holds one pair.
static void time_ring(const Ring *ring, RingKernels *dense, RingSparse *rs, const AttentionConfig *cfg,
                      const AttnShape *shape, const float *q, const float *k, const float *v, const float *w,
                      float *o, float *lse, float *dq, float *dk, float *dv, int reps, double *t) {
    const RingTensors forward = {.q = q, .k = k, .v = v, .out = {.o = o, .lse = lse}};
    const RingTensors backward = {.q = q, .k = k, .v = v, .o = o, .dout = w,
                                  .grads = {.lse = lse, .dq = dq, .dk = dk, .dv = dv}};
    SparseIndex index = {0};
    t[0] = t[1] = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double together = 0;
        comm_allreduce(&dist.world, &together, 1, DT_DOUBLE, REDUCE_SUM);
        const double t0 = now_seconds();
        if (rs) {
            ring_sparse_plan(ring, &(SparsePlanCall){.cfg = cfg, .shape = shape, .q = q, .k = k}, &index, rs);
            ring_sparse_forward(ring, rs, shape, &forward);
        } else {
            *dense->traffic = (RingTraffic){0};
            ring_attn_forward(ring, dense, shape, &forward);
        }
        const double t1 = now_seconds();
        if (rs) ring_sparse_backward(ring, rs, shape, &backward);
        else ring_attn_backward(ring, dense, shape, &backward);
        double dt[2] = {t1 - t0, now_seconds() - t1};
        comm_allreduce(&dist.world, dt, 2, DT_DOUBLE, REDUCE_MAX);
        t[0] = fmin(t[0], dt[0]);
        t[1] = fmin(t[1], dt[1]);
    }
    sparse_index_free(&index);
}

// Per layout, dense (ring_send full and selected) and sparse (fixed budget,
// ring_send selected) ring attention on N tokens without and with the
// document mix: forward and backward time and the bytes each rank sent, as a
// table.
static void bench(int64_t N, double median) {
    dist_setup(&dist, 1, 0, 0, "mpi_sparse_ring");
    const int Hq = 8, Hkv = 2, D = 64, B = 128, W = dist.cp.size;
    const int64_t wq = (int64_t)Hq * D, wk = (int64_t)Hkv * D;
    AttentionConfig cfg = sparse_cfg("fixed");
    cfg.block_size = B;
    cfg.last_q = 64;
    cfg.sink = 64;
    cfg.local = 128;
    cfg.vertical = 64;
    cfg.slash = 8;
    cfg.ring_send = RING_SEND_SELECTED;
    int64_t *starts = xmalloc((size_t)N * sizeof(int64_t)), *pos = xmalloc((size_t)N * sizeof(int64_t));
    const int64_t words = ring_need_words(N, B);
    uint64_t *need_bits = xmalloc((size_t)(W * words) * sizeof(uint64_t));
    double ideal;
    const int64_t doc_count = lognormal_documents(N, median, starts, &ideal);
    Rng rng;
    rng_seed(&rng, 7);
    float *q = randn(&rng, N * wq), *k = randn(&rng, N * wk), *v = randn(&rng, N * wk), *w = randn(&rng, N * wq);
    Grads g = grads_new(N, wq, wk, Hq);
    if (dist.world_rank == 0)
        printf("N=%lld W=%d Hq=%d Hkv=%d D=%d B=%d fp32, %lld documents (log-normal lengths, median %.0f, sigma 1.2, "
               ">= 16 tokens; sum len^2 / N^2 = %.3f); sparse: fixed %d vertical + %d slash lines, sink %d, local %d"
               "\n\n| layout | attention | ring_send | documents | forward s | backward s | MiB sent per rank |\n"
               "|---|---|---|---|---|---|---|\n",
               (long long)N, W, Hq, Hkv, D, B, (long long)doc_count, median, ideal, cfg.vertical, cfg.slash, cfg.sink,
               cfg.local);
    for (int l = 0; l < 3; l++) {
        const int64_t T = layout_rank_positions((LayoutKind)l, N, B, W, dist.cp.rank, pos);
        Ring ring;
        ring_init(&ring, &dist.cp, W, pos, T);
        for (int kind = 0; kind < 3; kind++)       // dense full, dense selected, sparse selected
            for (int docs = 0; docs < 2; docs++) {
                const bool sparse = kind == 2;
                AttnShape shape = {T, 0, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), docs ? starts : NULL,
                                   docs ? doc_count : 0, NULL};
                RingTraffic traffic = {0};
                RingKernels dense = ring_dense_cpu;
                dense.traffic = &traffic;
                const RingNeed need = {B, words, need_bits};
                if (kind == 1) {
                    ring_dense_need(&ring, &shape, words, need_bits);
                    dense.need = &need;
                }
                RingSparse rs = {0};
                double t[2];
                time_ring(&ring, &dense, sparse ? &rs : NULL, &cfg, &shape, q, k, v, w, g.o, g.lse, g.dq, g.dk, g.dv,
                          2, t);
                double bytes = sparse ? (double)(rs.traffic.kv_bytes + rs.traffic.dkv_bytes + rs.column_bytes)
                                      : (double)(traffic.kv_bytes + traffic.dkv_bytes);
                comm_allreduce(&dist.world, &bytes, 1, DT_DOUBLE, REDUCE_SUM);
                if (dist.world_rank == 0)
                    printf("| %s | %s | %s | %s | %.3f | %.3f | %.2f |\n", layout_name((LayoutKind)l),
                           sparse ? "sparse" : "dense", kind ? "selected" : "full", docs ? "yes" : "no", t[0], t[1],
                           bytes / W / 1048576.0);
                ring_sparse_free(&rs);
            }
        ring_free(&ring);
    }
    grads_free(&g);
    free(starts); free(pos); free(q); free(k); free(v); free(w); free(need_bits);
}

int main(int argc, char **argv) {
    const char *timeout = getenv("MTRAIN_TIMEOUT_S");
    dist_init(&dist, &argc, &argv, timeout ? atof(timeout) : 60.0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "check") && argc == 4) {
        check(argv[2], atoi(argv[3]));
    } else if (!strcmp(mode, "plan") && argc == 5) {
        plan(atoll(argv[2]), atoi(argv[3]), !strcmp(argv[4], "shared"));
    } else if (!strcmp(mode, "bench") && argc == 4) {
        bench(atoll(argv[2]), atof(argv[3]));
    } else {
        if (dist.world_rank == 0)
            fprintf(stderr, "usage: mpi_sparse_ring check flat|hierarchical INNER | plan N B shared|independent | "
                            "bench N MEDIAN_DOC\n");
        dist_finalize(&dist);
        return 2;
    }
    dist_finalize(&dist);
    return check_exit();
}
