// flash_cuda.cu: dense causal flash attention on NVIDIA GPUs (sm_80, sm_90),
// forward and backward, with the chunk semantics of attention.h (see
// attention_cuda.h for the API and docs/ARCHITECTURE.md for the design).
//
// Tensor cores through mma.sync.m16n8k16 (bf16 in, fp32 accumulate), tiles
// moved global -> shared with cp.async (16 bytes, zero-filled past the end)
// and shared -> registers with ldmatrix (building blocks: flash_tiles.cuh).
//   forward   one CTA per (q head, tile of 128 queries), 4 warps of 32
//             queries (two m16 tiles, so every K/V fragment read from shared
//             memory feeds both), two CTAs per SM; Q, K, V tiles swizzled
//             (no padding, no bank conflict); K and V single-buffered, each
//             loading while the other is computed with; the visited key
//             tiles and which need a mask from per-tile position bounds, 32
//             tiles a ballot; online softmax in registers (log2 domain,
//             exp2), P packed from the score accumulators as the A operand of
//             P V; at the end the chunk's (O, LSE) merged into the running
//             fp32 (o_acc, lse), whose lse was read at the start.
//   backward  FlashAttention-2: one CTA per (q head, tile of 128 keys), 8
//             warps, one CTA per SM, holding dK, dV in registers; loops over
//             query tiles of BM (Q double-buffered, dO reloaded once dV has
//             read it, lse and delta of the next tile read during this one),
//             recomputes S^T = K Q^T and dP^T = V dO^T (32 keys x BM / 2
//             queries a warp), P^T = exp2(S^T - lse), dS^T = P^T (dP^T -
//             delta); P^T and dS^T go through shared memory for dV += P^T
//             dO, dK += dS^T Q and dQ = dS K (32 rows a warp, every tile
//             swizzled), dQ added to global dq with fp32 atomics, each
//             covering 128 keys. dK, dV are added with fp32 atomics at the
//             end (GQA: several q heads per kv head).
// The mask is by global position (key j visible to query i iff
// k_pos[j] <= q_pos[i], and with documents k_pos[j] >= q_first[i], the first
// position of query i's document); per-tile position bounds skip tiles with
// no visible pair and drop the per-element test where every pair is visible.
// Documents are a template parameter: without them the kernels are the
// causal ones, with no extra load or test.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_elementwise.cuh"
#include "../../dist/cuda_kernel.h"
#include "attention_cuda.h"
#include "flash_tiles.cuh"

#define LOG2E 1.4426950408889634f

// ---- small kernels ----

// first[i] = the last of the sorted starts [count] <= pos[i], INT64_MIN when
// there is none (attn_doc_first of attention.h, per query on the device).
__global__ void doc_first_kernel(const int64_t *pos, int64_t T, const int64_t *starts, int64_t count,
                                 int64_t *first) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < T;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t lo = 0, hi = count;                        // first start > pos[i]: hi
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (starts[mid] <= pos[i]) lo = mid + 1; else hi = mid;
        }
        first[i] = hi == 0 ? INT64_MIN : starts[hi - 1];
    }
}

// The position arrays whose tile bounds one tile_bounds_kernel launch computes
// (at most 3: the backward's keys, queries and queries' document starts).
typedef struct {
    const int64_t *pos[3];     // [T[j]]
    int64_t T[3];
    int block[3];
    int64_t *lo[3], *hi[3];    // [ceil(T[j] / block[j])] each
} TileBounds;

// Min and max position of each tile of block[j] tokens of pos[j] -> lo[j], hi[j]; grid.y = the array j.
__global__ void tile_bounds_kernel(TileBounds b) {
    const int j = blockIdx.y;
    const int64_t T = b.T[j], block = b.block[j], tiles = (T + block - 1) / block;
    const int64_t *pos = b.pos[j];
    for (int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t0 < tiles;
         t0 += (int64_t)gridDim.x * blockDim.x) {
        const int64_t end = min(T, (t0 + 1) * block);
        int64_t mn = pos[t0 * block], mx = mn;
        for (int64_t t = t0 * block + 1; t < end; t++) {
            mn = min(mn, pos[t]);
            mx = max(mx, pos[t]);
        }
        b.lo[j][t0] = mn;
        b.hi[j][t0] = mx;
    }
}

__global__ void fill_kernel(float *x, int64_t n, float value) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = value;
}

// One warp per (token, head) row: delta[h, t] = sum_d o[t, h, d] dout[t, h, d].
__global__ void delta_kernel(const bf16 *o, const bf16 *dout, float *delta, int64_t Tq, int Hq, int D) {
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;   // t * Hq + h
    const int lane = threadIdx.x % 32;
    if (row >= Tq * Hq) return;
    const __nv_bfloat162 *a = reinterpret_cast<const __nv_bfloat162 *>(o + row * D);
    const __nv_bfloat162 *b = reinterpret_cast<const __nv_bfloat162 *>(dout + row * D);
    float sum = 0.0f;
    for (int d = lane; d < D / 2; d += 32) {
        const float2 x = __bfloat1622float2(a[d]), y = __bfloat1622float2(b[d]);
        sum += x.x * y.x + x.y * y.y;
    }
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) delta[(row % Hq) * Tq + row / Hq] = sum;
}

// ---- forward ----

// The forward's CTA: FWD_WARPS warps of 32 queries (two m16 tiles each).
enum { FWD_WARPS = 4, FWD_BM = FWD_WARPS * 32 };

// Grid (ceil(Tq / FWD_BM), Hq), FWD_WARPS warps of 32 queries each, at
// least two CTAs per multiprocessor. Key tiles of BN; k_lo, k_hi
// [ceil(Tk / BN)] are their position bounds; scale_log2 = d.scale log2(e).
// DOCS: pos.q_first as attn_args.h (NULL otherwise). Shared (forward_smem):
// q [FWD_BM][D], k, v [BN][D] (swizzled), key positions [BN] (INT64_MAX past
// Tk; written only for tiles that need a mask), and per query the position
// (INT64_MIN past Tq), the document start (DOCS) and the lse of the running
// output, read once at the start.
// Per key tile: K waits, V loads while S = Q K^T and the softmax run; V
// waits, the next K (and its positions, when it needs a mask) loads while
// O += P V runs.
template <int D, int BN, bool DOCS>
__global__ void __launch_bounds__(FWD_WARPS * 32, 2)
flash_forward_kernel(AttnDims d, AttnPos pos, AttnInputsBf16 in, AttnOut out, const int64_t *__restrict__ k_lo,
                     const int64_t *__restrict__ k_hi, float scale_log2) {
    RESTRICT_ARGS(d, pos, in);
    float *__restrict__ o = out.o, *__restrict__ lse = out.lse;
    constexpr int BM = FWD_BM, NT = FWD_WARPS * 32;
    DYNAMIC_SHARED(unsigned char, smem);
    bf16 *qs = reinterpret_cast<bf16 *>(smem);
    bf16 *ks = qs + BM * D;
    bf16 *vs = ks + BN * D;
    int64_t *kps = reinterpret_cast<int64_t *>(vs + BN * D);
    int64_t *qps = kps + BN;
    int64_t *qfs = qps + BM;                      // DOCS only
    float *lse_s = reinterpret_cast<float *>(qfs + (DOCS ? BM : 0));
    STATIC_SHARED(int64_t, red, [2 * (NT / 32)]);

    const int tid = threadIdx.x, warp = tid / 32;
    const int h = blockIdx.y, kvh = h / (Hq / Hkv);
    const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BM;   // heavier (later) tiles first

    load_tile<D, NT, true>(qs, q, i0, BM, Tq, Hq, h);
    {   // this thread's query: position, document start, running lse (published by the barrier below)
        const int64_t row = i0 + tid;
        qps[tid] = row < Tq ? q_pos[row] : INT64_MIN;
        if (DOCS) qfs[tid] = row < Tq ? q_first[row] : 0;
        lse_s[tid] = row < Tq ? lse[h * Tq + row] : 0.0f;
    }
    int64_t q_lo, q_hi, f_lo = 0, f_hi = 0;      // f: bounds of the tile's document starts
    tile_pos_bounds<NT>(q_pos, i0, BM, Tq, red, &q_lo, &q_hi);
    if (DOCS) {
        __syncthreads();                          // every thread has read red
        tile_pos_bounds<NT>(q_first, i0, BM, Tq, red, &f_lo, &f_hi);
    }
    // Key tile i: visible (k_lo <= q_hi, and with DOCS k_hi >= f_lo: not wholly before every query's
    // document); full (whole, k_hi <= q_lo, and with DOCS k_lo >= f_hi: every pair visible).
    auto key_tile = [&](int i, bool *whole) {
        const int64_t lo = k_lo[i], hi = k_hi[i];
        *whole = (int64_t)(i + 1) * BN <= Tk && hi <= q_lo && (!DOCS || lo >= f_hi);
        return lo <= q_hi && (!DOCS || hi >= f_lo);
    };
    TileWalk walk;
    const int nkt = (int)((Tk + BN - 1) / BN);
    bool full = false, next_full = false;
    int kt = walk.next(0, nkt, &full, key_tile);
    if (kt < nkt) {
        load_tile<D, NT, true>(ks, k, (int64_t)kt * BN, BN, Tk, Hkv, kvh);
        if (!full && tid < BN) kps[tid] = (int64_t)kt * BN + tid < Tk ? k_pos[(int64_t)kt * BN + tid] : INT64_MAX;
    }
    cp_async_commit();

    SoftmaxRows32<D> rows;                        // O, max, sum of the warp's 32 rows
    softmax_rows32_init<D>(rows);
    while (kt < nkt) {
        cp_async_wait<0>();
        __syncthreads();   // K and its positions are in; every warp is done with V
        load_tile<D, NT, true>(vs, v, (int64_t)kt * BN, BN, Tk, Hkv, kvh);
        cp_async_commit();
        const int nxt = walk.next(kt + 1, nkt, &next_full, key_tile);

        uint32_t p[2][BN / 16][4];                // P as the A fragments of P V
        forward_scores32<D, BN, DOCS>(rows, p, qs + warp * 32 * D, ks, full, kps, qps + warp * 32, qfs + warp * 32,
                                      scale_log2);

        cp_async_wait<0>();
        __syncthreads();   // V is in; every warp is done with K and its positions
        const int64_t j0 = (int64_t)nxt * BN;
        const bool mask_next = nxt < nkt && !next_full && tid < BN;
        int64_t kp_next = INT64_MAX;
        if (nxt < nkt) load_tile<D, NT, true>(ks, k, j0, BN, Tk, Hkv, kvh);
        if (mask_next && j0 + tid < Tk) kp_next = k_pos[j0 + tid];   // lands during P V
        cp_async_commit();
        mma_pb32<BN, D>(rows.acc, p, vs);
        if (mask_next) kps[tid] = kp_next;
        kt = nxt;
        full = next_full;
    }
    cp_async_wait<0>();
    forward_merge32<D>(rows, i0 + warp * 32, lse_s + warp * 32, Tq, Hq, h, o, lse);
}

// ---- backward ----

// The backward's CTA: BWD_WARPS warps over a key tile of BWD_BN keys.
enum { BWD_WARPS = 8, BWD_BN = 128 };

// Grid (ceil(Tk / BWD_BN), Hq), BWD_WARPS warps, one CTA per multiprocessor.
// k_lo, k_hi [ceil(Tk / BWD_BN)] are the key tiles' position bounds. Query
// tiles of BM; q_lo, q_hi [ceil(Tq / BM)] are their position bounds;
// scale_log2 = d.scale log2(e). DOCS: pos.q_first as attn_args.h, f_lo,
// f_hi its bounds per query tile (NULL otherwise). The warps' parts: S^T,
// dP^T and P^T, dS^T 4 (32 keys) x 2 (BM / 2 queries); dK, dV 4 (32 keys) x
// 2 (D / 2 columns), in registers over the whole loop; dQ BM / 32 (32
// queries) x the rest (columns). Shared (backward_smem), every tile
// swizzled: k, v [BWD_BN][D]; q [2][BM][D]; dout [BM][D]; P^T, dS^T
// [BWD_BN][BM]; key positions [BWD_BN] (INT64_MAX past Tk); per query of the
// two buffered tiles the position (INT64_MIN: masked, past Tq or lse =
// -inf; read only for tiles that need a mask), the document start (DOCS),
// lse (log2 units) and delta.
// Per query tile (three barriers): Q, dO and the tile's lse and delta wait;
// the next Q loads and the next lse and delta are read while S^T = K Q^T
// runs; dP^T = V dO^T, P^T and dS^T; P^T, dS^T go to shared memory; dV += P^T
// dO; dO is free and the next one loads while dK += dS^T Q and dQ = dS K run,
// dQ added to global dq with fp32 atomics. dK, dV are added with fp32
// atomics at the end (GQA: several q heads per kv head).
template <int D, int BM, bool DOCS>
__global__ void __launch_bounds__(BWD_WARPS * 32, 1)
flash_backward_kernel(AttnDims d, AttnPos pos, AttnInputsBf16 in, AttnGrads grads,
                      const int64_t *__restrict__ k_lo, const int64_t *__restrict__ k_hi,
                      const int64_t *__restrict__ q_lo, const int64_t *__restrict__ q_hi,
                      const int64_t *__restrict__ f_lo, const int64_t *__restrict__ f_hi, float scale_log2) {
    RESTRICT_ARGS(d, pos, in);
    RESTRICT_GRADS(grads);
    constexpr int BN = BWD_BN, NT = BWD_WARPS * 32;
    constexpr int SQ = BM / 2, KC = D / 2;                      // S^T: queries, dK and dV: columns a warp
    constexpr int QW = BM / 32, QC = D / (BWD_WARPS / QW);     // dQ: QW warps of 32 queries x QC columns
    static_assert(BWD_WARPS == 8 && BM % 64 == 0 && BM <= NT && QC % 16 == 0, "backward tile shape");
    DYNAMIC_SHARED(unsigned char, smem);
    bf16 *ks = reinterpret_cast<bf16 *>(smem);
    bf16 *vs = ks + BN * D;
    bf16 *qs = vs + BN * D;                                     // [2][BM][D]
    bf16 *dos = qs + 2 * BM * D;                                // [BM][D]
    bf16 *pts = dos + BM * D;                                   // P^T [BN][BM]
    bf16 *dsts = pts + BN * BM;                                 // dS^T [BN][BM]
    int64_t *kps = reinterpret_cast<int64_t *>(dsts + BN * BM); // [BN]
    int64_t *qps = kps + BN;                                    // [2][BM]
    int64_t *qfs = qps + 2 * BM;                                // [2][BM], DOCS only
    float *lse_s = reinterpret_cast<float *>(qfs + (DOCS ? 2 * BM : 0));   // [2][BM]
    float *del_s = lse_s + 2 * BM;                                          // [2][BM]

    const int tid = threadIdx.x, warp = tid / 32;
    const int h = blockIdx.y, kvh = h / (Hq / Hkv), kt = blockIdx.x;
    const int64_t j0 = (int64_t)kt * BN;
    const int nqt = (int)((Tq + BM - 1) / BM);

    // Query tile i: visible (q_hi >= k_lo, and with DOCS f_lo <= k_hi: not every document starting after
    // every key); full (both tiles whole, k_hi <= q_lo, and with DOCS k_lo >= f_hi: every pair visible).
    auto query_tile = [&](int i, bool *whole) {
        const int64_t lo = k_lo[kt], hi = k_hi[kt];
        *whole = (int64_t)(kt + 1) * BN <= Tk && (int64_t)(i + 1) * BM <= Tq && hi <= q_lo[i] &&
                 (!DOCS || lo >= f_hi[i]);
        return q_hi[i] >= lo && (!DOCS || f_lo[i] <= hi);
    };
    TileWalk walk;
    bool full = false, next_full = false;
    int qt = walk.next(0, nqt, &full, query_tile);
    if (qt >= nqt) return;                        // no query sees these keys

    // This thread's query of tile t (tid < BM), its position and document start only where the tile needs a
    // mask.
    auto query_row = [&](int t, bool need_pos) {
        const int64_t row = (int64_t)t * BM + tid;
        return backward_row<DOCS>(lse + h * Tq, delta + h * Tq, q_pos, q_first, tid < BM && row < Tq ? row : -1,
                                  need_pos);
    };
    auto put_row = [&](const BackwardRow &r, int b) { put_backward_row<BM, DOCS>(r, b, lse_s, del_s, qps, qfs); };

    if (tid < BN) kps[tid] = j0 + tid < Tk ? k_pos[j0 + tid] : INT64_MAX;
    load_tile<D, NT, true>(ks, k, j0, BN, Tk, Hkv, kvh);
    load_tile<D, NT, true>(vs, v, j0, BN, Tk, Hkv, kvh);
    load_tile<D, NT, true>(qs, q, (int64_t)qt * BM, BM, Tq, Hq, h);
    load_tile<D, NT, true>(dos, dout, (int64_t)qt * BM, BM, Tq, Hq, h);
    cp_async_commit();
    put_row(query_row(qt, !full), 0);

    const int kw = warp % 4, wh = warp / 4;       // S^T: keys 32 kw.., queries SQ wh..; dK, dV: columns KC wh..
    const int qw = warp % QW, qc = warp / QW;     // dQ: queries 32 qw.., columns QC qc..
    float dka[2][KC / 8][4], dva[2][KC / 8][4];   // dK / scale, dV of keys 32 kw..
#pragma unroll
    for (int m = 0; m < 2; m++) { zero<KC>(dka[m]); zero<KC>(dva[m]); }
    int buf = 0;
    while (qt < nqt) {
        cp_async_wait<0>();
        __syncthreads();   // Q, dO and the tile's rows are in; every warp is done with P^T, dS^T and the other Q
        const int nxt = walk.next(qt + 1, nqt, &next_full, query_tile);
        if (nxt < nqt) load_tile<D, NT, true>(qs + (buf ^ 1) * BM * D, q, (int64_t)nxt * BM, BM, Tq, Hq, h);
        cp_async_commit();
        const BackwardRow next_row = nxt < nqt ? query_row(nxt, !next_full) : BackwardRow{};   // lands during S^T

        const bf16 *qb = qs + buf * BM * D;
        const int c0 = buf * BM + wh * SQ;        // the warp's queries in the row buffers
        backward_scores32<D, SQ, BM, DOCS>(pts, dsts, ks, vs, qb, dos, kw, wh, full, kps, lse_s + c0, del_s + c0,
                                           qps + c0, qfs + c0, scale_log2, [&] { put_row(next_row, buf ^ 1); });
        __syncthreads();   // P^T, dS^T and the rows of the next tile are in

        mma_ab32<BM, KC, BM, D, false>(dva, pts + kw * 32 * BM, 0, dos, wh * KC);
        __syncthreads();   // every warp is done with dO
        if (nxt < nqt) load_tile<D, NT, true>(dos, dout, (int64_t)nxt * BM, BM, Tq, Hq, h);
        cp_async_commit();
        mma_ab32<BM, KC, BM, D, false>(dka, dsts + kw * 32 * BM, 0, qb, wh * KC);

        float dqa[2][QC / 8][4];                  // dQ / scale of queries 32 qw.., columns QC qc..
#pragma unroll
        for (int m = 0; m < 2; m++) zero<QC>(dqa[m]);
        mma_ab32<BN, QC, BM, D, true>(dqa, dsts, qw * 32, ks, qc * QC);
        atomic_add_rows32<QC>(dq, (int64_t)Hq * D, (int64_t)h * D + qc * QC, dqa, d.scale, [&](int r) {
            const int64_t row = (int64_t)qt * BM + qw * 32 + r;
            return row < Tq ? row : (int64_t)-1;
        });
        qt = nxt;
        full = next_full;
        buf ^= 1;
    }
    cp_async_wait<0>();

    auto key_row = [&](int r) {
        const int64_t key = j0 + kw * 32 + r;
        return key < Tk ? key : (int64_t)-1;
    };
    atomic_add_rows32<KC>(dk, (int64_t)Hkv * D, (int64_t)kvh * D + wh * KC, dka, d.scale, key_row);
    atomic_add_rows32<KC>(dv, (int64_t)Hkv * D, (int64_t)kvh * D + wh * KC, dva, 1.0f, key_row);
}

// ---- host side ----

// Tile shapes per head dim: forward FWD_BM queries x FWD_BN keys, backward
// BWD_BM queries per step x BWD_BN keys per CTA. Chosen so that ptxas
// reports no spills and the backward's shared memory fits an A100's
// (docs/DECISIONS.md).
template <int D> struct Tiles;
template <> struct Tiles<64> { enum { FWD_BN = 64, BWD_BM = 128 }; };
template <> struct Tiles<128> { enum { FWD_BN = 64, BWD_BM = 64 }; };

static void check_shape_cuda(const AttnShape *s) {
    CHECK(s->head_dim == 64 || s->head_dim == 128, "attention (CUDA): head_dim %d (supported: 64, 128)",
          s->head_dim);
    CHECK(s->num_kv_heads >= 1 && s->num_heads % s->num_kv_heads == 0,
          "attention (CUDA): %d q heads not a multiple of %d kv heads", s->num_heads, s->num_kv_heads);
    CHECK(s->q_tokens >= 0 && s->k_tokens >= 0, "attention (CUDA): negative token count");
}

static void check_aligned(const void *p, const char *name) {
    CHECK(((uintptr_t)p & 15) == 0, "attention (CUDA): %s is not 16-byte aligned", name);
}

// Position bounds of the tiles of count arrays pos[j] [T[j]] (tiles of
// block[j]) in one launch, in one stream-ordered scratch: array j's lo is
// bounds[j], its hi bounds[j] + its tiles; release with cudaFreeAsync(bounds[0]).
static void tile_bounds(int count, const int64_t *const *pos, const int64_t *T, const int *block, int64_t **bounds,
                        cudaStream_t stream) {
    TileBounds b;
    memset(&b, 0, sizeof b);
    int64_t total = 0, most = 0;
    for (int j = 0; j < count; j++) {
        const int64_t tiles = (T[j] + block[j] - 1) / block[j];
        total += 2 * tiles;
        most = tiles > most ? tiles : most;
    }
    int64_t *scratch;
    CUDA_CHECK(cudaMallocAsync((void **)&scratch, (size_t)total * sizeof(int64_t), stream));
    for (int j = 0; j < count; j++) {
        const int64_t tiles = (T[j] + block[j] - 1) / block[j];
        b.pos[j] = pos[j];
        b.T[j] = T[j];
        b.block[j] = block[j];
        b.lo[j] = bounds[j] = scratch;
        b.hi[j] = scratch + tiles;
        scratch += 2 * tiles;
    }
    CUDA_LAUNCH(tile_bounds_kernel, dim3(grid_for(most, 128), (unsigned)count), 128, 0, stream, b);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void attn_forward_init_cuda(const AttnShape *s, float *o_acc, float *lse, cudaStream_t stream) {
    check_shape_cuda(s);
    const int64_t rows = s->q_tokens * s->num_heads;
    CUDA_CHECK(cudaMemsetAsync(o_acc, 0, (size_t)(rows * s->head_dim) * sizeof(float), stream));
    if (rows == 0) return;
    CUDA_LAUNCH(fill_kernel, grid_for(rows, 256), 256, 0, stream, lse, rows, -INFINITY);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" int64_t *attn_doc_first_cuda(const AttnShape *s, const int64_t *q_pos, cudaStream_t stream) {
    if (s->doc_starts == NULL || s->doc_count == 0) return NULL;
    CHECK(s->doc_starts_device, "attention (CUDA): %lld document starts without their device copy "
          "(AttnShape.doc_starts_device)", (long long)s->doc_count);
    int64_t *first;
    CUDA_CHECK(cudaMallocAsync((void **)&first, (size_t)(s->q_tokens + 1) * sizeof(int64_t), stream));
    CUDA_LAUNCH(doc_first_kernel, grid_for(s->q_tokens, 128), 128, 0, stream, q_pos, s->q_tokens,
                s->doc_starts_device, s->doc_count, first);
    CUDA_CHECK(cudaGetLastError());
    return first;
}

template <int D, bool DOCS>
static void forward(const AttnShape *s, const AttnPos &pos, const AttnInputsBf16 &in, const AttnOut &out,
                    cudaStream_t stream) {
    constexpr int BM = FWD_BM, BN = Tiles<D>::FWD_BN;
    // q, k, v tiles (bf16), key positions, query positions (and document starts), lse
    const size_t smem = (size_t)(BM + 2 * BN) * D * sizeof(bf16) + (BN + (DOCS ? 2 : 1) * BM) * sizeof(int64_t) +
                        BM * sizeof(float);
    auto kernel = flash_forward_kernel<D, BN, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int block = BN;
    int64_t *k_lo;
    tile_bounds(1, &pos.k_pos, &s->k_tokens, &block, &k_lo, stream);
    const int64_t nkt = (s->k_tokens + BN - 1) / BN;
    const dim3 grid((unsigned)((s->q_tokens + BM - 1) / BM), (unsigned)s->num_heads);
    CUDA_LAUNCH(kernel, grid, FWD_WARPS * 32, smem, stream, attn_dims(s), pos, in, out, k_lo, k_lo + nkt,
                s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(k_lo, stream));
}

extern "C" void attn_dense_forward_cuda(const AttnShape *s, const uint16_t *q, const int64_t *q_pos,
                                        const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                                        float *o_acc, float *lse, cudaStream_t stream) {
    check_shape_cuda(s);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    check_aligned(q, "q"); check_aligned(k, "k"); check_aligned(v, "v"); check_aligned(o_acc, "o_acc");
    int64_t *q_first = attn_doc_first_cuda(s, q_pos, stream);
    const AttnPos pos = {q_pos, k_pos, q_first};
    const AttnInputsBf16 in = {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, NULL};
    const AttnOut out = {o_acc, lse};
    if (s->head_dim == 64 && q_first) forward<64, true>(s, pos, in, out, stream);
    else if (s->head_dim == 64) forward<64, false>(s, pos, in, out, stream);
    else if (q_first) forward<128, true>(s, pos, in, out, stream);
    else forward<128, false>(s, pos, in, out, stream);
    if (q_first) CUDA_CHECK(cudaFreeAsync(q_first, stream));
}

extern "C" void attn_output_bf16_cuda(const AttnShape *s, const float *o_acc, uint16_t *o,
                                      cudaStream_t stream) {
    launch_convert((bf16 *)o, o_acc, s->q_tokens * s->num_heads * s->head_dim, stream);
}

extern "C" void attn_backward_delta_cuda(const AttnShape *s, const uint16_t *o, const uint16_t *dout,
                                         float *delta, cudaStream_t stream) {
    check_shape_cuda(s);
    const int64_t rows = s->q_tokens * s->num_heads;
    if (rows == 0) return;
    check_aligned(o, "o"); check_aligned(dout, "dout");
    const int64_t blocks = (rows * 32 + 255) / 256;
    CHECK(blocks < INT32_MAX, "attention (CUDA): %lld rows is too many", (long long)rows);
    CUDA_LAUNCH(delta_kernel, (unsigned)blocks, 256, 0, stream, (const bf16 *)o, (const bf16 *)dout, delta,
                s->q_tokens, s->num_heads, s->head_dim);
    CUDA_CHECK(cudaGetLastError());
}

// Shared memory of the backward kernel (its layout: flash_backward_kernel).
template <int D, bool DOCS>
static size_t backward_smem() {
    constexpr int BM = Tiles<D>::BWD_BM, BN = BWD_BN;
    return (size_t)(2 * BN + 3 * BM) * D * sizeof(bf16) + (size_t)2 * BN * BM * sizeof(bf16) +
           BN * sizeof(int64_t) + 2 * BM * ((DOCS ? 2 : 1) * sizeof(int64_t) + 2 * sizeof(float));
}

template <int D, bool DOCS>
static void backward(const AttnShape *s, const AttnPos &pos, const AttnInputsBf16 &in, const AttnGrads &grads,
                     cudaStream_t stream) {
    constexpr int BM = Tiles<D>::BWD_BM, BN = BWD_BN;
    const size_t smem = backward_smem<D, DOCS>();
    auto kernel = flash_backward_kernel<D, BM, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t nqt = (s->q_tokens + BM - 1) / BM, nkt = (s->k_tokens + BN - 1) / BN;
    const int64_t *const arrays[3] = {pos.k_pos, pos.q_pos, pos.q_first}, tokens[3] = {s->k_tokens, s->q_tokens,
                                                                                     s->q_tokens};
    const int blocks[3] = {BN, BM, BM};
    int64_t *bounds[3] = {NULL, NULL, NULL};
    tile_bounds(DOCS ? 3 : 2, arrays, tokens, blocks, bounds, stream);
    int64_t *k_lo = bounds[0], *q_lo = bounds[1], *f_lo = bounds[2];
    const dim3 grid((unsigned)nkt, (unsigned)s->num_heads);
    CUDA_LAUNCH(kernel, grid, BWD_WARPS * 32, smem, stream, attn_dims(s), pos, in, grads, k_lo, k_lo + nkt, q_lo,
                q_lo + nqt, f_lo, DOCS ? f_lo + nqt : NULL, s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(k_lo, stream));
}

extern "C" void attn_dense_backward_cuda(const AttnShape *s, const uint16_t *q, const int64_t *q_pos,
                                         const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                                         const float *lse, const float *delta, const uint16_t *dout,
                                         float *dq, float *dk, float *dv, cudaStream_t stream) {
    check_shape_cuda(s);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    check_aligned(q, "q"); check_aligned(k, "k"); check_aligned(v, "v"); check_aligned(dout, "dout");
    int64_t *q_first = attn_doc_first_cuda(s, q_pos, stream);
    const AttnPos pos = {q_pos, k_pos, q_first};
    const AttnInputsBf16 in = {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)dout};
    const AttnGrads grads = {lse, delta, dq, dk, dv};
    if (s->head_dim == 64 && q_first) backward<64, true>(s, pos, in, grads, stream);
    else if (s->head_dim == 64) backward<64, false>(s, pos, in, grads, stream);
    else if (q_first) backward<128, true>(s, pos, in, grads, stream);
    else backward<128, false>(s, pos, in, grads, stream);
    if (q_first) CUDA_CHECK(cudaFreeAsync(q_first, stream));
}

// ---- the kernels of the variant registry (attn_variants.h) ----

extern "C" const void *attn_dense_kernel(int head_dim, int backward) {
    CHECK(head_dim == 64 || head_dim == 128, "attention (CUDA): head_dim %d (supported: 64, 128)", head_dim);
    if (head_dim == 64)
        return backward ? (const void *)flash_backward_kernel<64, Tiles<64>::BWD_BM, false>
                        : (const void *)flash_forward_kernel<64, Tiles<64>::FWD_BN, false>;
    return backward ? (const void *)flash_backward_kernel<128, Tiles<128>::BWD_BM, false>
                    : (const void *)flash_forward_kernel<128, Tiles<128>::FWD_BN, false>;
}
