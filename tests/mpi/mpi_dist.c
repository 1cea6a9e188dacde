// mpi_dist.c: the MPI test program of dist/comm.c and attention/ring/ring.c, run
// under mpirun by tests/mpi/test_dist.sh (not by the runner: most modes need
// several ranks). Every rank checks its own part; each check is all-reduced
// and rank 0 prints "ok NAME" or "FAIL NAME: why".
//   mpi_dist collectives                 values of every operation, world and sub-communicators
//   mpi_dist grid DP CP INNER            communicator shapes and rank order for this request
//   mpi_dist grid-errors                 bad parallel.* settings give clear reasons (dist_grid)
//   mpi_dist setup DP CP INNER           dist_setup only (a bad request must end every rank)
//   mpi_dist ring flat|hierarchical INNER  ring attention against the single-rank kernel,
//                                        without and with documents (steps skipped);
//                                        ring_send selected: the same bits, fewer bytes
//   mpi_dist kill                        the last rank SIGKILLs itself inside an all-reduce
//   mpi_dist skip                        the last rank skips an all-reduce (time-out)
//   mpi_dist bench N flat|hierarchical INNER  times the ring (zigzag) and the single-rank kernel
// Environment: MTRAIN_TIMEOUT_S (default 60) is the deadline of every wait.
//
// Ring tolerances (fp32 ring against the fp32 single-rank kernel on the
// whole sequence; only the merge order differs): max |ring - ref| / max |ref|
// per tensor below 5e-6 for O and LSE and 2e-5 for dQ, dK and dV.
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/layout.h"
#include "../../attention/ring/ring_cpu.h"
#include "../../attention/ring/ring_plan.h"
#include "../../attention/ring/ring_sparse.h"
#include "../../dist/comm.h"
#include "../../dist/util.h"
#include "../lib/mpi_check.h"

// ----------------------------------------------------------------------------
// Collectives: every rank's input is known, so every rank knows the result.

// Element j of rank r's input.
static double input(int r, int64_t j) { return (double)(r + 1) * 1000.0 + (double)j * 0.5 - (double)(r * r); }

static void check_collectives_on(const Comm *c) {
    const int64_t n = 1000;
    const int W = c->size, r = c->rank;
    float *f = xmalloc((size_t)n * sizeof(float));
    double *d = xmalloc((size_t)(W * n) * sizeof(double)), *e = xmalloc((size_t)(W * n) * sizeof(double));
    int64_t *i64 = xmalloc((size_t)(W * n) * sizeof(int64_t));

    for (int64_t j = 0; j < n; j++) f[j] = (float)input(r, j);
    comm_allreduce(c, f, n, DT_FLOAT, REDUCE_SUM);
    int ok = 1;
    for (int64_t j = 0; j < n; j++) {
        double want = 0;
        for (int q = 0; q < W; q++) want += (float)input(q, j);
        ok &= fabs(f[j] - want) <= 1e-6 * fabs(want);
    }
    expect_all(ok, "allreduce_sum_float_%s_%d", c->name, W);

    for (int64_t j = 0; j < n; j++) d[j] = input(r, j) * (j % 2 ? 1 : -1);
    comm_allreduce(c, d, n, DT_DOUBLE, REDUCE_MAX);
    ok = 1;
    for (int64_t j = 0; j < n; j++) {
        double want = -INFINITY;
        for (int q = 0; q < W; q++) want = fmax(want, input(q, j) * (j % 2 ? 1 : -1));
        ok &= d[j] == want;
    }
    expect_all(ok, "allreduce_max_double_%s_%d", c->name, W);

    for (int64_t j = 0; j < n; j++) i64[j] = (int64_t)r * 1000000007LL + j;
    comm_allreduce(c, i64, n, DT_INT64, REDUCE_SUM);
    ok = 1;
    for (int64_t j = 0; j < n; j++) ok &= i64[j] == (int64_t)W * (W - 1) / 2 * 1000000007LL + W * j;
    expect_all(ok, "allreduce_sum_int64_%s_%d", c->name, W);

    for (int64_t j = 0; j < W * n; j++) d[j] = input(r, j);
    comm_reduce_scatter(c, d, e, n, DT_DOUBLE);
    ok = 1;
    for (int64_t j = 0; j < n; j++) {
        double want = 0;
        for (int q = 0; q < W; q++) want += input(q, r * n + j);
        ok &= fabs(e[j] - want) <= 1e-12 * fabs(want);
    }
    expect_all(ok, "reduce_scatter_double_%s_%d", c->name, W);

    for (int64_t j = 0; j < n; j++) i64[j] = (int64_t)r << 40 | j;
    int64_t *gathered = xmalloc((size_t)(W * n) * sizeof(int64_t));
    comm_allgather(c, i64, gathered, n, DT_INT64);
    ok = 1;
    for (int q = 0; q < W; q++)
        for (int64_t j = 0; j < n; j++) ok &= gathered[q * n + j] == ((int64_t)q << 40 | j);
    expect_all(ok, "allgather_int64_%s_%d", c->name, W);

    int root = W - 1;
    for (int64_t j = 0; j < n; j++) f[j] = (float)input(r, j);
    comm_broadcast(c, f, n, DT_FLOAT, root);
    ok = 1;
    for (int64_t j = 0; j < n; j++) ok &= f[j] == (float)input(root, j);
    expect_all(ok, "broadcast_float_%s_%d", c->name, W);

    // Point to point around the ring, both directions at once.
    double *right = xmalloc((size_t)n * sizeof(double)), *left = xmalloc((size_t)n * sizeof(double));
    for (int64_t j = 0; j < n; j++) d[j] = input(r, j);
    MPI_Request reqs[4];
    comm_irecv(c, left, n, DT_DOUBLE, (r + W - 1) % W, 7, &reqs[0]);
    comm_irecv(c, right, n, DT_DOUBLE, (r + 1) % W, 8, &reqs[1]);
    comm_isend(c, d, n, DT_DOUBLE, (r + 1) % W, 7, &reqs[2]);
    comm_isend(c, d, n, DT_DOUBLE, (r + W - 1) % W, 8, &reqs[3]);
    comm_wait(c, reqs, 4, "send/recv test");
    ok = 1;
    for (int64_t j = 0; j < n; j++) ok &= left[j] == input((r + W - 1) % W, j) && right[j] == input((r + 1) % W, j);
    expect_all(ok, "isend_irecv_double_%s_%d", c->name, W);

    free(f); free(d); free(e); free(i64); free(gathered); free(right); free(left);
}

// ----------------------------------------------------------------------------
// Communicator shapes: every member of a group must agree on the group.

// The world ranks of c's members, in c's rank order.
static int64_t *members(const Comm *c) {
    int64_t me = dist.world_rank, *all = xmalloc((size_t)c->size * sizeof(int64_t));
    comm_allgather(c, &me, all, 1, DT_INT64);
    return all;
}

static void check_grid(int dp, int cp, int cp_inner) {
    dist_setup(&dist, dp, cp, cp_inner, "mpi_dist");
    const Grid *g = &dist.grid;
    char tag[64];
    snprintf(tag, sizeof(tag), "%dx%dx%d_of_%d", g->dp, g->cp_outer, g->cp_inner, g->world);
    expect_all(g->dp * g->cp == g->world && g->cp_outer * g->cp_inner == g->cp &&
               (!dp || g->dp == dp) && (!cp || g->cp == cp) && (!cp_inner || g->cp_inner == cp_inner),
               "grid_sizes_%s", tag);
    expect_all(dist.dp.size == g->dp && dist.cp.size == g->cp, "grid_comm_sizes_%s", tag);
    // world rank = dp_rank * cp + cp_rank: a cp group, and so each of its inner rings, is consecutive world ranks.
    int r = dist.world_rank;
    expect_all(dist.dp.rank == r / g->cp && dist.cp.rank == r % g->cp, "grid_rank_order_%s", tag);
    int64_t *m_cp = members(&dist.cp), *m_dp = members(&dist.dp);
    int ok = 1;
    for (int j = 0; j < g->cp; j++) ok &= m_cp[j] == (r / g->cp) * g->cp + j;
    for (int j = 0; j < g->dp; j++) ok &= m_dp[j] == j * g->cp + r % g->cp;
    expect_all(ok, "grid_members_%s", tag);
    free(m_cp); free(m_dp);
}

static void expect_grid_error(int world, int per_node, int dp, int cp, int inner, const char *pattern) {
    Grid g;
    char why[512] = "";
    int rc = dist_grid(world, per_node, dp, cp, inner, &g, why, sizeof(why));
    expect_all(rc != 0 && strstr(why, pattern) != NULL, "grid_error_w%d_dp%d_cp%d_inner%d (%s)", world, dp, cp, inner,
               why);
}

static void check_grid_errors(void) {
    expect_grid_error(4, 4, 2, 3, 0, "parallel.dp × parallel.cp = 2 × 3 = 6 does not match the job's 4 ranks");
    expect_grid_error(4, 4, 0, 3, 0, "parallel.cp: 3 does not divide the job's 4 ranks");
    expect_grid_error(6, 6, 4, 0, 0, "parallel.dp: 4 does not divide the job's 6 ranks");
    expect_grid_error(8, 8, 0, 8, 3, "parallel.cp_inner: 3 does not divide parallel.cp = 8");
    expect_grid_error(8, 8, 2, 0, 3, "parallel.cp_inner: 3 does not divide parallel.cp = 4");
    expect_grid_error(8, 8, -1, 0, 0, "expected 0 = default, or positive");
    // Defaults: cp = world, dp = 1, inner = gcd(cp, ranks per node).
    Grid g;
    char why[512];
    int rc = dist_grid(12, 8, 0, 0, 0, &g, why, sizeof(why));
    expect_all(rc == 0 && g.dp == 1 && g.cp == 12 && g.cp_inner == 4 && g.cp_outer == 3, "grid_defaults_12_ranks_8_per_node");
    rc = dist_grid(16, 8, 2, 0, 0, &g, why, sizeof(why));
    expect_all(rc == 0 && g.dp == 2 && g.cp == 8 && g.cp_inner == 8 && g.cp_outer == 1, "grid_defaults_dp2_of_16");
}

// ----------------------------------------------------------------------------
// Ring attention against the single-rank kernel on the whole sequence.

static float *randn(Rng *rng, int64_t n) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_normal(rng);
    return x;
}

// Rows of x [N, width] at positions pos [T] into out [T, width].
static float *gather_rows(const float *x, int64_t width, const int64_t *pos, int64_t T) {
    float *out = xmalloc((size_t)(T * width) * sizeof(float));
    for (int64_t t = 0; t < T; t++) memcpy(out + t * width, x + pos[t] * width, (size_t)width * sizeof(float));
    return out;
}

// Columns of lse [H, N] at positions pos [T] into out [H, T].
static float *gather_cols(const float *lse, int H, int64_t N, const int64_t *pos, int64_t T) {
    float *out = xmalloc((size_t)(H * T) * sizeof(float));
    for (int h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++) out[h * T + t] = lse[h * N + pos[t]];
    return out;
}

// The dense CPU kernels, counting the ring steps that call them (ctx: int64_t [2]).
static void counted_forward(void *ctx, const RingStep *step) {
    ((int64_t *)ctx)[0]++;
    ring_dense_cpu.forward(NULL, step);
}

static void counted_backward(void *ctx, const RingStep *step) {
    ((int64_t *)ctx)[1]++;
    ring_dense_cpu.backward(NULL, step);
}

// ring_attn_forward (o, lse written) and ring_attn_backward (dq, dk, dv added into) on these tensors.
static void ring_forward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape, const float *q,
                         const float *k, const float *v, float *o, float *lse) {
    const RingTensors t = {.q = q, .k = k, .v = v, .out = {.o = o, .lse = lse}};
    ring_attn_forward(ring, kernels, shape, &t);
}

static void ring_backward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape, const float *q,
                          const float *k, const float *v, const float *o, const float *lse, const float *dout,
                          float *dq, float *dk, float *dv) {
    const RingTensors t = {.q = q, .k = k, .v = v, .o = o, .dout = dout,
                           .grads = {.lse = lse, .dq = dq, .dk = dk, .dv = dv}};
    ring_attn_backward(ring, kernels, shape, &t);
}

// One sequence of N tokens in `layout` on the cp ranks, with the documents of
// `docs`: forward and backward of the ring against the single-rank kernel on
// the whole sequence with the same documents. With one document per rank of
// the contiguous layout every step but the own chunk's is skipped: each rank
// holding tokens calls the kernels once per pass. Returns nothing; checks.
static void check_ring_case(LayoutKind layout, int64_t N, int inner, const char *schedule, DocSet docs) {
    const int Hq = 4, Hkv = 2, D = 8, B = 16;
    const int W = dist.cp.size, r = dist.cp.rank;
    const int64_t wq = (int64_t)Hq * D, wk = (int64_t)Hkv * D;
    Rng rng;
    rng_seed(&rng, 1000 + (uint64_t)N);
    float *q = randn(&rng, N * wq), *k = randn(&rng, N * wk), *v = randn(&rng, N * wk), *w = randn(&rng, N * wq);
    int64_t *all_pos = xmalloc((size_t)N * sizeof(int64_t));
    for (int64_t t = 0; t < N; t++) all_pos[t] = t;

    int64_t starts[64];
    const int64_t doc_count = doc_set_starts(docs, N, B, W, starts);

    // Reference: one call on the whole sequence.
    AttnShape full = {N, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), doc_count ? starts : NULL, doc_count, NULL};
    float *o = xmalloc((size_t)(N * wq) * sizeof(float)), *lse = xmalloc((size_t)(Hq * N) * sizeof(float));
    float *dq = xcalloc((size_t)(N * wq), sizeof(float));
    float *dk = xcalloc((size_t)(N * wk), sizeof(float)), *dv = xcalloc((size_t)(N * wk), sizeof(float));
    float *delta = xmalloc((size_t)(Hq * N) * sizeof(float));
    attn_forward_init(&full, o, lse);
    attn_dense_forward_cpu(&full, q, all_pos, k, v, all_pos, o, lse);
    attn_backward_delta(&full, o, w, delta);
    attn_dense_backward_cpu(&full, q, all_pos, k, v, all_pos, lse, delta, w, dq, dk, dv);

    // This rank's slice, then the ring.
    int64_t T = layout_rank_positions(layout, N, B, W, r, NULL);
    int64_t *pos = xmalloc((size_t)(T > 0 ? T : 1) * sizeof(int64_t));
    layout_rank_positions(layout, N, B, W, r, pos);
    float *lq = gather_rows(q, wq, pos, T), *lk = gather_rows(k, wk, pos, T), *lv = gather_rows(v, wk, pos, T);
    float *lw = gather_rows(w, wq, pos, T);
    Ring ring;
    ring_init(&ring, &dist.cp, inner, pos, T);
    AttnShape shape = {T, 0, Hq, Hkv, D, B, full.scale, full.doc_starts, full.doc_count, NULL};
    float *ro = xmalloc((size_t)(T * wq + 1) * sizeof(float)), *rlse = xmalloc((size_t)(Hq * T + 1) * sizeof(float));
    float *rdq = xcalloc((size_t)(T * wq + 1), sizeof(float));
    float *rdk = xcalloc((size_t)(T * wk + 1), sizeof(float)), *rdv = xcalloc((size_t)(T * wk + 1), sizeof(float));
    int64_t calls[2] = {0, 0};
    RingTraffic traffic[2] = {{0}, {0}};       // ring_send full, selected
    const RingKernels counted = {.forward = counted_forward, .backward = counted_backward, .ctx = calls,
                                 .traffic = &traffic[0]};
    ring_forward(&ring, &counted, &shape, lq, lk, lv, ro, rlse);
    ring_backward(&ring, &counted, &shape, lq, lk, lv, ro, rlse, lw, rdq, rdk, rdv);

    // ring_send selected: the same results to the bit, fewer bytes, as the
    // byte planner counts them.
    const int64_t words = ring_need_words(N, B);
    uint64_t *bits = xmalloc((size_t)(W * words) * sizeof(uint64_t));
    ring_dense_need(&ring, &shape, words, bits);
    const RingNeed need = {B, words, bits};
    RingKernels selected = ring_dense_cpu;
    selected.need = &need;
    selected.traffic = &traffic[1];
    float *so = xmalloc((size_t)(T * wq + 1) * sizeof(float)), *slse = xmalloc((size_t)(Hq * T + 1) * sizeof(float));
    float *sdq = xcalloc((size_t)(T * wq + 1), sizeof(float));
    float *sdk = xcalloc((size_t)(T * wk + 1), sizeof(float)), *sdv = xcalloc((size_t)(T * wk + 1), sizeof(float));
    ring_forward(&ring, &selected, &shape, lq, lk, lv, so, slse);
    ring_backward(&ring, &selected, &shape, lq, lk, lv, so, slse, lw, sdq, sdk, sdv);
    const int identical = !memcmp(so, ro, (size_t)(T * wq) * sizeof(float)) &&
                          !memcmp(slse, rlse, (size_t)(Hq * T) * sizeof(float)) &&
                          !memcmp(sdq, rdq, (size_t)(T * wq) * sizeof(float)) &&
                          !memcmp(sdk, rdk, (size_t)(T * wk) * sizeof(float)) &&
                          !memcmp(sdv, rdv, (size_t)(T * wk) * sizeof(float));
    int64_t *kv_tokens = xmalloc((size_t)(W * W) * sizeof(int64_t)), *dkv_tokens = xmalloc((size_t)(W * W) * sizeof(int64_t));
    ring_send_tokens(&ring, &need, kv_tokens, dkv_tokens);
    int64_t planned = 0;
    for (int s = 0; s < W; s++) planned += (2 * kv_tokens[r * W + s] + dkv_tokens[r * W + s]) * 2 * wk * (int64_t)sizeof(float);
    int64_t sent[2] = {traffic[0].kv_bytes + traffic[0].dkv_bytes, traffic[1].kv_bytes + traffic[1].dkv_bytes};
    const int planner_ok = planned == sent[1];
    comm_allreduce(&dist.world, sent, 2, DT_INT64, REDUCE_SUM);

    float *eo = gather_rows(o, wq, pos, T), *e_lse = gather_cols(lse, Hq, N, pos, T);
    float *edq = gather_rows(dq, wq, pos, T), *edk = gather_rows(dk, wk, pos, T), *edv = gather_rows(dv, wk, pos, T);
    double err_fwd = fmax(max_rel_diff(ro, eo, T * wq), max_rel_diff(rlse, e_lse, Hq * T));
    double err_grad = fmax(max_rel_diff(rdq, edq, T * wq),
                           fmax(max_rel_diff(rdk, edk, T * wk), max_rel_diff(rdv, edv, T * wk)));
    double errs[2] = {err_fwd, err_grad};
    comm_allreduce(&dist.world, errs, 2, DT_DOUBLE, REDUCE_MAX);
    const char *lname = layout_name(layout), *dname = doc_set_suffix(docs);
    expect_all(err_fwd < TOL_FWD, "ring_%s_%s_W%d_inner%d_N%lld%s_forward (max rel err %.2e)", schedule, lname, W,
               inner, (long long)N, dname, errs[0]);
    expect_all(err_grad < TOL_GRAD, "ring_%s_%s_W%d_inner%d_N%lld%s_backward (max rel err %.2e)", schedule, lname, W,
               inner, (long long)N, dname, errs[1]);
    expect_all(identical, "ring_selected_%s_%s_W%d_inner%d_N%lld%s_identical", schedule, lname, W, inner,
               (long long)N, dname);
    expect_all(planner_ok, "ring_selected_%s_%s_W%d_inner%d_N%lld%s_byte_planner (rank %d: planned %lld, sent %lld)",
               schedule, lname, W, inner, (long long)N, dname, r, (long long)planned,
               (long long)(traffic[1].kv_bytes + traffic[1].dkv_bytes));
    // Never more; nothing at all with one document per contiguous rank.
    const int nothing = docs == DOCS_PER_RANK && layout == LAYOUT_CONTIGUOUS;
    expect_all(sent[1] <= sent[0] && (!nothing || sent[1] == 0),
               "ring_selected_%s_%s_W%d_inner%d_N%lld%s_bytes (full %lld, selected %lld)", schedule, lname, W, inner,
               (long long)N, dname, (long long)sent[0], (long long)sent[1]);
    free(bits); free(kv_tokens); free(dkv_tokens); free(so); free(slse); free(sdq); free(sdk); free(sdv);
    if (docs == DOCS_PER_RANK && layout == LAYOUT_CONTIGUOUS)
        expect_all(calls[0] == (T > 0) && calls[1] == (T > 0),
                   "ring_%s_W%d_inner%d_N%lld_docs_per_rank_steps_skipped (rank %d: %lld forward, %lld backward "
                   "kernel calls of %d steps)", schedule, W, inner, (long long)N, r, (long long)calls[0],
                   (long long)calls[1], W);

    ring_free(&ring);
    free(q); free(k); free(v); free(w); free(all_pos); free(o); free(lse); free(dq); free(dk); free(dv); free(delta);
    free(pos); free(lq); free(lk); free(lv); free(lw); free(ro); free(rlse); free(rdq); free(rdk); free(rdv);
    free(eo); free(e_lse); free(edq); free(edk); free(edv);
}

static void check_ring(const char *schedule, int cp_inner) {
    dist_setup(&dist, 1, 0, cp_inner, "mpi_dist");
    int inner = ring_inner_size(strcmp(schedule, "flat") ? RING_HIERARCHICAL : RING_FLAT, dist.cp.size, dist.grid.cp_inner);
    const int B = 16, W = dist.cp.size;
    // N not a multiple of W·B (ranks hold different block counts, the last
    // block is short), and a short sequence where some ranks hold nothing.
    const int64_t lengths[] = {(int64_t)W * B * 2 + 7, 40};
    for (int docs = 0; docs < DOC_SETS; docs++)
        for (int l = 0; l < 3; l++)
            for (size_t n = 0; n < sizeof(lengths) / sizeof(lengths[0]); n++)
                check_ring_case((LayoutKind)l, lengths[n], inner, schedule, (DocSet)docs);
}

// Timing, not a check: best of 3 of the ring forward and backward on N
// tokens (zigzag), and of the single-rank kernel on the whole sequence (rank 0).
static void bench_ring(int64_t N, const char *schedule, int cp_inner) {
    dist_setup(&dist, 1, 0, cp_inner, "mpi_dist");
    const int Hq = 8, Hkv = 2, D = 64, B = 128, W = dist.cp.size;
    int inner = ring_inner_size(strcmp(schedule, "flat") ? RING_HIERARCHICAL : RING_FLAT, W, dist.grid.cp_inner);
    int64_t T = layout_rank_positions(LAYOUT_ZIGZAG, N, B, W, dist.cp.rank, NULL);
    int64_t *pos = xmalloc((size_t)N * sizeof(int64_t));
    Rng rng;
    rng_seed(&rng, 7);
    float *q = randn(&rng, N * Hq * D), *k = randn(&rng, N * Hkv * D), *v = randn(&rng, N * Hkv * D);
    float *w = randn(&rng, N * Hq * D), *o = xmalloc((size_t)(N * Hq * D) * sizeof(float));
    float *lse = xmalloc((size_t)(N * Hq) * sizeof(float)), *dq = xcalloc((size_t)(N * Hq * D), sizeof(float));
    float *dk = xcalloc((size_t)(N * Hkv * D), sizeof(float)), *dv = xcalloc((size_t)(N * Hkv * D), sizeof(float));
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    AttnShape shape = {T, 0, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), NULL, 0, NULL};
    layout_rank_positions(LAYOUT_ZIGZAG, N, B, W, dist.cp.rank, pos);
    Ring ring;
    ring_init(&ring, &dist.cp, inner, pos, T);
    for (int rep = 0; rep < 3; rep++) {
        double start_together = 0;
        comm_allreduce(&dist.world, &start_together, 1, DT_DOUBLE, REDUCE_SUM);
        double t0 = now_seconds();
        ring_forward(&ring, &ring_dense_cpu, &shape, q, k, v, o, lse);
        double t1 = now_seconds();
        ring_backward(&ring, &ring_dense_cpu, &shape, q, k, v, o, lse, w, dq, dk, dv);
        double t2[2] = {t1 - t0, now_seconds() - t1};
        comm_allreduce(&dist.world, t2, 2, DT_DOUBLE, REDUCE_MAX);
        best[0] = fmin(best[0], t2[0]);
        best[1] = fmin(best[1], t2[1]);
    }
    ring_free(&ring);
    if (dist.world_rank == 0) {
        AttnShape full = {N, N, Hq, Hkv, D, B, shape.scale, NULL, 0, NULL};
        for (int64_t t = 0; t < N; t++) pos[t] = t;
        float *delta = xmalloc((size_t)(N * Hq) * sizeof(float));
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_seconds();
            attn_forward_init(&full, o, lse);
            attn_dense_forward_cpu(&full, q, pos, k, v, pos, o, lse);
            double t1 = now_seconds();
            attn_backward_delta(&full, o, w, delta);
            attn_dense_backward_cpu(&full, q, pos, k, v, pos, lse, delta, w, dq, dk, dv);
            best[2] = fmin(best[2], t1 - t0);
            best[3] = fmin(best[3], now_seconds() - t1);
        }
        free(delta);
        printf("bench N=%lld Hq=%d Hkv=%d D=%d B=%d: ring %s W=%d inner=%d: forward %.1f ms, backward %.1f ms | "
               "single rank: forward %.1f ms, backward %.1f ms\n", (long long)N, Hq, Hkv, D, B, schedule, W, inner,
               best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[3] * 1e3);
    }
    free(pos); free(q); free(k); free(v); free(w); free(o); free(lse); free(dq); free(dk); free(dv);
}

// ----------------------------------------------------------------------------
// Failures: a rank dies, or a rank never joins a collective.

static void check_kill(void) {
    double x = 1;
    if (dist.world_rank == dist.world_size - 1) {
        fprintf(stderr, "rank %d: killing myself with SIGKILL\n", dist.world_rank);
        fflush(stderr);
        raise(SIGKILL);
    }
    comm_allreduce(&dist.world, &x, 1, DT_DOUBLE, REDUCE_SUM);
    printf("FAIL rank %d: all-reduce completed although a rank died\n", dist.world_rank);
}

static void check_skip(void) {
    double x = 1;
    if (dist.world_rank == dist.world_size - 1) {
        sleep(120);  // stuck elsewhere; the others' time-out must end this rank too
        return;
    }
    comm_allreduce(&dist.world, &x, 1, DT_DOUBLE, REDUCE_SUM);
    printf("FAIL rank %d: all-reduce completed although a rank skipped it\n", dist.world_rank);
}

int main(int argc, char **argv) {
    const char *timeout = getenv("MTRAIN_TIMEOUT_S");
    dist_init(&dist, &argc, &argv, timeout ? atof(timeout) : 60.0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "collectives")) {
        dist_setup(&dist, 0, 0, 0, "mpi_dist");
        check_collectives_on(&dist.world);
    } else if (!strcmp(mode, "grid") && argc == 5) {
        check_grid(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
        if (dist.dp.size > 1) check_collectives_on(&dist.dp);
        if (dist.cp.size > 1 && dist.cp.size < dist.world_size) check_collectives_on(&dist.cp);
    } else if (!strcmp(mode, "grid-errors")) {
        check_grid_errors();
    } else if (!strcmp(mode, "setup") && argc == 5) {
        dist_setup(&dist, atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), "mpi_dist");
        if (dist.world_rank == 0) printf("setup succeeded\n");
    } else if (!strcmp(mode, "ring") && argc == 4) {
        check_ring(argv[2], atoi(argv[3]));
    } else if (!strcmp(mode, "bench") && argc == 5) {
        bench_ring(atoll(argv[2]), argv[3], atoi(argv[4]));
    } else if (!strcmp(mode, "kill")) {
        check_kill();
    } else if (!strcmp(mode, "skip")) {
        check_skip();
    } else {
        if (dist.world_rank == 0) fprintf(stderr, "usage: mpi_dist collectives | grid DP CP INNER | grid-errors | "
                                                  "setup DP CP INNER | ring flat|hierarchical INNER | kill | skip | "
                                                  "bench N flat|hierarchical INNER\n");
        dist_finalize(&dist);
        return 2;
    }
    dist_finalize(&dist);
    return check_exit();
}
