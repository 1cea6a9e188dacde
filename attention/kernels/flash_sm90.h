// flash_sm90.h: the Hopper (sm_90a) dense attention forward (flash_sm90.cu)
// and backward (flash_sm90_backward.cu), and the choice between them and the
// mma.sync kernels (attention_cuda.h), callable from C. Same arguments, chunk
// semantics and results (within rounding) as attn_dense_forward_cuda and
// attn_dense_backward_cuda.
//
// Covered: head_dim 64 and 128, any Hq a multiple of Hkv, any token counts,
// with or without documents, on a GPU of compute capability 9.0 (the build
// holds sm_90a code for it). The op's backward is the mma.sync one.
#ifndef MTRAIN_FLASH_SM90_H
#define MTRAIN_FLASH_SM90_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"

#ifdef __cplusplus
extern "C" {
#endif

// Why the sm_90 forward cannot run `shape` on the current device (a phrase for
// a message), or NULL when it can.
const char *attn_sm90_unsupported(const AttnShape *shape);

// The process's choice for the dense forward (attention.kernels, attention.h;
// default AUTO). AUTO: the mma.sync kernels (no table of measurements
// chooses the sm_90 ones yet); SM80: the mma.sync kernels; SM90: the sm_90
// kernels, and on a device without compute capability 9.0 one line and exit
// here, on a shape they do not cover one line and exit at the call.
void attn_kernels_choose(AttnKernels kernels);

// attn_dense_forward_cuda (attention_cuda.h) on the sm_90 kernels: the shape
// must be covered (attn_sm90_unsupported NULL).
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

// The dense forward the process chose: attn_dense_forward_sm90 under SM90,
// attn_dense_forward_cuda otherwise (the mma.sync kernels).
void attn_dense_forward_chosen_cuda(const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                                    const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                                    float *o_acc, float *lse, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
