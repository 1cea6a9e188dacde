// gpu_test_attention.c: the CUDA dense flash attention (attention/kernels/flash_cuda.cu)
// against the CPU kernels (attention/kernels/flash_cpu.c) on the same bf16-rounded
// inputs, fresh random ones per case: lengths that are not multiples of the
// tiles, head dims 64 and 128, GQA ratios 1, 2, 4 and 8, and key chunks taken
// from a striped layout (attention/layout.h) merged in ring order, so rows that
// see nothing of a chunk occur; with documents (data.doc_mask) of DOC_STARTS:
// documents crossing tile boundaries, one-token documents, positions before
// the first document, and query tiles that see no key of earlier key tiles
// (a document starting at a tile boundary). Needs a GPU; run by `make
// test-gpu` and under the sim (tests/sim/test_sim.sh).
//   build/tests/gpu_test_attention         every case
//   build/tests/gpu_test_attention small   the small cases (compute-sanitizer)
//
// Tolerance: relative Frobenius error ||gpu - cpu|| / ||cpu|| <= 1e-2 for O
// (bf16), delta, dQ, dK and dV (bf16 P and dS in the tensor-core products),
// 1e-4 for the fp32 LSE. Outputs are poisoned (NaN) before each kernel
// writes them; the accumulated gradients start from random values (the same
// on both sides) and their increments are compared. The forward has no
// atomics, so two runs must agree bit for bit (a race would show here).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/attention.h"
#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/layout.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"

#define TOL 1e-2
#define TOL_LSE 1e-4
#define LAYOUT_BLOCK 64      // tokens per layout block (striped chunks)

// Document starts of the cases with documents (those below the sequence's
// length): positions 0..2 before the first document; [5, 6) and [256, 257)
// one token; [6, 129) and [129, 200) across tile boundaries (32, 64, 128),
// so a query tile holds queries of a document that covers whole earlier key
// tiles and queries that see none of them; 256 at a tile boundary, so whole
// key tiles lie before every document of a query tile.
static const int64_t DOC_STARTS[] = {3, 5, 6, 129, 200, 256, 257, 1000, 2050, 4000};

#include "attn_case.h"

// One key chunk: positions and bf16 K, V (host bits, fp32 values, device copies).
typedef struct {
    int64_t T;
    int64_t *pos;
    uint16_t *k, *v;
    float *kf, *vf;
    int64_t *d_pos;
    uint16_t *d_k, *d_v;
} Chunk;

// Forward of every chunk on the GPU into fresh (poisoned, then initialised)
// o_acc and lse; returns o_acc on the device.
static float *gpu_forward(const Case *c, int64_t Tq, const uint16_t *d_q, const int64_t *d_qpos,
                          const Chunk *ch, int nch, float *d_lse) {
    float *d_oacc = poisoned((size_t)(Tq * c->Hq * c->D) * sizeof(float));
    const AttnShape s0 = shape_of(c, Tq, 0);
    attn_forward_init_cuda(&s0, d_oacc, d_lse, 0);
    for (int i = 0; i < nch; i++) {
        const AttnShape s = shape_of(c, Tq, ch[i].T);
        attn_dense_forward_cuda(&s, d_q, d_qpos, ch[i].d_k, ch[i].d_v, ch[i].d_pos, d_oacc, d_lse, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return d_oacc;
}

static void run_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv;
    char name[160];
    snprintf(name, sizeof name, "N=%lld D=%d Hq=%d Hkv=%d chunks=%d%s", (long long)c->n, D, Hq, Hkv,
             c->world, c->docs ? " documents" : "");

    // Positions: the queries' and each chunk's, in ring order (own rank first).
    const int nch = c->world;
    int64_t *qpos = xmalloc((size_t)c->n * sizeof(int64_t));
    const int64_t Tq = case_chunk_positions(c, 0, qpos);
    Chunk *ch = xcalloc((size_t)nch, sizeof(Chunk));
    for (int i = 0; i < nch; i++) {
        ch[i].pos = xmalloc((size_t)c->n * sizeof(int64_t) + 1);
        ch[i].T = case_chunk_positions(c, i, ch[i].pos);
        random_bf16(&rng, ch[i].T * Hkv * D, &ch[i].k, &ch[i].kf);
        random_bf16(&rng, ch[i].T * Hkv * D, &ch[i].v, &ch[i].vf);
        ch[i].d_pos = to_device(ch[i].pos, (size_t)ch[i].T * sizeof(int64_t));
        ch[i].d_k = to_device(ch[i].k, (size_t)(ch[i].T * Hkv * D) * sizeof(uint16_t));
        ch[i].d_v = to_device(ch[i].v, (size_t)(ch[i].T * Hkv * D) * sizeof(uint16_t));
    }
    const int64_t nq = Tq * Hq * D, nl = Hq * Tq;
    uint16_t *q, *dout;
    float *qf, *doutf;
    random_bf16(&rng, nq, &q, &qf);
    random_bf16(&rng, nq, &dout, &doutf);
    float *dq0 = random_f32(&rng, nq);                 // gradients start from these

    // CPU reference on the same bf16 values.
    float *o_ref = xmalloc((size_t)nq * sizeof(float) + 1), *lse_ref = xmalloc((size_t)nl * sizeof(float) + 1);
    float *delta_ref = xmalloc((size_t)nl * sizeof(float) + 1), *dq_ref = xmalloc((size_t)nq * sizeof(float) + 1);
    const AttnShape s0 = shape_of(c, Tq, 0);
    attn_forward_init(&s0, o_ref, lse_ref);
    for (int i = 0; i < nch; i++) {
        const AttnShape s = shape_of(c, Tq, ch[i].T);
        attn_dense_forward_cpu(&s, qf, qpos, ch[i].kf, ch[i].vf, ch[i].pos, o_ref, lse_ref);
    }
    attn_backward_delta(&s0, o_ref, doutf, delta_ref);
    memcpy(dq_ref, dq0, (size_t)nq * sizeof(float));

    // GPU forward (twice: no atomics there, so the results must be identical).
    uint16_t *d_q = to_device(q, (size_t)nq * sizeof(uint16_t));
    uint16_t *d_dout = to_device(dout, (size_t)nq * sizeof(uint16_t));
    int64_t *d_qpos = to_device(qpos, (size_t)Tq * sizeof(int64_t));
    float *d_lse = poisoned((size_t)nl * sizeof(float));
    float *d_oacc = gpu_forward(c, Tq, d_q, d_qpos, ch, nch, d_lse);
    float *oacc1 = from_device_f32(d_oacc, nq), *lse1 = from_device_f32(d_lse, nl);
    CUDA_CHECK(cudaFree(d_oacc));
    CUDA_CHECK(cudaMemset(d_lse, 0xff, (size_t)nl * sizeof(float)));
    d_oacc = gpu_forward(c, Tq, d_q, d_qpos, ch, nch, d_lse);
    float *oacc2 = from_device_f32(d_oacc, nq);
    EXPECT_COUNTED(memcmp(oacc1, oacc2, (size_t)nq * sizeof(float)) == 0, "%s forward repeatable", name);

    uint16_t *d_o = poisoned((size_t)nq * sizeof(uint16_t));
    attn_output_bf16_cuda(&s0, d_oacc, d_o, 0);
    float *d_delta = poisoned((size_t)nl * sizeof(float));
    attn_backward_delta_cuda(&s0, d_o, d_dout, d_delta, 0);
    float *d_dq = to_device(dq0, (size_t)nq * sizeof(float));
    float **dk0 = xmalloc((size_t)nch * sizeof(float *)), **dv0 = xmalloc((size_t)nch * sizeof(float *));
    float **d_dk = xmalloc((size_t)nch * sizeof(float *)), **d_dv = xmalloc((size_t)nch * sizeof(float *));
    for (int i = 0; i < nch; i++) {
        const int64_t nk = ch[i].T * Hkv * D;
        dk0[i] = random_f32(&rng, nk);
        dv0[i] = random_f32(&rng, nk);
        d_dk[i] = to_device(dk0[i], (size_t)nk * sizeof(float));
        d_dv[i] = to_device(dv0[i], (size_t)nk * sizeof(float));
        const AttnShape s = shape_of(c, Tq, ch[i].T);
        attn_dense_backward_cuda(&s, d_q, d_qpos, ch[i].d_k, ch[i].d_v, ch[i].d_pos, d_lse, d_delta,
                                 d_dout, d_dq, d_dk[i], d_dv[i], 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());

    float *o = from_device_bf16(d_o, nq), *lse = from_device_f32(d_lse, nl);
    float *delta = from_device_f32(d_delta, nl), *dq = from_device_f32(d_dq, nq);
    EXPECT_COUNTED(memcmp(lse1, lse, (size_t)nl * sizeof(float)) == 0, "%s lse repeatable", name);
    double e;
    EXPECT_COUNTED((e = rel_frobenius(o, o_ref, nq)) <= TOL, "%s O rel %.2e", name, e);
    EXPECT_COUNTED((e = rel_frobenius(lse, lse_ref, nl)) <= TOL_LSE, "%s LSE rel %.2e", name, e);
    EXPECT_COUNTED((e = rel_frobenius(delta, delta_ref, nl)) <= TOL, "%s delta rel %.2e", name, e);

    // CPU backward with its own lse and delta; compare the increments.
    double dk_diff = 0, dk_norm = 0, dv_diff = 0, dv_norm = 0;
    for (int i = 0; i < nch; i++) {
        const int64_t nk = ch[i].T * Hkv * D;
        float *dk_ref = xmalloc((size_t)nk * sizeof(float) + 1), *dv_ref = xmalloc((size_t)nk * sizeof(float) + 1);
        memcpy(dk_ref, dk0[i], (size_t)nk * sizeof(float));
        memcpy(dv_ref, dv0[i], (size_t)nk * sizeof(float));
        const AttnShape s = shape_of(c, Tq, ch[i].T);
        attn_dense_backward_cpu(&s, qf, qpos, ch[i].kf, ch[i].vf, ch[i].pos, lse_ref, delta_ref, doutf,
                                dq_ref, dk_ref, dv_ref);
        float *dk = from_device_f32(d_dk[i], nk), *dv = from_device_f32(d_dv[i], nk);
        subtract(dk, dk0[i], nk); subtract(dk_ref, dk0[i], nk);
        subtract(dv, dv0[i], nk); subtract(dv_ref, dv0[i], nk);
        // Per-chunk errors combined into one Frobenius norm over all chunks.
        double ek = rel_frobenius(dk, dk_ref, nk), ev = rel_frobenius(dv, dv_ref, nk);
        double nkr = 0, nvr = 0;
        for (int64_t j = 0; j < nk; j++) { nkr += (double)dk_ref[j] * dk_ref[j]; nvr += (double)dv_ref[j] * dv_ref[j]; }
        dk_diff += ek * ek * nkr; dk_norm += nkr;
        dv_diff += ev * ev * nvr; dv_norm += nvr;
        free(dk_ref); free(dv_ref); free(dk); free(dv);
    }
    subtract(dq, dq0, nq);
    subtract(dq_ref, dq0, nq);
    EXPECT_COUNTED((e = rel_frobenius_floor(dq, dq_ref, nq, GRAD_FLOOR)) <= TOL, "%s dQ rel %.2e", name, e);
    EXPECT_COUNTED((e = sqrt(dk_diff / (dk_norm + 1e-30))) <= TOL, "%s dK rel %.2e", name, e);
    EXPECT_COUNTED((e = sqrt(dv_diff / (dv_norm + 1e-30))) <= TOL, "%s dV rel %.2e", name, e);

    for (int i = 0; i < nch; i++) {
        CUDA_CHECK(cudaFree(ch[i].d_pos)); CUDA_CHECK(cudaFree(ch[i].d_k)); CUDA_CHECK(cudaFree(ch[i].d_v));
        CUDA_CHECK(cudaFree(d_dk[i])); CUDA_CHECK(cudaFree(d_dv[i]));
        free(ch[i].pos); free(ch[i].k); free(ch[i].v); free(ch[i].kf); free(ch[i].vf);
        free(dk0[i]); free(dv0[i]);
    }
    CUDA_CHECK(cudaFree(d_q)); CUDA_CHECK(cudaFree(d_dout)); CUDA_CHECK(cudaFree(d_qpos));
    CUDA_CHECK(cudaFree(d_lse)); CUDA_CHECK(cudaFree(d_oacc)); CUDA_CHECK(cudaFree(d_o));
    CUDA_CHECK(cudaFree(d_delta)); CUDA_CHECK(cudaFree(d_dq));
    free(ch); free(dk0); free(dv0); free(d_dk); free(d_dv); free(qpos);
    free(q); free(qf); free(dout); free(doutf); free(dq0);
    free(o_ref); free(lse_ref); free(delta_ref); free(dq_ref);
    free(oacc1); free(oacc2); free(lse1); free(o); free(lse); free(delta); free(dq);
}

int main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    CHECK(argc == 1 || small, "usage: %s [small]", argv[0]);
    d_doc_starts = to_device(DOC_STARTS, sizeof DOC_STARTS);
    // {n, D, Hq, Hkv, world, rank, docs}
    static const Case cases[] = {
        {1, 64, 2, 2, 1, 0, 0},
        {17, 128, 4, 2, 1, 0, 0},
        {100, 64, 8, 1, 1, 0, 0},
        {100, 128, 4, 4, 2, 1, 0},
        {300, 64, 4, 1, 3, 0, 0},
        {300, 128, 4, 2, 1, 0, 0},
        {6, 64, 2, 1, 1, 0, 1},
        {300, 64, 2, 1, 1, 0, 1},
        {300, 128, 2, 2, 3, 1, 1},
        {1000, 128, 8, 1, 3, 2, 0},
        {1000, 64, 4, 2, 1, 0, 0},
        {1000, 128, 2, 2, 2, 0, 0},
        {1000, 128, 4, 2, 1, 0, 1},
        {4099, 128, 16, 2, 1, 0, 0},
        {4099, 64, 8, 8, 3, 1, 0},
        {4099, 64, 8, 2, 1, 0, 1},
    };
    int count = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (small && cases[i].n > 300) continue;
        run_case(&cases[i], 1000 + i);
        count++;
    }
    printf("%d cases: %d passed, %d failed\n", count, checks - check_failures, check_failures);
    return check_exit();
}
