// gpu_test_attention_op.c: the CUDA backend's attention op
// (attention/op/attention_cuda_op.cu) against the CPU backend's attention op
// (backend_cpu()->attention_*, fp32) on the same bf16-rounded inputs, on one
// rank: dense, sparse with top_p = 1 (every line: must equal dense) and
// sparse with fixed budgets, each without and with documents (DOC_STARTS).
// GQA 1, 2 and 7, head dims 64 and 128, lengths that are not multiples of
// the block. Each case runs two layers with different
// inputs and patterns, then recomputes layer 0 (plan = false), which must
// give layer 0's first output bit for bit (the forward has no atomics and
// the layer's index is kept), then the backward of layer 0 accumulates into
// non-zero bf16 dq, dk, dv. Also the sparse statistics: density counts
// (integers) equal to the CPU op's, their causal pairs (with documents: of
// one document) equal to an independent count, recall (estimation rows and
// the recall sample) within 1e-3.
// Needs a GPU (`make test-gpu`), or the sim (tests/sim/test_sim.sh).
//   build/tests/gpu_test_attention_op             every case
//   build/tests/gpu_test_attention_op small       the small cases
//   build/tests/gpu_test_attention_op refuse-block what the op refuses: sparse
//                                                 attention with blocks of 32
//                                                 (exit 1 with one line;
//                                                 tests/sim/test_sim.sh)
//
// Inputs are planted so that the pattern has no near-ties to flip between the
// CPU's and the GPU's fp32 estimation: every query attends strongly (logit
// +6) to a few key positions (vertical lines, inside the last document with
// documents, where the estimation queries are) through dimension 0, and to
// the key at one offset (a slash line) through a block of random +-1 codes;
// the other dimensions are N(0, 1). The fixed budgets take exactly the planted
// lines, which outscore every other line by more than 10x.
//
// Tolerances (relative Frobenius error against the CPU op): O 1e-2 (bf16
// output, 2^-9 per rounding, and bf16 P in the tensor-core P V product, as
// gpu_test_attention.c), LSE 1e-4 (fp32 statistics from identical inputs),
// the increments of dq, dk, dv 2e-2: the kernels' 1e-2 plus one bf16
// rounding of (start + increment) with starts of a quarter of the
// increments' scale (2^-9 of the sum). Sparse top_p = 1 against the GPU's
// own dense op: 1e-3 for O and LSE (same bf16 roundings, other sum orders),
// 2e-2 for the gradients (bf16-rounded sums, atomics in another order).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/attention_api.h"
#include "../../attention/sparse/sparse.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../../model/backend.h"
#include "../lib/check.h"
#include "gpu_common.h"

#define TOL 1e-2
#define TOL_GRAD 2e-2
#define TOL_LSE 1e-4
#define TOL_DENSE 1e-3
#define TOL_RECALL 1e-3
#define PLANT_LOGIT 6.0       // logit of a planted (query, key) pair
#define PLANT_VERTICAL 4      // planted key positions
#define START_SCALE 0.25      // starting gradients: N(0, START_SCALE^2)

typedef enum { KIND_DENSE, KIND_SPARSE_TOPP1, KIND_SPARSE_FIXED } Kind;

typedef struct {
    int64_t T;
    int D, Hq, Hkv, B;
    Kind kind;
    int docs;        // 1: documents at DOC_STARTS; 0: one document
} Case;

// Document starts of the cases with documents: one-token documents at 2 and
// 65, documents across the blocks, the last one past T for the short cases.
static const int64_t DOC_STARTS[] = {2, 3, 40, 65, 66, 150, 500};
#define DOC_COUNT (int64_t)(sizeof DOC_STARTS / sizeof DOC_STARTS[0])

// One layer's inputs: bf16 bits on the host, their fp32 values, device copies.
typedef struct {
    int64_t nq, nk;
    uint16_t *q, *k, *v, *dout, *dq0, *dk0, *dv0;      // dq0, dk0, dv0: starting gradients
    float *qf, *kf, *vf, *doutf, *dq0f, *dk0f, *dv0f;
    uint16_t *d_q, *d_k, *d_v, *d_dout;
} Inputs;

// ---- the CPU backend's op through its table: the only casts to its tensor types ----

static void cpu_forward(AttnState *st, int layer, bool plan, const AttnShape *s, const Inputs *in,
                        const int64_t *pos, float *o, float *lse, SparseStats *stats) {
    backend_cpu()->attention_forward(st, layer, plan, s, (const void *)in->qf, (const void *)in->kf,
                                     (const void *)in->vf, pos, (void *)o, lse, stats);
}

static void cpu_backward(AttnState *st, int layer, const AttnShape *s, const Inputs *in, const int64_t *pos,
                         const float *o, const float *lse, float *dq, float *dk, float *dv) {
    backend_cpu()->attention_backward(st, layer, s, (const void *)in->qf, (const void *)in->kf,
                                      (const void *)in->vf, pos, (const void *)o, lse, (const void *)in->doutf,
                                      (void *)dq, (void *)dk, (void *)dv);
}

// ---- inputs ----

// A random +-1 code of position p, element i (a hash: any position, no table).
static float code(int64_t p, int i) {
    uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 1) * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (x & 1) ? 1.0f : -1.0f;
}

static void to_bf16(const float *x, int64_t n, uint16_t **bits, float **values) {
    *bits = xmalloc((size_t)n * sizeof(uint16_t));
    *values = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        (*bits)[i] = f32_to_bf16(x[i]);
        (*values)[i] = bf16_to_f32((*bits)[i]);
    }
}

// The start of the case's last document (0 without documents).
static int64_t last_document(const Case *c) {
    int64_t first = 0;
    for (int64_t i = 0; c->docs && i < DOC_COUNT; i++)
        if (DOC_STARTS[i] < c->T) first = DOC_STARTS[i];
    return first;
}

// The planted lines of a layer (variant 0 or 1: different lines): key
// positions vertical [PLANT_VERTICAL] in the last document and the returned
// slash offset.
static int64_t planted_lines(const Case *c, int variant, int64_t *vertical) {
    const int64_t first = last_document(c), len = c->T - first;
    for (int i = 0; i < PLANT_VERTICAL; i++)
        vertical[i] = first + (len * (2 * i + 1 + variant)) / (2 * PLANT_VERTICAL + 3);
    return c->T / 5 + 1 + 3 * variant;
}

// Causal (query, key) pairs of one document, times the heads: what the
// density's denominator counts.
static double same_document_pairs(const Case *c) {
    double pairs = 0;
    for (int64_t q = 0; q < c->T; q++) {
        int64_t first = 0;
        for (int64_t i = 0; c->docs && i < DOC_COUNT; i++)
            if (DOC_STARTS[i] <= q) first = DOC_STARTS[i];
        pairs += (double)(q - first + 1);
    }
    return pairs * c->Hq;
}

// Queries and keys with the planted lines (file comment), v and dout
// N(0, 1), starting gradients N(0, START_SCALE^2).
static Inputs make_inputs(const Case *c, int variant, Rng *rng) {
    const int D = c->D, m = (D - 1) / 2;               // code length of the slash line
    const double scale = 1.0 / sqrt((double)D);
    const float cv = (float)sqrt(PLANT_LOGIT / scale), a = (float)sqrt(PLANT_LOGIT / (m * scale));
    int64_t vertical[PLANT_VERTICAL];
    const int64_t slash = planted_lines(c, variant, vertical);
    Inputs in = {.nq = c->T * c->Hq * D, .nk = c->T * c->Hkv * D};
    float *q = xmalloc((size_t)in.nq * sizeof(float)), *k = xmalloc((size_t)in.nk * sizeof(float));
    for (int64_t t = 0; t < c->T; t++)
        for (int h = 0; h < c->Hq; h++) {
            float *x = q + (t * c->Hq + h) * D;
            x[0] = cv;
            for (int i = 0; i < m; i++) x[1 + i] = a * code(t, i);
            for (int d = 1 + m; d < D; d++) x[d] = (float)rng_normal(rng);
        }
    for (int64_t j = 0; j < c->T; j++)
        for (int g = 0; g < c->Hkv; g++) {
            float *x = k + (j * c->Hkv + g) * D;
            x[0] = 0;
            for (int i = 0; i < PLANT_VERTICAL; i++)
                if (vertical[i] == j) x[0] = cv;
            for (int i = 0; i < m; i++) x[1 + i] = a * code(j + slash, i);
            for (int d = 1 + m; d < D; d++) x[d] = (float)rng_normal(rng);
        }
    to_bf16(q, in.nq, &in.q, &in.qf);
    to_bf16(k, in.nk, &in.k, &in.kf);
    free(q);
    free(k);
    random_bf16(rng, in.nk, &in.v, &in.vf);
    random_bf16(rng, in.nq, &in.dout, &in.doutf);
    float *start = random_f32(rng, in.nq + 2 * in.nk);
    for (int64_t i = 0; i < in.nq + 2 * in.nk; i++) start[i] *= (float)START_SCALE;
    to_bf16(start, in.nq, &in.dq0, &in.dq0f);
    to_bf16(start + in.nq, in.nk, &in.dk0, &in.dk0f);
    to_bf16(start + in.nq + in.nk, in.nk, &in.dv0, &in.dv0f);
    free(start);
    in.d_q = to_device(in.q, (size_t)in.nq * sizeof(uint16_t));
    in.d_k = to_device(in.k, (size_t)in.nk * sizeof(uint16_t));
    in.d_v = to_device(in.v, (size_t)in.nk * sizeof(uint16_t));
    in.d_dout = to_device(in.dout, (size_t)in.nq * sizeof(uint16_t));
    return in;
}

static void free_inputs(Inputs *in) {
    free(in->q); free(in->k); free(in->v); free(in->dout); free(in->dq0); free(in->dk0); free(in->dv0);
    free(in->qf); free(in->kf); free(in->vf); free(in->doutf); free(in->dq0f); free(in->dk0f); free(in->dv0f);
    CUDA_CHECK(cudaFree(in->d_q)); CUDA_CHECK(cudaFree(in->d_k)); CUDA_CHECK(cudaFree(in->d_v));
    CUDA_CHECK(cudaFree(in->d_dout));
}

static AttentionConfig config_of(const Case *c, Kind kind) {
    AttentionConfig cfg = {.type = kind == KIND_DENSE ? ATTN_DENSE : ATTN_SPARSE, .block_size = c->B, .last_q = 64,
                           .sink = 4, .local = 16};
    if (kind == KIND_SPARSE_TOPP1) {
        cfg.budget = BUDGET_TOPP;
        cfg.top_p = 1.0;
        cfg.max_vertical = cfg.max_slash = (int)c->T;
    } else {
        cfg.budget = BUDGET_FIXED;
        cfg.vertical = PLANT_VERTICAL;
        cfg.slash = 1;
    }
    return cfg;
}

static AttnShape shape_of(const Case *c) {
    return (AttnShape){c->T, c->T, c->Hq, c->Hkv, c->D, c->B, 1.0f / sqrtf((float)c->D),
                       c->docs ? DOC_STARTS : NULL, c->docs ? DOC_COUNT : 0, NULL};
}

// ---- runs ----

// Layer 0's results: O (bf16 values on the GPU), LSE, the gradients' increments.
typedef struct {
    float *o, *lse, *dq, *dk, *dv;
    SparseStats stats;
} Results;

static void free_results(Results *r) {
    free(r->o); free(r->lse); free(r->dq); free(r->dk); free(r->dv);
}

static int64_t *iota(int64_t n) {
    int64_t *pos = xmalloc((size_t)n * sizeof(int64_t));
    for (int64_t t = 0; t < n; t++) pos[t] = t;
    return pos;
}

static float *copy_f32(const float *x, int64_t n) {
    float *y = xmalloc((size_t)n * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static Results cpu_run(const Case *c, Kind kind, Inputs in[2]) {
    const Backend *be = backend_cpu();
    const AttentionConfig cfg = config_of(c, kind);
    const AttnShape s = shape_of(c);
    const int64_t nl = c->T * c->Hq;
    int64_t *pos = iota(c->T);
    AttnState *st = be->attention_new(&cfg, 2, c->Hq);
    EXPECT_COUNTED(!be->attention_set_ring(st, NULL, 1), "CPU op: no ring");
    be->attention_sequence(st, pos, c->T);
    Results r = {.o = xmalloc((size_t)in[0].nq * sizeof(float)), .lse = xmalloc((size_t)nl * sizeof(float))};
    float *o1 = xmalloc((size_t)in[1].nq * sizeof(float)), *lse1 = xmalloc((size_t)nl * sizeof(float));
    cpu_forward(st, 0, true, &s, &in[0], pos, r.o, r.lse, &r.stats);
    cpu_forward(st, 1, true, &s, &in[1], pos, o1, lse1, NULL);
    r.dq = copy_f32(in[0].dq0f, in[0].nq);
    r.dk = copy_f32(in[0].dk0f, in[0].nk);
    r.dv = copy_f32(in[0].dv0f, in[0].nk);
    cpu_backward(st, 0, &s, &in[0], pos, r.o, r.lse, r.dq, r.dk, r.dv);
    subtract(r.dq, in[0].dq0f, in[0].nq);
    subtract(r.dk, in[0].dk0f, in[0].nk);
    subtract(r.dv, in[0].dv0f, in[0].nk);
    be->attention_free(st);
    free(pos); free(o1); free(lse1);
    return r;
}

// One forward of `layer` on the GPU into poisoned o, lse; returns them (host).
static void gpu_forward(AttnState *st, int layer, bool plan, const Case *c, const Inputs *in, const int64_t *d_pos,
                        uint16_t *d_o, float *d_lse, SparseStats *stats, float **o, float **lse) {
    const AttnShape s = shape_of(c);
    const int64_t nl = c->T * c->Hq;
    CUDA_CHECK(cudaMemset(d_o, 0xff, (size_t)in->nq * sizeof(uint16_t)));
    CUDA_CHECK(cudaMemset(d_lse, 0xff, (size_t)nl * sizeof(float)));
    attention_cuda_forward(st, layer, plan, &s, in->d_q, in->d_k, in->d_v, d_pos, d_o, d_lse, stats, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    *o = from_device_bf16(d_o, in->nq);
    *lse = from_device_f32(d_lse, nl);
}

static Results gpu_run(const Case *c, Kind kind, Inputs in[2], const char *name) {
    const AttentionConfig cfg = config_of(c, kind);
    const AttnShape s = shape_of(c);
    const int64_t nl = c->T * c->Hq;
    int64_t *pos = iota(c->T);
    int64_t *d_pos = to_device(pos, (size_t)c->T * sizeof(int64_t));
    AttnState *st = attention_cuda_new(&cfg, 2, c->Hq);
    EXPECT_COUNTED(!attention_cuda_set_ring(st, NULL, 1), "%s: a ring of one on one rank", name);
    attention_cuda_sequence(st, pos, c->T);
    uint16_t *d_o = poisoned((size_t)in[0].nq * sizeof(uint16_t));
    float *d_lse = poisoned((size_t)nl * sizeof(float));
    Results r = {0};
    float *o1, *lse1, *o_again, *lse_again;
    gpu_forward(st, 0, true, c, &in[0], d_pos, d_o, d_lse, &r.stats, &r.o, &r.lse);
    gpu_forward(st, 1, true, c, &in[1], d_pos, d_o, d_lse, NULL, &o1, &lse1);
    gpu_forward(st, 0, false, c, &in[0], d_pos, d_o, d_lse, NULL, &o_again, &lse_again);
    EXPECT_COUNTED(memcmp(o_again, r.o, (size_t)in[0].nq * sizeof(float)) == 0 &&
                   memcmp(lse_again, r.lse, (size_t)nl * sizeof(float)) == 0,
                   "%s: recomputation of layer 0 (plan = false, after layer 1's plan) gives the same O and LSE", name);
    EXPECT_COUNTED(memcmp(o1, r.o, (size_t)in[0].nq * sizeof(float)) != 0, "%s: layer 1's O differs", name);

    // Backward of layer 0 from its recomputed o and lse, accumulating into the bf16 starts.
    uint16_t *d_dq = to_device(in[0].dq0, (size_t)in[0].nq * sizeof(uint16_t));
    uint16_t *d_dk = to_device(in[0].dk0, (size_t)in[0].nk * sizeof(uint16_t));
    uint16_t *d_dv = to_device(in[0].dv0, (size_t)in[0].nk * sizeof(uint16_t));
    attention_cuda_backward(st, 0, &s, in[0].d_q, in[0].d_k, in[0].d_v, d_pos, d_o, d_lse, in[0].d_dout, d_dq,
                            d_dk, d_dv, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.dq = from_device_bf16(d_dq, in[0].nq);
    r.dk = from_device_bf16(d_dk, in[0].nk);
    r.dv = from_device_bf16(d_dv, in[0].nk);
    subtract(r.dq, in[0].dq0f, in[0].nq);
    subtract(r.dk, in[0].dk0f, in[0].nk);
    subtract(r.dv, in[0].dv0f, in[0].nk);
    attention_cuda_free(st);
    CUDA_CHECK(cudaFree(d_pos)); CUDA_CHECK(cudaFree(d_o)); CUDA_CHECK(cudaFree(d_lse));
    CUDA_CHECK(cudaFree(d_dq)); CUDA_CHECK(cudaFree(d_dk)); CUDA_CHECK(cudaFree(d_dv));
    free(pos); free(o1); free(lse1); free(o_again); free(lse_again);
    return r;
}

static void compare(const char *name, const char *what, const Results *a, const Results *b, const Inputs *in,
                    int64_t nl, double tol_o, double tol_grad) {
    double e;
    EXPECT_COUNTED((e = rel_frobenius(a->o, b->o, in->nq)) <= tol_o, "%s %s O rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->lse, b->lse, nl)) <= TOL_LSE, "%s %s LSE rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius_floor(a->dq, b->dq, in->nq, GRAD_FLOOR)) <= tol_grad, "%s %s dQ rel %.2e",
                   name, what, e);
    EXPECT_COUNTED((e = rel_frobenius_floor(a->dk, b->dk, in->nk, GRAD_FLOOR)) <= tol_grad, "%s %s dK rel %.2e",
                   name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->dv, b->dv, in->nk)) <= tol_grad, "%s %s dV rel %.2e", name, what, e);
}

static const char *kind_name(Kind kind) {
    return kind == KIND_DENSE ? "dense" : kind == KIND_SPARSE_TOPP1 ? "sparse top_p=1" : "sparse fixed";
}

static void run_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    Inputs in[2] = {make_inputs(c, 0, &rng), make_inputs(c, 1, &rng)};
    char name[160];
    snprintf(name, sizeof name, "T=%lld D=%d Hq=%d Hkv=%d B=%d %s%s", (long long)c->T, c->D, c->Hq, c->Hkv, c->B,
             kind_name(c->kind), c->docs ? " documents" : "");
    const int64_t nl = c->T * c->Hq;
    // Sparse with every line is checked against the CPU's dense op; the rest against the CPU op of its kind.
    Results cpu = cpu_run(c, c->kind == KIND_SPARSE_TOPP1 ? KIND_DENSE : c->kind, in);
    Results gpu = gpu_run(c, c->kind, in, name);
    compare(name, "vs CPU op", &gpu, &cpu, &in[0], nl, TOL, TOL_GRAD);
    if (c->kind == KIND_SPARSE_TOPP1) {
        Results dense = gpu_run(c, KIND_DENSE, in, name);
        compare(name, "vs dense GPU op", &gpu, &dense, &in[0], nl, TOL_DENSE, TOL_GRAD);
        EXPECT_COUNTED(gpu.stats.computed == gpu.stats.causal && gpu.stats.causal == same_document_pairs(c),
                       "%s density 1 (%.0f of %.0f; causal pairs%s %.0f)", name, gpu.stats.computed,
                       gpu.stats.causal, c->docs ? " of one document" : "", same_document_pairs(c));
        free_results(&dense);
    }
    if (c->kind == KIND_SPARSE_FIXED) {
        EXPECT_COUNTED(gpu.stats.computed == cpu.stats.computed && gpu.stats.causal == cpu.stats.causal,
                       "%s density counts as the CPU op's (%.0f of %.0f; CPU %.0f of %.0f)", name, gpu.stats.computed,
                       gpu.stats.causal, cpu.stats.computed, cpu.stats.causal);
        EXPECT_COUNTED(cpu.stats.causal == same_document_pairs(c), "%s density's denominator: the causal pairs%s "
                       "(%.0f, counted %.0f)", name, c->docs ? " of one document" : "", cpu.stats.causal,
                       same_document_pairs(c));
        if (c->T - last_document(c) >= 2 * c->B)   // a document of two blocks or more: the budgets leave some out
            EXPECT_COUNTED(gpu.stats.computed < gpu.stats.causal, "%s sparse: fewer elements than dense (%.0f of "
                           "%.0f)", name, gpu.stats.computed, gpu.stats.causal);
    }
    if (c->kind != KIND_DENSE) {
        const double rows = (double)(c->Hq * (c->T < 64 ? c->T : 64));
        const double ref = c->kind == KIND_SPARSE_FIXED ? cpu.stats.covered_mass : rows;
        EXPECT_COUNTED(gpu.stats.estimation_rows == rows && fabs(gpu.stats.covered_mass - ref) <= TOL_RECALL * ref,
                       "%s recall %.6f (reference %.6f, %.0f rows)", name, gpu.stats.covered_mass / rows, ref / rows,
                       gpu.stats.estimation_rows);
        // The recall sample (away from the estimation rows) against the CPU op's (fixed), itself tested
        // against a double brute force (tests/unit/test_sparse_index.c); every line: all of the mass.
        int64_t sample[SPARSE_RECALL_ROWS];
        const double sample_rows = (double)(c->Hq * sparse_recall_rows(c->T, config_of(c, c->kind).last_q, sample));
        const double sampled = c->kind == KIND_SPARSE_FIXED ? cpu.stats.sampled_mass : sample_rows;
        EXPECT_COUNTED(gpu.stats.sampled_rows == sample_rows && fabs(gpu.stats.sampled_mass - sampled) <= TOL_RECALL *
                       sampled, "%s sampled recall %.6f (reference %.6f, %.0f rows)", name,
                       gpu.stats.sampled_mass / sample_rows, sampled / sample_rows, gpu.stats.sampled_rows);
    }
    free_results(&cpu);
    free_results(&gpu);
    free_inputs(&in[0]);
    free_inputs(&in[1]);
}

// What the op refuses: sparse attention with blocks of 32 (the kernels'
// query tile is one block of 64 or 128) ends the program with one line.
static void refuse_block(void) {
    const Case c = {200, 64, 4, 2, 32, KIND_SPARSE_FIXED, 0};
    const AttentionConfig cfg = config_of(&c, c.kind);
    attention_cuda_free(attention_cuda_new(&cfg, 1, c.Hq));
}

int main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    if (argc == 2 && strcmp(argv[1], "refuse-block") == 0) {
        refuse_block();
        return 0;
    }
    CHECK(argc == 1 || small, "usage: %s [small | refuse-block]", argv[0]);
    // {T, D, Hq, Hkv, B, kind, docs}
    static const Case cases[] = {
        {1, 64, 2, 1, 64, KIND_DENSE, 0},
        {200, 64, 4, 2, 64, KIND_DENSE, 0},
        {333, 128, 7, 1, 128, KIND_DENSE, 0},
        {200, 64, 4, 2, 64, KIND_DENSE, 1},
        {333, 128, 7, 1, 128, KIND_DENSE, 1},
        {7, 64, 2, 1, 64, KIND_SPARSE_FIXED, 0},
        {200, 64, 4, 2, 64, KIND_SPARSE_TOPP1, 0},
        {200, 64, 14, 2, 64, KIND_SPARSE_FIXED, 0},
        {333, 128, 7, 1, 64, KIND_SPARSE_FIXED, 0},
        {333, 128, 4, 2, 64, KIND_SPARSE_TOPP1, 0},
        {200, 64, 4, 2, 64, KIND_SPARSE_TOPP1, 1},
        {333, 128, 7, 1, 128, KIND_SPARSE_TOPP1, 1},
        {200, 64, 14, 2, 64, KIND_SPARSE_FIXED, 1},
        {333, 128, 7, 1, 64, KIND_SPARSE_FIXED, 1},
        {1000, 128, 14, 2, 128, KIND_SPARSE_FIXED, 0},
        {1000, 64, 8, 2, 128, KIND_SPARSE_FIXED, 1},
        {1000, 64, 8, 1, 64, KIND_DENSE, 0},
    };
    int count = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (small && cases[i].T > 333) continue;
        run_case(&cases[i], 4000 + i);
        count++;
    }
    printf("%d cases: %d passed, %d failed\n", count, checks - check_failures, check_failures);
    return check_exit();
}
