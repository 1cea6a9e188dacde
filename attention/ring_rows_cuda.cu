// ring_rows_cuda.cu: the row moves of the ring attention's messages on the
// GPU (ring_rows_cuda.h): gather, scatter and add of selected rows, one
// thread per element (16-bit units for the moves, fp32 for the add).
#include <cuda_runtime.h>
#include <stdint.h>

#include "../dist/cuda_check.h"
#include "../dist/cuda_elementwise.cuh"
#include "../dist/cuda_kernel.h"
#include "ring_rows_cuda.h"

// Element e of the packed message [2, n, units]: (part, j, x); its row in
// the full layout [2, full, units] is sel[j]. gather: packed <- full;
// scatter: full <- packed.
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) move_rows_kernel(uint16_t *dst, const uint16_t *src,
                                                                         int64_t full, const int64_t *sel, int64_t n,
                                                                         int64_t units, int gather) {
    const int64_t total = 2 * n * units;
    FOR_EACH(e, total) {
        const int64_t x = e % units, j = (e / units) % n, part = e / (units * n);
        const int64_t at = (part * full + sel[j]) * units + x;
        if (gather) dst[e] = src[at];
        else dst[at] = src[e];
    }
}

__global__ void __launch_bounds__(ELEMENTWISE_THREADS) add_rows_kernel(float *dk, float *dv, const float *in,
                                                                        const int64_t *sel, int64_t n, int64_t kv) {
    const int64_t total = 2 * n * kv;
    FOR_EACH(e, total) {
        const int64_t x = e % kv, j = (e / kv) % n, part = e / (kv * n);
        (part ? dv : dk)[sel[j] * kv + x] += in[e];
    }
}

static void move_rows(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n, size_t row_bytes,
                      int gather, cudaStream_t stream) {
    const int64_t units = (int64_t)(row_bytes / sizeof(uint16_t));
    if (n == 0 || units == 0) return;
    CUDA_LAUNCH(move_rows_kernel, grid_for(2 * n * units, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream,
                (uint16_t *)dst, (const uint16_t *)src, full, sel, n, units, gather);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void ring_gather_rows_cuda(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                                      size_t row_bytes, cudaStream_t stream) {
    move_rows(dst, src, full, sel, n, row_bytes, 1, stream);
}

extern "C" void ring_scatter_rows_cuda(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                                       size_t row_bytes, cudaStream_t stream) {
    move_rows(dst, src, full, sel, n, row_bytes, 0, stream);
}

extern "C" void ring_add_rows_cuda(float *dk, float *dv, const float *in, const int64_t *sel, int64_t n, int64_t kv,
                                   cudaStream_t stream) {
    if (n == 0 || kv == 0) return;
    CUDA_LAUNCH(add_rows_kernel, grid_for(2 * n * kv, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, dk, dv, in,
                sel, n, kv);
    CUDA_CHECK(cudaGetLastError());
}
