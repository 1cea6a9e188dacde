// gpu_test_counts.c: the plan's count formulas (attention/kernels/kernel_counts.c)
// against the work the CPU execution model of CUDA counts in the attention
// kernels (cudasim_kernel_counts: mma.sync, ldmatrix and cp.async bytes,
// shuffles, barriers, atomics; docs/SIM.md): the dense forward and backward
// (flash_cuda.cu) on one causal sequence, head dims 64 and 128, lengths 128
// and 320 (a short last forward query tile); the sparse forward and
// backward (sparse_cuda.cu) on an index of slash lines and vertical columns,
// blocks of 64 and 128, 384 tokens, whose visited key tiles and keys the
// test reads from the host index. Every count must be equal, and so must the
// shared bytes per mma.sync that `mtrain plan --kernels` prints; the dense
// forward's must be at most 200, the dense backward's at most 260 with at
// most 800 dQ atomics per MFLOP. Each kernel's shared-memory wavefronts
// (ldmatrix, cp.async) against their conflict-free minimum are reported; the
// kernels of the table conflict_free must have none above it. Sim only: a
// native build cannot count and says so.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/attention.h"
#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/sparse/sparse.h"
#include "../../attention/kernels/sparse_cuda.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../../attention/kernels/kernel_counts.h"
#include "../lib/check.h"

#ifdef CUDASIM_KERNEL_COUNTS
#include "gpu_common.h"

enum { HQ = 4, HKV = 2 };

// The attention kernels whose shared memory the sim counts free of bank
// conflicts (wavefronts equal to the conflict-free minimum, ldmatrix and
// cp.async; docs/SIM.md), by kind and head dim (sparse: and block size). A
// listed kernel that gains a conflict fails; one not listed prints its excess.
static const char *const conflict_free[] = {
    "dense forward D64",  "dense forward D128",  "dense backward D64",  "dense backward D128",
    "sparse forward D64 B64", "sparse forward D64 B128", "sparse forward D128 B64", "sparse forward D128 B128",
    "sparse backward D64 B64", "sparse backward D64 B128", "sparse backward D128 B64", "sparse backward D128 B128",
    "sparse backward columns D64 B64", "sparse backward columns D64 B128", "sparse backward columns D128 B64",
    "sparse backward columns D128 B128",
};

static bool listed_conflict_free(const char *kind) {
    for (size_t i = 0; i < sizeof(conflict_free) / sizeof(conflict_free[0]); i++)
        if (!strcmp(conflict_free[i], kind)) return true;
    return false;
}

// The wavefronts of `got` (kernel kind `kind`, case `name`) against their minimum.
static void expect_conflict_free(const char *name, const char *kind, const cudasimKernelCounts *got) {
    const unsigned long long excess = got->ldmatrix_wavefronts - got->ldmatrix_wavefronts_min +
                                      got->cp_async_wavefronts - got->cp_async_wavefronts_min;
    char what[256];
    snprintf(what, sizeof what, "%s (%s): ldmatrix %llu wavefronts, minimum %llu; cp.async %llu, minimum %llu",
             name, kind, got->ldmatrix_wavefronts, got->ldmatrix_wavefronts_min, got->cp_async_wavefronts,
             got->cp_async_wavefronts_min);
    if (listed_conflict_free(kind))
        EXPECT_COUNTED(excess == 0 && got->ldmatrix_wavefronts_min > 0 && got->cp_async_wavefronts_min > 0,
                       "%s: conflict-free", what);
    else
        printf("conflicts %s: %llu wavefronts above the minimum (%.1f%%)\n", what, excess,
               100.0 * (double)excess / (double)(got->ldmatrix_wavefronts_min + got->cp_async_wavefronts_min));
}

// The counts of the kernels named `kernel` (of kind `kind`) since the reset against `want`.
static void expect_counts(const char *name, const char *kernel, const char *kind, KernelCounts want) {
    CUDA_CHECK(cudaDeviceSynchronize());
    cudasimKernelCounts got;
    EXPECT_COUNTED(cudasim_kernel_counts(kernel, &got) == 1, "%s: one kernel named %s", name, kernel);
    const double g[] = {got.launches, got.blocks, got.mma, got.ldmatrix_bytes, got.cp_async_bytes, got.shuffles,
                        got.barriers, got.atomics};
    const double w[] = {want.launches, want.blocks, want.mma, want.ldmatrix_bytes, want.cp_async_bytes,
                        want.shuffles, want.barriers, want.atomics};
    const char *what[] = {"launches", "blocks", "mma", "ldmatrix bytes", "cp.async bytes", "shuffles", "barriers",
                          "atomics"};
    char diffs[512] = "";
    size_t used = 0;
    for (int i = 0; i < 8 && used < sizeof diffs; i++)
        if (g[i] != w[i])
            used += (size_t)snprintf(diffs + used, sizeof diffs - used, "; %s %.0f counted, %.0f by the formula",
                                     what[i], g[i], w[i]);
    EXPECT_COUNTED(used == 0, "%s (%.0f mma, %.0f ldmatrix bytes, %.0f cp.async bytes, %.0f atomics)%s", name, g[2],
                   g[3], g[4], g[7], diffs);
    const double per_mma = (g[3] + g[4]) / g[2], planned = shared_bytes_per_mma(want);
    EXPECT_COUNTED(per_mma == planned, "%s: %.1f shared bytes per mma.sync counted, %.1f by the plan", name, per_mma,
                   planned);
    expect_conflict_free(name, kind, &got);
}

typedef struct {
    int64_t T;
    int D;
    uint16_t *q, *k, *v, *dout;
    int64_t *pos;
    float *o, *lse, *delta, *dq, *dk, *dv;
} Inputs;

static Inputs make_inputs(int64_t T, int D, Rng *rng) {
    Inputs in = {.T = T, .D = D};
    const int64_t nq = T * HQ * D, nk = T * HKV * D;
    uint16_t *bits;
    float *values;
    uint16_t **dev[] = {&in.q, &in.k, &in.v, &in.dout};
    const int64_t sizes[] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        random_bf16(rng, sizes[i], &bits, &values);
        *dev[i] = to_device(bits, (size_t)sizes[i] * sizeof(uint16_t));
        free(bits);
        free(values);
    }
    int64_t *pos = xmalloc((size_t)T * sizeof(int64_t));
    for (int64_t i = 0; i < T; i++) pos[i] = i;
    in.pos = to_device(pos, (size_t)T * sizeof(int64_t));
    free(pos);
    CUDA_CHECK(cudaMalloc((void **)&in.o, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&in.lse, (size_t)(T * HQ) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&in.delta, (size_t)(T * HQ) * sizeof(float)));
    CUDA_CHECK(cudaMemset(in.delta, 0, (size_t)(T * HQ) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&in.dq, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&in.dk, (size_t)nk * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&in.dv, (size_t)nk * sizeof(float)));
    CUDA_CHECK(cudaMemset(in.dq, 0, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMemset(in.dk, 0, (size_t)nk * sizeof(float)));
    CUDA_CHECK(cudaMemset(in.dv, 0, (size_t)nk * sizeof(float)));
    return in;
}

static void free_inputs(Inputs *in) {
    void *p[] = {in->q, in->k, in->v, in->dout, in->pos, in->o, in->lse, in->delta, in->dq, in->dk, in->dv};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) CUDA_CHECK(cudaFree(p[i]));
}

static AttnShape shape_of(const Inputs *in, int block) {
    return (AttnShape){.q_tokens = in->T, .k_tokens = in->T, .num_heads = HQ, .num_kv_heads = HKV,
                       .head_dim = in->D, .block_size = block, .scale = 0.125f};
}

static void dense_case(int64_t T, int D, Rng *rng) {
    Inputs in = make_inputs(T, D, rng);
    const AttnShape s = shape_of(&in, 64);
    const FlashTiles f = flash_tiles(D);
    char name[96];
    attn_forward_init_cuda(&s, in.o, in.lse, 0);
    cudasim_kernel_counts_reset();
    attn_dense_forward_cuda(&s, in.q, in.pos, in.k, in.v, in.pos, in.o, in.lse, 0);
    char kind[64];
    snprintf(name, sizeof name, "counts_dense_forward_T%lld_D%d", (long long)T, D);
    snprintf(kind, sizeof kind, "dense forward D%d", D);
    expect_counts(name, "flash_forward_kernel<", kind,
                  flash_forward_counts(D, HQ * (double)((T + f.fwd_bm - 1) / f.fwd_bm),
                                       HQ * flash_forward_pairs(T, f.fwd_bm, f.fwd_bn)));
    cudasim_kernel_counts_reset();
    attn_dense_backward_cuda(&s, in.q, in.pos, in.k, in.v, in.pos, in.lse, in.delta, in.dout, in.dq, in.dk, in.dv, 0);
    snprintf(name, sizeof name, "counts_dense_backward_T%lld_D%d", (long long)T, D);
    snprintf(kind, sizeof kind, "dense backward D%d", D);
    // dq rows: each visited query tile's rows before T (the last one short where T is not a multiple of bwd_bm)
    double dq_rows = 0;
    for (int64_t j0 = 0; j0 < T; j0 += f.bwd_bn)
        for (int64_t i0 = j0 / f.bwd_bm * f.bwd_bm; i0 < T; i0 += f.bwd_bm)
            dq_rows += HQ * (double)(T - i0 < f.bwd_bm ? T - i0 : f.bwd_bm);
    expect_counts(name, "flash_backward_kernel<", kind,
                  flash_backward_counts(D, HQ * (double)((T + f.bwd_bn - 1) / f.bwd_bn),
                                        HQ * flash_backward_pairs(T, f.bwd_bm, f.bwd_bn), dq_rows, HQ * (double)T));
    free_inputs(&in);
}

// Slash offsets 0 and 300, vertical columns 5, 77 and 200 in every head:
// at blocks of 64 and of 128 rows with columns beside their blocks.
static void sparse_case(int64_t T, int D, int B, Rng *rng) {
    static const int64_t slash[] = {0, 300}, vertical[] = {5, 77, 200};
    Inputs in = make_inputs(T, D, rng);
    SparsePattern p = {.num_heads = HQ, .seq_len = T};
    p.vertical_start = xmalloc((HQ + 1) * sizeof(int64_t));
    p.slash_start = xmalloc((HQ + 1) * sizeof(int64_t));
    p.vertical = xmalloc(HQ * 3 * sizeof(int64_t));
    p.slash = xmalloc(HQ * 2 * sizeof(int64_t));
    for (int h = 0; h <= HQ; h++) {
        p.vertical_start[h] = 3 * h;
        p.slash_start[h] = 2 * h;
    }
    for (int h = 0; h < HQ; h++) {
        memcpy(p.vertical + 3 * h, vertical, sizeof vertical);
        memcpy(p.slash + 2 * h, slash, sizeof slash);
    }
    const int64_t nqb = (T + B - 1) / B;
    int64_t *q_blocks = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) q_blocks[i] = i;
    SparseIndex x;
    sparse_index_build(&p, B, q_blocks, nqb, &x);
    // The forward's key tiles; the column pass's rows with columns, tiles and columns.
    double rows = (double)HQ * nqb, tiles = 0, col_rows = 0, col_tiles = 0, col_keys = 0;
    for (int64_t r = 0; r < HQ * nqb; r++) {
        const int64_t blocks = x.block_start[r + 1] - x.block_start[r], cols = x.column_start[r + 1] - x.column_start[r];
        tiles += (double)(blocks * (B / SPARSE_KEY_TILE) + (cols + SPARSE_KEY_TILE - 1) / SPARSE_KEY_TILE);
        col_rows += cols > 0;
        col_tiles += (double)((cols + SPARSE_KEY_TILE - 1) / SPARSE_KEY_TILE);
        col_keys += (double)cols;
    }
    // The key-major pass: per (head, key block) the query blocks that select it, their rows BM at a time;
    // the rows of those tiles before T (dq), the keys of every block some query block selects (dk, dv).
    const int BM = sparse_backward_bm(D);
    double active = 0, q_tiles = 0, dq_rows = 0, block_keys = 0;
    for (int h = 0; h < HQ; h++)
        for (int64_t kb = 0; kb < nqb; kb++) {
            int64_t *listed = xmalloc((size_t)nqb * sizeof(int64_t)), n = 0;
            for (int64_t i = 0; i < nqb; i++)
                for (int64_t e = x.block_start[h * nqb + i]; e < x.block_start[h * nqb + i + 1]; e++)
                    if (x.blocks[e] == kb) listed[n++] = i;
            if (n == 0) { free(listed); continue; }
            active++;
            block_keys += (double)(T - kb * B < B ? T - kb * B : B);
            for (int64_t at0 = 0; at0 < n * B; at0 += BM, q_tiles++)
                for (int64_t at = at0; at < at0 + BM && at < n * B; at++) dq_rows += listed[at / B] * B + at % B < T;
            free(listed);
        }
    SparseIndexCuda dx = {0};
    sparse_index_to_cuda(&x, &dx);
    const AttnShape s = shape_of(&in, B);
    char name[96], kind[64];
    attn_forward_init_cuda(&s, in.o, in.lse, 0);
    cudasim_kernel_counts_reset();
    attn_sparse_forward_cuda(&s, &dx, in.q, in.pos, in.k, in.v, in.pos, in.o, in.lse, 0);
    snprintf(name, sizeof name, "counts_sparse_forward_T%lld_D%d_B%d", (long long)T, D, B);
    snprintf(kind, sizeof kind, "sparse forward D%d B%d", D, B);
    expect_counts(name, "sparse_forward_kernel<", kind, sparse_forward_counts(D, B, rows, tiles));
    cudasim_kernel_counts_reset();
    attn_sparse_backward_cuda(&s, &dx, in.q, in.pos, in.k, in.v, in.pos, in.lse, in.delta, in.dout, in.dq, in.dk,
                              in.dv, 0);
    snprintf(name, sizeof name, "counts_sparse_backward_T%lld_D%d_B%d", (long long)T, D, B);
    snprintf(kind, sizeof kind, "sparse backward D%d B%d", D, B);
    expect_counts(name, "sparse_backward_blocks_kernel<", kind,
                  sparse_backward_block_counts(D, B, (double)HQ * nqb, active, q_tiles, dq_rows, block_keys));
    snprintf(name, sizeof name, "counts_sparse_backward_columns_T%lld_D%d_B%d", (long long)T, D, B);
    snprintf(kind, sizeof kind, "sparse backward columns D%d B%d", D, B);
    expect_counts(name, "sparse_backward_columns_kernel<", kind,
                  sparse_backward_column_counts(D, B, rows, col_rows, col_tiles, col_keys));
    sparse_index_free_cuda(&dx);
    sparse_index_free(&x);
    sparse_pattern_free(&p);
    free(q_blocks);
    free_inputs(&in);
}

// The dense forward's shared-memory bytes (ldmatrix + cp.async) per mma.sync
// over one tile pair, from the formula the cases above hold equal to the
// kernel: at most 200 (each K/V fragment serves the 32 rows of a warp).
static void dense_forward_smem_per_mma(int D) {
    const KernelCounts pair = flash_forward_counts(D, 0, 1);
    const double bytes = (pair.ldmatrix_bytes + pair.cp_async_bytes) / pair.mma;
    EXPECT_COUNTED(bytes <= 200, "counts_dense_forward_D%d_smem_per_mma: %.0f bytes per mma.sync (at most 200)", D,
                   bytes);
}

// The dense backward's shared-memory bytes per mma.sync over one tile pair
// (at most 260: every fragment serves 32 rows) and its dQ atomics per MFLOP
// of the pair (5 products of 2 x bwd_bm x bwd_bn x D FLOPs: at most 800, each
// atomic covering bwd_bn keys), from the formula the cases above hold equal
// to the kernel.
static void dense_backward_per_mma(int D) {
    const FlashTiles f = flash_tiles(D);
    const KernelCounts pair = flash_backward_counts(D, 0, 1, f.bwd_bm, 0);
    const double bytes = (pair.ldmatrix_bytes + pair.cp_async_bytes) / pair.mma;
    const double mflop = 5 * 2.0 * f.bwd_bm * f.bwd_bn * D / 1e6;
    EXPECT_COUNTED(bytes <= 260, "counts_dense_backward_D%d_smem_per_mma: %.1f bytes per mma.sync (at most 260)", D,
                   bytes);
    EXPECT_COUNTED(pair.atomics / mflop <= 800, "counts_dense_backward_D%d_dq_atomics: %.0f per MFLOP (at most 800)",
                   D, pair.atomics / mflop);
}

// The sparse backward's blocks (the key-major kernel) over one query tile:
// at most 260 shared-memory bytes per mma.sync (the dense backward's tiles),
// and its dQ atomics per MFLOP the dense backward's times 128 / B (each
// atomic covers the CTA's B keys, the dense's 128): no worse than the
// dense's at blocks of 128.
static void sparse_backward_per_mma(int D, int B) {
    const FlashTiles f = flash_tiles(D);
    const int BM = sparse_backward_bm(D);
    const KernelCounts pair = sparse_backward_block_counts(D, B, 0, 0, 1, BM, 0),
                       dense = flash_backward_counts(D, 0, 1, f.bwd_bm, 0);
    const double bytes = (pair.ldmatrix_bytes + pair.cp_async_bytes) / pair.mma;
    const double per_mflop = pair.atomics / (5 * 2.0 * BM * B * D / 1e6),
                 dense_per_mflop = dense.atomics / (5 * 2.0 * f.bwd_bm * f.bwd_bn * D / 1e6);
    EXPECT_COUNTED(bytes <= 260, "counts_sparse_backward_D%d_B%d_smem_per_mma: %.1f bytes per mma.sync (at most 260)",
                   D, B, bytes);
    EXPECT_COUNTED(per_mflop == dense_per_mflop * 128 / B && (B < 128 || per_mflop <= dense_per_mflop),
                   "counts_sparse_backward_D%d_B%d_dq_atomics: %.0f per MFLOP (dense %.0f)", D, B, per_mflop,
                   dense_per_mflop);
}

int main(void) {
    Rng rng;
    rng_seed(&rng, 7);
    for (int d = 64; d <= 128; d *= 2) {
        dense_forward_smem_per_mma(d);
        dense_backward_per_mma(d);
        dense_case(128, d, &rng);
        dense_case(320, d, &rng);
        for (int b = 64; b <= 128; b *= 2) {
            sparse_backward_per_mma(d, b);
            sparse_case(384, d, b, &rng);
        }
    }
    printf("%d checks, %d failed\n", checks, check_failures);
    return check_exit();
}

#else

int main(void) {
    printf("gpu_test_counts: a native build cannot count the kernels' work (the sim's cudasim_kernel_counts)\n");
    return 0;
}

#endif
