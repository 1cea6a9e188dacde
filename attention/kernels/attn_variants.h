// attn_variants.h: the registry of the CUDA attention kernels' variants
// (attn_variants.cu). A variant is one template instance of a kernel (tile
// shape, warps, pipeline stages) with a launch function of one signature
// for every kind, so that gpu_sweep_attention (tests/sim/) can time each one
// on the same inputs and compare it with its kind's reference (the first
// variant of that kind and head dim), and the trainer can pick one per GPU
// architecture and head dim (attn_variant_choose).
#ifndef MTRAIN_ATTN_VARIANTS_H
#define MTRAIN_ATTN_VARIANTS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "sparse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ATTN_DENSE_FORWARD, ATTN_DENSE_BACKWARD, ATTN_SPARSE_FORWARD, ATTN_SPARSE_BACKWARD } AttnVariantKind;

// One call of any variant: device tensors as attention_cuda.h and
// sparse_cuda.h; a kind reads what its entry point takes (the forward q, k,
// v and writes o_acc, lse; the backward adds into dq, dk, dv; the sparse
// kinds also read index).
typedef struct {
    const AttnShape *shape;
    const SparseIndexCuda *index;
    const uint16_t *q, *k, *v, *dout;
    const int64_t *q_pos, *k_pos;
    float *o_acc, *lse;
    const float *delta;
    float *dq, *dk, *dv;
} AttnVariantCall;

typedef struct {
    const char *name;          // kind, head dim and shape, e.g. dense_fwd_d128_q128_k64_w4_s2
    AttnVariantKind kind;
    int head_dim;
    int tile_q, tile_k;        // queries and keys of a tile pair
    int warps, stages;         // warps per block; K/V (forward) or Q/dO (backward) buffers
    void (*launch)(const AttnVariantCall *call, cudaStream_t stream);
    // The kernel (without documents) for cudaFuncGetAttributes; NULL where its file does not expose it.
    const void *(*kernel)(void);
} AttnVariant;

extern const AttnVariant attn_variants[];
extern const int attn_variant_count;

// What cudaFuncGetAttributes and the occupancy API report for a variant's
// kernel after it ran once (its launch sets the dynamic shared memory):
// registers per thread, static, dynamic and local (spilled) bytes, blocks
// per SM at warps x 32 threads. -1 everywhere when the kernel is not exposed.
typedef struct {
    int registers, blocks_per_sm;
    long static_smem, dynamic_smem, local_bytes;
} AttnVariantResources;
AttnVariantResources attn_variant_resources(const AttnVariant *v);

// The variant of `kind` at head_dim for a GPU of compute capability `arch`
// (major x 10 + minor): the sweep's measured choice (attn_choice.h) where a
// sweep of that architecture filled it, else the cost model's (the most
// TFLOP/s predicted by kernel_cost.h for a causal pass of 16K tokens,
// 16 q heads; sparse at 5 % of the key blocks of 128). *tflops is the figure
// behind the choice, *measured whether the sweep measured it. NULL: no
// variant of that kind and head dim.
const AttnVariant *attn_variant_choose(AttnVariantKind kind, int head_dim, int arch, double *tflops, int *measured);

// Once per process, on stderr: how the kernels of head_dim (dense or sparse)
// were chosen for device 0, e.g. "attention kernels: chosen by the cost model
// (...); no sweep for sm_90 yet".
void attn_variants_report(int head_dim, int sparse);

// The dense kernels of flash_cuda.cu without documents, for head dim 64 or
// 128: the forward (backward = 0) or the backward.
const void *attn_dense_kernel(int head_dim, int backward);

#ifdef __cplusplus
}
#endif

#endif
