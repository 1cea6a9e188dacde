// sparse_cuda.h: the CUDA block-sparse + vertical-column flash attention
// (sparse_cuda.cu), callable from C: the kernels of sparse.h's CPU version
// over one key chunk, driven by the same SparseIndex held in device memory.
//
// Conventions as attention_cuda.h (device pointers, 16-byte aligned tensors,
// bf16 as uint16_t bits, asynchronous on `stream`, CUDA_CHECK errors), plus
// sparse.h's block-aligned arrangement: q and every key chunk are whole
// blocks of index->block_size consecutive global positions (only the
// sequence's last block may be short). This is not checked on the device.
// Supported: block_size 64 or 128 (the GPU query tile is one block, key
// tiles are 64 keys: a selected block is 1 or 2 key tiles, a row's columns
// are gathered into tiles of 64), head_dim 64 and 128, GQA.
#ifndef MTRAIN_SPARSE_CUDA_H
#define MTRAIN_SPARSE_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "sparse.h"

#ifdef __cplusplus
extern "C" {
#endif

// A SparseIndex in device memory: the same CSR arrays (rows h * num_q_blocks
// + i), allocated with room for block_capacity blocks and column_capacity
// columns (the index's real lengths, block_start[rows] and
// column_start[rows], live on the device and may be smaller).
typedef struct {
    int num_heads;             // Hq
    int block_size;            // B
    int64_t seq_len;           // N
    int64_t num_q_blocks;      // local query blocks
    int64_t block_capacity, column_capacity;
    int64_t *q_blocks;         // [num_q_blocks]
    int64_t *block_start;      // [Hq * num_q_blocks + 1]
    int64_t *blocks;           // [block_capacity]
    int64_t *column_start;     // [Hq * num_q_blocks + 1]
    int64_t *columns;          // [column_capacity]
} SparseIndexCuda;

// A copy of a host index on the device (synchronous).
void sparse_index_to_cuda(const SparseIndex *host, SparseIndexCuda *dev);

void sparse_index_free_cuda(SparseIndexCuda *dev);

// As attn_dense_forward_cuda, computing only the index's blocks and columns
// that lie in this key chunk (causal mask token-exact), merged into the
// running (o_acc, lse) in fp32: sparse and dense chunks can be mixed.
void attn_sparse_forward_cuda(const AttnShape *shape, const SparseIndexCuda *index,
                              const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                              const uint16_t *v, const int64_t *k_pos, float *o_acc, float *lse,
                              cudaStream_t stream);

// As attn_dense_backward_cuda (accumulates dq, dk, dv) restricted to the same
// index. dq has one writer per row (plain +=); dk, dv get fp32 atomics.
void attn_sparse_backward_cuda(const AttnShape *shape, const SparseIndexCuda *index,
                               const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                               const uint16_t *v, const int64_t *k_pos, const float *lse,
                               const float *delta, const uint16_t *dout, float *dq, float *dk,
                               float *dv, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
