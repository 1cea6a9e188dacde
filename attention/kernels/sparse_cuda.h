// sparse_cuda.h: the CUDA block-sparse + vertical-column flash attention
// (sparse_cuda.cu), callable from C: the kernels of sparse.h's CPU version
// over one key chunk, driven by the same SparseIndex held in device memory
// (the GPU's estimation, selection and index: sparse/sparse_select_cuda.h).
//
// Conventions as attention_cuda.h (device pointers, 16-byte aligned tensors,
// bf16 as uint16_t bits, asynchronous on `stream`, CUDA_CHECK errors), plus
// sparse.h's block-aligned arrangement: q and every key chunk are whole
// blocks of index->block_size consecutive global positions (only the
// sequence's last block may be short; the column pass's keys are a list of
// positions, see attn_sparse_forward_part_cuda). This is not checked on the
// device.
// Supported: block_size 64 or 128 (the GPU query tile is one block, key
// tiles are 64 keys: a selected block is 1 or 2 key tiles, a row's columns
// are gathered into tiles of 64), head_dim 64 and 128, GQA.
#ifndef MTRAIN_SPARSE_CUDA_H
#define MTRAIN_SPARSE_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"
#include "../sparse_types.h"

#ifdef __cplusplus
extern "C" {
#endif

// A SparseIndex in device memory: the same CSR arrays (rows h * num_q_blocks
// + i), allocated with room for block_capacity blocks and column_capacity
// columns (the index's real lengths, block_start[rows] and
// column_start[rows], live on the device and may be smaller), and for
// q_block_capacity query blocks and row_capacity, column_row_capacity
// entries of block_start, column_start. A zeroed struct holds nothing.
typedef struct {
    int num_heads;             // Hq
    int block_size;            // B
    int64_t seq_len;           // N
    int64_t num_q_blocks;      // local query blocks
    int64_t block_capacity, column_capacity;
    int64_t q_block_capacity, row_capacity, column_row_capacity;
    int64_t *q_blocks;         // [num_q_blocks]
    int64_t *block_start;      // [Hq * num_q_blocks + 1]
    int64_t *blocks;           // [block_capacity]
    int64_t *column_start;     // [Hq * num_q_blocks + 1]
    int64_t *columns;          // [column_capacity]
} SparseIndexCuda;

// A copy of a host index on the device (synchronous).
void sparse_index_to_cuda(const SparseIndex *host, SparseIndexCuda *dev);

// A copy of a device index on the host, once `stream` is done with it
// (synchronous); free with sparse_index_free.
void sparse_index_to_host(const SparseIndexCuda *dev, cudaStream_t stream, SparseIndex *host);

// Frees what dev holds (nothing for a zeroed struct) and zeroes it.
void sparse_index_free_cuda(SparseIndexCuda *dev);

// As attn_dense_forward_cuda, computing only the index's blocks and columns
// that lie in this key chunk (causal mask token-exact, and with documents,
// shape->doc_starts, the document mask: the index restricted to the
// documents by sparse_index_documents), merged into the running (o_acc,
// lse) in fp32: sparse and dense chunks can be mixed.
void attn_sparse_forward_cuda(const AttnShape *shape, const SparseIndexCuda *index,
                              const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                              const uint16_t *v, const int64_t *k_pos, float *o_acc, float *lse,
                              cudaStream_t stream);

// As attn_dense_backward_cuda (accumulates dq, dk, dv) restricted to the same
// index: the blocks' dq, dk, dv get fp32 atomics, then the columns' dq one
// writer per row (plain +=) and their dk, dv fp32 atomics (one stream: the
// two passes do not overlap).
void attn_sparse_backward_cuda(const AttnShape *shape, const SparseIndexCuda *index,
                               const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                               const uint16_t *v, const int64_t *k_pos, const float *lse,
                               const float *delta, const uint16_t *dout, float *dq, float *dk,
                               float *dv, cudaStream_t stream);

// attn_sparse_forward_cuda / attn_sparse_backward_cuda restricted to `part`
// of the index (sparse.h's SparsePart): SPARSE_BLOCKS the selected blocks
// in this chunk, SPARSE_COLUMNS the columns against K/V rows k, v [Tk, Hkv,
// D] at an ascending list of key positions k_pos [Tk] (need not be
// block-aligned; the backward's dk, dv are rows of that list). The plain
// calls are SPARSE_ALL.
void attn_sparse_forward_part_cuda(SparsePart part, const AttnShape *shape, const SparseIndexCuda *index,
                                   const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                                   const uint16_t *v, const int64_t *k_pos, float *o_acc, float *lse,
                                   cudaStream_t stream);
void attn_sparse_backward_part_cuda(SparsePart part, const AttnShape *shape, const SparseIndexCuda *index,
                                    const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                                    const uint16_t *v, const int64_t *k_pos, const float *lse,
                                    const float *delta, const uint16_t *dout, float *dq, float *dk,
                                    float *dv, cudaStream_t stream);

// x [n] (device int64) = its inclusive prefix sums, in place (CUB's scan,
// its temporary stream-ordered): the index's CSR starts, here and in the
// sparse selection and the ring's column pass.
void sparse_inclusive_sum_cuda(int64_t *x, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
