// mpi_gpu_ring.c: the CUDA attention op over a cp ring (attention/ring_cuda.c,
// the schedules of ring.c on device buffers) against the same op on one GPU
// over the whole sequence, under mpirun (real NCCL on GPUs, the sim's NCCL
// over MPI; tests/test_cuda_ring.sh runs it under several CUDASIM_SEEDs):
//   mpirun -np W mpi_gpu_ring INNER   (INNER = W: flat; else hierarchical)
// For each layout (zigzag, striped), ring_send (full, selected) and document
// set (none, mixed): every rank draws the whole sequence's q, k, v, dout
// (bf16, one seed for all) with sharp attention (q scaled by 3: a query's
// weight sits on a few keys, so a chunk lost, repeated or placed at the wrong
// positions moves its output by far more than the tolerance), runs the
// one-GPU op on all of it and the ring op on its own rows, and compares its
// rows of o, lse, and of the dq, dk, dv increments; and the bytes the ring
// sent (attention_cuda_ring_bytes) with those ring_send_tokens plans: K/V as
// bf16 in both passes, dK/dV as fp32.
// Tolerances: o, dq, dk, dv are bf16 (each rounded once from fp32 sums that
// the ring adds in another order: 2^-9 relative per rounding, up to 2^-8 per
// element when the fp32 sums straddle a rounding boundary), so relative
// Frobenius 1e-2; lse is fp32 from the same bf16 inputs, merged by
// log-sum-exp in another order: 1e-6 relative.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attention/attention_cuda_op.h"
#include "../attention/layout.h"
#include "../attention/ring_cuda.h"
#include "../attention/ring_plan.h"
#include "../attention/ring_sparse.h"
#include "../dist/comm_device.h"
#include "../dist/cuda_check.h"
#include "../dist/util.h"
#include "check.h"
#include "gpu_common.h"
#include "mpi_check.h"

#define EXPECT_ALL(...) do { checks++; expect_all(__VA_ARGS__); } while (0)

enum { N = 128, B = 16, HQ = 4, HKV = 2, D = 64 };
#define TOL_BF16 1e-2
#define TOL_LSE 1e-6

// One GPU's op (cp NULL) or the ring's on its rows: q, k, v, dout [tokens]
// rows of the whole sequence's; o, lse and the dq, dk, dv increments (fp32, host).
typedef struct {
    float *o, *lse, *dq, *dk, *dv;
    double bytes;              // sent in the ring
} Result;

static Result run_op(const AttentionConfig *cfg, const Comm *cp, int inner, const AttnShape *shape,
                     const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                     const int64_t *pos, int64_t T) {
    const int64_t nq = T * HQ * D, nk = T * HKV * D;
    AttnState *st = attention_cuda_new(cfg, 1, HQ);
    if (cp) {
        const AttnRingCuda ring = ring_cuda_new(cp, inner);
        attention_cuda_set_ring(st, &ring);
    }
    attention_cuda_sequence(st, pos, T);
    uint16_t *d_q = to_device(q, (size_t)nq * 2), *d_k = to_device(k, (size_t)nk * 2);
    uint16_t *d_v = to_device(v, (size_t)nk * 2), *d_dout = to_device(dout, (size_t)nq * 2);
    int64_t *d_pos = to_device(pos, (size_t)T * sizeof(int64_t));
    uint16_t *d_o = poisoned((size_t)nq * 2);
    float *d_lse = poisoned((size_t)(HQ * T) * sizeof(float)), *d_delta = poisoned((size_t)(HQ * T) * sizeof(float));
    uint16_t *d_dq = poisoned((size_t)nq * 2), *d_dk = poisoned((size_t)nk * 2);
    uint16_t *d_dv = poisoned((size_t)nk * 2);
    CUDA_CHECK(cudaMemset(d_dq, 0, (size_t)nq * 2));
    CUDA_CHECK(cudaMemset(d_dk, 0, (size_t)nk * 2));
    CUDA_CHECK(cudaMemset(d_dv, 0, (size_t)nk * 2));
    attention_cuda_forward(st, 0, true, shape, d_q, d_k, d_v, d_pos, d_o, d_lse, NULL, 0);
    attention_cuda_backward(st, 0, shape, d_q, d_k, d_v, d_pos, d_o, d_lse, d_dout, d_delta, d_dq, d_dk, d_dv, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    Result r = {from_device_bf16(d_o, nq), from_device_f32(d_lse, HQ * T), from_device_bf16(d_dq, nq),
                from_device_bf16(d_dk, nk), from_device_bf16(d_dv, nk), attention_cuda_ring_bytes(st)};
    void *all[] = {d_q, d_k, d_v, d_dout, d_pos, d_o, d_lse, d_delta, d_dq, d_dk, d_dv};
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
static float *lse_rows(const float *lse, const int64_t *pos, int64_t T) {
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

// The bytes this rank's ring sends for one forward and backward, by the
// byte planner (ring_send_tokens), for ring_send `send`.
static double planned_bytes(int inner, RingSend send, const AttnShape *shape, const int64_t *pos, int64_t T) {
    const int W = dist.cp.size, r = dist.cp.rank;
    Ring ring;
    ring_init(&ring, &dist.cp, inner, pos, T);
    const int64_t words = ring_need_words(N, B);
    uint64_t *bits = xmalloc((size_t)(W * words) * sizeof(uint64_t));
    ring_dense_need(&ring, shape, words, bits);
    const RingNeed need = {B, words, bits};
    int64_t *kv = xcalloc((size_t)(W * W), sizeof(int64_t)), *dkv = xcalloc((size_t)(W * W), sizeof(int64_t));
    ring_send_tokens(&ring, send == RING_SEND_SELECTED ? &need : NULL, kv, dkv);
    double bytes = 0;
    for (int s = 0; s < W; s++)
        bytes += 2.0 * (double)kv[r * W + s] * 2 * HKV * D * sizeof(uint16_t) +
                 (double)dkv[r * W + s] * 2 * HKV * D * sizeof(float);
    free(bits);
    free(kv);
    free(dkv);
    ring_free(&ring);
    return bytes;
}

static void check_case(int inner, LayoutKind layout, RingSend send, DocSet docs) {
    const int W = dist.cp.size, r = dist.cp.rank;
    Rng rng;
    rng_seed(&rng, 1234);
    uint16_t *q = random_bits(&rng, N * HQ * D, 3.0), *k = random_bits(&rng, N * HKV * D, 1.0);
    uint16_t *v = random_bits(&rng, N * HKV * D, 1.0), *dout = random_bits(&rng, N * HQ * D, 1.0);
    int64_t starts[64];
    const int64_t doc_count = doc_set_starts(docs, N, B, W, starts);
    const AttentionConfig cfg = {.type = ATTN_DENSE, .block_size = B, .ring_send = send};
    AttnShape full = {N, N, HQ, HKV, D, B, 1.0f / sqrtf((float)D), doc_count ? starts : NULL, doc_count};
    int64_t *iota = xmalloc(N * sizeof(int64_t));
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
    const double planned = planned_bytes(inner, send, &shape, pos, T);

    float *o = rows(ref.o, HQ * D * sizeof(float), pos, T), *lse = lse_rows(ref.lse, pos, T);
    float *dq = rows(ref.dq, HQ * D * sizeof(float), pos, T), *dk = rows(ref.dk, HKV * D * sizeof(float), pos, T);
    float *dv = rows(ref.dv, HKV * D * sizeof(float), pos, T);
    const double e_o = rel_frobenius(ring.o, o, T * HQ * D), e_lse = rel_frobenius(ring.lse, lse, HQ * T);
    const double e_dq = rel_frobenius(ring.dq, dq, T * HQ * D), e_dk = rel_frobenius(ring.dk, dk, T * HKV * D);
    const double e_dv = rel_frobenius(ring.dv, dv, T * HKV * D);
    double worst[5] = {e_o, e_lse, e_dq, e_dk, e_dv};
    comm_allreduce(&dist.world, worst, 5, DT_DOUBLE, REDUCE_MAX);
    const char *ring_name = inner == W ? "flat" : "hierarchical";
    const char *layout_name = layout == LAYOUT_ZIGZAG ? "zigzag" : "striped";
    const char *send_name = send == RING_SEND_SELECTED ? "selected" : "full";
    EXPECT_ALL(e_o <= TOL_BF16 && e_lse <= TOL_LSE, "cuda_ring_forward_cp%d_%s_%s_%s%s: o %.2e <= %.0e, lse %.2e <= %.0e",
               W, ring_name, layout_name, send_name, doc_set_suffix(docs), worst[0], TOL_BF16, worst[1], TOL_LSE);
    EXPECT_ALL(e_dq <= TOL_BF16 && e_dk <= TOL_BF16 && e_dv <= TOL_BF16,
               "cuda_ring_backward_cp%d_%s_%s_%s%s: dq %.2e, dk %.2e, dv %.2e <= %.0e", W, ring_name, layout_name,
               send_name, doc_set_suffix(docs), worst[2], worst[3], worst[4], TOL_BF16);
    EXPECT_ALL(ring.bytes == planned && planned > 0, "cuda_ring_bytes_cp%d_%s_%s_%s%s: rank %d sent %.0f bytes, "
               "planned %.0f", W, ring_name, layout_name, send_name, doc_set_suffix(docs), r, ring.bytes, planned);
    void *all[] = {q, k, v, dout, iota, pos, lq, lk, lv, ldout, o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    result_free(&ref);
    result_free(&ring);
}

int main(int argc, char **argv) {
    dist_init(&dist, &argc, &argv, 60.0);
    CHECK(argc == 2, "usage: mpirun -np W %s INNER (ranks per inner ring; W: flat)", argv[0]);
    const int inner = atoi(argv[1]);
    dist_setup(&dist, 1, 0, inner, "mpi_gpu_ring");
    comm_device_join(&dist, true);
    const LayoutKind layouts[] = {LAYOUT_ZIGZAG, LAYOUT_STRIPED};
    const RingSend sends[] = {RING_SEND_FULL, RING_SEND_SELECTED};
    const DocSet docs[] = {DOCS_NONE, DOCS_MIXED};
    for (int l = 0; l < 2; l++)
        for (int s = 0; s < 2; s++)
            for (int d = 0; d < 2; d++) check_case(inner, layouts[l], sends[s], docs[d]);
    dist_finalize(&dist);
    return check_failures > 0;
}
