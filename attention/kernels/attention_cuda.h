// attention_cuda.h: the CUDA dense flash attention kernels (flash_cuda.cu),
// callable from C. Same chunk semantics as attention.h's CPU kernels: the
// forward merges one key chunk into a running (o, lse), the backward
// accumulates one chunk's dQ, dK, dV.
//
// Every pointer is device memory, 16-byte aligned; every call is enqueued on
// `stream` (asynchronous; errors through CUDA_CHECK). bf16 tensors are passed
// as uint16_t (the bits of a bf16; dist/util.h converts on the host).
//   q, dout       : [Tq, Hq, D] bf16      k, v  : [Tk, Hkv, D] bf16
//   o_acc         : [Tq, Hq, D] fp32, the running output between chunks
//   o             : [Tq, Hq, D] bf16, the final output (attn_output_bf16_cuda)
//   lse, delta    : [Hq, Tq] fp32         q_pos [Tq], k_pos [Tk] : int64
//   dq            : [Tq, Hq, D] fp32      dk, dv : [Tk, Hkv, D] fp32
// Supported: head_dim 64 and 128, Hq a multiple of Hkv (GQA, K and V never
// repeated). Documents: shape->doc_starts adds the mask k_pos >=
// attn_doc_first(q_pos); the kernels read the list from its device copy
// shape->doc_starts_device (the caller's, put there once per sequence) and
// each call finds every query's document start there, on the device.
// shape->block_size is not used: the GPU tiles are fixed per head
// dim (docs/DECISIONS.md); results do not depend on the tiling beyond
// rounding.
#ifndef MTRAIN_ATTENTION_CUDA_H
#define MTRAIN_ATTENTION_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"

#ifdef __cplusplus
extern "C" {
#endif

// The documents of a call on the device: q_first [Tq] (int64), the first key
// position each query may see (attn_doc_first of shape->doc_starts_device
// at every q_pos [Tq], both device memory), in stream-ordered scratch
// (release with cudaFreeAsync on `stream`). NULL without documents. The
// kernels with documents call it themselves.
int64_t *attn_doc_first_cuda(const AttnShape *shape, const int64_t *q_pos, cudaStream_t stream);

// Start a running result: o_acc = 0, lse = -inf.
void attn_forward_init_cuda(const AttnShape *shape, float *o_acc, float *lse, cudaStream_t stream);

// Causal attention of q against one key chunk (mask: k_pos <= q_pos, and
// k_pos >= attn_doc_first(q_pos) with documents), merged
// into the running (o_acc, lse) in fp32; o_acc stays normalised after every
// call and rows that see no key of this chunk are left unchanged.
void attn_dense_forward_cuda(const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                             const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                             float *o_acc, float *lse, cudaStream_t stream);

// o = bf16(o_acc), after the last chunk.
void attn_output_bf16_cuda(const AttnShape *shape, const float *o_acc, uint16_t *o,
                           cudaStream_t stream);

// delta[h, t] = sum_d dout[t, h, d] * o[t, h, d] in fp32 (FlashAttention-2's D).
void attn_backward_delta_cuda(const AttnShape *shape, const uint16_t *o, const uint16_t *dout,
                              float *delta, cudaStream_t stream);

// Gradients of the final output for q and this key chunk, P = exp(S - lse)
// recomputed from the final lse. Accumulates (+=) into dq, dk, dv with fp32
// atomics, so the sum order (and the last bits) can vary between runs.
void attn_dense_backward_cuda(const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                              const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                              const float *lse, const float *delta, const uint16_t *dout,
                              float *dq, float *dk, float *dv, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
