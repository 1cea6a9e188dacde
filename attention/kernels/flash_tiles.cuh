// flash_tiles.cuh: the device building blocks of the CUDA attention kernels
// (flash_cuda.cu, sparse_cuda.cu): PTX wrappers for cp.async, ldmatrix and
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate), tile loads global -> shared
// (contiguous or gathered by token), per-tile position bounds and the walk
// over the visible tiles, the three warp-level tile products of 16 rows the
// sparse backward's column pass is made of, the products of 32 rows a warp
// over swizzled tiles with the forward's per-tile online softmax and final
// merge (the dense and the sparse forward) and the backwards' P^T, dS^T tile
// and fp32 atomic adds (the dense backward, the sparse backward's blocks);
// the backward's P and dS of one score (both backwards); the kernels'
// arguments (attn_args.h) as __restrict__ locals.
// Shared tiles are row-major bf16, either with rows padded by 16 bytes (8
// elements), so the 8 row addresses of an ldmatrix land in distinct banks,
// or unpadded and swizzled (swizzle) to the same effect.
#ifndef MTRAIN_FLASH_TILES_CUH
#define MTRAIN_FLASH_TILES_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "../attn_args.h"

typedef __nv_bfloat16 bf16;
typedef ATTN_INPUTS(bf16) AttnInputsBf16;   // the kernels' inputs (attn_args.h)

// ---- kernel arguments ----
// The kernels take the structs of attn_args.h and name their fields as
// __restrict__ locals: nvcc ignores __restrict__ on struct members, and
// without it every load may alias every store (the sparse backward kernels
// then need up to 21 more registers). The locals bring the registers back to
// within a few of __restrict__ pointer parameters; what they do not bring
// back is the read-only (ld.global.nc) form of the scalar position and lse
// loads, which nvcc picks only for parameters.

// Tq, Tk, Hq, Hkv of d; q_pos, k_pos, q_first of pos; q, k, v, dout of in.
#define RESTRICT_ARGS(d, pos, in)                                                               \
    [[maybe_unused]] const int64_t Tq = (d).Tq, Tk = (d).Tk;                                    \
    [[maybe_unused]] const int Hq = (d).Hq, Hkv = (d).Hkv;                                      \
    [[maybe_unused]] const int64_t *__restrict__ q_pos = (pos).q_pos, *__restrict__ k_pos = (pos).k_pos, \
                                   *__restrict__ q_first = (pos).q_first;                        \
    [[maybe_unused]] const bf16 *__restrict__ q = (in).q, *__restrict__ k = (in).k,              \
                                *__restrict__ v = (in).v, *__restrict__ dout = (in).dout

// lse, delta, dq, dk, dv of grads.
#define RESTRICT_GRADS(grads)                                                                   \
    const float *__restrict__ lse = (grads).lse, *__restrict__ delta = (grads).delta;           \
    float *__restrict__ dq = (grads).dq, *__restrict__ dk = (grads).dk, *__restrict__ dv = (grads).dv

// nqb, block_start, blocks, local_block, col_start, col_key of the SparseView c.
#define RESTRICT_ROWS(c)                                                                        \
    const int64_t nqb = (c).num_q_blocks;                                                       \
    const int64_t *__restrict__ block_start = (c).block_start, *__restrict__ blocks = (c).blocks, \
                  *__restrict__ local_block = (c).local_block, *__restrict__ col_start = (c).col_start, \
                  *__restrict__ col_key = (c).col_key

// ---- PTX wrappers (under the CPU execution model, -D__CUDASIM__, the sim's
// implementation of the same instruction: tests/sim/cudasim/grid.cpp) ----

// The shared-memory address of p (under the sim: its offset in the block's dynamic shared memory).
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
#ifdef __CUDASIM__
    return cudasim::shared_address(p);
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

// 16 bytes global -> shared, asynchronous; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
#ifdef __CUDASIM__
    cudasim::cp_async16(smem, gmem, valid ? 16 : 0);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDASIM__
    cudasim::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDASIM__
    cudasim::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}

// Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// register i receives matrix i (thread l: row l/4, columns 2(l%4), 2(l%4)+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *smem) {
#ifdef __CUDASIM__
    cudasim::ldmatrix(r, 4, false, smem);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
#endif
}
// The same, each matrix transposed (thread l: column l/4, rows 2(l%4), 2(l%4)+1).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16 *smem) {
#ifdef __CUDASIM__
    cudasim::ldmatrix(r, 4, true, smem);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
#endif
}

// c [16x8] += a [16x16] b [16x8]. Fragments (g = lane/4, t = lane%4):
// a: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)} as bf16 pairs;
// b: {(k 2t..2t+1, n g), (k 2t+8.., n g)}; c: {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#ifdef __CUDASIM__
    cudasim::mma_m16n8k16_bf16(c, a, b0, b1, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats as a bf16 pair, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// 2^x, approximate (2 ulp); 2^-inf = 0. The sim: exp2f with the .ftz
// flush of a subnormal result (PTX ISA, ex2).
__device__ __forceinline__ float exp2_approx(float x) {
#ifdef __CUDASIM__
    const float y = exp2f(x);
    return y < 1.17549435e-38f ? 0.0f : y;
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

// ---- tiles: loads, position bounds, skipping ----

// Element (row, col) of a swizzled [rows][D] bf16 tile (no padding): the
// 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so the 8 rows of
// one chunk that an ldmatrix phase reads and the 8 chunks of one row that a
// cp.async phase writes fall in 8 distinct 16-byte bank groups. col is a
// multiple of 8 wherever a chunk is addressed.
template <int D>
__device__ __forceinline__ int swizzle(int row, int col) {
    static_assert(D % 64 == 0, "swizzled tiles need rows of a multiple of 64 elements");
    return row * D + (((col / 8) ^ (row % 8)) * 8) + col % 8;
}

// rows x D tile gathered from x [T, H, D], head h -> s by cp.async: row r
// from token tok(r), a zero row where tok(r) < 0. s is [rows][D + 8]
// (padded) or, with SWIZZLE, [rows][D] swizzled. All NT threads of the CTA
// take part.
template <int D, int NT, bool SWIZZLE = false, typename Tok>
__device__ __forceinline__ void load_rows(bf16 *s, const bf16 *x, int rows, int H, int h, Tok tok) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    for (int c = threadIdx.x; c < rows * CHUNKS; c += NT) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const int64_t t = tok(r);
        const bf16 *src = t >= 0 ? x + (t * H + h) * (int64_t)D + col : x;
        cp_async16(s + (SWIZZLE ? swizzle<D>(r, col) : r * LD + col), src, t >= 0);
    }
}

// rows x D tile of x [T, H, D] (tokens t0.., head h) -> s by cp.async
// ([rows][D + 8], or swizzled [rows][D] with SWIZZLE), zero rows past T.
template <int D, int NT, bool SWIZZLE = false>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *x, int64_t t0, int rows, int64_t T,
                                          int H, int h) {
    load_rows<D, NT, SWIZZLE>(s, x, rows, H, h, [=](int r) { return t0 + r < T ? t0 + r : (int64_t)-1; });
}

// A walk over tiles 0 .. n - 1 that visits, in order, those a test marks
// visible, 32 tiles a window: per window each lane tests one tile
// (test(i, &full) returns whether tile i holds a visible pair and sets full
// where every pair is visible, so that no mask is needed) and two ballots
// keep the answers, so stepping to the next tile is bit arithmetic and the
// tiles' position bounds are read once per 32 tiles. The test reads the
// kernel's arguments where it is called: they stay in the parameter bank,
// not in registers. Every lane of a warp steps alike.
struct TileWalk {
    int w0 = -32;                // the window: tiles w0 .. w0 + 31
    unsigned visible = 0, full = 0;

    // The first visible tile at or after t (n: none), and whether it is full.
    template <typename Test>
    __device__ int next(int t, int n, bool *is_full, Test test) {
        for (; t < n; t = (t | 31) + 1) {
            const int w = t & ~31;
            if (w != w0) {
                const int i = w + (int)threadIdx.x % 32;
                bool whole = false;
                const bool vis = i < n && test(i, &whole);
                w0 = w;
                visible = __ballot_sync(0xffffffffu, vis);
                full = __ballot_sync(0xffffffffu, vis && whole);
            }
            const unsigned rest = visible & (0xffffffffu << (t - w));
            if (rest) {
                const int at = __ffs((int)rest) - 1;
                *is_full = (full >> at) & 1u;
                return w + at;
            }
        }
        return n;
    }
};

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

// Exclusive prefix sum of x over the NT threads of the CTA in thread order,
// and the CTA's total: warp scans by shuffles, the warps' totals through
// scratch [NT / 32] shared. Contains a __syncthreads; the caller syncs again
// before it reuses scratch.
template <int NT>
__device__ __forceinline__ void block_exclusive_sum(int x, int *scratch, int &offset, int &total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = x;
    for (int d = 1; d < 32; d *= 2) {
        const int y = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += y;
    }
    if (lane == 31) scratch[warp] = inclusive;
    __syncthreads();
    int before = 0;
    total = 0;
    for (int w = 0; w < NT / 32; w++) {
        before += w < warp ? scratch[w] : 0;
        total += scratch[w];
    }
    offset = before + inclusive - x;
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

// c [16 x N] += a^T b: a [K x 16] and b [K x N] row-major bf16 in shared
// memory (both read transposed by ldmatrix), rows lda and ldb elements apart,
// a at the warp's first output row (column of a).
template <int K, int N>
__device__ __forceinline__ void mma_atb(float (*c)[4], const bf16 *a, int lda, const bf16 *b, int ldb) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[4];
        ldmatrix_x4_trans(af, a + (kk * 16 + lane % 8 + (lane / 16) * 8) * lda + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * ldb + nn * 16 + (lane / 16) * 8);
            mma16816(c[2 * nn], af, bf[0], bf[1]);
            mma16816(c[2 * nn + 1], af, bf[2], bf[3]);
        }
    }
}

// ---- forward: a chunk's result merged into the running output ----

// The merge of one row's chunk result (max m in log2 units, sum l) into its
// running lse `old` (natural log): the weights of the old output (wa) and
// of the chunk's unnormalised one (wb, 1 / l included); returns the new lse.
__device__ __forceinline__ float merge_weights(float old, float m, float l, float *wa, float *wb) {
    const float chunk = (m + __log2f(l)) * 0.6931471805599453f;
    const float mx = fmaxf(old, chunk);
    const float a = __expf(old - mx), b = __expf(chunk - mx);
    *wa = a / (a + b);
    *wb = b / (a + b) / l;
    return mx + __logf(a + b);
}

// orow [D] = wa orow + wb acc for this thread's columns of row half (0: g,
// 1: g + 8) of a 16-row accumulator acc [D / 8][4].
template <int D>
__device__ __forceinline__ void merge_row(float *orow, const float (*acc)[4], int half, float wa, float wb) {
    const int t4 = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        float2 *p = reinterpret_cast<float2 *>(orow + n * 8 + 2 * t4);
        float2 prev = *p;
        prev.x = wa * prev.x + wb * acc[n][2 * half];
        prev.y = wa * prev.y + wb * acc[n][2 * half + 1];
        *p = prev;
    }
}

// ---- forward (dense and sparse): one warp's 32 queries, two m16 tiles,
// over swizzled tiles (swizzle) ----
// Every K or V fragment an ldmatrix reads feeds the mma.sync of both m16
// tiles. Rows of the warp: i = 0..3 is m16 tile i / 2, row g + 8 (i % 2)
// (local row 16 (i / 2) + g + 8 (i % 2)).

// Both products step along the swizzled rows by 16 columns (two chunks) with
// an XOR: swizzle(r, c + 16 k) = swizzle(r, c) ^ 16 k for c < 16 and
// 16 k < D (the row's bits lie above), so each lane keeps one offset per
// operand instead of one per step.

// c [32 x N] += a [32 x K] b^T with b [N x K]: a (the warp's first row) and
// b swizzled [.][K] bf16 tiles in shared memory; c[m] rows 16 m .. 16 m + 15.
// UNROLL: steps of 16 along K unrolled (fewer keep fewer fragments in flight:
// the backward's registers).
template <int K, int N, int UNROLL = K / 16>
__device__ __forceinline__ void mma_abt32(float (*c)[N / 8][4], const bf16 *a, const bf16 *b) {
    const int lane = threadIdx.x % 32;
    const int a0 = swizzle<K>(lane % 16, (lane / 16) * 8);
    const int b0 = swizzle<K>(lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8);
#pragma unroll UNROLL
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[2][4];
#pragma unroll
        for (int m = 0; m < 2; m++) ldmatrix_x4(af[m], a + m * 16 * K + (a0 ^ (kk * 16)));
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t bf[4];
            ldmatrix_x4(bf, b + nn * 16 * K + (b0 ^ (kk * 16)));
#pragma unroll
            for (int m = 0; m < 2; m++) {
                mma16816(c[m][2 * nn], af[m], bf[0], bf[1]);
                mma16816(c[m][2 * nn + 1], af[m], bf[2], bf[3]);
            }
        }
    }
}

// The A fragments of P [32 x K] (mma_pb32) from the accumulators of the
// 32 x K product that made it (mma_abt32's layout), rounded to bf16.
template <int K>
__device__ __forceinline__ void pack_rows32(uint32_t (*pa)[K / 16][4], const float (*p)[K / 8][4]) {
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int kk = 0; kk < K / 16; kk++) {
            pa[m][kk][0] = pack_bf16(p[m][2 * kk][0], p[m][2 * kk][1]);
            pa[m][kk][1] = pack_bf16(p[m][2 * kk][2], p[m][2 * kk][3]);
            pa[m][kk][2] = pack_bf16(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
            pa[m][kk][3] = pack_bf16(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
        }
}

// c [32 x N] += P [32 x K] b: P as A fragments (pack_rows32), b a swizzled
// [K][N] bf16 tile in shared memory (read transposed by ldmatrix).
template <int K, int N>
__device__ __forceinline__ void mma_pb32(float (*c)[N / 8][4], const uint32_t (*pa)[K / 16][4], const bf16 *b) {
    const int lane = threadIdx.x % 32;
    const int b0 = swizzle<N>(lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8);
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + kk * 16 * N + (b0 ^ (nn * 16)));
#pragma unroll
            for (int m = 0; m < 2; m++) {
                mma16816(c[m][2 * nn], pa[m][kk], bf[0], bf[1]);
                mma16816(c[m][2 * nn + 1], pa[m][kk], bf[2], bf[3]);
            }
        }
    }
}

// The running state of the online softmax of the warp's 32 rows: O
// (unnormalised), max (log2 units) and this thread's part of the sum.
template <int D>
struct SoftmaxRows32 {
    float acc[2][D / 8][4];
    float m[4], l[4];
};

template <int D>
__device__ __forceinline__ void softmax_rows32_init(SoftmaxRows32<D> &r) {
#pragma unroll
    for (int m = 0; m < 2; m++) zero<D>(r.acc[m]);
#pragma unroll
    for (int i = 0; i < 4; i++) { r.m[i] = -INFINITY; r.l[i] = 0.0f; }
}

// S [32 x BN] (the scores of one key tile, from mma_abt32) -> P in place:
// scaled to log2 units, masked by position unless `full` (key j visible to
// row i iff kp[j] <= qp[i], and with DOCS kp[j] >= qf[i]; kp [BN] the keys',
// qp, qf [32] the warp's rows' positions and document starts, all in shared
// memory), then the online softmax: max, sum and O rescaled.
template <int D, int BN, bool DOCS>
__device__ __forceinline__ void softmax_tile32(SoftmaxRows32<D> &r, float (*s)[BN / 8][4], bool full,
                                               const int64_t *kp, const int64_t *qp, const int64_t *qf,
                                               float scale_log2) {
    const int g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    float mx[4];
#pragma unroll
    for (int i = 0; i < 4; i++) mx[i] = r.m[i];
#pragma unroll
    for (int m = 0; m < 2; m++) {
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[m][n][e] *= scale_log2;
        if (!full) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int row = m * 16 + g + half * 8;
                const int64_t qpr = qp[row], qfr = DOCS ? qf[row] : 0;
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int64_t key = kp[n * 8 + 2 * t4 + e];
                        if (key > qpr || (DOCS && key < qfr)) s[m][n][2 * half + e] = -INFINITY;
                    }
            }
        }
#pragma unroll
        for (int n = 0; n < BN / 8; n++) {
            mx[2 * m] = fmaxf(mx[2 * m], fmaxf(s[m][n][0], s[m][n][1]));
            mx[2 * m + 1] = fmaxf(mx[2 * m + 1], fmaxf(s[m][n][2], s[m][n][3]));
        }
    }
    float base[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        // A row with nothing visible yet keeps max -inf; subtracting 0 keeps p = 0.
        base[i] = mx[i] == -INFINITY ? 0.0f : mx[i];
        const float corr = exp2_approx(r.m[i] - base[i]);
        r.m[i] = mx[i];
        r.l[i] *= corr;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            r.acc[i / 2][n][2 * (i % 2)] *= corr;
            r.acc[i / 2][n][2 * (i % 2) + 1] *= corr;
        }
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[m][n][e] = exp2_approx(s[m][n][e] - base[2 * m + e / 2]);
                r.l[2 * m + e / 2] += s[m][n][e];
            }
}

// One key tile into the warp's 32 rows, up to P: S = Q K^T (qw the warp's
// first query row, kb the tile's keys, swizzled [BN][D]), the online softmax
// (softmax_tile32: mask unless `full`, kp, qp, qf as there), P as the A
// fragments of P V (mma_pb32).
template <int D, int BN, bool DOCS>
__device__ __forceinline__ void forward_scores32(SoftmaxRows32<D> &r, uint32_t (*p)[BN / 16][4], const bf16 *qw,
                                                 const bf16 *kb, bool full, const int64_t *kp, const int64_t *qp,
                                                 const int64_t *qf, float scale_log2) {
    float s[2][BN / 8][4];
#pragma unroll
    for (int m = 0; m < 2; m++) zero<BN>(s[m]);
    mma_abt32<D, BN>(s, qw, kb);
    softmax_tile32<D, BN, DOCS>(r, s, full, kp, qp, qf, scale_log2);
    pack_rows32<BN>(p, s);
}

// Merge the warp's 32 rows (acc / l, m + log l) into the running (o [Tq, Hq,
// D], lse [Hq, Tq]) of q head h; row0 the warp's first row, old [32] the
// rows' lse as the kernel found it (read into shared memory at its start);
// rows past Tq or that saw no key are left unchanged.
template <int D>
__device__ __forceinline__ void forward_merge32(SoftmaxRows32<D> &r, int64_t row0, const float *old, int64_t Tq,
                                                int Hq, int h, float *o, float *lse) {
    const int g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        r.l[i] += __shfl_xor_sync(0xffffffffu, r.l[i], 1);
        r.l[i] += __shfl_xor_sync(0xffffffffu, r.l[i], 2);
        const int local = (i / 2) * 16 + g + (i % 2) * 8;
        const int64_t row = row0 + local;
        if (row >= Tq || r.m[i] == -INFINITY) continue;
        float wa, wb;
        const float merged = merge_weights(old[local], r.m[i], r.l[i], &wa, &wb);
        merge_row<D>(o + (row * Hq + h) * (int64_t)D, r.acc[i / 2], i % 2, wa, wb);
        if (t4 == 0) lse[h * Tq + row] = merged;
    }
}

// ---- backward (dense and sparse): the scores' gradients, and the products
// of 32 rows a warp over swizzled tiles ----

// One score of the backward: s of S = Q K^T (unscaled) and dp of dP = dO V^T
// -> P = exp2(s scale_log2 - lse2) and dS = P (dp - delta) in place; lse2
// the query's lse in log2 units, P = dS = 0 where the pair is not visible.
// Every backward kernel computes its P and dS here (fp32; each rounds them to
// bf16 only as an mma operand), so that the dense and sparse backwards agree.
__device__ __forceinline__ void backward_score(float &s, float &dp, float scale_log2, float lse2, float delta,
                                               bool visible) {
    const float p = exp2_approx(visible ? s * scale_log2 - lse2 : -INFINITY);
    s = p;
    dp = p * (dp - delta);
}

// S^T, dP^T [32 keys x N queries] of one warp (mma_abt32's layout, rows the
// keys) -> P^T, dS^T in place (backward_score), masked by position unless
// `full` (key j visible to query i iff kp[j] <= qp[i], and with DOCS
// kp[j] >= qf[i]); kp [32] the warp's keys' positions, ls, ds, qp, qf [N] the
// queries' lse (log2 units), delta, position and document start, in shared
// memory.
template <int N, bool DOCS>
__device__ __forceinline__ void backward_tile32(float (*st)[N / 8][4], float (*dpt)[N / 8][4], bool full,
                                                const int64_t *kp, const float *ls, const float *ds,
                                                const int64_t *qp, const int64_t *qf, float scale_log2) {
    const int g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    int64_t key[4];                               // the thread's rows i: m16 tile i / 2, row g + 8 (i % 2)
#pragma unroll
    for (int i = 0; i < 4; i++) key[i] = full ? 0 : kp[(i / 2) * 16 + g + (i % 2) * 8];
#pragma unroll
    for (int n = 0; n < N / 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int col = n * 8 + 2 * t4 + e;
            const float l = ls[col], dl = ds[col];
            const int64_t qpc = full ? 0 : qp[col], qfc = DOCS && !full ? qf[col] : 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const bool visible = full || (key[i] <= qpc && (!DOCS || key[i] >= qfc));
                backward_score(st[i / 2][n][2 * (i % 2) + e], dpt[i / 2][n][2 * (i % 2) + e], scale_log2, l, dl,
                               visible);
            }
        }
}

// The warp's 32 x N accumulators (mma_abt32's layout) rounded to bf16 into
// rows r0 .. r0 + 31, columns c0 .. c0 + N - 1 of a swizzled [.][W] tile t:
// two elements a store. r0 is a multiple of 32 and c0 of N (a power of 2),
// so a thread's stores step from one offset by XOR and constant rows:
// swizzle(r, c0 + 8 n + 2 t4) = swizzle(r, c0 + 2 t4) ^ 8 n.
template <int N, int W>
__device__ __forceinline__ void store_rows32(bf16 *t, int r0, int c0, const float (*c)[N / 8][4]) {
    const int g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    const int base = swizzle<W>(r0 + g, c0 + 2 * t4);
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < N / 8; n++) {
            const int at = base + m * 16 * W;
            *reinterpret_cast<uint32_t *>(t + (at ^ (n * 8))) = pack_bf16(c[m][n][0], c[m][n][1]);
            *reinterpret_cast<uint32_t *>(t + ((at + 8 * W) ^ (n * 8))) = pack_bf16(c[m][n][2], c[m][n][3]);
        }
}

// A query row of a backward as its kernel keeps it in shared memory (two
// buffers of BM rows: lse in log2 units, delta, position, document start);
// pos INT64_MIN and lse 0: the row sees no key.
struct BackwardRow { float lse, delta; int64_t pos, first; };

// The row of query token tok (tok < 0: none) from the forward's lse and
// delta at lse_h, delta_h (q head h's [Tq]) and, with need_pos, its position
// and document start; the loads are independent (a dead row, none or with
// lse = -inf, is settled after they land).
template <bool DOCS>
__device__ __forceinline__ BackwardRow backward_row(const float *lse_h, const float *delta_h, const int64_t *q_pos,
                                                    const int64_t *q_first, int64_t tok, bool need_pos) {
    BackwardRow r = {0.0f, 0.0f, INT64_MIN, 0};
    if (tok >= 0) {
        const float L = lse_h[tok], del = delta_h[tok];
        const int64_t p = need_pos ? q_pos[tok] : INT64_MIN;
        const int64_t first = DOCS && need_pos ? q_first[tok] : 0;
        if (L != -INFINITY) {
            r.lse = L * 1.4426950408889634f;
            r.delta = del;
            r.pos = p;
            r.first = first;
        }
    }
    return r;
}

// Thread tid's row r into buffer b of the rows in shared memory (tid < BM;
// the others store nothing).
template <int BM, bool DOCS>
__device__ __forceinline__ void put_backward_row(const BackwardRow &r, int b, float *lse_s, float *del_s,
                                                 int64_t *qps, int64_t *qfs) {
    const int tid = threadIdx.x;
    if (tid >= BM) return;
    lse_s[b * BM + tid] = r.lse;
    del_s[b * BM + tid] = r.delta;
    qps[b * BM + tid] = r.pos;
    if (DOCS) qfs[b * BM + tid] = r.first;
}

// A backward's first half for one warp: S^T = K Q^T and dP^T = V dO^T of its
// 32 keys (rows 32 kw.. of ks, vs [. x D], swizzled) and SQ queries (rows SQ
// wh.. of qb, dob), turned into P^T and dS^T (backward_tile32 with the rows
// ls, ds, qp, qf of those queries) and stored into pts, dsts [keys x BM];
// `between` runs between the two products (a load that lands during S^T).
template <int D, int SQ, int BM, bool DOCS, typename Between>
__device__ __forceinline__ void backward_scores32(bf16 *pts, bf16 *dsts, const bf16 *ks, const bf16 *vs,
                                                  const bf16 *qb, const bf16 *dob, int kw, int wh, bool full,
                                                  const int64_t *kp, const float *ls, const float *ds,
                                                  const int64_t *qp, const int64_t *qf, float scale_log2,
                                                  Between between) {
    float st[2][SQ / 8][4], dpt[2][SQ / 8][4];
#pragma unroll
    for (int m = 0; m < 2; m++) { zero<SQ>(st[m]); zero<SQ>(dpt[m]); }
    mma_abt32<D, SQ, 2>(st, ks + kw * 32 * D, qb + wh * SQ * D);
    between();
    mma_abt32<D, SQ, 2>(dpt, vs + kw * 32 * D, dob + wh * SQ * D);
    backward_tile32<SQ, DOCS>(st, dpt, full, kp + kw * 32, ls, ds, qp, qf, scale_log2);
    store_rows32<SQ, BM>(pts, kw * 32, wh * SQ, st);
    store_rows32<SQ, BM>(dsts, kw * 32, wh * SQ, dpt);
}

// x[row(r) * ld + c0 + col] += f c (row r, column col) for the warp's 32 x N
// accumulators c (mma_abt32's layout) with fp32 atomics; row(r) < 0 (r =
// 0..31): the row is left out. The backwards' dQ per query tile and dK, dV
// at the end.
template <int N, typename Row>
__device__ __forceinline__ void atomic_add_rows32(float *x, int64_t ld, int64_t c0, const float (*c)[N / 8][4],
                                                  float f, Row row) {
    const int g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = row((i / 2) * 16 + g + (i % 2) * 8);
        if (r < 0) continue;
        float *p = x + r * ld + c0 + 2 * t4;
#pragma unroll
        for (int n = 0; n < N / 8; n++) {
            atomicAdd(p + n * 8, f * c[i / 2][n][2 * (i % 2)]);
            atomicAdd(p + n * 8 + 1, f * c[i / 2][n][2 * (i % 2) + 1]);
        }
    }
}

// c [32 x N] += A [32 x K] B, both from swizzled tiles in shared memory: A
// the warp's 32 rows of a [.][LDA] tile (a at its first row) or, with
// A_TRANS, the transpose of columns a_col .. a_col + 31 of a [K][LDA] tile;
// B columns b_col .. b_col + N - 1 of a [K][LDB] tile (read transposed).
// Every fragment of B feeds the mma.sync of both m16 tiles.
template <int K, int N, int LDA, int LDB, bool A_TRANS>
__device__ __forceinline__ void mma_ab32(float (*c)[N / 8][4], const bf16 *a, int a_col, const bf16 *b, int b_col) {
    const int lane = threadIdx.x % 32;
    const int a0 = A_TRANS ? swizzle<LDA>(lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8)
                           : swizzle<LDA>(lane % 16, (lane / 16) * 8);
    const int b0 = swizzle<LDB>(lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8);
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[2][4];
#pragma unroll
        for (int m = 0; m < 2; m++) {
            if (A_TRANS) ldmatrix_x4_trans(af[m], a + kk * 16 * LDA + (a0 ^ (a_col + m * 16)));
            else ldmatrix_x4(af[m], a + m * 16 * LDA + (a0 ^ (kk * 16)));
        }
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + kk * 16 * LDB + (b0 ^ (b_col + nn * 16)));
#pragma unroll
            for (int m = 0; m < 2; m++) {
                mma16816(c[m][2 * nn], af[m], bf[0], bf[1]);
                mma16816(c[m][2 * nn + 1], af[m], bf[2], bf[3]);
            }
        }
    }
}

#endif
