// attn_variants.cu: the registry of attention kernel variants
// (attn_variants.h) and the choice of what runs. Today each mma.sync kernel
// has one template instance per head dim, reached through its file's entry
// point (attention_cuda.h, sparse_cuda.h); the tile shapes below are those
// instances' (flash_cuda.cu Tiles<D>; sparse_cuda.cu: one query block of
// 128 per block, key tiles of 64); the Hopper forward and backward
// (flash_sm90.h) are one variant each per head dim: the forward 64 queries x
// 64 keys per tile, a producer and up to two consumer warpgroups; the
// backward 128 keys per block over query tiles of 64, a producer and two
// consumer warpgroups; the Hopper sparse forward one per head dim: a query
// block of the index (64 or 128: one consumer warpgroup per 64 queries) x
// 64 keys per tile, blocks by TMA, gathered columns by cp.async. A new
// instance adds its launch function beside its kernel and a row here; the first row of a kind and head dim is that
// kind's reference. The choice per architecture and head dim: attn_choice.h
// (measured), else the cost model (kernel_cost.h), within attention.kernels.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
extern "C" {
#include "kernel_cost.h"
}
#include "attention_cuda.h"
#include "attn_choice.h"
#include "attn_variants.h"
#include "flash_sm90.h"

static void dense_forward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_dense_forward_cuda(c->shape, c->q, c->q_pos, c->k, c->v, c->k_pos, c->o_acc, c->lse, stream);
}

static void dense_backward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_dense_backward_cuda(c->shape, c->q, c->q_pos, c->k, c->v, c->k_pos, c->lse_final, c->delta, c->dout, c->dq,
                             c->dk, c->dv, stream);
}

static void dense_forward_sm90(const AttnVariantCall *c, cudaStream_t stream) {
    attn_dense_forward_sm90(c->shape, c->q, c->q_pos, c->k, c->v, c->k_pos, c->o_acc, c->lse, stream);
}

static void dense_backward_sm90(const AttnVariantCall *c, cudaStream_t stream) {
    attn_dense_backward_sm90(c->shape, c->q, c->q_pos, c->k, c->v, c->k_pos, c->lse_final, c->delta, c->dout, c->dq,
                             c->dk, c->dv, stream);
}

static void sparse_forward_sm90(const AttnVariantCall *c, cudaStream_t stream) {
    attn_sparse_forward_part_sm90(c->part, c->shape, c->index, c->q, c->q_pos, c->k, c->v, c->k_pos, c->o_acc,
                                  c->lse, stream);
}

static void sparse_forward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_sparse_forward_part_cuda(c->part, c->shape, c->index, c->q, c->q_pos, c->k, c->v, c->k_pos, c->o_acc,
                                  c->lse, stream);
}

static void sparse_backward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_sparse_backward_part_cuda(c->part, c->shape, c->index, c->q, c->q_pos, c->k, c->v, c->k_pos, c->lse_final,
                                   c->delta, c->dout, c->dq, c->dk, c->dv, stream);
}

static const void *dense_forward_64(void) { return attn_dense_kernel(64, 0); }
static const void *dense_forward_128(void) { return attn_dense_kernel(128, 0); }
static const void *dense_backward_64(void) { return attn_dense_kernel(64, 1); }
static const void *dense_backward_128(void) { return attn_dense_kernel(128, 1); }

#define MMA ATTN_ISA_MMA_SYNC
#define SM90 ATTN_ISA_SM90
extern "C" const AttnVariant attn_variants[] = {
    {"dense_fwd_d64_q128_k64_w4_s2", ATTN_DENSE_FORWARD, MMA, 64, 128, 64, 4, 2, dense_forward, dense_forward_64},
    {"dense_fwd_d128_q128_k64_w4_s2", ATTN_DENSE_FORWARD, MMA, 128, 128, 64, 4, 2, dense_forward, dense_forward_128},
    {"dense_bwd_d64_q128_k128_w8_s2", ATTN_DENSE_BACKWARD, MMA, 64, 128, 128, 8, 2, dense_backward, dense_backward_64},
    {"dense_bwd_d128_q64_k128_w8_s2", ATTN_DENSE_BACKWARD, MMA, 128, 64, 128, 8, 2, dense_backward, dense_backward_128},
    {"sparse_fwd_d64_q128_k64_w4_s1", ATTN_SPARSE_FORWARD, MMA, 64, 128, 64, 4, 1, sparse_forward, NULL},
    {"sparse_fwd_d128_q128_k64_w4_s1", ATTN_SPARSE_FORWARD, MMA, 128, 128, 64, 4, 1, sparse_forward, NULL},
    {"sparse_bwd_d64_q128_k64_w8_s2", ATTN_SPARSE_BACKWARD, MMA, 64, 128, 64, 8, 2, sparse_backward, NULL},
    {"sparse_bwd_d128_q128_k64_w8_s2", ATTN_SPARSE_BACKWARD, MMA, 128, 128, 64, 8, 2, sparse_backward, NULL},
    {"dense_fwd_sm90_d64_q64_k64_w12_s2", ATTN_DENSE_FORWARD, SM90, 64, 64, 64, 12, 2, dense_forward_sm90, NULL},
    {"dense_fwd_sm90_d128_q64_k64_w12_s2", ATTN_DENSE_FORWARD, SM90, 128, 64, 64, 12, 2, dense_forward_sm90, NULL},
    {"dense_bwd_sm90_d64_q64_k128_w12_s2", ATTN_DENSE_BACKWARD, SM90, 64, 64, 128, 12, 2, dense_backward_sm90, NULL},
    {"dense_bwd_sm90_d128_q64_k128_w12_s2", ATTN_DENSE_BACKWARD, SM90, 128, 64, 128, 12, 2, dense_backward_sm90, NULL},
    {"sparse_fwd_sm90_d64_q128_k64_w12_s2", ATTN_SPARSE_FORWARD, SM90, 64, 128, 64, 12, 2, sparse_forward_sm90, NULL},
    {"sparse_fwd_sm90_d128_q128_k64_w12_s2", ATTN_SPARSE_FORWARD, SM90, 128, 128, 64, 12, 2, sparse_forward_sm90, NULL},
};
#undef MMA
#undef SM90
extern "C" const int attn_variant_count = sizeof(attn_variants) / sizeof(attn_variants[0]);

extern "C" AttnVariantResources attn_variant_resources(const AttnVariant *v) {
    AttnVariantResources r = {-1, -1, -1, -1, -1};
    if (!v->kernel) return r;
    const void *kernel = v->kernel();
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    r.registers = attr.numRegs;
    r.static_smem = (long)attr.sharedSizeBytes;
    r.dynamic_smem = attr.maxDynamicSharedSizeBytes;
    r.local_bytes = (long)attr.localSizeBytes;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, kernel, v->warps * 32,
                                                             (size_t)attr.maxDynamicSharedSizeBytes));
    return r;
}

extern "C" const AttnChoiceRow attn_choice_rows[] = {ATTN_CHOICE_ROWS{0, 0, ATTN_DENSE_FORWARD, NULL, 0, NULL}};

static int is_sparse(AttnVariantKind k) { return k == ATTN_SPARSE_FORWARD || k == ATTN_SPARSE_BACKWARD; }
static int is_backward(AttnVariantKind k) { return k == ATTN_DENSE_BACKWARD || k == ATTN_SPARSE_BACKWARD; }

// The cost model's TFLOP/s for v on a causal pass of 16K tokens, 16 q heads (sparse: 5 % of the key blocks
// of 128), on the rates of an A100 (sm_80) or an H100 (sm_90 and later). The counts are those of the
// kernels' tile shapes per head dim (kernel_counts.h).
static double predicted_tflops(const AttnVariant *v, int arch) {
    const double density = is_sparse(v->kind) ? 0.05 : 1.0, n = 16384, heads = 16;
    KernelCounts fwd, bwd;
    attn_pass_counts(v->head_dim, (int64_t)n, heads, density, 128, &fwd, &bwd);
    const KernelCounts *c = is_backward(v->kind) ? &bwd : &fwd;
    const AttnCost cost = attn_cost(c, attn_exp2_count(c, v->head_dim, is_backward(v->kind)),
                                    attn_blocks_per_sm(is_sparse(v->kind), is_backward(v->kind), v->head_dim, 128),
                                    attn_gpu_rates(arch < 90 ? "a100-80g" : "h100"));
    const double flops = 2.0 * n * n * heads * v->head_dim * density * (is_backward(v->kind) ? ATTN_BACKWARD_FLOPS : 1.0);
    return flops / cost.seconds / 1e12;
}

extern "C" bool attn_variant_runs_on(const AttnVariant *v, int arch) {
    return v->isa == ATTN_ISA_MMA_SYNC ? arch >= 80 : arch == 90;
}

// Whether v is a candidate for `kind` at head_dim on arch under `kernels` (attn_variant_choose).
static bool candidate(const AttnVariant *v, AttnVariantKind kind, int head_dim, int arch, AttnKernels kernels) {
    if (v->kind != kind || v->head_dim != head_dim || !attn_variant_runs_on(v, arch)) return false;
    if (kernels == ATTN_KERNELS_SM80) return v->isa == ATTN_ISA_MMA_SYNC;
    if (kernels != ATTN_KERNELS_SM90 || v->isa == ATTN_ISA_SM90) return true;
    for (int j = 0; j < attn_variant_count; j++) {
        const AttnVariant *w = &attn_variants[j];
        if (w->kind == kind && w->head_dim == head_dim && w->isa == ATTN_ISA_SM90 && attn_variant_runs_on(w, arch))
            return false;
    }
    return true;
}

extern "C" AttnChoice attn_variant_choose(const AttnChoiceRow *rows, AttnVariantKind kind, int head_dim, int arch,
                                          AttnKernels kernels) {
    for (int i = 0; rows[i].variant; i++) {
        if (rows[i].arch != arch || rows[i].head_dim != head_dim || rows[i].kind != kind) continue;
        for (int j = 0; j < attn_variant_count; j++) {
            const AttnVariant *v = &attn_variants[j];
            if (strcmp(v->name, rows[i].variant) || !candidate(v, kind, head_dim, arch, kernels)) continue;
            const AttnChoice measured = {v, ATTN_CHOSEN_MEASURED, rows[i].tflops};
            return measured;
        }
    }
    AttnChoice best = {NULL, ATTN_CHOSEN_BY_CONFIG, 0};
    for (int j = 0; j < attn_variant_count; j++) {
        const AttnVariant *v = &attn_variants[j];
        if (!candidate(v, kind, head_dim, arch, kernels)) continue;
        if (v->isa != ATTN_ISA_MMA_SYNC) {   // not modelled: under sm90 the first, never under auto
            if (kernels == ATTN_KERNELS_SM90 && !best.variant) best.variant = v;
            continue;
        }
        const double t = predicted_tflops(v, arch);
        if (best.by != ATTN_CHOSEN_PREDICTED || t > best.tflops) {
            best.variant = v;
            best.by = ATTN_CHOSEN_PREDICTED;
            best.tflops = t;
        }
    }
    return best;
}

// The process's attention.kernels and the choices made under it on the current GPU, per head dim.
#define CHOSEN_HEAD_DIMS 4
static AttnKernels constraint = ATTN_KERNELS_AUTO;
static struct {
    int head_dim;
    AttnChoice kinds[4];   // by AttnVariantKind
} chosen[CHOSEN_HEAD_DIMS];
static int chosen_count;

static int device_arch(void) {
    int device, major, minor;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor;
}

extern "C" void attn_variants_constrain(AttnKernels kernels) {
    CHECK(kernels != ATTN_KERNELS_SM90 || device_arch() == 90,
          "attention.kernels: sm90 needs a GPU of compute capability 9.0 (this one is not; use auto or sm80)");
    if (kernels != constraint) chosen_count = 0;
    constraint = kernels;
}

// The choices for head_dim (made on first use).
static const AttnChoice *choices(int head_dim) {
    for (int i = 0; i < chosen_count; i++)
        if (chosen[i].head_dim == head_dim) return chosen[i].kinds;
    CHECK(chosen_count < CHOSEN_HEAD_DIMS, "attention (CUDA): more than %d head dims in one process",
          CHOSEN_HEAD_DIMS);
    const int arch = device_arch();
    chosen[chosen_count].head_dim = head_dim;
    for (int k = 0; k < 4; k++)
        chosen[chosen_count].kinds[k] =
            attn_variant_choose(attn_choice_rows, (AttnVariantKind)k, head_dim, arch, constraint);
    return chosen[chosen_count++].kinds;
}

extern "C" void attn_variant_launch(AttnVariantKind kind, const AttnVariantCall *call, cudaStream_t stream) {
    const AttnVariant *v = choices(call->shape->head_dim)[kind].variant;
    CHECK(v, "attention (CUDA): head_dim %d (supported: 64, 128)", call->shape->head_dim);
    v->launch(call, stream);
}

extern "C" void attn_variants_report(int head_dim, int sparse) {
    static int reported;
    if (reported) return;
    reported = 1;
    const int arch = device_arch();
    const AttnChoice *c = choices(head_dim);
    char line[512];
    int len = snprintf(line, sizeof line, "attention kernels on sm_%d, head_dim %d: ", arch, head_dim);
    for (int k = 0; k < 2; k++) {
        const AttnChoice *kind = &c[sparse ? ATTN_SPARSE_FORWARD + k : ATTN_DENSE_FORWARD + k];
        if (!kind->variant) continue;
        len += snprintf(line + len, sizeof line - (size_t)len, "%s%s ", k ? ", " : "", kind->variant->name);
        if (kind->by == ATTN_CHOSEN_BY_CONFIG)
            len += snprintf(line + len, sizeof line - (size_t)len, "(attention.kernels: sm90)");
        else
            len += snprintf(line + len, sizeof line - (size_t)len, "(%s: %.0f TFLOP/s)",
                            kind->by == ATTN_CHOSEN_MEASURED ? "sweep" : "cost model", kind->tflops);
    }
    int swept = 0;
    for (int i = 0; attn_choice_rows[i].variant; i++) swept |= attn_choice_rows[i].arch == arch;
    if (swept) fprintf(stderr, "%s\n", line);
    else fprintf(stderr, "%s; no sweep for sm_%d yet\n", line, arch);
}
