// flash_cpu.h: the dense CPU attention kernels (flash_cpu.c), fp32, one key
// chunk per call, as attention.h lays out their tensors.
#ifndef MTRAIN_FLASH_CPU_H
#define MTRAIN_FLASH_CPU_H

#include <stdint.h>

#include "../attention.h"

// Start a running result: o = 0, lse = -inf.
void attn_forward_init(const AttnShape *shape, float *o, float *lse);

// Causal attention of q against one key chunk (mask: k_pos <= q_pos, and
// k_pos >= attn_doc_first(q_pos) with documents), merged
// into the running (o, lse) by log-sum-exp in fp32. o stays normalised after
// every call; rows that see no key in this chunk are left unchanged.
void attn_dense_forward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                            const float *k, const float *v, const int64_t *k_pos,
                            float *o, float *lse);

// delta[h, t] = sum_d do[t, h, d] * o[t, h, d] (FlashAttention-2's D).
void attn_backward_delta(const AttnShape *shape, const float *o, const float *dout, float *delta);

// Gradients of the final attention output with respect to q and this key
// chunk, recomputing P = exp(S - lse) from the final lse. Accumulates (+=)
// into dq [Tq, Hq, D], dk and dv [Tk, Hkv, D].
void attn_dense_backward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                             const float *k, const float *v, const int64_t *k_pos,
                             const float *lse, const float *delta, const float *dout,
                             float *dq, float *dk, float *dv);

#endif
