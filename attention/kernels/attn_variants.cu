// attn_variants.cu: the registry of attention kernel variants
// (attn_variants.h). Today each kernel has one template instance per head
// dim, reached through its file's entry point (attention_cuda.h,
// sparse_cuda.h); the tile shapes below are those instances' (flash_cuda.cu
// Tiles<D>; sparse_cuda.cu: one query block of 128 per block, key tiles of
// 64). A new instance adds its launch function beside its kernel and a row
// here; the first row of a kind and head dim is that kind's reference. The
// choice per architecture and head dim: attn_choice.h (measured), else the
// cost model (trainer/plan_cost.h).
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "../../dist/cuda_check.h"
extern "C" {
#include "../../trainer/plan_cost.h"
}
#include "attention_cuda.h"
#include "attn_choice.h"
#include "attn_variants.h"

static void dense_forward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_dense_forward_cuda(c->shape, c->q, c->q_pos, c->k, c->v, c->k_pos, c->o_acc, c->lse, stream);
}

static void dense_backward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_dense_backward_cuda(c->shape, c->q, c->q_pos, c->k, c->v, c->k_pos, c->lse, c->delta, c->dout, c->dq,
                             c->dk, c->dv, stream);
}

static void sparse_forward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_sparse_forward_cuda(c->shape, c->index, c->q, c->q_pos, c->k, c->v, c->k_pos, c->o_acc, c->lse, stream);
}

static void sparse_backward(const AttnVariantCall *c, cudaStream_t stream) {
    attn_sparse_backward_cuda(c->shape, c->index, c->q, c->q_pos, c->k, c->v, c->k_pos, c->lse, c->delta, c->dout,
                              c->dq, c->dk, c->dv, stream);
}

static const void *dense_forward_64(void) { return attn_dense_kernel(64, 0); }
static const void *dense_forward_128(void) { return attn_dense_kernel(128, 0); }
static const void *dense_backward_64(void) { return attn_dense_kernel(64, 1); }
static const void *dense_backward_128(void) { return attn_dense_kernel(128, 1); }

extern "C" const AttnVariant attn_variants[] = {
    {"dense_fwd_d64_q128_k64_w4_s2", ATTN_DENSE_FORWARD, 64, 128, 64, 4, 2, dense_forward, dense_forward_64},
    {"dense_fwd_d128_q128_k64_w4_s2", ATTN_DENSE_FORWARD, 128, 128, 64, 4, 2, dense_forward, dense_forward_128},
    {"dense_bwd_d64_q128_k128_w8_s2", ATTN_DENSE_BACKWARD, 64, 128, 128, 8, 2, dense_backward, dense_backward_64},
    {"dense_bwd_d128_q64_k128_w8_s2", ATTN_DENSE_BACKWARD, 128, 64, 128, 8, 2, dense_backward, dense_backward_128},
    {"sparse_fwd_d64_q128_k64_w4_s1", ATTN_SPARSE_FORWARD, 64, 128, 64, 4, 1, sparse_forward, NULL},
    {"sparse_fwd_d128_q128_k64_w4_s1", ATTN_SPARSE_FORWARD, 128, 128, 64, 4, 1, sparse_forward, NULL},
    {"sparse_bwd_d64_q128_k64_w8_s2", ATTN_SPARSE_BACKWARD, 64, 128, 64, 8, 2, sparse_backward, NULL},
    {"sparse_bwd_d128_q128_k64_w8_s2", ATTN_SPARSE_BACKWARD, 128, 128, 64, 8, 2, sparse_backward, NULL},
};
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

// The sweep's measured choices (attn_choice.h), then a row that ends the list.
static const struct {
    int arch, head_dim;
    AttnVariantKind kind;
    const char *variant;
    double tflops;
    const char *sweep;
} attn_choices[] = {ATTN_CHOICE_ROWS{0, 0, ATTN_DENSE_FORWARD, NULL, 0, NULL}};

static int is_sparse(AttnVariantKind k) { return k == ATTN_SPARSE_FORWARD || k == ATTN_SPARSE_BACKWARD; }
static int is_backward(AttnVariantKind k) { return k == ATTN_DENSE_BACKWARD || k == ATTN_SPARSE_BACKWARD; }

// The cost model's TFLOP/s for v on a causal pass of 16K tokens, 16 q heads (sparse: 5 % of the key blocks
// of 128), on the rates of an A100 (sm_80) or an H100 (sm_90 and later). The counts are those of the
// kernels' tile shapes per head dim (plan_counts.h).
static double predicted_tflops(const AttnVariant *v, int arch) {
    const double density = is_sparse(v->kind) ? 0.05 : 1.0, n = 16384, heads = 16;
    KernelCounts fwd, bwd;
    attn_pass_counts(v->head_dim, (int64_t)n, heads, density, 128, &fwd, &bwd);
    const KernelCounts *c = is_backward(v->kind) ? &bwd : &fwd;
    const AttnCost cost = attn_cost(c, attn_exp2_count(c, v->head_dim, is_backward(v->kind)),
                                    attn_blocks_per_sm(is_sparse(v->kind), is_backward(v->kind), v->head_dim, 128),
                                    attn_gpu_rates(arch < 90 ? "a100-80g" : "h100"));
    const double flops = 2.0 * n * n * heads * v->head_dim * density * (is_backward(v->kind) ? 2.5 : 1.0);
    return flops / cost.seconds / 1e12;
}

extern "C" const AttnVariant *attn_variant_choose(AttnVariantKind kind, int head_dim, int arch, double *tflops,
                                                  int *measured) {
    for (int i = 0; attn_choices[i].variant; i++) {
        if (attn_choices[i].arch != arch || attn_choices[i].head_dim != head_dim || attn_choices[i].kind != kind)
            continue;
        for (int j = 0; j < attn_variant_count; j++)
            if (!strcmp(attn_variants[j].name, attn_choices[i].variant)) {
                *tflops = attn_choices[i].tflops;
                *measured = 1;
                return &attn_variants[j];
            }
    }
    const AttnVariant *best = NULL;
    *measured = 0;
    for (int j = 0; j < attn_variant_count; j++) {
        const AttnVariant *v = &attn_variants[j];
        if (v->kind != kind || v->head_dim != head_dim) continue;
        const double t = predicted_tflops(v, arch);
        if (!best || t > *tflops) { best = v; *tflops = t; }
    }
    return best;
}

extern "C" void attn_variants_report(int head_dim, int sparse) {
    static int reported;
    if (reported) return;
    reported = 1;
    int major, minor;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    const int arch = major * 10 + minor;
    const AttnVariantKind kinds[2] = {sparse ? ATTN_SPARSE_FORWARD : ATTN_DENSE_FORWARD,
                                      sparse ? ATTN_SPARSE_BACKWARD : ATTN_DENSE_BACKWARD};
    char line[512];
    int len = 0, measured = 0;
    for (int k = 0; k < 2; k++) {
        double tflops = 0;
        const AttnVariant *v = attn_variant_choose(kinds[k], head_dim, arch, &tflops, &measured);
        if (v) len += snprintf(line + len, sizeof line - (size_t)len, "%s%s %.0f TFLOP/s", k ? ", " : "", v->name, tflops);
    }
    if (measured)
        fprintf(stderr, "attention kernels: chosen by the sweep of sm_%d (%s, measured)\n", arch, line);
    else
        fprintf(stderr, "attention kernels: chosen by the cost model (%s, predicted); no sweep for sm_%d yet\n", line,
                arch);
}
