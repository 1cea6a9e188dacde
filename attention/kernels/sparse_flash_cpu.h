// sparse_flash_cpu.h: the CPU block-sparse + vertical-column flash attention
// (sparse_flash_cpu.c): the dense kernels of attention.h restricted to a
// SparseIndex (sparse_types.h), one key chunk at a time.
#ifndef MTRAIN_SPARSE_FLASH_CPU_H
#define MTRAIN_SPARSE_FLASH_CPU_H

#include <stdint.h>

#include "../attention.h"
#include "../sparse_types.h"

// Sparse flash attention over one key chunk, as attn_dense_forward_cpu
// (flash_cpu.h) but computing only the index's blocks and columns that lie in
// this chunk (causal mask token-exact). q and this chunk block-aligned;
// index->q_blocks[i] is the global block of q's local block i.
void attn_sparse_forward_cpu(const AttnShape *shape, const SparseIndex *index,
                             const float *q, const int64_t *q_pos, const float *k,
                             const float *v, const int64_t *k_pos, float *o, float *lse);

// Backward over one key chunk, as attn_dense_backward_cpu (accumulates dq,
// dk, dv) restricted to the same index.
void attn_sparse_backward_cpu(const AttnShape *shape, const SparseIndex *index,
                              const float *q, const int64_t *q_pos, const float *k,
                              const float *v, const int64_t *k_pos, const float *lse,
                              const float *delta, const float *dout, float *dq, float *dk,
                              float *dv);

// attn_sparse_forward_cpu / attn_sparse_backward_cpu restricted to `part`.
void attn_sparse_forward_part_cpu(SparsePart part, const AttnShape *shape,
                                  const SparseIndex *index, const float *q, const int64_t *q_pos,
                                  const float *k, const float *v, const int64_t *k_pos, float *o,
                                  float *lse);
void attn_sparse_backward_part_cpu(SparsePart part, const AttnShape *shape,
                                   const SparseIndex *index, const float *q, const int64_t *q_pos,
                                   const float *k, const float *v, const int64_t *k_pos,
                                   const float *lse, const float *delta, const float *dout,
                                   float *dq, float *dk, float *dv);

#endif
