// gpu_test_sm90.c: the Hopper dense attention forward (attention/kernels/flash_sm90.cu)
// against the CPU kernel (attention/kernels/flash_cpu.c) on the same bf16-rounded
// inputs: head dims 64 and 128, GQA groups of 1, 2 and 3 (one consumer
// warpgroup, two, and two with the last slice of heads half empty), lengths
// that are not multiples of the 64-token tiles, key chunks of a striped layout
// merged in ring order (rows that see nothing of a chunk), documents crossing
// tiles. Also: the work done is the work planned (wgmma instructions and TMA
// bytes from the tiles some query of a tile sees: causal and document tiles
// skipped), no shared-memory wavefront above its minimum, and two runs agree
// bit for bit. And the registry's choice of it (attn_variants.h: under
// auto only where a sweep row chose it, under sm90 always, under sm80 never),
// on any device. The rest needs a GPU of compute capability 9.0 (skipped elsewhere);
// under the sim the device is an H100 (CUDASIM_SM=90). Run by `make test-gpu`
// and under the sim (tests/sim/test_sim.sh).
//   build/tests/gpu_test_sm90 [small]     (every case is small)
//
// Tolerance as gpu_test_attention: ||gpu - cpu|| / ||cpu|| <= 1e-2 for O, 1e-4 for the LSE.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/attention.h"
#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/kernels/attn_variants.h"
#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/kernels/flash_sm90.h"
#include "../../attention/layout.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"

#define TOL 1e-2
#define TOL_LSE 1e-4
#define LAYOUT_BLOCK 32      // tokens per layout block (striped chunks)
#define TILE 64              // the kernel's query and key tiles

// Documents: [0, 3) before the first; [3, 70) across the first tile boundary; a one-token [70, 71);
// [71, 150); [150, 260) from inside one tile to the fifth.
static const int64_t DOC_STARTS[] = {3, 70, 71, 150, 260};

#include "attn_case.h"

// Min and max of x[t0 .. min(t0 + TILE, T)).
static void bounds(const int64_t *x, int64_t t0, int64_t T, int64_t *lo, int64_t *hi) {
    *lo = INT64_MAX;
    *hi = INT64_MIN;
    for (int64_t t = t0; t < T && t < t0 + TILE; t++) {
        if (x[t] < *lo) *lo = x[t];
        if (x[t] > *hi) *hi = x[t];
    }
}

// The key tiles the kernel must load for queries qpos [Tq] (first positions qfirst) against kpos [Tk]: summed
// over the query tiles, the tiles with a key some query of the tile sees by position and document.
static int64_t tiles_seen(const int64_t *qpos, const int64_t *qfirst, int64_t Tq, const int64_t *kpos, int64_t Tk) {
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < Tq; i0 += TILE) {
        int64_t q_lo, q_hi, f_lo, f_hi;
        bounds(qpos, i0, Tq, &q_lo, &q_hi);
        bounds(qfirst, i0, Tq, &f_lo, &f_hi);
        for (int64_t j0 = 0; j0 < Tk; j0 += TILE) {
            int64_t k_lo, k_hi;
            bounds(kpos, j0, Tk, &k_lo, &k_hi);
            n += k_lo <= q_hi && k_hi >= f_lo;
        }
    }
    return n;
}

static void run_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv;
    char name[160];
    snprintf(name, sizeof name, "sm90 N=%lld D=%d Hq=%d Hkv=%d chunks=%d%s", (long long)c->n, D, Hq, Hkv,
             c->world, c->docs ? " documents" : "");

    int64_t *qpos = xmalloc((size_t)c->n * sizeof(int64_t));
    const int64_t Tq = case_chunk_positions(c, 0, qpos);
    const AttnShape s0 = shape_of(c, Tq, 0);
    int64_t *qfirst = xmalloc((size_t)Tq * sizeof(int64_t) + 1);
    for (int64_t t = 0; t < Tq; t++)
        qfirst[t] = s0.doc_count ? attn_doc_first(s0.doc_starts, s0.doc_count, qpos[t]) : INT64_MIN;
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
        tiles += tiles_seen(qpos, qfirst, Tq, kpos, Tk);
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
    CHECK(argc == 1 || (argc == 2 && strcmp(argv[1], "small") == 0), "usage: %s [small]", argv[0]);
#ifdef CUDASIM_KERNEL_COUNTS
    setenv("CUDASIM_SM", "90", 1);                 // the sim's device: an H100
#endif
    test_choice();
    AttnShape probe = {1, 1, 1, 1, 128, 64, 1.0f, NULL, 0, NULL};
    const char *why = attn_sm90_unsupported(&probe);
    if (why) {
        printf("ok gpu_test_sm90 skipped: %s\n", why);
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
    for (int i = 0; i < count; i++) run_case(&cases[i], 2000 + i);
    printf("%d cases: %d passed, %d failed\n", count, checks - check_failures, check_failures);
    return check_exit();
}
