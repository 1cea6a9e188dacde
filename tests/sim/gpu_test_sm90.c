// gpu_test_sm90.c: the Hopper dense attention forward and backward
// (attention/kernels/flash_sm90.cu, flash_sm90_backward.cu) against the CPU
// kernels (attention/kernels/flash_cpu.c), and the Hopper sparse forward
// (flash_sm90_sparse.cu) against the CPU sparse kernel and the mma.sync
// sparse forward (sparse_cuda.cu), on the same bf16-rounded inputs:
// head dims 64 and 128, GQA groups of 1, 2 and 3 (forward: one consumer
// warpgroup, two, and two with the last slice of heads half empty), lengths
// that are not multiples of the 64-token tiles, key chunks of a striped layout
// in ring order (rows that see nothing of a chunk), tiles every query sees
// whole, documents crossing tiles; sparse: random vertical-slash indexes
// (blocks of 64 and 128, a short last block, rows of more than 64 columns in
// a call), the whole index per chunk and the cp ring's split (the blocks per
// chunk, then the gathered columns). Also: the work done is the work planned
// (wgmma instructions and TMA bytes from the tiles some query of a tile sees:
// causal and document tiles skipped), no shared-memory wavefront above its
// minimum, and two runs agree bit for bit (the backward: dK and dV; dQ is
// added with atomics). And the registry's choice of them (attn_variants.h:
// under auto only where a sweep row chose one, under sm90 always, under sm80
// never), on any device. The rest needs a GPU of compute capability 9.0
// (skipped elsewhere); under the sim the device is an H100 (CUDASIM_SM=90).
// Run by `make test-gpu` and under the sim (tests/sim/test_sim.sh).
//   build/tests/gpu_test_sm90 [small | backward | sparse]   (every case is small; backward, sparse: those cases only)
//
// Tolerance as gpu_test_attention: ||gpu - cpu|| / ||cpu|| <= 1e-2 for O, dQ, dK, dV, 1e-4 for the LSE.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/attention.h"
#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/kernels/attn_variants.h"
#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/kernels/flash_sm90.h"
#include "../../attention/kernels/sparse_cuda.h"
#include "../../attention/kernels/sparse_flash_cpu.h"
#include "../../attention/layout.h"
#include "../../attention/sparse/sparse.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"

#define TOL 1e-2
#define TOL_LSE 1e-4
#define TOL_MMA 1e-3         // the sparse forward against the mma.sync one: the same bf16 roundings, other sum orders
#define LAYOUT_BLOCK 32      // tokens per layout block (striped chunks)
#define TILE 64              // the kernel's query and key tiles

// Documents: [0, 3) before the first; [3, 70) across the first tile boundary; a one-token [70, 71);
// [71, 150); [150, 260) from inside one tile to the fifth.
static const int64_t DOC_STARTS[] = {3, 70, 71, 150, 260};

#include "attn_case.h"

// Min and max of x[t0 .. min(t0 + tile, T)).
static void bounds(const int64_t *x, int64_t t0, int64_t T, int64_t tile, int64_t *lo, int64_t *hi) {
    *lo = INT64_MAX;
    *hi = INT64_MIN;
    for (int64_t t = t0; t < T && t < t0 + tile; t++) {
        if (x[t] < *lo) *lo = x[t];
        if (x[t] > *hi) *hi = x[t];
    }
}

// The (query tile, key tile) pairs of TILE queries and key_tile keys for queries qpos [Tq] (first positions
// qfirst) against kpos [Tk] where some query of the tile sees a key of the tile by position and document: the
// key tiles the forward loads, the query tiles the backward visits.
static int64_t tiles_seen(const int64_t *qpos, const int64_t *qfirst, int64_t Tq, const int64_t *kpos, int64_t Tk,
                          int64_t key_tile) {
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < Tq; i0 += TILE) {
        int64_t q_lo, q_hi, f_lo, f_hi;
        bounds(qpos, i0, Tq, TILE, &q_lo, &q_hi);
        bounds(qfirst, i0, Tq, TILE, &f_lo, &f_hi);
        for (int64_t j0 = 0; j0 < Tk; j0 += key_tile) {
            int64_t k_lo, k_hi;
            bounds(kpos, j0, Tk, key_tile, &k_lo, &k_hi);
            n += k_lo <= q_hi && k_hi >= f_lo;
        }
    }
    return n;
}

// The case's check name (prefix, sizes), its queries' positions qpos and the first key position each may
// see qfirst (INT64_MIN without documents); returns their count.
static int64_t case_queries(const Case *c, const char *prefix, char name[160], int64_t **qpos, int64_t **qfirst) {
    snprintf(name, 160, "%s N=%lld D=%d Hq=%d Hkv=%d chunks=%d%s", prefix, (long long)c->n, c->D, c->Hq, c->Hkv,
             c->world, c->docs ? " documents" : "");
    *qpos = xmalloc((size_t)c->n * sizeof(int64_t));
    const int64_t Tq = case_chunk_positions(c, 0, *qpos);
    const AttnShape s = shape_of(c, Tq, 0);
    *qfirst = xmalloc((size_t)Tq * sizeof(int64_t) + 1);
    for (int64_t t = 0; t < Tq; t++)
        (*qfirst)[t] = s.doc_count ? attn_doc_first(s.doc_starts, s.doc_count, (*qpos)[t]) : INT64_MIN;
    return Tq;
}

static void run_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv;
    char name[160];
    int64_t *qpos, *qfirst;
    const int64_t Tq = case_queries(c, "sm90", name, &qpos, &qfirst);
    const AttnShape s0 = shape_of(c, Tq, 0);
    const int64_t nq = Tq * Hq * D, nl = Hq * Tq;
    uint16_t *q;
    float *qf;
    random_bf16(&rng, nq, &q, &qf);
    uint16_t *d_q = to_device(q, (size_t)nq * sizeof(uint16_t));
    int64_t *d_qpos = to_device(qpos, (size_t)Tq * sizeof(int64_t));
    float *o_ref = xmalloc((size_t)nq * sizeof(float) + 1), *lse_ref = xmalloc((size_t)nl * sizeof(float) + 1);
    attn_forward_init(&s0, o_ref, lse_ref);
    float *d_o[2], *d_lse[2];
    for (int run = 0; run < 2; run++) {
        d_o[run] = poisoned((size_t)nq * sizeof(float));
        d_lse[run] = poisoned((size_t)nl * sizeof(float));
        attn_forward_init_cuda(&s0, d_o[run], d_lse[run], 0);
    }

    int64_t tiles = 0;
#ifdef CUDASIM_KERNEL_COUNTS
    cudasim_kernel_counts_reset();
#endif
    for (int i = 0; i < c->world; i++) {          // chunks in ring order, own rank first
        int64_t *kpos = xmalloc((size_t)c->n * sizeof(int64_t) + 1);
        const int64_t Tk = case_chunk_positions(c, i, kpos);
        uint16_t *k, *v;
        float *kf, *vf;
        random_bf16(&rng, Tk * Hkv * D, &k, &kf);
        random_bf16(&rng, Tk * Hkv * D, &v, &vf);
        const AttnShape s = shape_of(c, Tq, Tk);
        attn_dense_forward_cpu(&s, qf, qpos, kf, vf, kpos, o_ref, lse_ref);
        uint16_t *d_k = to_device(k, (size_t)(Tk * Hkv * D) * sizeof(uint16_t));
        uint16_t *d_v = to_device(v, (size_t)(Tk * Hkv * D) * sizeof(uint16_t));
        int64_t *d_kpos = to_device(kpos, (size_t)Tk * sizeof(int64_t));
        for (int run = 0; run < 2; run++)
            attn_dense_forward_sm90(&s, d_q, d_qpos, d_k, d_v, d_kpos, d_o[run], d_lse[run], 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        tiles += tiles_seen(qpos, qfirst, Tq, kpos, Tk, TILE);
        CUDA_CHECK(cudaFree(d_k)); CUDA_CHECK(cudaFree(d_v)); CUDA_CHECK(cudaFree(d_kpos));
        free(kpos); free(k); free(v); free(kf); free(vf);
    }

    float *o = from_device_f32(d_o[0], nq), *lse = from_device_f32(d_lse[0], nl);
    float *o2 = from_device_f32(d_o[1], nq), *lse2 = from_device_f32(d_lse[1], nl);
    double e;
    EXPECT_COUNTED((e = rel_frobenius(o, o_ref, nq)) <= TOL, "%s O rel %.2e", name, e);
    EXPECT_COUNTED((e = rel_frobenius(lse, lse_ref, nl)) <= TOL_LSE, "%s LSE rel %.2e", name, e);
    EXPECT_COUNTED(memcmp(o, o2, (size_t)nq * sizeof(float)) == 0 && memcmp(lse, lse2, (size_t)nl * sizeof(float)) == 0,
                   "%s repeatable", name);
#ifdef CUDASIM_KERNEL_COUNTS
    // Per run: each q head's tiles x (D / 16 wgmma for S, 64 / 16 for P V); TMA: Q once per head, K and V per tile
    // per kv head and slice of at most two heads.
    cudasimKernelCounts k;
    cudasim_kernel_counts("flash_sm90_forward_kernel", &k);
    const int group = Hq / Hkv, slices = group >= 2 ? (group + 1) / 2 : 1;
    const unsigned long long wgmma = 2ull * Hq * tiles * (D / 16 + TILE / 16);
    const unsigned long long tma = 2ull * ((unsigned long long)c->world * ((Tq + TILE - 1) / TILE) * Hq * TILE * D * 2 +
                                          (unsigned long long)tiles * Hkv * slices * 2 * TILE * D * 2);
    EXPECT_COUNTED(k.wgmma == wgmma && k.tma_bytes == tma, "%s work: %llu wgmma (planned %llu), %llu TMA bytes "
                   "(planned %llu) over %lld key tiles seen", name, k.wgmma, wgmma, k.tma_bytes, tma, (long long)tiles);
    EXPECT_COUNTED(k.ldmatrix_wavefronts == k.ldmatrix_wavefronts_min && k.cp_async_wavefronts == k.cp_async_wavefronts_min,
                   "%s shared-memory wavefronts at their minimum (ldmatrix %llu/%llu, cp.async %llu/%llu)", name,
                   k.ldmatrix_wavefronts, k.ldmatrix_wavefronts_min, k.cp_async_wavefronts, k.cp_async_wavefronts_min);
#endif
    for (int run = 0; run < 2; run++) { CUDA_CHECK(cudaFree(d_o[run])); CUDA_CHECK(cudaFree(d_lse[run])); }
    CUDA_CHECK(cudaFree(d_q)); CUDA_CHECK(cudaFree(d_qpos));
    free(qpos); free(qfirst); free(q); free(qf); free(o_ref); free(lse_ref); free(o); free(lse); free(o2); free(lse2);
}

// The backward of every key chunk against the CPU's, from the CPU forward's lse and delta (dq, dk, dv start
// from random values; the increments compared). Also: the work done is the work planned, no ldmatrix wavefront
// above its minimum, and dk, dv (no atomics) the same bits in a second run.
static void run_backward_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv;
    char name[160];
    int64_t *qpos, *qfirst;
    const int64_t Tq = case_queries(c, "sm90 backward", name, &qpos, &qfirst);
    const AttnShape s0 = shape_of(c, Tq, 0);
    const int64_t nq = Tq * Hq * D, nl = Hq * Tq;
    uint16_t *q, *dout;
    float *qf, *doutf;
    random_bf16(&rng, nq, &q, &qf);
    random_bf16(&rng, nq, &dout, &doutf);
    int64_t *kpos[8], Tk[8];
    uint16_t *k[8], *v[8];
    float *kf[8], *vf[8];
    CHECK(c->world <= 8, "gpu_test_sm90: at most 8 chunks");
    float *o_ref = xmalloc((size_t)nq * sizeof(float) + 1), *lse_ref = xmalloc((size_t)nl * sizeof(float) + 1);
    float *delta_ref = xmalloc((size_t)nl * sizeof(float) + 1);
    attn_forward_init(&s0, o_ref, lse_ref);
    for (int i = 0; i < c->world; i++) {
        kpos[i] = xmalloc((size_t)c->n * sizeof(int64_t) + 1);
        Tk[i] = case_chunk_positions(c, i, kpos[i]);
        random_bf16(&rng, Tk[i] * Hkv * D, &k[i], &kf[i]);
        random_bf16(&rng, Tk[i] * Hkv * D, &v[i], &vf[i]);
        const AttnShape s = shape_of(c, Tq, Tk[i]);
        attn_dense_forward_cpu(&s, qf, qpos, kf[i], vf[i], kpos[i], o_ref, lse_ref);
    }
    attn_backward_delta(&s0, o_ref, doutf, delta_ref);
    float *dq0 = random_f32(&rng, nq), *dq_ref = xmalloc((size_t)nq * sizeof(float) + 1);
    memcpy(dq_ref, dq0, (size_t)nq * sizeof(float));
    uint16_t *d_q = to_device(q, (size_t)nq * sizeof(uint16_t)), *d_dout = to_device(dout, (size_t)nq * sizeof(uint16_t));
    int64_t *d_qpos = to_device(qpos, (size_t)Tq * sizeof(int64_t));
    float *d_lse = to_device(lse_ref, (size_t)nl * sizeof(float)), *d_delta = to_device(delta_ref, (size_t)nl * sizeof(float));
    float *d_dq = to_device(dq0, (size_t)nq * sizeof(float));

    double dk_diff = 0, dk_norm = 0, dv_diff = 0, dv_norm = 0;
    int64_t pairs = 0, visits = 0, kv_tiles = 0;
    int same = 1;
#ifdef CUDASIM_KERNEL_COUNTS
    cudasim_kernel_counts_reset();
#endif
    for (int i = 0; i < c->world; i++) {
        const int64_t nk = Tk[i] * Hkv * D;
        const AttnShape s = shape_of(c, Tq, Tk[i]);
        float *dk0 = random_f32(&rng, nk), *dv0 = random_f32(&rng, nk);
        float *dk_ref = xmalloc((size_t)nk * sizeof(float) + 1), *dv_ref = xmalloc((size_t)nk * sizeof(float) + 1);
        memcpy(dk_ref, dk0, (size_t)nk * sizeof(float));
        memcpy(dv_ref, dv0, (size_t)nk * sizeof(float));
        attn_dense_backward_cpu(&s, qf, qpos, kf[i], vf[i], kpos[i], lse_ref, delta_ref, doutf, dq_ref, dk_ref, dv_ref);
        uint16_t *d_k = to_device(k[i], (size_t)nk * sizeof(uint16_t)), *d_v = to_device(v[i], (size_t)nk * sizeof(uint16_t));
        int64_t *d_kpos = to_device(kpos[i], (size_t)Tk[i] * sizeof(int64_t));
        float *d_dk[2], *d_dv[2], *d_dq2 = poisoned((size_t)nq * sizeof(float));
        for (int run = 0; run < 2; run++) {        // the second into scratch dq
            d_dk[run] = to_device(dk0, (size_t)nk * sizeof(float));
            d_dv[run] = to_device(dv0, (size_t)nk * sizeof(float));
            attn_dense_backward_sm90(&s, d_q, d_qpos, d_k, d_v, d_kpos, d_lse, d_delta, d_dout, run ? d_dq2 : d_dq,
                                     d_dk[run], d_dv[run], 0);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        pairs += tiles_seen(qpos, qfirst, Tq, kpos[i], Tk[i], TILE);
        visits += tiles_seen(qpos, qfirst, Tq, kpos[i], Tk[i], 2 * TILE);
        kv_tiles += (Tk[i] + 2 * TILE - 1) / (2 * TILE);
        float *dk = from_device_f32(d_dk[0], nk), *dv = from_device_f32(d_dv[0], nk);
        float *dk2 = from_device_f32(d_dk[1], nk), *dv2 = from_device_f32(d_dv[1], nk);
        same &= memcmp(dk, dk2, (size_t)nk * sizeof(float)) == 0 && memcmp(dv, dv2, (size_t)nk * sizeof(float)) == 0;
        subtract(dk, dk0, nk); subtract(dk_ref, dk0, nk);
        subtract(dv, dv0, nk); subtract(dv_ref, dv0, nk);
        // Per-chunk errors combined into one Frobenius norm over all chunks.
        const double ek = rel_frobenius(dk, dk_ref, nk), ev = rel_frobenius(dv, dv_ref, nk);
        double nkr = 0, nvr = 0;
        for (int64_t j = 0; j < nk; j++) { nkr += (double)dk_ref[j] * dk_ref[j]; nvr += (double)dv_ref[j] * dv_ref[j]; }
        dk_diff += ek * ek * nkr; dk_norm += nkr;
        dv_diff += ev * ev * nvr; dv_norm += nvr;
        for (int run = 0; run < 2; run++) { CUDA_CHECK(cudaFree(d_dk[run])); CUDA_CHECK(cudaFree(d_dv[run])); }
        CUDA_CHECK(cudaFree(d_k)); CUDA_CHECK(cudaFree(d_v)); CUDA_CHECK(cudaFree(d_kpos)); CUDA_CHECK(cudaFree(d_dq2));
        free(dk0); free(dv0); free(dk_ref); free(dv_ref); free(dk); free(dv); free(dk2); free(dv2);
    }
    float *dq = from_device_f32(d_dq, nq);
    subtract(dq, dq0, nq);
    subtract(dq_ref, dq0, nq);
    double e;
    EXPECT_COUNTED((e = rel_frobenius_floor(dq, dq_ref, nq, GRAD_FLOOR)) <= TOL, "%s dQ rel %.2e", name, e);
    EXPECT_COUNTED((e = sqrt(dk_diff / (dk_norm + 1e-30))) <= TOL, "%s dK rel %.2e", name, e);
    EXPECT_COUNTED((e = sqrt(dv_diff / (dv_norm + 1e-30))) <= TOL, "%s dV rel %.2e", name, e);
    EXPECT_COUNTED(same, "%s dK, dV repeatable", name);
#ifdef CUDASIM_KERNEL_COUNTS
    // Per run: each q head's (64-key tile, query tile) pairs seen x (D / 16 wgmma for S^T, D / 16 for dP^T,
    // 64 / 16 for dV, for dK, D / 16 for dQ); TMA: K and V of 128 keys per kv head, Q and dO per q head and
    // (128-key tile, query tile) pair seen.
    cudasimKernelCounts kc;
    cudasim_kernel_counts("flash_sm90_backward_kernel", &kc);
    const unsigned long long wgmma = 2ull * Hq * pairs * (3 * D / 16 + 2 * TILE / 16);
    const unsigned long long tma = 2ull * ((unsigned long long)kv_tiles * Hkv * 2 * (2 * TILE) * D * 2 +
                                          (unsigned long long)visits * Hq * 2 * TILE * D * 2);
    EXPECT_COUNTED(kc.wgmma == wgmma && kc.tma_bytes == tma, "%s work: %llu wgmma (planned %llu), %llu TMA bytes "
                   "(planned %llu) over %lld pairs of tiles seen", name, kc.wgmma, wgmma, kc.tma_bytes, tma,
                   (long long)pairs);
    EXPECT_COUNTED(kc.ldmatrix_wavefronts == kc.ldmatrix_wavefronts_min, "%s ldmatrix wavefronts at their minimum "
                   "(%llu/%llu)", name, kc.ldmatrix_wavefronts, kc.ldmatrix_wavefronts_min);
#endif
    for (int i = 0; i < c->world; i++) { free(kpos[i]); free(k[i]); free(v[i]); free(kf[i]); free(vf[i]); }
    CUDA_CHECK(cudaFree(d_q)); CUDA_CHECK(cudaFree(d_dout)); CUDA_CHECK(cudaFree(d_qpos));
    CUDA_CHECK(cudaFree(d_lse)); CUDA_CHECK(cudaFree(d_delta)); CUDA_CHECK(cudaFree(d_dq));
    free(qpos); free(qfirst); free(q); free(qf); free(dout); free(doutf); free(o_ref); free(lse_ref);
    free(delta_ref); free(dq0); free(dq_ref); free(dq);
}

// ---- the sparse forward (attention/kernels/flash_sm90_sparse.cu) ----

// A sparse case: the dense case's sizes, chunks and documents; the index's block B (also the striped layout's
// block, as the cp ring holds whole index blocks) and the probabilities of the random pattern's vertical and
// slash lines (offset 0 always a slash).
typedef struct {
    Case c;
    int B;
    double vertical, slash;
} SparseCase;

#define DOC_SINK 4            // attention.sink of the cases with documents (sparse_index_documents)

static AttnShape sparse_shape(const SparseCase *sc, int64_t Tq, int64_t Tk) {
    AttnShape s = shape_of(&sc->c, Tq, Tk);
    s.block_size = sc->B;
    return s;
}

// Positions pos [n] of key chunk i in ring order (chunk 0: the queries' own); returns its tokens.
static int64_t sparse_chunk(const SparseCase *sc, int i, int64_t *pos) {
    const int w = sc->c.world;
    return layout_rank_positions(LAYOUT_STRIPED, sc->c.n, sc->B, w, ((sc->c.rank - i) % w + w) % w, pos);
}

// The index of a random vertical-slash pattern for the queries' blocks, restricted to the documents.
static void random_index(const SparseCase *sc, const int64_t *qpos, int64_t Tq, Rng *rng, SparseIndex *index) {
    const int64_t N = sc->c.n, nqb = (Tq + sc->B - 1) / sc->B;
    const int H = sc->c.Hq;
    SparsePattern p = {.num_heads = H, .seq_len = N};
    p.vertical_start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    p.slash_start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    p.vertical = xmalloc((size_t)(H * N + 1) * sizeof(int64_t));
    p.slash = xmalloc((size_t)(H * N + 1) * sizeof(int64_t));
    p.vertical_start[0] = p.slash_start[0] = 0;
    for (int h = 0; h < H; h++) {
        int64_t nv = p.vertical_start[h], ns = p.slash_start[h];
        for (int64_t i = 0; i < N; i++) {
            if (rng_uniform(rng) < sc->vertical) p.vertical[nv++] = i;
            if (i == 0 || rng_uniform(rng) < sc->slash) p.slash[ns++] = i;
        }
        p.vertical_start[h + 1] = nv;
        p.slash_start[h + 1] = ns;
    }
    int64_t *q_blocks = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) q_blocks[i] = qpos[i * sc->B] / sc->B;
    sparse_index_build(&p, sc->B, q_blocks, nqb, index);
    const AttnShape s = sparse_shape(sc, Tq, Tq);
    sparse_index_documents(&s, DOC_SINK, index);
    sparse_pattern_free(&p);
    free(q_blocks);
}

// Local key token of position x among the ascending kpos [Tk], or -1.
static int64_t key_at(const int64_t *kpos, int64_t Tk, int64_t x) {
    for (int64_t t = 0; t < Tk && kpos[t] <= x; t++)
        if (kpos[t] == x) return t;
    return -1;
}

// The work the sparse forward plans for one call of `part` of the index against kpos [Tk], as its producer
// walks each row: key tiles of 64 by TMA (B / 64 per selected block in the call), gathered tiles of 64 of the
// row's columns in the call, each kept where some query of the block sees a key of it; Q boxes per row.
typedef struct {
    unsigned long long wgmma, tma_bytes, cp_async_bytes;
} SparseWork;

// Whether some query of a block (its last position q_hi, its first query's document start f_lo) sees a key at
// the positions kp [m].
static int seen_by_block(const int64_t *kp, int64_t m, int64_t q_hi, int64_t f_lo) {
    int64_t lo, hi;
    bounds(kp, 0, m, m, &lo, &hi);
    return m > 0 && lo <= q_hi && hi >= f_lo;
}

static void sparse_planned(const SparseCase *sc, const SparseIndex *x, SparsePart part, const int64_t *qpos,
                           const int64_t *qfirst, int64_t Tq, const int64_t *kpos, int64_t Tk, SparseWork *w) {
    const int B = sc->B, D = sc->c.D;
    int64_t *tile = xmalloc((size_t)(Tk + 64) * sizeof(int64_t));
    for (int64_t r = 0; r < (int64_t)x->num_heads * x->num_q_blocks; r++) {
        const int64_t i0 = (r % x->num_q_blocks) * B, last = (i0 + B < Tq ? i0 + B : Tq) - 1;
        const int consumers = (int)((last - i0) / 64 + 1);
        const int64_t q_hi = qpos[last], f_lo = sc->c.docs ? qfirst[i0] : INT64_MIN;
        int64_t block_tiles = 0, gathered_tiles = 0, n = 0;
        for (int64_t e = x->block_start[r]; part != SPARSE_COLUMNS && e < x->block_start[r + 1]; e++) {
            const int64_t j = key_at(kpos, Tk, x->blocks[e] * B);
            for (int64_t j0 = j; j >= 0 && j0 < j + B && j0 < Tk; j0 += 64)
                block_tiles += seen_by_block(kpos + j0, j0 + 64 < Tk ? 64 : Tk - j0, q_hi, f_lo);
        }
        for (int64_t e = x->column_start[r]; part != SPARSE_BLOCKS && e < x->column_start[r + 1]; e++) {
            const int64_t t = key_at(kpos, Tk, x->columns[e]);
            if (t >= 0) tile[n++] = kpos[t];
        }
        for (int64_t t0 = 0; t0 < n; t0 += 64) gathered_tiles += seen_by_block(tile + t0, t0 + 64 < n ? 64 : n - t0, q_hi, f_lo);
        w->wgmma += (unsigned long long)consumers * (block_tiles + gathered_tiles) * (D / 16 + 64 / 16);
        w->tma_bytes += (unsigned long long)(consumers + 2 * block_tiles) * 64 * D * 2;
        w->cp_async_bytes += (unsigned long long)gathered_tiles * 2 * 64 * D * 2;
    }
    free(tile);
}

// The index's columns gathered out of the sequence's K/V rows (k, v [n][Hkv D]), as the cp ring gathers them for
// the column pass: ascending positions, their rows, on the device.
static int64_t gather_columns(const SparseCase *sc, const SparseIndex *x, const uint16_t *k, const uint16_t *v,
                              int64_t **pos, int64_t **d_pos, uint16_t **d_k, uint16_t **d_v) {
    const int64_t w = (int64_t)sc->c.Hkv * sc->c.D, rows = (int64_t)x->num_heads * x->num_q_blocks;
    char *mark = xcalloc((size_t)sc->c.n, 1);
    for (int64_t e = 0; e < x->column_start[rows]; e++) mark[x->columns[e]] = 1;
    *pos = xmalloc((size_t)(sc->c.n + 1) * sizeof(int64_t));
    uint16_t *gk = xmalloc((size_t)(sc->c.n * w + 1) * sizeof(uint16_t)), *gv = xmalloc((size_t)(sc->c.n * w + 1) * sizeof(uint16_t));
    int64_t n = 0;
    for (int64_t p = 0; p < sc->c.n; p++) {
        if (!mark[p]) continue;
        memcpy(gk + n * w, k + p * w, (size_t)w * sizeof(uint16_t));
        memcpy(gv + n * w, v + p * w, (size_t)w * sizeof(uint16_t));
        (*pos)[n++] = p;
    }
    *d_pos = to_device(*pos, (size_t)n * sizeof(int64_t));
    *d_k = to_device(gk, (size_t)(n * w) * sizeof(uint16_t));
    *d_v = to_device(gv, (size_t)(n * w) * sizeof(uint16_t));
    free(mark); free(gk); free(gv);
    return n;
}

// The sparse forward over every key chunk in ring order against the CPU sparse kernel on the same index: the
// whole index per chunk (twice: bit for bit the same), the mma.sync sparse forward on the same calls (within
// 1e-3: the same bf16 roundings, other sum orders), and the cp ring's split (the blocks per chunk, then the
// columns once, gathered). Under the sim also the work planned (sparse_planned) and shared-memory wavefronts at
// their minimum.
static void run_sparse_case(const SparseCase *sc, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    const Case *c = &sc->c;
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv;
    char name[160];
    snprintf(name, sizeof name, "sm90 sparse N=%lld D=%d Hq=%d Hkv=%d B=%d chunks=%d%s", (long long)c->n, D, Hq, Hkv,
             sc->B, c->world, c->docs ? " documents" : "");
    int64_t *qpos = xmalloc((size_t)c->n * sizeof(int64_t)), *qfirst = xmalloc((size_t)c->n * sizeof(int64_t));
    const int64_t Tq = sparse_chunk(sc, 0, qpos), nq = Tq * Hq * D, nl = Hq * Tq, w = (int64_t)Hkv * D;
    const AttnShape s0 = sparse_shape(sc, Tq, 0);
    for (int64_t t = 0; t < Tq; t++)
        qfirst[t] = s0.doc_count ? attn_doc_first(s0.doc_starts, s0.doc_count, qpos[t]) : INT64_MIN;
    uint16_t *q, *k, *v;                           // k, v: the sequence's rows by position; chunks take theirs
    float *qf, *kf, *vf;
    random_bf16(&rng, nq, &q, &qf);
    random_bf16(&rng, c->n * w, &k, &kf);
    random_bf16(&rng, c->n * w, &v, &vf);
    SparseIndex index;
    random_index(sc, qpos, Tq, &rng, &index);
    SparseIndexCuda d_index;
    sparse_index_to_cuda(&index, &d_index);
    uint16_t *d_q = to_device(q, (size_t)nq * sizeof(uint16_t));
    int64_t *d_qpos = to_device(qpos, (size_t)Tq * sizeof(int64_t));

    // Runs: 0, 1 sm90 (the whole index per chunk), 2 mma.sync, 3 sm90 blocks per chunk then gathered columns.
    float *o_ref = xmalloc((size_t)nq * sizeof(float) + 1), *lse_ref = xmalloc((size_t)nl * sizeof(float) + 1);
    attn_forward_init(&s0, o_ref, lse_ref);
    float *d_o[4], *d_lse[4];
    for (int run = 0; run < 4; run++) {
        d_o[run] = poisoned((size_t)nq * sizeof(float));
        d_lse[run] = poisoned((size_t)nl * sizeof(float));
        attn_forward_init_cuda(&s0, d_o[run], d_lse[run], 0);
    }
    SparseWork planned = {0, 0, 0};
#ifdef CUDASIM_KERNEL_COUNTS
    cudasim_kernel_counts_reset();
#endif
    int64_t *kpos = xmalloc((size_t)c->n * sizeof(int64_t) + 1);
    uint16_t *ck = xmalloc((size_t)(c->n * w + 1) * sizeof(uint16_t)), *cv = xmalloc((size_t)(c->n * w + 1) * sizeof(uint16_t));
    float *ckf = xmalloc((size_t)(c->n * w + 1) * sizeof(float)), *cvf = xmalloc((size_t)(c->n * w + 1) * sizeof(float));
    uint16_t *d_k[8], *d_v[8];
    int64_t *d_kpos[8], Tk[8];
    CHECK(c->world <= 8, "gpu_test_sm90: at most 8 chunks");
    for (int i = 0; i < c->world; i++) {
        Tk[i] = sparse_chunk(sc, i, kpos);
        for (int64_t t = 0; t < Tk[i]; t++) {
            memcpy(ck + t * w, k + kpos[t] * w, (size_t)w * sizeof(uint16_t));
            memcpy(cv + t * w, v + kpos[t] * w, (size_t)w * sizeof(uint16_t));
            memcpy(ckf + t * w, kf + kpos[t] * w, (size_t)w * sizeof(float));
            memcpy(cvf + t * w, vf + kpos[t] * w, (size_t)w * sizeof(float));
        }
        const AttnShape s = sparse_shape(sc, Tq, Tk[i]);
        attn_sparse_forward_cpu(&s, &index, qf, qpos, ckf, cvf, kpos, o_ref, lse_ref);
        d_k[i] = to_device(ck, (size_t)(Tk[i] * w) * sizeof(uint16_t));
        d_v[i] = to_device(cv, (size_t)(Tk[i] * w) * sizeof(uint16_t));
        d_kpos[i] = to_device(kpos, (size_t)Tk[i] * sizeof(int64_t));
        for (int run = 0; run < 2; run++)
            attn_sparse_forward_part_sm90(SPARSE_ALL, &s, &d_index, d_q, d_qpos, d_k[i], d_v[i], d_kpos[i], d_o[run],
                                          d_lse[run], 0);
        sparse_planned(sc, &index, SPARSE_ALL, qpos, qfirst, Tq, kpos, Tk[i], &planned);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
#ifdef CUDASIM_KERNEL_COUNTS
    cudasimKernelCounts kc;
    cudasim_kernel_counts("flash_sm90_sparse_forward_kernel", &kc);
    EXPECT_COUNTED(kc.wgmma == 2 * planned.wgmma && kc.tma_bytes == 2 * planned.tma_bytes &&
                   kc.cp_async_bytes == 2 * planned.cp_async_bytes,
                   "%s work: %llu wgmma (planned %llu), %llu TMA bytes (planned %llu), %llu cp.async bytes (planned "
                   "%llu)", name, kc.wgmma, 2 * planned.wgmma, kc.tma_bytes, 2 * planned.tma_bytes, kc.cp_async_bytes,
                   2 * planned.cp_async_bytes);
    EXPECT_COUNTED(kc.cp_async_wavefronts == kc.cp_async_wavefronts_min, "%s cp.async wavefronts at their minimum "
                   "(%llu/%llu)", name, kc.cp_async_wavefronts, kc.cp_async_wavefronts_min);
#endif
    for (int i = 0; i < c->world; i++) {
        const AttnShape s = sparse_shape(sc, Tq, Tk[i]);
        attn_sparse_forward_part_cuda(SPARSE_ALL, &s, &d_index, d_q, d_qpos, d_k[i], d_v[i], d_kpos[i], d_o[2],
                                      d_lse[2], 0);
        attn_sparse_forward_part_sm90(SPARSE_BLOCKS, &s, &d_index, d_q, d_qpos, d_k[i], d_v[i], d_kpos[i], d_o[3],
                                      d_lse[3], 0);
    }
    int64_t *cpos, *d_cpos;
    uint16_t *d_ck, *d_cv;
    const int64_t ncol = gather_columns(sc, &index, k, v, &cpos, &d_cpos, &d_ck, &d_cv);
    const AttnShape sc_cols = sparse_shape(sc, Tq, ncol);
    attn_sparse_forward_part_sm90(SPARSE_COLUMNS, &sc_cols, &d_index, d_q, d_qpos, d_ck, d_cv, d_cpos, d_o[3],
                                  d_lse[3], 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    float *o[4], *lse[4];
    for (int run = 0; run < 4; run++) {
        o[run] = from_device_f32(d_o[run], nq);
        lse[run] = from_device_f32(d_lse[run], nl);
    }
    // Against the CPU (runs 0 and 3) and the mma.sync kernel (run 2): O and LSE relative errors.
    const float *want[4] = {o_ref, NULL, o[2], o_ref}, *want_lse[4] = {lse_ref, NULL, lse[2], lse_ref};
    double eo[4] = {0}, el[4] = {0};
    for (int run = 0; run < 4; run++)
        if (want[run]) {
            eo[run] = rel_frobenius(run == 2 ? o[0] : o[run], want[run], nq);
            el[run] = rel_frobenius(run == 2 ? lse[0] : lse[run], want_lse[run], nl);
        }
    EXPECT_COUNTED(eo[0] <= TOL && el[0] <= TOL_LSE, "%s O rel %.2e, LSE rel %.2e against the CPU", name, eo[0], el[0]);
    EXPECT_COUNTED(memcmp(o[0], o[1], (size_t)nq * sizeof(float)) == 0 &&
                   memcmp(lse[0], lse[1], (size_t)nl * sizeof(float)) == 0, "%s repeatable", name);
    EXPECT_COUNTED(eo[2] <= TOL_MMA && el[2] <= TOL_LSE, "%s O rel %.2e, LSE rel %.2e against the mma.sync sparse "
                   "forward", name, eo[2], el[2]);
    EXPECT_COUNTED(eo[3] <= TOL && el[3] <= TOL_LSE, "%s ring parts (blocks per chunk, then %lld gathered columns): "
                   "O rel %.2e, LSE rel %.2e against the CPU", name, (long long)ncol, eo[3], el[3]);

    for (int run = 0; run < 4; run++) {
        CUDA_CHECK(cudaFree(d_o[run])); CUDA_CHECK(cudaFree(d_lse[run]));
        free(o[run]); free(lse[run]);
    }
    for (int i = 0; i < c->world; i++) {
        CUDA_CHECK(cudaFree(d_k[i])); CUDA_CHECK(cudaFree(d_v[i])); CUDA_CHECK(cudaFree(d_kpos[i]));
    }
    CUDA_CHECK(cudaFree(d_cpos)); CUDA_CHECK(cudaFree(d_ck)); CUDA_CHECK(cudaFree(d_cv));
    CUDA_CHECK(cudaFree(d_q)); CUDA_CHECK(cudaFree(d_qpos));
    sparse_index_free_cuda(&d_index);
    sparse_index_free(&index);
    free(cpos); free(kpos); free(ck); free(cv); free(ckf); free(cvf);
    free(qpos); free(qfirst); free(q); free(k); free(v); free(qf); free(kf); free(vf); free(o_ref); free(lse_ref);
}

// The Hopper variant of `kind` at head dim d (the registry has one per head dim).
static const AttnVariant *hopper_variant(AttnVariantKind kind, int d) {
    for (int i = 0; i < attn_variant_count; i++)
        if (attn_variants[i].kind == kind && attn_variants[i].head_dim == d && attn_variants[i].isa == ATTN_ISA_SM90)
            return &attn_variants[i];
    return NULL;
}

static const char *name_of(AttnChoice c) { return c.variant ? c.variant->name : "none"; }

// attn_variant_choose under each attention.kernels, with and without a sweep row that names the Hopper forward.
static void test_choice(void) {
    const AttnChoiceRow none[] = {{0, 0, ATTN_DENSE_FORWARD, NULL, 0, NULL}};
    const AttnVariant *h64 = hopper_variant(ATTN_DENSE_FORWARD, 64);
    EXPECT_COUNTED(h64 && hopper_variant(ATTN_DENSE_FORWARD, 128),
                   "choice: the registry has the Hopper forward at head dims 64 and 128");
    if (!h64) return;
    const AttnChoiceRow hopper_row[] = {{90, 64, ATTN_DENSE_FORWARD, h64->name, 500.0, "TEST"},
                                        {0, 0, ATTN_DENSE_FORWARD, NULL, 0, NULL}};
    const AttnChoiceRow mma_row[] = {{90, 64, ATTN_DENSE_FORWARD, "dense_fwd_d64_q128_k64_w4_s2", 300.0, "TEST"},
                                     {0, 0, ATTN_DENSE_FORWARD, NULL, 0, NULL}};
    for (int d = 64; d <= 128; d += 64)
        for (int k = 0; k < 4; k++) {
            const AttnChoice a80 = attn_variant_choose(none, (AttnVariantKind)k, d, 80, ATTN_KERNELS_AUTO);
            const AttnChoice a90 = attn_variant_choose(none, (AttnVariantKind)k, d, 90, ATTN_KERNELS_AUTO);
            EXPECT_COUNTED(a80.variant && a80.variant->isa == ATTN_ISA_MMA_SYNC && a80.by == ATTN_CHOSEN_PREDICTED &&
                           a80.tflops > 0 && a90.variant && a90.variant->isa == ATTN_ISA_MMA_SYNC &&
                           a90.by == ATTN_CHOSEN_PREDICTED,
                           "choice: kind %d head dim %d under auto without a sweep row: the cost model's mma.sync "
                           "variant on sm_80 (%s) and sm_90 (%s)", k, d, name_of(a80), name_of(a90));
            const AttnChoice s90 = attn_variant_choose(none, (AttnVariantKind)k, d, 90, ATTN_KERNELS_SM90);
            const AttnVariant *want = hopper_variant((AttnVariantKind)k, d);
            EXPECT_COUNTED(want ? s90.variant == want && s90.by == ATTN_CHOSEN_BY_CONFIG
                                : s90.variant == a90.variant && s90.by == ATTN_CHOSEN_PREDICTED,
                           "choice: kind %d head dim %d under sm90 on sm_90: %s (got %s)", k, d,
                           want ? want->name : "the mma.sync one (no Hopper variant)", name_of(s90));
        }
    AttnChoice c = attn_variant_choose(hopper_row, ATTN_DENSE_FORWARD, 64, 90, ATTN_KERNELS_AUTO);
    EXPECT_COUNTED(c.variant == h64 && c.by == ATTN_CHOSEN_MEASURED && c.tflops == 500.0,
                   "choice: auto on sm_90 runs the Hopper forward its sweep row chose (%s)", name_of(c));
    c = attn_variant_choose(hopper_row, ATTN_DENSE_FORWARD, 128, 90, ATTN_KERNELS_AUTO);
    EXPECT_COUNTED(c.variant && c.variant->isa == ATTN_ISA_MMA_SYNC && c.by == ATTN_CHOSEN_PREDICTED,
                   "choice: a row at head dim 64 leaves 128 to the cost model (%s)", name_of(c));
    c = attn_variant_choose(hopper_row, ATTN_DENSE_FORWARD, 64, 80, ATTN_KERNELS_AUTO);
    EXPECT_COUNTED(c.variant && c.variant->isa == ATTN_ISA_MMA_SYNC && c.by == ATTN_CHOSEN_PREDICTED,
                   "choice: sm_90's row does not choose for sm_80 (%s)", name_of(c));
    c = attn_variant_choose(hopper_row, ATTN_DENSE_FORWARD, 64, 90, ATTN_KERNELS_SM80);
    EXPECT_COUNTED(c.variant && c.variant->isa == ATTN_ISA_MMA_SYNC && c.by == ATTN_CHOSEN_PREDICTED,
                   "choice: sm80 overrides a row that chose the Hopper forward (%s)", name_of(c));
    c = attn_variant_choose(mma_row, ATTN_DENSE_FORWARD, 64, 90, ATTN_KERNELS_AUTO);
    EXPECT_COUNTED(c.variant && !strcmp(c.variant->name, mma_row[0].variant) && c.by == ATTN_CHOSEN_MEASURED,
                   "choice: auto on sm_90 runs the mma.sync forward its sweep row chose (%s)", name_of(c));
    c = attn_variant_choose(mma_row, ATTN_DENSE_FORWARD, 64, 90, ATTN_KERNELS_SM90);
    EXPECT_COUNTED(c.variant == h64 && c.by == ATTN_CHOSEN_BY_CONFIG,
                   "choice: sm90 overrides a row that chose the mma.sync forward (%s)", name_of(c));
    c = attn_variant_choose(none, ATTN_DENSE_FORWARD, 96, 90, ATTN_KERNELS_AUTO);
    EXPECT_COUNTED(!c.variant, "choice: no variant at head dim 96 (%s)", name_of(c));
}

int main(int argc, char **argv) {
    const int backward_only = argc == 2 && strcmp(argv[1], "backward") == 0;
    const int sparse_only = argc == 2 && strcmp(argv[1], "sparse") == 0;
    CHECK(argc == 1 || (argc == 2 && (strcmp(argv[1], "small") == 0 || backward_only || sparse_only)),
          "usage: %s [small | backward | sparse]", argv[0]);
#ifdef CUDASIM_KERNEL_COUNTS
    setenv("CUDASIM_SM", "90", 1);                 // the sim's device: an H100
#endif
    test_choice();
    AttnShape probe = {1, 1, 1, 1, 128, 64, 1.0f, NULL, 0, NULL};
    const char *why = attn_sm90_unsupported(&probe);
    if (why) {
        printf("skip gpu_test_sm90: %s\n", why);
        return 0;
    }
    d_doc_starts = to_device(DOC_STARTS, sizeof DOC_STARTS);
    // {n, D, Hq, Hkv, world, rank, docs}
    static const Case cases[] = {
        {200, 128, 4, 2, 1, 0, 0},
        {300, 128, 3, 1, 2, 1, 1},
        {130, 64, 2, 2, 1, 0, 1},
        {256, 64, 2, 1, 3, 2, 0},
    };
    const int count = (int)(sizeof cases / sizeof cases[0]);
    // {{n, D, Hq, Hkv, world, rank, docs}, B, vertical, slash}: a short last block, GQA 2 and 3, rows of up to
    // 4 gathered tiles in a call, a last block of 128 with one consumer's queries, documents, 1 to 3 chunks.
    static const SparseCase sparse_cases[] = {
        {{300, 64, 2, 1, 1, 0, 0}, 64, 0.05, 0.005},
        {{1000, 64, 2, 2, 1, 0, 0}, 64, 0.3, 0.002},
        {{520, 128, 3, 1, 2, 0, 1}, 128, 0.1, 0.01},
        {{700, 128, 2, 1, 3, 2, 1}, 64, 0.04, 0.004},
    };
    const int sparse_count = (int)(sizeof sparse_cases / sizeof sparse_cases[0]);
    for (int i = 0; i < count && !backward_only && !sparse_only; i++) run_case(&cases[i], 2000 + i);
    for (int i = 0; i < count && !sparse_only; i++) run_backward_case(&cases[i], 3000 + i);
    for (int i = 0; i < sparse_count && !backward_only; i++) run_sparse_case(&sparse_cases[i], 4000 + i);
    printf("%d cases: %d passed, %d failed\n", count + sparse_count, checks - check_failures, check_failures);
    return check_exit();
}
