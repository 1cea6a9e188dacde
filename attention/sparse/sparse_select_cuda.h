// sparse_select_cuda.h: the sparse plan's steps on the GPU
// (sparse_select_cuda.cu), callable from C, as sparse.h's on the CPU:
// estimation, selection into a device SparsePatternCuda, and the device
// SparseIndexCuda (kernels/sparse_cuda.h) built from it. Conventions as
// kernels/sparse_cuda.h (device pointers, bf16 as uint16_t bits,
// asynchronous on `stream`, CUDA_CHECK errors).
#ifndef MTRAIN_SPARSE_SELECT_CUDA_H
#define MTRAIN_SPARSE_SELECT_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"
#include "../kernels/sparse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

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
