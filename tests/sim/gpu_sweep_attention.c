// gpu_sweep_attention.c: every attention kernel variant of the registry
// (attention/kernels/attn_variants.h) on a fixed set of shapes, and the
// micro-benchmarks behind the attention cost model (gpu_sweep_micro.h). For
// head dims 64 and 128, 16 q / 2 kv heads: causal N1 and N2 tokens, an N2
// ring chunk seen whole (queries N2..2 N2-1 against keys 0..N2-1), N2 in 8
// documents (dense kinds); N2 with about 5 % of the causal key blocks of
// 128 (sparse kinds). Per variant and shape: the median time of `repeats`
// runs after a checked one (CUDA events), TFLOP/s (causal FLOPs: 4 D per
// visible query-key pair and head forward, ATTN_BACKWARD_FLOPS times that backward), the
// relative Frobenius error of its output against its kind's reference (the
// first variant of that kind and head dim; the forward's o, the backward's
// dq, dk, dv: the worst) within the bf16 bound of the attention tests (1e-2),
// registers, shared memory and blocks per SM (cudaFuncGetAttributes, the
// occupancy API). scripts/sweep_table.sh turns the table into the trainer's
// choice of variant per architecture and head dim.
//   gpu_sweep_attention [small] [--repeats R] [--head-dim 64|128] [--out FILE] [--broken]
// Default N1 = 4096, N2 = 16384, 5 repeats; `small`: N1 = 64, N2 = 256, 2
// q / 1 kv heads, micro-benchmarks at a few iterations (the sim). --head-dim:
// that head dim only.
// --broken adds, after each reference, a copy that runs it with the scale
// doubled: its error must fail it (tests/sim/test_gpu_sweep.sh).
// Variants the GPU does not run (the Hopper ones on another architecture)
// are listed on a '#' line and not run.
// Output (FILE, default stdout): '#' lines (device, SM clock, micro-benchmarks,
// the variants not run) then a TSV with a header line; "ok NAME" / "FAIL NAME: why" per variant and
// shape on stdout; exit status 1 when any variant failed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/kernels/attn_variants.h"
#include "../../attention/kernels/kernel_counts.h"
#include "../../attention/kernels/sparse_cuda.h"
#include "../../attention/sparse/sparse.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"
#include "gpu_sweep_micro.h"

#define TOL 1e-2              // the bf16 bound of gpu_test_attention
#define SPARSE_BLOCK 128
#define MAX_REPEATS 16

typedef enum { SHAPE_CAUSAL, SHAPE_RING_FULL, SHAPE_DOCUMENTS, SHAPE_SPARSE } ShapeKind;

typedef struct {
    char name[32];
    ShapeKind kind;
    int64_t tokens;           // queries = keys
} Shape;

// What one (head dim, shape) runs on: inputs on the device, the reference's outputs on the host.
typedef struct {
    int D, Hq, Hkv;
    AttnShape s;
    int64_t doc_starts[8];
    SparseIndexCuda index;
    double pairs;             // visible query-key pairs of one head
    uint16_t *q, *k, *v, *dout, *o;
    int64_t *q_pos, *k_pos;
    float *o_acc, *lse, *delta, *dq, *dk, *dv;
    float *ref_fwd, *ref_dq, *ref_dk, *ref_dv;   // host, the reference variant's
} Problem;

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// n random bf16 on the device.
static uint16_t *device_random(Rng *rng, int64_t n) {
    uint16_t *bits;
    float *values;
    random_bf16(rng, n, &bits, &values);
    uint16_t *dev = to_device(bits, (size_t)n * sizeof(uint16_t));
    free(bits);
    free(values);
    return dev;
}

// Visible pairs of one head: causal positions 0..n-1, optionally in `docs` equal documents; or all n x n.
static double causal_pairs(int64_t n, int docs) {
    const double len = (double)n / docs;
    return docs * len * (len + 1) / 2;
}

// The sparse index: per head and query block i, the diagonal block and the earlier blocks j with
// (7 j + 3 i + h) % 20 == 0 (about 5 % of them); no columns. Returns the visible pairs of one head (mean).
static double build_sparse_index(int Hq, int64_t n, SparseIndexCuda *dev) {
    const int64_t nb = (n + SPARSE_BLOCK - 1) / SPARSE_BLOCK, rows = Hq * nb;
    SparseIndex ix = {.num_heads = Hq, .block_size = SPARSE_BLOCK, .seq_len = n, .num_q_blocks = nb};
    ix.q_blocks = xmalloc((size_t)nb * sizeof(int64_t));
    ix.block_start = xcalloc((size_t)rows + 1, sizeof(int64_t));
    ix.column_start = xcalloc((size_t)rows + 1, sizeof(int64_t));
    ix.blocks = xmalloc((size_t)(rows * nb) * sizeof(int64_t));
    ix.columns = xmalloc(sizeof(int64_t));
    double pairs = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < nb; i++) ix.q_blocks[i] = i;
    for (int h = 0; h < Hq; h++)
        for (int64_t i = 0; i < nb; i++) {
            const double rows_i = (double)((i + 1) * SPARSE_BLOCK < n ? SPARSE_BLOCK : n - i * SPARSE_BLOCK);
            for (int64_t j = 0; j <= i; j++)
                if (j == i || (7 * j + 3 * i + h) % 20 == 0) {
                    ix.blocks[count++] = j;
                    pairs += j == i ? rows_i * (rows_i + 1) / 2 : rows_i * SPARSE_BLOCK;
                }
            ix.block_start[h * nb + i + 1] = count;
        }
    sparse_index_to_cuda(&ix, dev);
    sparse_index_free(&ix);
    return pairs / Hq;
}

static void problem_init(Problem *p, int D, int Hq, int Hkv, const Shape *shape, Rng *rng) {
    memset(p, 0, sizeof *p);
    const int64_t n = shape->tokens, nq = n * Hq * D, nk = n * Hkv * D;
    p->D = D; p->Hq = Hq; p->Hkv = Hkv;
    p->s = (AttnShape){n, n, Hq, Hkv, D, SPARSE_BLOCK, 1.0f / sqrtf((float)D), NULL, 0, NULL};
    int64_t *pos = xmalloc((size_t)n * sizeof(int64_t));
    for (int64_t t = 0; t < n; t++) pos[t] = t;
    p->k_pos = to_device(pos, (size_t)n * sizeof(int64_t));
    if (shape->kind == SHAPE_RING_FULL)
        for (int64_t t = 0; t < n; t++) pos[t] = n + t;
    p->q_pos = to_device(pos, (size_t)n * sizeof(int64_t));
    free(pos);
    p->pairs = shape->kind == SHAPE_RING_FULL ? (double)n * n : causal_pairs(n, shape->kind == SHAPE_DOCUMENTS ? 8 : 1);
    if (shape->kind == SHAPE_DOCUMENTS) {
        for (int i = 0; i < 8; i++) p->doc_starts[i] = i * n / 8;
        p->s.doc_starts = p->doc_starts;
        p->s.doc_count = 8;
        p->s.doc_starts_device = to_device(p->doc_starts, sizeof p->doc_starts);
    }
    if (shape->kind == SHAPE_SPARSE) p->pairs = build_sparse_index(Hq, n, &p->index);
    p->q = device_random(rng, nq);
    p->dout = device_random(rng, nq);
    p->k = device_random(rng, nk);
    p->v = device_random(rng, nk);
    CUDA_CHECK(cudaMalloc((void **)&p->o, (size_t)nq * sizeof(uint16_t)));
    CUDA_CHECK(cudaMalloc((void **)&p->o_acc, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&p->dq, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&p->dk, (size_t)nk * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&p->dv, (size_t)nk * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&p->lse, (size_t)(n * Hq) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&p->delta, (size_t)(n * Hq) * sizeof(float)));
}

static void problem_free(Problem *p) {
    void *dev[] = {p->q, p->k, p->v, p->dout, p->o, p->q_pos, p->k_pos, p->o_acc, p->lse, p->delta, p->dq, p->dk,
                   p->dv, (void *)p->s.doc_starts_device};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) CUDA_CHECK(cudaFree(dev[i]));
    sparse_index_free_cuda(&p->index);
    free(p->ref_fwd); free(p->ref_dq); free(p->ref_dk); free(p->ref_dv);
}

static int is_forward(AttnVariantKind k) { return k == ATTN_DENSE_FORWARD || k == ATTN_SPARSE_FORWARD; }

// One run of v (scale times `scale_factor`) on p: the forward from a fresh (o_acc, lse), the backward into
// zeroed dq, dk, dv. Returns its milliseconds (CUDA events around the variant's launch only).
static float run_variant(const AttnVariant *v, Problem *p, float scale_factor) {
    AttnShape s = p->s;
    s.scale *= scale_factor;
    const AttnVariantCall call = {&s, &p->index, p->q, p->k, p->v, p->dout, p->q_pos, p->k_pos, p->o_acc, p->lse,
                                  p->lse, p->delta, p->dq, p->dk, p->dv, SPARSE_ALL};
    const int64_t nq = s.q_tokens * s.num_heads * s.head_dim, nk = s.k_tokens * s.num_kv_heads * s.head_dim;
    if (is_forward(v->kind)) {
        attn_forward_init_cuda(&s, p->o_acc, p->lse, 0);
    } else {
        CUDA_CHECK(cudaMemsetAsync(p->dq, 0, (size_t)nq * sizeof(float), 0));
        CUDA_CHECK(cudaMemsetAsync(p->dk, 0, (size_t)nk * sizeof(float), 0));
        CUDA_CHECK(cudaMemsetAsync(p->dv, 0, (size_t)nk * sizeof(float), 0));
    }
    cudaEvent_t ev[2];
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));
    CUDA_CHECK(cudaEventRecord(ev[0], 0));
    v->launch(&call, 0);
    CUDA_CHECK(cudaEventRecord(ev[1], 0));
    CUDA_CHECK(cudaEventSynchronize(ev[1]));
    CUDA_CHECK(cudaGetLastError());
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventDestroy(ev[i]));
    return ms;
}

// The backward's inputs: lse and o of the reference forward of `kind`, delta from o.
static void backward_inputs(AttnVariantKind kind, Problem *p) {
    for (int i = 0; i < attn_variant_count; i++)
        if (attn_variants[i].kind == kind && attn_variants[i].head_dim == p->D) {
            run_variant(&attn_variants[i], p, 1.0f);
            break;
        }
    attn_output_bf16_cuda(&p->s, p->o_acc, p->o, 0);
    attn_backward_delta_cuda(&p->s, p->o, p->dout, p->delta, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// The error of v's last run against the reference's outputs (stored when `store`).
static double output_error(const AttnVariant *v, Problem *p, int store) {
    const int64_t nq = p->s.q_tokens * p->Hq * p->D, nk = p->s.k_tokens * p->Hkv * p->D;
    if (is_forward(v->kind)) {
        float *o = from_device_f32(p->o_acc, nq);
        if (store) { free(p->ref_fwd); p->ref_fwd = o; return 0; }
        const double e = rel_frobenius(o, p->ref_fwd, nq);
        free(o);
        return e;
    }
    float *dq = from_device_f32(p->dq, nq), *dk = from_device_f32(p->dk, nk), *dv = from_device_f32(p->dv, nk);
    if (store) {
        free(p->ref_dq); free(p->ref_dk); free(p->ref_dv);
        p->ref_dq = dq; p->ref_dk = dk; p->ref_dv = dv;
        return 0;
    }
    const double e = fmax(rel_frobenius_floor(dq, p->ref_dq, nq, GRAD_FLOOR),
                          fmax(rel_frobenius(dk, p->ref_dk, nk), rel_frobenius(dv, p->ref_dv, nk)));
    free(dq); free(dk); free(dv);
    return e;
}

static const char *kind_name(AttnVariantKind k) {
    static const char *names[] = {"dense_fwd", "dense_bwd", "sparse_fwd", "sparse_bwd"};
    return names[k];
}

// Every variant of `kind` and p's head dim that a GPU of compute capability arch runs, on p (the reference
// first), one row each into out.
static void sweep_kind(AttnVariantKind kind, Problem *p, const Shape *shape, int arch, int repeats, int broken,
                       FILE *out) {
    const AttnVariant *ref = NULL;
    for (int i = 0; i < attn_variant_count; i++) {
        const AttnVariant *v = &attn_variants[i];
        if (v->kind != kind || v->head_dim != p->D || !attn_variant_runs_on(v, arch)) continue;
        const int copies = broken && !ref ? 2 : 1;
        for (int copy = 0; copy < copies; copy++) {
            const int is_ref = !ref && copy == 0, is_broken = copy == 1;
            const float factor = is_broken ? 2.0f : 1.0f;
            run_variant(v, p, factor);                                    // the checked run
            const double error = output_error(v, p, is_ref);
            float ms[MAX_REPEATS];
            for (int r = 0; r < repeats; r++) ms[r] = run_variant(v, p, factor);
            qsort(ms, (size_t)repeats, sizeof(float), compare_floats);
            const double median = ms[repeats / 2];
            const double flops = 4.0 * p->D * p->Hq * p->pairs * (is_forward(kind) ? 1.0 : ATTN_BACKWARD_FLOPS);
            const AttnVariantResources res = attn_variant_resources(v);
            char name[96];
            snprintf(name, sizeof name, "%s%s", is_broken ? "broken_" : "", v->name);
            const int ok = error <= TOL;
            EXPECT_COUNTED(ok, "sweep %s %s: error %.2e against %s (bound %.0e)", name, shape->name, error, ref ? ref->name : v->name, TOL);
            fprintf(out, "%s\t%s\t%d\t%s\t%lld\t%.4f\t%.4f\t%.4g\t%.3e\t%d\t%ld\t%ld\t%ld\t%d\t%s\n", name,
                    kind_name(kind), p->D, shape->name, (long long)shape->tokens,
                    p->pairs / causal_pairs(shape->tokens, 1), median, flops / (median * 1e9), error, res.registers,
                    res.static_smem, res.dynamic_smem, res.local_bytes, res.blocks_per_sm, ok ? "ok" : "FAIL");
            fflush(out);
            if (is_ref) ref = v;
        }
    }
}

int main(int argc, char **argv) {
    int small = 0, repeats = 5, broken = 0, only_dim = 0;
    const char *out_path = NULL;
    const char *usage = "usage: gpu_sweep_attention [small] [--repeats R] [--head-dim 64|128] [--out FILE] [--broken]";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "small")) small = 1;
        else if (!strcmp(argv[i], "--broken")) broken = 1;
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) only_dim = atoi(argv[++i]);
        else FAIL("gpu_sweep_attention: unknown argument '%s' (%s)", argv[i], usage);
    }
    CHECK(repeats >= 1 && repeats <= MAX_REPEATS, "gpu_sweep_attention: --repeats %d (expected 1 to %d)", repeats,
          MAX_REPEATS);
    CHECK(only_dim == 0 || only_dim == 64 || only_dim == 128, "gpu_sweep_attention: --head-dim %d (expected 64 or 128)",
          only_dim);
    FILE *out = out_path ? fopen(out_path, "w") : stdout;
    CHECK(out, "gpu_sweep_attention: cannot write %s", out_path);

    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    SweepMicro m;
    sweep_micro(small ? 2 : prop.multiProcessorCount * 4, small ? 128 : 100000, &m);
    fprintf(out, "# gpu_sweep_attention: %s, sm_%d%d, %d SMs%s\n", prop.name, prop.major, prop.minor,
            prop.multiProcessorCount, small ? " (small)" : "");
    fprintf(out, "# arch sm_%d%d\n# sm_clock_mhz %.0f\n# mma_sync_tflops %.1f\n# mma_sync_per_sm_clock %.3f\n"
            "# ldmatrix_bytes_per_sm_clock %.1f\n# exp2_per_sm_clock %.2f\n# scalar_atomics_per_s %.4g\n"
            "# vector_atomics_floats_per_s %.4g\n", prop.major, prop.minor, m.sm_clock_mhz, m.mma_tflops,
            m.mma_per_sm_clock, m.ldmatrix_bytes_per_sm_clock, m.exp2_per_sm_clock, m.scalar_atomics_per_s,
            m.vector_atomics_per_s);
    const int arch = prop.major * 10 + prop.minor;
    fprintf(out, "# not run on sm_%d:", arch);
    for (int i = 0; i < attn_variant_count; i++)
        if (!attn_variant_runs_on(&attn_variants[i], arch)) fprintf(out, " %s", attn_variants[i].name);
    fprintf(out, "\n");
    fprintf(out, "variant\tkind\thead_dim\tshape\ttokens\tdensity\tms\ttflops\terror\tregisters\tsmem_static\t"
            "smem_dynamic\tlocal_bytes\tblocks_per_sm\tstatus\n");

    const int64_t n1 = small ? 64 : 4096, n2 = small ? 256 : 16384;
    const int Hq = small ? 2 : 16, Hkv = small ? 1 : 2;
    Shape shapes[5] = {{"", SHAPE_CAUSAL, n1}, {"", SHAPE_CAUSAL, n2}, {"", SHAPE_RING_FULL, n2},
                       {"", SHAPE_DOCUMENTS, n2}, {"", SHAPE_SPARSE, n2}};
    const char *labels[] = {"causal", "causal", "ring_full", "documents8", "sparse"};
    for (int i = 0; i < 5; i++) snprintf(shapes[i].name, sizeof shapes[i].name, "%s_%lld", labels[i],
                                         (long long)shapes[i].tokens);
    Rng rng;
    rng_seed(&rng, 7);
    const int dims[2] = {64, 128};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 5 && (!only_dim || only_dim == dims[d]); i++) {
            Problem p;
            problem_init(&p, dims[d], Hq, Hkv, &shapes[i], &rng);
            const int sparse = shapes[i].kind == SHAPE_SPARSE;
            sweep_kind(sparse ? ATTN_SPARSE_FORWARD : ATTN_DENSE_FORWARD, &p, &shapes[i], arch, repeats, broken, out);
            backward_inputs(sparse ? ATTN_SPARSE_FORWARD : ATTN_DENSE_FORWARD, &p);
            sweep_kind(sparse ? ATTN_SPARSE_BACKWARD : ATTN_DENSE_BACKWARD, &p, &shapes[i], arch, repeats, broken,
                       out);
            problem_free(&p);
        }
    if (out != stdout) CHECK(fclose(out) == 0, "gpu_sweep_attention: cannot write %s", out_path);
    printf("%d variant runs: %d passed, %d failed\n", checks, checks - check_failures, check_failures);
    return check_exit();
}
