// flash_tiles.cuh: the device building blocks of the CUDA attention kernels
// (flash_cuda.cu now; the block-sparse kernels next): PTX wrappers for
// cp.async, ldmatrix and mma.sync.m16n8k16 (bf16 in, fp32 accumulate), tile
// loads global -> shared, per-tile position bounds and tile skipping, and the
// two warp-level tile products every flash kernel is made of.
// Shared tiles are row-major bf16 with rows padded by 16 bytes (8 elements),
// so the 8 row addresses of an ldmatrix land in distinct banks.
#ifndef MTRAIN_FLASH_TILES_CUH
#define MTRAIN_FLASH_TILES_CUH

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronous; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// register i receives matrix i (thread l: row l/4, columns 2(l%4), 2(l%4)+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
}
// The same, each matrix transposed (thread l: column l/4, rows 2(l%4), 2(l%4)+1).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16 *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
}

// c [16x8] += a [16x16] b [16x8]. Fragments (g = lane/4, t = lane%4):
// a: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)} as bf16 pairs;
// b: {(k 2t..2t+1, n g), (k 2t+8.., n g)}; c: {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// 2^x, approximate (2 ulp); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- tiles: loads, position bounds, skipping ----

// rows x D tile of x [T, H, D] (tokens t0.., head h) -> s [rows][D + 8] by
// cp.async, zero rows past T. All NT threads of the CTA take part.
template <int D, int NT>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *x, int64_t t0, int rows, int64_t T,
                                          int H, int h) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    for (int c = threadIdx.x; c < rows * CHUNKS; c += NT) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = t0 + r < T;
        const bf16 *src = valid ? x + ((t0 + r) * H + h) * (int64_t)D + col : x;
        cp_async16(s + r * LD + col, src, valid);
    }
}

// The first tile t' >= t (n when none) that is not skipped: key tiles with
// bound = k_lo > limit = q_hi (forward), query tiles with bound = q_hi <
// limit = k_lo (backward). Every lane of a warp calls it alike; 32 tiles a step.
template <bool KEYS>
__device__ __forceinline__ int64_t next_tile(const int64_t *bound, int64_t t, int64_t n, int64_t limit) {
    const int lane = threadIdx.x % 32;
    for (; t < n; t += 32) {
        const int64_t i = t + lane;
        const bool take = i < n && (KEYS ? bound[i] <= limit : bound[i] >= limit);
        const unsigned mask = __ballot_sync(0xffffffffu, take);
        if (mask) return t + __ffs((int)mask) - 1;
    }
    return n;
}

// Min and max of pos[t0 .. t0 + n) (entries at T and beyond left out; n <= NT)
// over the CTA; red [2 * NT / 32] shared. Contains a __syncthreads.
template <int NT>
__device__ __forceinline__ void tile_pos_bounds(const int64_t *pos, int64_t t0, int n, int64_t T,
                                                int64_t *red, int64_t *out_lo, int64_t *out_hi) {
    const bool mine = (int)threadIdx.x < n && t0 + threadIdx.x < T;
    int64_t lo = mine ? pos[t0 + threadIdx.x] : INT64_MAX, hi = mine ? pos[t0 + threadIdx.x] : INT64_MIN;
    for (int off = 16; off > 0; off /= 2) {
        lo = min(lo, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)lo, off));
        hi = max(hi, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)hi, off));
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) { red[2 * warp] = lo; red[2 * warp + 1] = hi; }
    __syncthreads();
    lo = INT64_MAX; hi = INT64_MIN;
    for (int w = 0; w < NT / 32; w++) { lo = min(lo, red[2 * w]); hi = max(hi, red[2 * w + 1]); }
    *out_lo = lo; *out_hi = hi;
}

// ---- warp-level tile products (one warp, 16 rows) ----

template <int N>
__device__ __forceinline__ void zero(float (*c)[4]) {
#pragma unroll
    for (int n = 0; n < N / 8; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// c [16 x N] += a [16 x K] b^T with b [N x K]: a and b row-major bf16 in shared
// memory, rows lda and ldb elements apart, a at the warp's first row.
template <int K, int N>
__device__ __forceinline__ void mma_abt(float (*c)[4], const bf16 *a, int lda, const bf16 *b, int ldb) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[4];
        ldmatrix_x4(af, a + (lane % 16) * lda + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t bf[4];
            ldmatrix_x4(bf, b + (nn * 16 + lane % 8 + (lane / 16) * 8) * ldb + kk * 16 + ((lane / 8) % 2) * 8);
            mma16816(c[2 * nn], af, bf[0], bf[1]);
            mma16816(c[2 * nn + 1], af, bf[2], bf[3]);
        }
    }
}

// c [16 x N] += p [16 x K] b: p in registers in the accumulator layout of a
// 16 x K product (rounded to bf16 here: it becomes the A fragments as is),
// b [K x N] row-major bf16 in shared memory (read transposed by ldmatrix).
template <int K, int N>
__device__ __forceinline__ void mma_pb(float (*c)[4], const float (*p)[4], const bf16 *b, int ldb) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        const uint32_t af[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                                pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * ldb + nn * 16 + (lane / 16) * 8);
            mma16816(c[2 * nn], af, bf[0], bf[1]);
            mma16816(c[2 * nn + 1], af, bf[2], bf[3]);
        }
    }
}

#endif
