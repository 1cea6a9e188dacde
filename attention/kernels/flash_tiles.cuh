// flash_tiles.cuh: the device building blocks of the CUDA attention kernels
// (flash_cuda.cu, sparse_cuda.cu): PTX wrappers for cp.async, ldmatrix and
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate), tile loads global -> shared
// (contiguous or gathered by token), per-tile position bounds and tile
// skipping, the three warp-level tile products every flash kernel is made of,
// and the forward's per-tile online softmax and final merge; the kernels'
// arguments (attn_args.h) as __restrict__ locals.
// Shared tiles are row-major bf16 with rows padded by 16 bytes (8 elements),
// so the 8 row addresses of an ldmatrix land in distinct banks.
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

// rows x D tile gathered from x [T, H, D], head h -> s [rows][D + 8] by
// cp.async: row r from token tok(r), a zero row where tok(r) < 0. All NT
// threads of the CTA take part.
template <int D, int NT, typename Tok>
__device__ __forceinline__ void load_rows(bf16 *s, const bf16 *x, int rows, int H, int h, Tok tok) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    for (int c = threadIdx.x; c < rows * CHUNKS; c += NT) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const int64_t t = tok(r);
        const bf16 *src = t >= 0 ? x + (t * H + h) * (int64_t)D + col : x;
        cp_async16(s + r * LD + col, src, t >= 0);
    }
}

// rows x D tile of x [T, H, D] (tokens t0.., head h) -> s [rows][D + 8] by
// cp.async, zero rows past T.
template <int D, int NT>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *x, int64_t t0, int rows, int64_t T,
                                          int H, int h) {
    load_rows<D, NT>(s, x, rows, H, h, [=](int r) { return t0 + r < T ? t0 + r : (int64_t)-1; });
}

// The first tile t' >= t (n when none) that is not skipped: key tiles with
// bound = k_lo > limit = q_hi (forward), query tiles with bound = q_hi <
// limit = k_lo (backward). With DOCS also key tiles wholly before every
// query's document (doc_bound = k_hi < doc_limit = the query tile's lowest
// document start) and query tiles whose documents all start after every key
// (doc_bound = the tiles' lowest document start > doc_limit = k_hi). Every
// lane of a warp calls it alike; 32 tiles a step.
template <bool KEYS, bool DOCS = false>
__device__ __forceinline__ int64_t next_tile(const int64_t *bound, int64_t t, int64_t n, int64_t limit,
                                             const int64_t *doc_bound = nullptr, int64_t doc_limit = 0) {
    const int lane = threadIdx.x % 32;
    for (; t < n; t += 32) {
        const int64_t i = t + lane;
        bool take = i < n && (KEYS ? bound[i] <= limit : bound[i] >= limit);
        if (DOCS && take) take = KEYS ? doc_bound[i] >= doc_limit : doc_bound[i] <= doc_limit;
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

// ---- forward: one warp's 16 queries (rows g and g + 8 of this thread) ----

// The running state of an online softmax: O (unnormalised), max (log2 units)
// and this thread's part of the sum, for rows g and g + 8.
template <int D>
struct SoftmaxRows {
    float acc[D / 8][4];
    float m0, m1, l0, l1;
};

template <int D>
__device__ __forceinline__ void softmax_rows_init(SoftmaxRows<D> &r) {
    zero<D>(r.acc);
    r.m0 = r.m1 = -INFINITY;
    r.l0 = r.l1 = 0.0f;
}

// One key tile of BN keys (kb, vb [BN][D + 8], positions kp [BN]) into the
// warp's rows: S = Q K^T (qw: the warp's 16 query rows), scaled to log2
// units, masked by position (key visible iff kp <= qp, and with DOCS
// kp >= qf, the first position of the row's document) unless `full`, online
// softmax, O += P V with P taken from the score accumulators.
template <int D, int BN, bool DOCS = false>
__device__ __forceinline__ void forward_tile(SoftmaxRows<D> &r, const bf16 *qw, const bf16 *kb,
                                             const bf16 *vb, const int64_t *kp, bool full,
                                             int64_t qp0, int64_t qp1, float scale_log2,
                                             int64_t qf0 = 0, int64_t qf1 = 0) {
    constexpr int LD = D + 8;
    const int t4 = threadIdx.x % 4;
    float s[BN / 8][4];
    zero<BN>(s);
    mma_abt<D, BN>(s, qw, LD, kb, LD);

    float mx0 = r.m0, mx1 = r.m1;
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[n][e] *= scale_log2;
            if (!full) {
                const int64_t key = kp[n * 8 + 2 * t4 + (e & 1)];
                if (key > (e < 2 ? qp0 : qp1) || (DOCS && key < (e < 2 ? qf0 : qf1))) s[n][e] = -INFINITY;
            }
        }
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row with nothing visible yet keeps max -inf; subtracting 0 keeps p = 0.
    const float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float corr0 = exp2_approx(r.m0 - base0), corr1 = exp2_approx(r.m1 - base1);
    r.m0 = mx0; r.m1 = mx1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
        s[n][0] = exp2_approx(s[n][0] - base0);
        s[n][1] = exp2_approx(s[n][1] - base0);
        s[n][2] = exp2_approx(s[n][2] - base1);
        s[n][3] = exp2_approx(s[n][3] - base1);
        sum0 += s[n][0] + s[n][1];
        sum1 += s[n][2] + s[n][3];
    }
    r.l0 = r.l0 * corr0 + sum0;
    r.l1 = r.l1 * corr1 + sum1;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        r.acc[n][0] *= corr0; r.acc[n][1] *= corr0;
        r.acc[n][2] *= corr1; r.acc[n][3] *= corr1;
    }
    mma_pb<BN, D>(r.acc, s, vb, LD);
}

// Merge the rows' (acc / l, m + log l) into the running (o [Tq, Hq, D], lse
// [Hq, Tq]) of q head h; rows past Tq or that saw no key are left unchanged.
template <int D>
__device__ __forceinline__ void forward_merge(SoftmaxRows<D> &r, int64_t row0, int64_t row1,
                                              int64_t Tq, int Hq, int h, float *o, float *lse) {
    const int t4 = threadIdx.x % 4;
    r.l0 += __shfl_xor_sync(0xffffffffu, r.l0, 1);
    r.l0 += __shfl_xor_sync(0xffffffffu, r.l0, 2);
    r.l1 += __shfl_xor_sync(0xffffffffu, r.l1, 1);
    r.l1 += __shfl_xor_sync(0xffffffffu, r.l1, 2);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = half ? row1 : row0;
        const float m = half ? r.m1 : r.m0, l = half ? r.l1 : r.l0;
        const bool valid = row < Tq && m != -INFINITY;        // same for the 4 lanes of a row
        const float old = valid ? lse[h * Tq + row] : 0.0f;
        __syncwarp();                                         // every lane read before lane t4 = 0 writes
        if (valid) {
            const float chunk = (m + __log2f(l)) * 0.6931471805599453f;
            const float mx = fmaxf(old, chunk);
            const float a = __expf(old - mx), b = __expf(chunk - mx);
            const float wa = a / (a + b), wb = b / (a + b) / l;
            float *orow = o + (row * Hq + h) * (int64_t)D;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                float2 *p = reinterpret_cast<float2 *>(orow + n * 8 + 2 * t4);
                float2 prev = *p;
                prev.x = wa * prev.x + wb * r.acc[n][2 * half];
                prev.y = wa * prev.y + wb * r.acc[n][2 * half + 1];
                *p = prev;
            }
            if (t4 == 0) lse[h * Tq + row] = mx + __logf(a + b);
        }
    }
}

#endif
