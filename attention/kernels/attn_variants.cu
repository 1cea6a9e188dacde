// attn_variants.cu: the registry of attention kernel variants
// (attn_variants.h). Today each kernel has one template instance per head
// dim, reached through its file's entry point (attention_cuda.h,
// sparse_cuda.h); the tile shapes below are those instances' (flash_cuda.cu
// Tiles<D>; sparse_cuda.cu: one query block of 128 per block, key tiles of
// 64). A new instance adds its launch function beside its kernel and a row
// here; the first row of a kind and head dim is that kind's reference.
#include <cuda_runtime.h>

#include "../../dist/cuda_check.h"
#include "attention_cuda.h"
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
    {"dense_fwd_d64_q128_k64_w8_s2", ATTN_DENSE_FORWARD, 64, 128, 64, 8, 2, dense_forward, dense_forward_64},
    {"dense_fwd_d128_q128_k64_w8_s2", ATTN_DENSE_FORWARD, 128, 128, 64, 8, 2, dense_forward, dense_forward_128},
    {"dense_bwd_d64_q64_k64_w4_s2", ATTN_DENSE_BACKWARD, 64, 64, 64, 4, 2, dense_backward, dense_backward_64},
    {"dense_bwd_d128_q32_k64_w4_s2", ATTN_DENSE_BACKWARD, 128, 32, 64, 4, 2, dense_backward, dense_backward_128},
    {"sparse_fwd_d64_q128_k64_w8_s2", ATTN_SPARSE_FORWARD, 64, 128, 64, 8, 2, sparse_forward, NULL},
    {"sparse_fwd_d128_q128_k64_w8_s2", ATTN_SPARSE_FORWARD, 128, 128, 64, 8, 2, sparse_forward, NULL},
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
