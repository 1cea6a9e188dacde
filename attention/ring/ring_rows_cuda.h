// ring_rows_cuda.h: the row moves of the ring attention's messages on the
// GPU (ring_rows_cuda.cu), callable from C, for the device RingMemory of
// ring_cuda.c and its gathered columns. A message [2, n, row] holds n rows
// of K then n rows of V (or dK, dV); sel [n] (device, int64) are rows of
// the chunk's full layout [2, full, row]. Asynchronous on `stream`; the buffers must not overlap.
#ifndef MTRAIN_RING_ROWS_CUDA_H
#define MTRAIN_RING_ROWS_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// dst [2, n, row] = rows sel of src [2, full, row]; row_bytes a multiple of 2.
void ring_gather_rows_cuda(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                           size_t row_bytes, cudaStream_t stream);
// Rows sel of dst [2, full, row] = src [2, n, row].
void ring_scatter_rows_cuda(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                            size_t row_bytes, cudaStream_t stream);
// The same moves between a message and two row arrays: part 0 of dst [2, n,
// row] = rows sel0 of src0, part 1 = rows sel1 of src1 (K and V apart, or
// rows of one array at two lists); scatter the other way. live (device,
// or NULL for all n): only rows j < *live move (a list held at a bound,
// its real length on the device).
void ring_gather_pair_rows_cuda(void *dst, const void *src0, const int64_t *sel0, const void *src1,
                                const int64_t *sel1, int64_t n, const int64_t *live, size_t row_bytes,
                                cudaStream_t stream);
void ring_scatter_pair_rows_cuda(void *dst0, const int64_t *sel0, void *dst1, const int64_t *sel1,
                                 const void *src, int64_t n, const int64_t *live, size_t row_bytes,
                                 cudaStream_t stream);
// dk [*, kv] rows sel += in [0, n, kv], dv rows sel += in [1, n, kv] (fp32);
// live as above.
void ring_add_rows_cuda(float *dk, float *dv, const float *in, const int64_t *sel, int64_t n, const int64_t *live,
                        int64_t kv, cudaStream_t stream);
// out [n] = the log-sum-exp over the W blocks of all [W, n] (fp32), block 0
// first, -inf parts skipped (ring_sparse_combine_lse's order): every rank
// that runs it on the same blocks holds the same bits.
void ring_combine_lse_cuda(const float *all, int W, int64_t n, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
