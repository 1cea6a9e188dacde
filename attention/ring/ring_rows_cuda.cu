// ring_rows_cuda.cu: the row moves of the ring attention's messages on the
// GPU (ring_rows_cuda.h): gather, scatter and add of selected rows, one
// thread per element (16-bit units for the moves, fp32 for the add); and the
// sparse plan's combine of the ranks' partial lse, one thread per element.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_elementwise.cuh"
#include "../../dist/cuda_kernel.h"
#include "ring_rows_cuda.h"

// Element e of the packed message [2, n, units]: (part, j, x); its row in
// the full layout of that part (full0 for K, full1 for V, [*, units]) is
// sel0[j] or sel1[j]. gather: packed <- full; scatter: full <- packed.
// Rows j >= *live (live not NULL: a count on the device) are not moved.
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) move_rows_kernel(uint16_t *packed, uint16_t *full0,
                                                                         const int64_t *sel0, uint16_t *full1,
                                                                         const int64_t *sel1, int64_t n,
                                                                         const int64_t *live, int64_t units,
                                                                         int gather) {
    const int64_t total = 2 * n * units;
    FOR_EACH(e, total) {
        const int64_t x = e % units, j = (e / units) % n, part = e / (units * n);
        if (live && j >= *live) continue;
        uint16_t *at = part ? full1 + sel1[j] * units + x : full0 + sel0[j] * units + x;
        if (gather) packed[e] = *at;
        else *at = packed[e];
    }
}

__global__ void __launch_bounds__(ELEMENTWISE_THREADS) add_rows_kernel(float *dk, float *dv, const float *in,
                                                                        const int64_t *sel, int64_t n,
                                                                        const int64_t *live, int64_t kv) {
    const int64_t total = 2 * n * kv;
    FOR_EACH(e, total) {
        const int64_t x = e % kv, j = (e / kv) % n, part = e / (kv * n);
        if (live && j >= *live) continue;
        (part ? dv : dk)[sel[j] * kv + x] += in[e];
    }
}

__global__ void __launch_bounds__(ELEMENTWISE_THREADS) combine_lse_kernel(const float *all, int W, int64_t n,
                                                                           float *out) {
    FOR_EACH(i, n) {
        float row = -INFINITY;
        for (int r = 0; r < W; r++) {
            const float part = all[r * n + i];
            if (part == -INFINITY) continue;
            const float mx = fmaxf(row, part);
            row = mx + logf(expf(row - mx) + expf(part - mx));
        }
        out[i] = row;
    }
}

static void move_rows(void *packed, void *full0, const int64_t *sel0, void *full1, const int64_t *sel1, int64_t n,
                      const int64_t *live, size_t row_bytes, int gather, cudaStream_t stream) {
    const int64_t units = (int64_t)(row_bytes / sizeof(uint16_t));
    if (n == 0 || units == 0) return;
    CUDA_LAUNCH(move_rows_kernel, grid_for(2 * n * units, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream,
                (uint16_t *)packed, (uint16_t *)full0, sel0, (uint16_t *)full1, sel1, n, live, units, gather);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void ring_gather_rows_cuda(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                                      size_t row_bytes, cudaStream_t stream) {
    char *from = (char *)src;
    move_rows(dst, from, sel, from + (size_t)full * row_bytes, sel, n, NULL, row_bytes, 1, stream);
}

extern "C" void ring_scatter_rows_cuda(void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                                       size_t row_bytes, cudaStream_t stream) {
    char *to = (char *)dst;
    move_rows((void *)src, to, sel, to + (size_t)full * row_bytes, sel, n, NULL, row_bytes, 0, stream);
}

extern "C" void ring_gather_pair_rows_cuda(void *dst, const void *src0, const int64_t *sel0, const void *src1,
                                           const int64_t *sel1, int64_t n, const int64_t *live, size_t row_bytes,
                                           cudaStream_t stream) {
    move_rows(dst, (void *)src0, sel0, (void *)src1, sel1, n, live, row_bytes, 1, stream);
}

extern "C" void ring_scatter_pair_rows_cuda(void *dst0, const int64_t *sel0, void *dst1, const int64_t *sel1,
                                            const void *src, int64_t n, const int64_t *live, size_t row_bytes,
                                            cudaStream_t stream) {
    move_rows((void *)src, dst0, sel0, dst1, sel1, n, live, row_bytes, 0, stream);
}

extern "C" void ring_add_rows_cuda(float *dk, float *dv, const float *in, const int64_t *sel, int64_t n,
                                   const int64_t *live, int64_t kv, cudaStream_t stream) {
    if (n == 0 || kv == 0) return;
    CUDA_LAUNCH(add_rows_kernel, grid_for(2 * n * kv, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, dk, dv, in,
                sel, n, live, kv);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void ring_combine_lse_cuda(const float *all, int W, int64_t n, float *out, cudaStream_t stream) {
    if (n == 0) return;
    CUDA_LAUNCH(combine_lse_kernel, grid_for(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, all, W, n, out);
    CUDA_CHECK(cudaGetLastError());
}
