// ring_columns_cuda.cu: the sparse ring's per-layer plan on the GPU
// (ring_columns_cuda.h): one thread per element for the estimation's
// initial values and an index's bits (64-bit atomic OR, order-free); the
// gathered columns from the ranks' column bits by two prefix sums, one over
// the marked positions (a column's place) and one over the ring's tokens (a
// column's slot among its owner's), so nothing is read back.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_elementwise.cuh"
#include "../../dist/cuda_kernel.h"
#include "../sparse/sparse_select_cuda.h"
#include "ring_columns_cuda.h"

__global__ void __launch_bounds__(ELEMENTWISE_THREADS) estimation_init_kernel(int64_t *pos, int64_t Lq,
                                                                               int64_t first, float *lse,
                                                                               int64_t n) {
    FOR_EACH(i, Lq > n ? Lq : n) {
        if (i < Lq) pos[i] = first + i;
        if (i < n) lse[i] = -INFINITY;
    }
}

// bits |= 1 << entry for the list's entries [0, *end) of its capacity.
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) index_bits_kernel(const int64_t *entries, const int64_t *end,
                                                                          int64_t capacity, uint64_t *bits) {
    FOR_EACH(e, capacity) {
        if (e >= *end) return;
        const int64_t x = entries[e];
        atomicOr((unsigned long long *)&bits[x / 64], 1ull << (x % 64));
    }
}

__device__ __forceinline__ bool marked(const uint64_t *mark, int64_t x) { return mark[x / 64] >> (x % 64) & 1; }

// mark [words] = the OR of the W ranks' bits; place [words + 1]: place[w +
// 1] = the marked positions in word w (place[0] = 0; summed next).
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) columns_mark_kernel(const uint64_t *all, int W, int64_t words,
                                                                           uint64_t *mark, int64_t *place) {
    FOR_EACH(w, words) {
        uint64_t m = 0;
        for (int r = 0; r < W; r++) m |= all[(int64_t)r * words + w];
        mark[w] = m;
        place[w + 1] = __popcll(m);
        if (w == 0) place[0] = 0;
    }
}

// slot [N + 1]: slot[i + 1] = 1 when the ring's token i is marked (slot[0] = 0; summed next).
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) columns_flag_kernel(const int64_t *positions, int64_t N,
                                                                           const uint64_t *mark, int64_t *slot) {
    FOR_EACH(i, N) {
        slot[i + 1] = marked(mark, positions[i]);
        if (i == 0) slot[0] = 0;
    }
}

// The ring's tokens: positions [N] by rank, rank r's at offsets[r] ..
// (offsets [W + 1]); me this rank.
struct RingTokens {
    const int64_t *positions, *offsets;
    int W, me;
    int64_t N;
};

// The gathered columns' plan at its bounds (ring_columns_plan_cuda's
// outputs, ring_columns_cuda.h).
struct ColumnsPlan {
    int64_t count_bound, owned_bound;
    int64_t *column_pos, *column_rows, *own_local, *live;
};

// With place and slot summed: every marked token's column (its place j
// among the marked positions, its owner r and slot among r's), the padding
// after the columns, and the counts.
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) columns_fill_kernel(const uint64_t *mark, const int64_t *place,
                                                                           int64_t words, const int64_t *slot,
                                                                           RingTokens ring, ColumnsPlan plan) {
    const int64_t *positions = ring.positions, *offsets = ring.offsets;
    const int W = ring.W, me = ring.me;
    const int64_t N = ring.N, count_bound = plan.count_bound, owned_bound = plan.owned_bound;
    int64_t *column_pos = plan.column_pos, *column_rows = plan.column_rows, *own_local = plan.own_local;
    const int64_t count = place[words];
    FOR_EACH(i, N) {
        const int64_t x = positions[i];
        if (!marked(mark, x)) continue;
        int lo = 0, hi = W - 1;        // the owner: the last r with offsets[r] <= i
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (offsets[mid] <= i) lo = mid; else hi = mid - 1;
        }
        const int64_t s = slot[i] - slot[offsets[lo]];
        const int64_t j = place[x / 64] + __popcll(mark[x / 64] & ((1ull << (x % 64)) - 1));
        if (j >= count_bound || s >= owned_bound) continue;   // not reached: the bounds hold every column
        const int64_t block = (int64_t)lo * 2 * owned_bound;
        column_pos[j] = x;
        column_rows[j] = block + s;
        column_rows[count_bound + j] = block + owned_bound + s;
        if (lo == me) own_local[s] = i - offsets[me];
    }
    FOR_EACH(j, count_bound) {
        if (j < count) continue;
        column_pos[j] = N;
        column_rows[j] = column_rows[count_bound + j] = 0;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        plan.live[0] = count < count_bound ? count : count_bound;
        plan.live[1] = slot[offsets[me + 1]] - slot[offsets[me]];
    }
}

extern "C" void ring_estimation_init_cuda(int64_t *pos, int64_t Lq, int64_t first, float *lse, int64_t n,
                                          cudaStream_t stream) {
    const int64_t most = Lq > n ? Lq : n;
    if (most == 0) return;
    CUDA_LAUNCH(estimation_init_kernel, grid_for(most, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, pos, Lq,
                first, lse, n);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void ring_index_bits_cuda(const SparseIndexCuda *x, bool columns, uint64_t *bits, int64_t words,
                                     cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof(uint64_t) * (size_t)words, stream));
    const int64_t rows = (int64_t)x->num_heads * x->num_q_blocks;
    const int64_t capacity = columns ? x->column_capacity : x->block_capacity;
    if (rows == 0 || capacity == 0) return;
    CUDA_LAUNCH(index_bits_kernel, grid_for(capacity, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream,
                columns ? x->columns : x->blocks, (columns ? x->column_start : x->block_start) + rows, capacity, bits);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void ring_columns_plan_cuda(const uint64_t *all, int W, int me, int64_t N, const int64_t *positions,
                                       const int64_t *offsets, int64_t count_bound, int64_t owned_bound,
                                       int64_t *column_pos, int64_t *column_rows, int64_t *own_local, int64_t *live,
                                       cudaStream_t stream) {
    const int64_t words = (N + 63) / 64;
    uint64_t *mark;
    int64_t *place, *slot;
    CUDA_CHECK(cudaMallocAsync((void **)&mark, sizeof(uint64_t) * (size_t)(words + 1), stream));
    CUDA_CHECK(cudaMallocAsync((void **)&place, sizeof(int64_t) * (size_t)(words + 1), stream));
    CUDA_CHECK(cudaMallocAsync((void **)&slot, sizeof(int64_t) * (size_t)(N + 1), stream));
    CUDA_LAUNCH(columns_mark_kernel, grid_for(words, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, all, W,
                words, mark, place);
    CUDA_CHECK(cudaGetLastError());
    CUDA_LAUNCH(columns_flag_kernel, grid_for(N, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, positions, N,
                mark, slot);
    CUDA_CHECK(cudaGetLastError());
    sparse_inclusive_sum_cuda(place + 1, words, stream);
    sparse_inclusive_sum_cuda(slot + 1, N, stream);
    const int64_t most = N > count_bound ? N : count_bound;
    const RingTokens ring = {positions, offsets, W, me, N};
    const ColumnsPlan plan = {count_bound, owned_bound, column_pos, column_rows, own_local, live};
    CUDA_LAUNCH(columns_fill_kernel, grid_for(most, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, mark, place,
                words, slot, ring, plan);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(mark, stream));
    CUDA_CHECK(cudaFreeAsync(place, stream));
    CUDA_CHECK(cudaFreeAsync(slot, stream));
}
