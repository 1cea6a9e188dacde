// sparse_cuda.h: the CUDA block-sparse + vertical-column flash attention
// (sparse_cuda.cu), callable from C: the kernels of sparse.h's CPU version
// over one key chunk, driven by the same SparseIndex held in device memory.
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

#include "../sparse/sparse.h"

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

// A SparsePattern in device memory: per q head h, its vertical positions
// vertical[h * vertical_capacity ..] (vertical_count[h] of them, ascending)
// and slash offsets likewise. The buffers hold vertical_allocated,
// slash_allocated and count_allocated int64 (at least what the capacities
// need). A zeroed struct holds nothing.
typedef struct {
    int num_heads;             // Hq
    int64_t seq_len;           // N
    int64_t vertical_capacity, slash_capacity;
    int64_t vertical_allocated, slash_allocated, count_allocated;
    int64_t *vertical_count;   // [Hq]
    int64_t *slash_count;      // [Hq] (inside the vertical_count allocation)
    int64_t *vertical;         // [Hq][vertical_capacity]
    int64_t *slash;            // [Hq][slash_capacity]
} SparsePatternCuda;

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
// index. dq has one writer per row (plain +=); dk, dv get fp32 atomics.
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

// Estimation pass 1 on the GPU (sparse_select_cuda.cu), as
// sparse_estimate_lse: shape q_tokens = Lq (1 to 128) estimation queries qe
// [Lq, Hq, D] bf16 at qe_pos [Lq], k_tokens = this chunk's keys k [Tk, Hkv, D]
// bf16 at k_pos; merges into lse_est [Hq, Lq] (fp32, starts at -inf). With
// documents (shape->doc_starts) a query sees only keys of its document.
void sparse_estimate_lse_cuda(const AttnShape *shape, const uint16_t *qe, const int64_t *qe_pos,
                              const uint16_t *k, const int64_t *k_pos, float *lse_est,
                              cudaStream_t stream);

// Pass 2, as sparse_estimate_scores: with the final lse_est, vertical [Hq, N]
// and slash [Hq, N] (fp32, start at zero) += this chunk's softmax sums
// (same-document scores only, with documents).
void sparse_estimate_scores_cuda(const AttnShape *shape, const uint16_t *qe, const int64_t *qe_pos,
                                 const uint16_t *k, const int64_t *k_pos, const float *lse_est,
                                 int64_t seq_len, float *vertical, float *slash, cudaStream_t stream);

// Selection on the GPU, as sparse_select (same budgets, same order: descending
// score, ties to the smaller position / offset; topp summed in double in the
// same order as the CPU, so equal scores give equal lines). vertical, slash
// device [Hq, N], finite and >= 0 (not checked); fixed_vertical, fixed_slash
// host [Hq] or NULL (at most 128 q heads: passed to the device by value). *pattern (zeroed, or a previous call's) is reused: its
// buffers are replaced (cudaFree, cudaMalloc: a wait for the device) only
// when this call needs more; free with sparse_pattern_free_cuda. The work is
// enqueued on `stream`; its temporaries are stream-ordered (cudaMallocAsync).
void sparse_select_cuda(const AttentionConfig *cfg, const float *vertical, const float *slash,
                        int num_heads, int64_t seq_len, const int *fixed_vertical,
                        const int *fixed_slash, SparsePatternCuda *pattern, cudaStream_t stream);

void sparse_pattern_free_cuda(SparsePatternCuda *pattern);

// The most blocks and columns one index row of `pattern` can hold
// (docs/DECISIONS.md): a row keeps its diagonal block and at most two key
// blocks per slash line (a slash crosses B consecutive keys), no more than
// the sequence's blocks; its columns are vertical lines (at most the
// pattern's vertical capacity, sink lines included) and, with documents, a
// document's sink (`sink`: 0 without documents), no more than N.
void sparse_index_bound(const SparsePatternCuda *pattern, int block_size, int sink, int64_t *row_blocks,
                        int64_t *row_columns);

// x [n] (device int64) = its inclusive prefix sums, in place (CUB's scan,
// its temporary stream-ordered).
void sparse_inclusive_sum_cuda(int64_t *x, int64_t n, cudaStream_t stream);

// q_blocks device [ceil(T / B)]: the global block of each local block, from
// the device positions pos [T] (whole blocks of B).
void sparse_query_blocks_cuda(const int64_t *pos, int64_t tokens, int block_size, int64_t *q_blocks,
                              cudaStream_t stream);

// The index on the GPU, as sparse_index_build followed by
// sparse_index_documents: q_blocks device [num_q_blocks]; doc_starts
// device [doc_count] (AttnShape.doc_starts_device; NULL: one document)
// restricts each row to its queries' documents and adds the sink (`sink`
// tokens) of each, the same blocks and columns as the CPU. *index (zeroed, or a previous call's) is
// reused, its buffers held at sparse_index_bound's rows x row_blocks
// blocks and rows x row_columns columns, replaced (a wait for the device)
// only when that bound grows; nothing is read back, the real lengths stay
// on the device. Free with sparse_index_free_cuda.
void sparse_index_build_cuda(const SparsePatternCuda *pattern, int block_size,
                             const int64_t *q_blocks, int64_t num_q_blocks, const int64_t *doc_starts,
                             int64_t doc_count, int sink, SparseIndexCuda *index, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
