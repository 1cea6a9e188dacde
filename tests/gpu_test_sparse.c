// gpu_test_sparse.c: the CUDA block-sparse + vertical-column flash attention
// (attention/sparse_cuda.cu) against the CPU sparse kernels
// (attention/sparse_flash_cpu.c) on the same bf16-rounded inputs and the same
// index, fresh random ones per case: random vertical-slash patterns turned
// into an index by sparse_index_build, lengths that are not multiples of the
// block, blocks 64 and 128, head dims 64 and 128, GQA 1, 2 and 8, 1 to 3 key
// chunks of a striped layout (block = the index's block) merged in ring
// order. Also: the all-blocks index (every slash offset) against the dense
// CUDA kernels on the same inputs. Needs a GPU; run by `make test-gpu`.
//   build/tests/gpu_test_sparse         every case
//   build/tests/gpu_test_sparse small   the small cases (compute-sanitizer)
//
// Tolerances as gpu_test_attention.c: relative Frobenius error <= 1e-2 for O,
// delta, dQ, dK, dV and 1e-4 for the LSE against the CPU; sparse (all blocks)
// against dense on the GPU: 1e-3 (same bf16 roundings, other sum orders).
// Outputs are poisoned (NaN) before the kernels write them; gradients start
// from random values and their increments are compared; the forward has no
// atomics, so two runs must agree bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attention/attention.h"
#include "../attention/attention_cuda.h"
#include "../attention/layout.h"
#include "../attention/sparse.h"
#include "../attention/sparse_cuda.h"
#include "../dist/cuda_check.h"
#include "../dist/util.h"
#include "check.h"
#include "gpu_common.h"

#define TOL 1e-2
#define TOL_LSE 1e-4
#define TOL_DENSE 1e-3

typedef struct {
    int64_t n;       // sequence length
    int D, Hq, Hkv, B;
    int world;       // 1: queries and keys are the whole sequence; else striped chunks
    int rank;        // the queries' rank; chunks come in ring order from it
    double density;  // probability of each vertical line and slash line; < 0: all blocks
} Case;

// The inputs of one case: queries (rank's tokens) and the key chunks in ring
// order; host bf16 bits, their fp32 values, device copies.
typedef struct {
    int64_t Tq, nq;
    int64_t *qpos, *d_qpos;
    uint16_t *q, *dout, *d_q, *d_dout;
    float *qf, *doutf;
    int nch;
    int64_t *T, **pos, **d_pos;
    uint16_t **k, **v, **d_k, **d_v;
    float **kf, **vf;
} Inputs;

// Forward and backward results, host fp32: O (bf16 values), LSE, delta, and
// the increments of dQ and of every chunk's dK, dV (chunks concatenated).
typedef struct {
    float *o, *lse, *delta, *dq, *dk, *dv;
} Results;

static AttnShape shape_of(const Case *c, int64_t Tq, int64_t Tk) {
    return (AttnShape){Tq, Tk, c->Hq, c->Hkv, c->D, c->B, 1.0f / sqrtf((float)c->D)};
}

static int64_t total_keys(const Inputs *in) {
    int64_t n = 0;
    for (int i = 0; i < in->nch; i++) n += in->T[i];
    return n;
}

static Inputs make_inputs(const Case *c, Rng *rng) {
    Inputs in = {.nch = c->world};
    in.qpos = xmalloc((size_t)c->n * sizeof(int64_t));
    in.Tq = layout_rank_positions(LAYOUT_STRIPED, c->n, c->B, c->world, c->rank, in.qpos);
    in.nq = in.Tq * c->Hq * c->D;
    in.T = xmalloc((size_t)in.nch * sizeof(int64_t));
    in.pos = xmalloc((size_t)in.nch * sizeof(int64_t *));
    in.d_pos = xmalloc((size_t)in.nch * sizeof(int64_t *));
    in.k = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.v = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.d_k = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.d_v = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.kf = xmalloc((size_t)in.nch * sizeof(float *));
    in.vf = xmalloc((size_t)in.nch * sizeof(float *));
    for (int i = 0; i < in.nch; i++) {
        const int r = ((c->rank - i) % c->world + c->world) % c->world;
        in.pos[i] = xmalloc((size_t)c->n * sizeof(int64_t));
        in.T[i] = layout_rank_positions(LAYOUT_STRIPED, c->n, c->B, c->world, r, in.pos[i]);
        const int64_t nk = in.T[i] * c->Hkv * c->D;
        random_bf16(rng, nk, &in.k[i], &in.kf[i]);
        random_bf16(rng, nk, &in.v[i], &in.vf[i]);
        in.d_pos[i] = to_device(in.pos[i], (size_t)in.T[i] * sizeof(int64_t));
        in.d_k[i] = to_device(in.k[i], (size_t)nk * sizeof(uint16_t));
        in.d_v[i] = to_device(in.v[i], (size_t)nk * sizeof(uint16_t));
    }
    random_bf16(rng, in.nq, &in.q, &in.qf);
    random_bf16(rng, in.nq, &in.dout, &in.doutf);
    in.d_q = to_device(in.q, (size_t)in.nq * sizeof(uint16_t));
    in.d_dout = to_device(in.dout, (size_t)in.nq * sizeof(uint16_t));
    in.d_qpos = to_device(in.qpos, (size_t)in.Tq * sizeof(int64_t));
    return in;
}

static void free_inputs(Inputs *in) {
    for (int i = 0; i < in->nch; i++) {
        CUDA_CHECK(cudaFree(in->d_pos[i])); CUDA_CHECK(cudaFree(in->d_k[i])); CUDA_CHECK(cudaFree(in->d_v[i]));
        free(in->pos[i]); free(in->k[i]); free(in->v[i]); free(in->kf[i]); free(in->vf[i]);
    }
    CUDA_CHECK(cudaFree(in->d_q)); CUDA_CHECK(cudaFree(in->d_dout)); CUDA_CHECK(cudaFree(in->d_qpos));
    free(in->T); free(in->pos); free(in->d_pos); free(in->k); free(in->v); free(in->d_k); free(in->d_v);
    free(in->kf); free(in->vf); free(in->qpos); free(in->q); free(in->dout); free(in->qf); free(in->doutf);
}

static void free_results(Results *r) {
    free(r->o); free(r->lse); free(r->delta); free(r->dq); free(r->dk); free(r->dv);
}

// A random vertical-slash pattern (each line with probability `density`,
// offset 0 always; density < 0: every offset, i.e. every causal block) and
// its index for the queries' blocks.
static void make_index(const Case *c, const Inputs *in, Rng *rng, SparseIndex *index) {
    const int64_t N = c->n;
    SparsePattern p = {.num_heads = c->Hq, .seq_len = N};
    p.vertical_start = xmalloc((size_t)(c->Hq + 1) * sizeof(int64_t));
    p.slash_start = xmalloc((size_t)(c->Hq + 1) * sizeof(int64_t));
    p.vertical = xmalloc((size_t)(c->Hq * N + 1) * sizeof(int64_t));
    p.slash = xmalloc((size_t)(c->Hq * N + 1) * sizeof(int64_t));
    p.vertical_start[0] = p.slash_start[0] = 0;
    for (int h = 0; h < c->Hq; h++) {
        int64_t nv = p.vertical_start[h], ns = p.slash_start[h];
        for (int64_t i = 0; i < N; i++) {
            if (c->density >= 0 && rng_uniform(rng) < c->density) p.vertical[nv++] = i;
            if (i == 0 || c->density < 0 || rng_uniform(rng) < c->density) p.slash[ns++] = i;
        }
        p.vertical_start[h + 1] = nv;
        p.slash_start[h + 1] = ns;
    }
    const int64_t nqb = (in->Tq + c->B - 1) / c->B;
    int64_t *q_blocks = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) q_blocks[i] = in->qpos[i * c->B] / c->B;
    sparse_index_build(&p, c->B, q_blocks, nqb, index);
    free(q_blocks);
    sparse_pattern_free(&p);
}

// Random starting gradients (the same for every run of a case).
typedef struct {
    float *dq, *dk, *dv;       // [nq], [total keys * Hkv * D] x 2
} Start;

// The CPU sparse kernels over every chunk.
static Results cpu_run(const Case *c, const Inputs *in, const SparseIndex *index, const Start *st) {
    const int64_t nl = in->Tq * c->Hq, nk = total_keys(in) * c->Hkv * c->D;
    Results r = {xmalloc((size_t)in->nq * sizeof(float) + 1), xmalloc((size_t)nl * sizeof(float) + 1),
                 xmalloc((size_t)nl * sizeof(float) + 1), xmalloc((size_t)in->nq * sizeof(float) + 1),
                 xmalloc((size_t)nk * sizeof(float) + 1), xmalloc((size_t)nk * sizeof(float) + 1)};
    const AttnShape s0 = shape_of(c, in->Tq, 0);
    attn_forward_init(&s0, r.o, r.lse);
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        attn_sparse_forward_cpu(&s, index, in->qf, in->qpos, in->kf[i], in->vf[i], in->pos[i], r.o, r.lse);
    }
    attn_backward_delta(&s0, r.o, in->doutf, r.delta);
    memcpy(r.dq, st->dq, (size_t)in->nq * sizeof(float));
    memcpy(r.dk, st->dk, (size_t)nk * sizeof(float));
    memcpy(r.dv, st->dv, (size_t)nk * sizeof(float));
    int64_t off = 0;
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        attn_sparse_backward_cpu(&s, index, in->qf, in->qpos, in->kf[i], in->vf[i], in->pos[i], r.lse,
                                 r.delta, in->doutf, r.dq, r.dk + off, r.dv + off);
        off += in->T[i] * c->Hkv * c->D;
    }
    subtract(r.dq, st->dq, in->nq);
    subtract(r.dk, st->dk, nk);
    subtract(r.dv, st->dv, nk);
    return r;
}

// The GPU forward of every chunk into fresh poisoned (then initialised) o_acc
// and lse: sparse with `index`, dense when it is NULL. Returns o_acc (device).
static float *gpu_forward(const Case *c, const Inputs *in, const SparseIndexCuda *index, float *d_lse) {
    float *d_oacc = poisoned((size_t)in->nq * sizeof(float));
    CUDA_CHECK(cudaMemset(d_lse, 0xff, (size_t)(in->Tq * c->Hq) * sizeof(float)));
    const AttnShape s0 = shape_of(c, in->Tq, 0);
    attn_forward_init_cuda(&s0, d_oacc, d_lse, 0);
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        if (index)
            attn_sparse_forward_cuda(&s, index, in->d_q, in->d_qpos, in->d_k[i], in->d_v[i], in->d_pos[i],
                                     d_oacc, d_lse, 0);
        else
            attn_dense_forward_cuda(&s, in->d_q, in->d_qpos, in->d_k[i], in->d_v[i], in->d_pos[i], d_oacc,
                                    d_lse, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return d_oacc;
}

// Forward (twice: checks that the runs agree bit for bit) and backward on
// the GPU, sparse with `index` or dense when it is NULL.
static Results gpu_run(const Case *c, const Inputs *in, const SparseIndexCuda *index, const Start *st,
                       const char *name) {
    const int64_t nl = in->Tq * c->Hq, nk = total_keys(in) * c->Hkv * c->D;
    float *d_lse = poisoned((size_t)nl * sizeof(float));
    float *d_oacc = gpu_forward(c, in, index, d_lse);
    float *oacc1 = from_device_f32(d_oacc, in->nq), *lse1 = from_device_f32(d_lse, nl);
    CUDA_CHECK(cudaFree(d_oacc));
    d_oacc = gpu_forward(c, in, index, d_lse);
    float *oacc2 = from_device_f32(d_oacc, in->nq), *lse2 = from_device_f32(d_lse, nl);
    EXPECT_COUNTED(memcmp(oacc1, oacc2, (size_t)in->nq * sizeof(float)) == 0 &&
                   memcmp(lse1, lse2, (size_t)nl * sizeof(float)) == 0, "%s forward repeatable", name);

    const AttnShape s0 = shape_of(c, in->Tq, 0);
    uint16_t *d_o = poisoned((size_t)in->nq * sizeof(uint16_t));
    attn_output_bf16_cuda(&s0, d_oacc, d_o, 0);
    float *d_delta = poisoned((size_t)nl * sizeof(float));
    attn_backward_delta_cuda(&s0, d_o, in->d_dout, d_delta, 0);
    float *d_dq = to_device(st->dq, (size_t)in->nq * sizeof(float));
    float *d_dk = to_device(st->dk, (size_t)nk * sizeof(float));
    float *d_dv = to_device(st->dv, (size_t)nk * sizeof(float));
    int64_t off = 0;
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        if (index)
            attn_sparse_backward_cuda(&s, index, in->d_q, in->d_qpos, in->d_k[i], in->d_v[i], in->d_pos[i],
                                      d_lse, d_delta, in->d_dout, d_dq, d_dk + off, d_dv + off, 0);
        else
            attn_dense_backward_cuda(&s, in->d_q, in->d_qpos, in->d_k[i], in->d_v[i], in->d_pos[i], d_lse,
                                     d_delta, in->d_dout, d_dq, d_dk + off, d_dv + off, 0);
        off += in->T[i] * c->Hkv * c->D;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    Results r = {from_device_bf16(d_o, in->nq), lse2, from_device_f32(d_delta, nl),
                 from_device_f32(d_dq, in->nq), from_device_f32(d_dk, nk), from_device_f32(d_dv, nk)};
    subtract(r.dq, st->dq, in->nq);
    subtract(r.dk, st->dk, nk);
    subtract(r.dv, st->dv, nk);
    CUDA_CHECK(cudaFree(d_lse)); CUDA_CHECK(cudaFree(d_oacc)); CUDA_CHECK(cudaFree(d_o));
    CUDA_CHECK(cudaFree(d_delta)); CUDA_CHECK(cudaFree(d_dq)); CUDA_CHECK(cudaFree(d_dk));
    CUDA_CHECK(cudaFree(d_dv));
    free(oacc1); free(oacc2); free(lse1);
    return r;
}

static void compare(const char *name, const char *what, const Results *a, const Results *b, int64_t nq,
                    int64_t nl, int64_t nk, double tol, double tol_lse) {
    double e;
    EXPECT_COUNTED((e = rel_frobenius(a->o, b->o, nq)) <= tol, "%s %s O rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->lse, b->lse, nl)) <= tol_lse, "%s %s LSE rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->delta, b->delta, nl)) <= tol, "%s %s delta rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->dq, b->dq, nq)) <= tol, "%s %s dQ rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->dk, b->dk, nk)) <= tol, "%s %s dK rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->dv, b->dv, nk)) <= tol, "%s %s dV rel %.2e", name, what, e);
}

static void run_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    char name[160];
    snprintf(name, sizeof name, "N=%lld D=%d Hq=%d Hkv=%d B=%d chunks=%d %s", (long long)c->n, c->D, c->Hq,
             c->Hkv, c->B, c->world, c->density < 0 ? "all-blocks" : "random");
    Inputs in = make_inputs(c, &rng);
    SparseIndex index;
    make_index(c, &in, &rng, &index);
    SparseIndexCuda d_index;
    sparse_index_to_cuda(&index, &d_index);
    const int64_t nl = in.Tq * c->Hq, nk = total_keys(&in) * c->Hkv * c->D;
    const Start st = {random_f32(&rng, in.nq), random_f32(&rng, nk), random_f32(&rng, nk)};

    Results cpu = cpu_run(c, &in, &index, &st);
    Results gpu = gpu_run(c, &in, &d_index, &st, name);
    compare(name, "vs CPU", &gpu, &cpu, in.nq, nl, nk, TOL, TOL_LSE);
    if (c->density < 0) {
        Results dense = gpu_run(c, &in, NULL, &st, name);
        compare(name, "vs dense GPU", &gpu, &dense, in.nq, nl, nk, TOL_DENSE, TOL_LSE);
        free_results(&dense);
    }
    free_results(&cpu);
    free_results(&gpu);
    free(st.dq); free(st.dk); free(st.dv);
    sparse_index_free_cuda(&d_index);
    sparse_index_free(&index);
    free_inputs(&in);
}

int main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    CHECK(argc == 1 || small, "usage: %s [small]", argv[0]);
    // {n, D, Hq, Hkv, B, world, rank, density}
    static const Case cases[] = {
        {1, 64, 2, 2, 64, 1, 0, 0.1},
        {100, 128, 4, 2, 64, 1, 0, 0.1},
        {300, 64, 8, 1, 128, 2, 1, 0.1},
        {300, 128, 4, 4, 64, 3, 0, -1},
        {1000, 128, 8, 1, 64, 3, 2, 0.05},
        {1000, 64, 4, 2, 128, 1, 0, 0.05},
        {1000, 128, 2, 2, 128, 2, 0, -1},
        {2500, 128, 16, 2, 128, 3, 1, 0.02},
        {4099, 64, 8, 8, 64, 2, 1, 0.02},
        {4099, 128, 16, 2, 64, 1, 0, -1},
    };
    int count = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (small && cases[i].n > 300) continue;
        run_case(&cases[i], 2000 + i);
        count++;
    }
    printf("%d cases: %d passed, %d failed\n", count, checks - check_failures, check_failures);
    return check_exit();
}
