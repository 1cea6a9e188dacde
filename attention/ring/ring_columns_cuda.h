// ring_columns_cuda.h: the sparse ring's per-layer plan on the GPU
// (ring_columns_cuda.cu), callable from C, for ring_cuda.c: the
// estimation's initial positions and lse, bit rows of an index's key blocks
// or columns, and the gathered columns (ring_sparse.h's RingColumns) from
// every rank's column bits, held at bounds the host knows without reading
// anything back, their real counts on the device. Asynchronous on `stream`;
// scratch is stream-ordered (cudaMallocAsync).
#ifndef MTRAIN_RING_COLUMNS_CUDA_H
#define MTRAIN_RING_COLUMNS_CUDA_H

#include <stdbool.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../kernels/sparse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

// pos [Lq] = first, first + 1, ..; lse [n] = -inf (the estimation's query
// positions and the start of its partial lse).
void ring_estimation_init_cuda(int64_t *pos, int64_t Lq, int64_t first, float *lse, int64_t n, cudaStream_t stream);

// bits [words] (device) = one bit per entry of the index: of its key blocks
// (columns false: bit b for block b, ring_need_row's row) or of its columns
// (true: bit x for position x); the lists' real lengths are read on the
// device.
void ring_index_bits_cuda(const SparseIndexCuda *index, bool columns, uint64_t *bits, int64_t words,
                          cudaStream_t stream);

// The gathered columns of a ring of W ranks from all [W, words] (device: each
// rank's column bits, words = ceil(N / 64)), positions [N] and offsets [W +
// 1] (device: the ring's positions by rank, rank r's at offsets[r] ..), as
// ring_columns_build (the same positions in the same order) in the layout of
// a message of W blocks of 2 * owned_bound rows (owner r's block at r * 2 *
// owned_bound: a column's K row at its slot, its V row at owned_bound +
// slot), for count_bound >= the columns and owned_bound >= the most one rank
// holds (ring_columns_bound):
//   column_pos  [count_bound]     ascending positions, then N (matches no key)
//   column_rows [2, count_bound]  each column's K row, then its V row, in the message
//   own_local   [owned_bound]     rank me's columns' local tokens, by slot
//   live        [2]               the columns, and rank me's
void ring_columns_plan_cuda(const uint64_t *all, int W, int me, int64_t N, const int64_t *positions,
                            const int64_t *offsets, int64_t count_bound, int64_t owned_bound, int64_t *column_pos,
                            int64_t *column_rows, int64_t *own_local, int64_t *live, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
