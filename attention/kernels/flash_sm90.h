// flash_sm90.h: the Hopper (sm_90a) dense attention forward (flash_sm90.cu)
// and backward (flash_sm90_backward.cu) and the sparse forward
// (flash_sm90_sparse.cu), callable from C: variants of the registry
// (attn_variants.h), which chooses between them and the mma.sync kernels
// (attention_cuda.h, sparse_cuda.h). Same arguments, chunk semantics and
// results (within rounding) as attn_dense_forward_cuda,
// attn_dense_backward_cuda and attn_sparse_forward_part_cuda.
//
// Covered: head_dim 64 and 128, any Hq a multiple of Hkv, any token counts,
// with or without documents, on a GPU of compute capability 9.0 (the build
// holds sm_90a code for it).
#ifndef MTRAIN_FLASH_SM90_H
#define MTRAIN_FLASH_SM90_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"
#include "sparse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

// Why the sm_90 forward cannot run `shape` on the current device (a phrase for
// a message), or NULL when it can.
const char *attn_sm90_unsupported(const AttnShape *shape);

// attn_dense_forward_cuda (attention_cuda.h) on the sm_90 kernels: a shape
// they do not cover (attn_sm90_unsupported) stops with one line.
void attn_dense_forward_sm90(const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                             const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                             float *o_acc, float *lse, cudaStream_t stream);

// attn_dense_backward_cuda (attention_cuda.h) on the sm_90 kernels: the shape
// must be covered (attn_sm90_unsupported NULL). dq by fp32 atomics (the last
// bits vary between runs); dk, dv added without.
void attn_dense_backward_sm90(const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                              const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                              const float *lse, const float *delta, const uint16_t *dout,
                              float *dq, float *dk, float *dv, cudaStream_t stream);

// attn_sparse_forward_part_cuda (sparse_cuda.h) on the sm_90 kernels: a
// shape they do not cover (attn_sm90_unsupported, an index block size other
// than 64 and 128) stops with one line.
void attn_sparse_forward_part_sm90(SparsePart part, const AttnShape *shape, const SparseIndexCuda *index,
                                   const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                                   const uint16_t *v, const int64_t *k_pos, float *o_acc, float *lse,
                                   cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
