// flash_sm90_backward.cu: dense causal flash attention backward for Hopper
// (sm_90a), warp-specialised, with the chunk semantics and arguments of
// attn_dense_backward_cuda (attention_cuda.h, flash_sm90.h): P recomputed
// from the final lse; dq, dk, dv accumulated (+=).
//
// One CTA per (tile of 128 keys, kv head):
//   warpgroup 0   the producer (registers lowered by setmaxnreg): warp 0 loads
//                 the tile's K and V by TMA, then walks the query tiles of 64:
//                 it skips tiles no query of which sees a key of the CTA
//                 (causal, documents), and for each q head of the kv head's
//                 GQA group loads Q and dO by TMA into a ring of STAGES stages
//                 (wait on `empty`, expect-tx on `full`), with the rows' lse
//                 (log2 units), delta and positions, and per consumer a flag:
//                 nothing of its keys seen (skip), every pair seen (no mask),
//                 or masked. A last stage flagged END closes the walk.
//   warpgroups 1, 2  the consumers (registers raised), 64 keys each; per stage,
//                 by wgmma m64nNk16 with the keys as M: S^T = K Q^T and
//                 dP^T = V dO^T (K-major from 128-byte swizzled boxes), P^T =
//                 exp2(S^T scale - lse) and dS^T = P^T (dP^T - delta) in
//                 registers (the mask only on flagged tiles), dV += P^T dO and
//                 dK += dS^T Q with P^T, dS^T from registers and dO, Q read
//                 MN-major; dS^T to shared memory, a barrier of the warpgroup
//                 (an mbarrier of 128 arrivals), dS read back as A fragments
//                 by transposed ldmatrix for dQ = dS K (K MN-major), 64
//                 columns at a time, added to dq with fp32 atomics; then an
//                 arrive on `empty`. dK and dV stay in registers over every
//                 query tile and q head of the group, added to dk, dv once at
//                 the end (no other CTA has these keys of this kv head).
// dQ by atomics, not a second pass: docs/DECISIONS.md. Shared tiles are TMA
// boxes of 64 rows x 64 bf16 (128-byte swizzle), 1024-byte aligned; a head
// dim of 128 is two boxes side by side.
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_kernel.h"
#include "attention_cuda.h"
#include "flash_sm90.h"
#include "hopper.cuh"

#define LOG2E 1.4426950408889634f

constexpr int BWD_BM = 64;                    // queries per stage
constexpr int BWD_KEYS = 64;                  // keys per consumer warpgroup
constexpr int BWD_C = 2;                      // consumer warpgroups: 128 keys per CTA
constexpr int BWD_STAGES = 2;
constexpr int BWD_BOX = 64 * 128;             // one TMA box: 64 rows of 64 bf16
constexpr int DS_LD = BWD_BM + 8;             // dS^T rows padded by 16 bytes: ldmatrix without bank conflicts

// Byte offsets in the CTA's (1024-byte aligned) dynamic shared memory.
template <int D> struct Sm90BackwardSmem {
    static constexpr int BOXES = D / 64;
    static constexpr int K = 0;                                         // [C][BOXES] boxes
    static constexpr int V = K + BWD_C * BOXES * BWD_BOX;               // [C][BOXES] boxes
    static constexpr int Q = V + BWD_C * BOXES * BWD_BOX;               // [STAGES][BOXES] boxes
    static constexpr int DO = Q + BWD_STAGES * BOXES * BWD_BOX;         // [STAGES][BOXES] boxes
    static constexpr int DS = DO + BWD_STAGES * BOXES * BWD_BOX;        // bf16 [C][KEYS][DS_LD] dS^T
    static constexpr int LSE = DS + BWD_C * BWD_KEYS * DS_LD * 2;       // float [STAGES][BM], log2 units
    static constexpr int DELTA = LSE + BWD_STAGES * BWD_BM * 4;         // float [STAGES][BM]
    static constexpr int QPOS = DELTA + BWD_STAGES * BWD_BM * 4;        // int64 [STAGES][BM]
    static constexpr int QFIRST = QPOS + BWD_STAGES * BWD_BM * 8;       // int64 [STAGES][BM]
    static constexpr int ROW0 = QFIRST + BWD_STAGES * BWD_BM * 8;       // int64 [STAGES] first query
    static constexpr int HEAD = ROW0 + BWD_STAGES * 8;                  // int [STAGES] q head
    static constexpr int FLAG = HEAD + BWD_STAGES * 4;                  // int [STAGES][C]
    static constexpr int BAR = (FLAG + BWD_STAGES * BWD_C * 4 + 7) / 8 * 8;
    // uint64 kv_full, full[STAGES], empty[STAGES], ds_ready[C]
    static constexpr int BYTES = BAR + (1 + 2 * BWD_STAGES + BWD_C) * 8;
};

#if defined(__CUDASIM__) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A stage's query tile for one consumer: none of its keys seen, masked, every pair seen; none (the end).
constexpr int BWD_SKIP = 0, BWD_PARTIAL = 1, BWD_FULL = 2, BWD_END = 3;
constexpr int BWD_PRODUCER_REGS = 48, BWD_CONSUMER_REGS = 232;    // 48 + 2 x 232 = 512: ptxas spills nothing

// The mbarriers: kv_full, full[STAGES], empty[STAGES], ds_ready[C].
struct BackwardBarriers {
    uint64_t *kv_full, *full, *empty, *ds_ready;
};
template <int D> static __device__ __forceinline__ BackwardBarriers backward_barriers(unsigned char *smem) {
    uint64_t *b = reinterpret_cast<uint64_t *>(smem + Sm90BackwardSmem<D>::BAR);
    return {b, b + 1, b + 1 + BWD_STAGES, b + 1 + 2 * BWD_STAGES};
}

// The producer's warp: K and V of the CTA's keys j0 .., then for every query tile some query of which sees one
// of them, each q head of kv head kvh's group: Q, dO, the rows' statistics and the consumers' flags.
template <int D, bool DOCS>
static __device__ void produce_backward(unsigned char *smem, const CUtensorMap *qmap, const CUtensorMap *kmap,
                                        const CUtensorMap *vmap, const CUtensorMap *domap, const AttnDims &d,
                                        const AttnPos &pos, const float *__restrict__ lse,
                                        const float *__restrict__ delta, int64_t j0, int kvh) {
    using L = Sm90BackwardSmem<D>;
    const int lane = threadIdx.x % 32;
    const BackwardBarriers bar = backward_barriers<D>(smem);
    const int64_t Tq = d.Tq, Tk = d.Tk;
    const int64_t *__restrict__ q_pos = pos.q_pos;
    const int64_t *__restrict__ q_first = pos.q_first;
    float *lse_s = reinterpret_cast<float *>(smem + L::LSE), *del_s = reinterpret_cast<float *>(smem + L::DELTA);
    int64_t *qp_s = reinterpret_cast<int64_t *>(smem + L::QPOS), *qf_s = reinterpret_cast<int64_t *>(smem + L::QFIRST);
    int64_t *row0 = reinterpret_cast<int64_t *>(smem + L::ROW0);
    int *head = reinterpret_cast<int *>(smem + L::HEAD), *flag = reinterpret_cast<int *>(smem + L::FLAG);
    if (lane == 0) {
        mbarrier_arrive_expect_tx(bar.kv_full, 2 * BWD_C * L::BOXES * BWD_BOX);
        for (int c = 0; c < BWD_C; c++)
            for (int b = 0; b < L::BOXES; b++) {
                const int at = (c * L::BOXES + b) * BWD_BOX, row = (int)(j0 + BWD_KEYS * c);
                tma_load_2d(smem + L::K + at, kmap, kvh * D + 64 * b, row, bar.kv_full);
                tma_load_2d(smem + L::V + at, vmap, kvh * D + 64 * b, row, bar.kv_full);
            }
    }
    int64_t k_lo[BWD_C], k_hi[BWD_C], kl = INT64_MAX, kh = INT64_MIN;   // each consumer's key bounds, the CTA's
#pragma unroll
    for (int c = 0; c < BWD_C; c++) {
        const int64_t a = j0 + BWD_KEYS * c + lane, b = a + 32;
        warp_bounds(a < Tk ? pos.k_pos[a] : 0, a < Tk, b < Tk ? pos.k_pos[b] : 0, b < Tk, &k_lo[c], &k_hi[c]);
        kl = min(kl, k_lo[c]);
        kh = max(kh, k_hi[c]);
    }

    int stage = 0;
    unsigned phase = 0;                 // parity of the stage's current use; `empty` waits on the other
    for (int64_t i0 = 0; i0 < Tq; i0 += BWD_BM) {
        const bool qa = i0 + lane < Tq, qb = i0 + lane + 32 < Tq;
        int64_t q_lo, q_hi, f_lo = 0, f_hi = 0;
        warp_bounds(qa ? q_pos[i0 + lane] : 0, qa, qb ? q_pos[i0 + lane + 32] : 0, qb, &q_lo, &q_hi);
        if (DOCS) warp_bounds(qa ? q_first[i0 + lane] : 0, qa, qb ? q_first[i0 + lane + 32] : 0, qb, &f_lo, &f_hi);
        if (kl > q_hi || (DOCS && kh < f_lo)) continue;             // no query of the tile sees a key of the CTA
        int f[BWD_C];
#pragma unroll
        for (int c = 0; c < BWD_C; c++) {
            const bool whole = j0 + BWD_KEYS * (c + 1) <= Tk && i0 + BWD_BM <= Tq && k_hi[c] <= q_lo &&
                               (!DOCS || k_lo[c] >= f_hi);
            f[c] = k_lo[c] > q_hi || (DOCS && k_hi[c] < f_lo) ? BWD_SKIP : whole ? BWD_FULL : BWD_PARTIAL;
        }
        for (int h = kvh * d.group; h < (kvh + 1) * d.group; h++) {
            mbarrier_wait(&bar.empty[stage], phase ^ 1);
#pragma unroll
            for (int half = 0; half < 2; half++) {                  // rows past Tq or with lse -inf see nothing
                const int r = lane + 32 * half;
                const int64_t row = i0 + r;
                const float l = row < Tq ? lse[h * Tq + row] : -INFINITY;
                const bool live = l != -INFINITY;
                lse_s[stage * BWD_BM + r] = live ? l * LOG2E : 0.0f;
                del_s[stage * BWD_BM + r] = live ? delta[h * Tq + row] : 0.0f;
                qp_s[stage * BWD_BM + r] = live ? q_pos[row] : INT64_MIN;
                if (DOCS) qf_s[stage * BWD_BM + r] = live ? q_first[row] : 0;
            }
            __syncwarp();
            if (lane == 0) {
                row0[stage] = i0;
                head[stage] = h;
                for (int c = 0; c < BWD_C; c++) flag[stage * BWD_C + c] = f[c];
                mbarrier_arrive_expect_tx(&bar.full[stage], 2 * L::BOXES * BWD_BOX);
                for (int b = 0; b < L::BOXES; b++) {
                    const int at = (stage * L::BOXES + b) * BWD_BOX;
                    tma_load_2d(smem + L::Q + at, qmap, h * D + 64 * b, (int)i0, &bar.full[stage]);
                    tma_load_2d(smem + L::DO + at, domap, h * D + 64 * b, (int)i0, &bar.full[stage]);
                }
            }
            if (++stage == BWD_STAGES) { stage = 0; phase ^= 1; }
        }
    }
    mbarrier_wait(&bar.empty[stage], phase ^ 1);
    if (lane == 0) {
        for (int c = 0; c < BWD_C; c++) flag[stage * BWD_C + c] = BWD_END;
        mbarrier_arrive(&bar.full[stage]);
    }
}

// Consumer warpgroup c: keys j0 + 64 c .. against every stage the producer fills; dK, dV added at the end.
// Thread (warp w of the group, lane l; g = l / 4, t = l % 4) holds keys 16 w + g and + 8 of the 64.
template <int D, bool DOCS>
static __device__ void consume_backward(unsigned char *smem, int c, const AttnDims &d, const AttnPos &pos,
                                        const AttnGrads &grads, int64_t j0, int kvh, float scale_log2) {
    using L = Sm90BackwardSmem<D>;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const BackwardBarriers bar = backward_barriers<D>(smem);
    const int64_t Tq = d.Tq, Tk = d.Tk;
    const float scale = d.scale;
    const float *lse_s = reinterpret_cast<const float *>(smem + L::LSE);
    const float *del_s = reinterpret_cast<const float *>(smem + L::DELTA);
    const int64_t *qp_s = reinterpret_cast<const int64_t *>(smem + L::QPOS);
    const int64_t *qf_s = reinterpret_cast<const int64_t *>(smem + L::QFIRST);
    const int64_t *row0 = reinterpret_cast<const int64_t *>(smem + L::ROW0);
    const int *head = reinterpret_cast<const int *>(smem + L::HEAD), *flag = reinterpret_cast<const int *>(smem + L::FLAG);
    const unsigned char *ks = smem + L::K + c * L::BOXES * BWD_BOX, *vs = smem + L::V + c * L::BOXES * BWD_BOX;
    bf16 *dss = reinterpret_cast<bf16 *>(smem + L::DS) + c * BWD_KEYS * DS_LD;

    const int64_t key[2] = {j0 + BWD_KEYS * c + 16 * warp + g, j0 + BWD_KEYS * c + 16 * warp + g + 8};
    int64_t kp[2];
#pragma unroll
    for (int r = 0; r < 2; r++) kp[r] = key[r] < Tk ? pos.k_pos[key[r]] : INT64_MAX;   // past Tk: never seen
    // dK / scale, dV [64 keys x D]; S^T, dP^T [64 keys x BM]: accumulator i is key row 8 ((i%4)/2), column
    // 8 (i/4) + 2 t + i%2.
    float dka[D / 2], dva[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.0f;

    mbarrier_wait(bar.kv_full, 0);
    int stage = 0;
    unsigned phase = 0, ds_phase = 0;
    for (;;) {
        mbarrier_wait(&bar.full[stage], phase);
        const int f = flag[stage * BWD_C + c];
        if (f == BWD_END) break;
        if (f != BWD_SKIP) {
            const unsigned char *qs = smem + L::Q + stage * L::BOXES * BWD_BOX;
            const unsigned char *dos = smem + L::DO + stage * L::BOXES * BWD_BOX;
            const float *ls = lse_s + stage * BWD_BM, *dl = del_s + stage * BWD_BM;
            const int64_t *qp = qp_s + stage * BWD_BM, *qf = qf_s + stage * BWD_BM;
            const int64_t i0 = row0[stage];
            const int h = head[stage];

            // S^T = K Q^T, dP^T = V dO^T [64 x BM] over D in steps of 16 (32 bytes within a box's 128-byte rows).
            float st[BWD_BM / 2], dpt[BWD_BM / 2];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const int off = kk / 4 * BWD_BOX + 32 * (kk % 4);
                wgmma_bf16<BWD_BM>(st, wgmma_descriptor(ks + off, 16, 1024, WGMMA_SWIZZLE_128B),
                                   wgmma_descriptor(qs + off, 16, 1024, WGMMA_SWIZZLE_128B), kk > 0);
                wgmma_bf16<BWD_BM>(dpt, wgmma_descriptor(vs + off, 16, 1024, WGMMA_SWIZZLE_128B),
                                   wgmma_descriptor(dos + off, 16, 1024, WGMMA_SWIZZLE_128B), kk > 0);
            }
            wgmma_commit_group();
            wgmma_wait_group<0>();

            // P^T = exp2(S^T scale log2e - lse), dS^T = P^T (dP^T - delta); masked pairs 0, only on partial tiles.
#pragma unroll
            for (int i = 0; i < BWD_BM / 2; i++) {
                const int r = i % 4 / 2, col = 8 * (i / 4) + 2 * t4 + i % 2;
                float x = st[i] * scale_log2 - ls[col];
                if (f != BWD_FULL && (kp[r] > qp[col] || (DOCS && kp[r] < qf[col]))) x = -INFINITY;
                const float p = exp2_approx(x);
                st[i] = p;
                dpt[i] = p * (dpt[i] - dl[col]);
            }
            // As bf16 A fragments (queries 16 kk .. as K): dV += P^T dO, dK += dS^T Q, dO and Q MN-major (D
            // contiguous), 8 queries 1024 bytes apart, the second box of D 64 .. 127 one box further.
            uint32_t pa[BWD_BM / 16][4], dsa[BWD_BM / 16][4];
#pragma unroll
            for (int kk = 0; kk < BWD_BM / 16; kk++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    pa[kk][j] = pack_bf16(st[8 * kk + 2 * j], st[8 * kk + 2 * j + 1]);
                    dsa[kk][j] = pack_bf16(dpt[8 * kk + 2 * j], dpt[8 * kk + 2 * j + 1]);
                }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BWD_BM / 16; kk++) {
                wgmma_bf16_rs<D, true>(dva, pa[kk], wgmma_descriptor(dos + 16 * 128 * kk, BWD_BOX, 1024,
                                                                     WGMMA_SWIZZLE_128B), true);
                wgmma_bf16_rs<D, true>(dka, dsa[kk], wgmma_descriptor(qs + 16 * 128 * kk, BWD_BOX, 1024,
                                                                      WGMMA_SWIZZLE_128B), true);
            }
            wgmma_commit_group();

            // dS^T -> shared [64 keys][DS_LD] (fragment j of kk: key row + 8 (j%2), queries 16 kk + 8 (j/2) ..),
            // then every warp of the group has written it.
#pragma unroll
            for (int kk = 0; kk < BWD_BM / 16; kk++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    *reinterpret_cast<uint32_t *>(dss + (16 * warp + g + 8 * (j % 2)) * DS_LD + 16 * kk +
                                                  8 * (j / 2) + 2 * t4) = dsa[kk][j];
            mbarrier_arrive(&bar.ds_ready[c]);
            mbarrier_wait(&bar.ds_ready[c], ds_phase);
            ds_phase ^= 1;

            // dQ [BM x D] += scale dS K: A = dS (queries 16 w .., keys 16 kk ..) by transposed ldmatrix of dS^T
            // (matrix m of lane l: keys + 8 (m/2), queries + 8 (m%2)); K MN-major, 64 columns of D a box.
            uint32_t da[BWD_KEYS / 16][4];
            const int m = lane / 8;
#pragma unroll
            for (int kk = 0; kk < BWD_KEYS / 16; kk++)
                ldmatrix_x4_trans(da[kk], dss + (16 * kk + 8 * (m / 2) + lane % 8) * DS_LD + 16 * warp + 8 * (m % 2));
#pragma unroll
            for (int b = 0; b < L::BOXES; b++) {
                float dqa[32];
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BWD_KEYS / 16; kk++)
                    wgmma_bf16_rs<64, true>(dqa, da[kk], wgmma_descriptor(ks + b * BWD_BOX + 16 * 128 * kk, BWD_BOX,
                                                                          1024, WGMMA_SWIZZLE_128B), kk > 0);
                wgmma_commit_group();
                wgmma_wait_group<0>();
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int64_t row = i0 + 16 * warp + g + 8 * r;
                    if (row >= Tq) continue;
                    float *dqrow = grads.dq + (row * d.Hq + h) * (int64_t)D + 64 * b + 2 * t4;
#pragma unroll
                    for (int n = 0; n < 8; n++) {
                        atomicAdd(dqrow + 8 * n, scale * dqa[4 * n + 2 * r]);
                        atomicAdd(dqrow + 8 * n + 1, scale * dqa[4 * n + 2 * r + 1]);
                    }
                }
            }
        }
        mbarrier_arrive(&bar.empty[stage]);
        if (++stage == BWD_STAGES) { stage = 0; phase ^= 1; }
    }

    // dK, dV of the group's heads: these keys of kv head kvh are this CTA's alone.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= Tk) continue;
        const int64_t base = (key[r] * d.Hkv + kvh) * (int64_t)D + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            float2 *kat = reinterpret_cast<float2 *>(grads.dk + base + 8 * n);
            float2 *vat = reinterpret_cast<float2 *>(grads.dv + base + 8 * n);
            float2 kv = *kat, vv = *vat;
            kv.x += scale * dka[4 * n + 2 * r];
            kv.y += scale * dka[4 * n + 2 * r + 1];
            vv.x += dva[4 * n + 2 * r];
            vv.y += dva[4 * n + 2 * r + 1];
            *kat = kv;
            *vat = vv;
        }
    }
}

#endif  // sm_90a or the sim

// Grid (ceil(Tk / 128), Hkv); 128 (1 + C) threads. Maps: q, dout [Tq][Hq D], k, v [Tk][Hkv D] as 2D tensors of
// bf16 with boxes of 64 x 64, 128-byte swizzle. scale_log2 = d.scale log2(e); DOCS: pos.q_first.
template <int D, bool DOCS>
__global__ void __launch_bounds__(128 * (BWD_C + 1), 1)
flash_sm90_backward_kernel(AttnDims d, AttnPos pos, AttnGrads grads, const __grid_constant__ CUtensorMap qmap,
                           const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                           const __grid_constant__ CUtensorMap domap, float scale_log2) {
#if defined(__CUDASIM__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char *smem = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;   // swizzle atoms: 1024 bytes
    const int64_t j0 = (int64_t)blockIdx.x * BWD_C * BWD_KEYS;                    // earlier (heavier) keys first
    const int kvh = (int)blockIdx.y, wg = threadIdx.x / 128;
    const BackwardBarriers bar = backward_barriers<D>(smem);
    if (threadIdx.x == 0) {
        mbarrier_init(bar.kv_full, 1);
        for (int s = 0; s < BWD_STAGES; s++) {
            mbarrier_init(&bar.full[s], 1);
            mbarrier_init(&bar.empty[s], 128 * BWD_C);
        }
        for (int c = 0; c < BWD_C; c++) mbarrier_init(&bar.ds_ready[c], 128);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<BWD_PRODUCER_REGS>();
        if (threadIdx.x < 32)
            produce_backward<D, DOCS>(smem, &qmap, &kmap, &vmap, &domap, d, pos, grads.lse, grads.delta, j0, kvh);
    } else {
        setmaxnreg_inc<BWD_CONSUMER_REGS>();
        consume_backward<D, DOCS>(smem, wg - 1, d, pos, grads, j0, kvh, scale_log2);
    }
#endif
}

// ---- host side ----

template <int D, bool DOCS>
static void backward_sm90(const AttnShape *s, const AttnPos &pos, const AttnGrads &grads, const CUtensorMap &qmap,
                          const CUtensorMap &kmap, const CUtensorMap &vmap, const CUtensorMap &domap,
                          cudaStream_t stream) {
    const size_t smem = Sm90BackwardSmem<D>::BYTES + 1024;       // + the alignment to 1024 bytes
    auto kernel = flash_sm90_backward_kernel<D, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t keys = BWD_C * BWD_KEYS;
    const dim3 grid((unsigned)((s->k_tokens + keys - 1) / keys), (unsigned)s->num_kv_heads);
    CUDA_LAUNCH(kernel, grid, 128 * (BWD_C + 1), smem, stream, attn_dims(s), pos, grads, qmap, kmap, vmap, domap,
                s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void attn_dense_backward_sm90(const AttnShape *s, const uint16_t *q, const int64_t *q_pos,
                                         const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                                         const float *lse, const float *delta, const uint16_t *dout,
                                         float *dq, float *dk, float *dv, cudaStream_t stream) {
    const char *why = attn_sm90_unsupported(s);
    CHECK(why == NULL, "attention (sm_90): %s (q %lld x k %lld tokens, %d/%d heads, head_dim %d)", why,
          (long long)s->q_tokens, (long long)s->k_tokens, s->num_heads, s->num_kv_heads, s->head_dim);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    int64_t *q_first = attn_doc_first_cuda(s, q_pos, stream);
    const AttnPos pos = {q_pos, k_pos, q_first};
    const AttnGrads grads = {lse, delta, dq, dk, dv};
    const CUtensorMap qmap = tensor_map(q, s->q_tokens, s->num_heads, s->head_dim);
    const CUtensorMap kmap = tensor_map(k, s->k_tokens, s->num_kv_heads, s->head_dim);
    const CUtensorMap vmap = tensor_map(v, s->k_tokens, s->num_kv_heads, s->head_dim);
    const CUtensorMap domap = tensor_map(dout, s->q_tokens, s->num_heads, s->head_dim);
    if (s->head_dim == 64 && q_first) backward_sm90<64, true>(s, pos, grads, qmap, kmap, vmap, domap, stream);
    else if (s->head_dim == 64) backward_sm90<64, false>(s, pos, grads, qmap, kmap, vmap, domap, stream);
    else if (q_first) backward_sm90<128, true>(s, pos, grads, qmap, kmap, vmap, domap, stream);
    else backward_sm90<128, false>(s, pos, grads, qmap, kmap, vmap, domap, stream);
    if (q_first) CUDA_CHECK(cudaFreeAsync(q_first, stream));
}
