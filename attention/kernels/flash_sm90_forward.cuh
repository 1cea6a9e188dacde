// flash_sm90_forward.cuh: what the Hopper (sm_90a) attention forwards share,
// the dense one (flash_sm90.cu) and the sparse one (flash_sm90_sparse.cu):
// the tiles (64 queries of a consumer warpgroup, 64 keys a stage), the CTA's
// shared-memory layout (Q boxes of C consumers, a ring of STAGES K/V stages
// with their key positions and flags, the mbarriers), the barriers' set-up
// and the closing END stage, the dense forward's register split of producer
// and consumers, and the consumer warpgroup
// (S = Q K^T and O += P V by wgmma, online softmax, the chunk's fp32 merge
// into the running (o, lse)). A kernel's producer fills the stages; each
// consumer walks them until a stage flagged FLAG_END.
#ifndef MTRAIN_FLASH_SM90_FORWARD_CUH
#define MTRAIN_FLASH_SM90_FORWARD_CUH

#include <math.h>
#include <stdint.h>

#include "hopper.cuh"

#define LOG2E 1.4426950408889634f

constexpr int BM = 64, BN = 64, STAGES = 2;
constexpr int BOX_BYTES = 64 * 128;                 // one TMA box: 64 rows of 64 bf16

// Byte offsets in the CTA's (1024-byte aligned) dynamic shared memory.
template <int D, int C> struct Sm90Smem {
    static constexpr int BOXES = D / 64;
    static constexpr int Q = 0;                                        // [C][BOXES] boxes
    static constexpr int K = Q + C * BOXES * BOX_BYTES;                // [STAGES][BOXES] boxes
    static constexpr int V = K + STAGES * BOXES * BOX_BYTES;           // [STAGES][BOXES] boxes
    static constexpr int KPOS = V + STAGES * BOXES * BOX_BYTES;        // int64 [STAGES][BN]
    static constexpr int FLAG = KPOS + STAGES * BN * 8;                // int [STAGES]
    static constexpr int BAR = (FLAG + STAGES * 4 + 7) / 8 * 8;        // uint64 q_full, full[STAGES], empty[STAGES]
    static constexpr int BYTES = BAR + (1 + 2 * STAGES) * 8;
};

#if defined(__CUDASIM__) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int FLAG_PARTIAL = 0, FLAG_FULL = 1, FLAG_END = 2;   // a stage's key tile: masked, whole, none (the end)
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;       // 24 + 2 x 240 of 512 per thread of each warpgroup

// The CTA's dynamic shared memory from its 1024-byte aligned start (the swizzle atoms).
static __device__ __forceinline__ unsigned char *sm90_smem_aligned(unsigned char *raw) {
    return raw + (1024 - smem_addr(raw) % 1024) % 1024;
}

// Thread 0 initialises the barriers for `consumers` consumer warpgroups (q_full and full: one arrival, the
// producer's; empty: every consumer thread's); then the whole CTA syncs.
template <int D, int C>
static __device__ __forceinline__ void sm90_forward_barriers_init(unsigned char *smem, int consumers) {
    uint64_t *q_full = reinterpret_cast<uint64_t *>(smem + Sm90Smem<D, C>::BAR), *full = q_full + 1,
             *empty = full + STAGES;
    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 128 * consumers);
        }
        mbarrier_init_fence();
    }
    __syncthreads();
}

// The producer's last stage (`stage` in its use of parity `phase`), once the consumers released it: flagged
// END, arrived on by lane 0.
template <int D, int C>
static __device__ __forceinline__ void sm90_forward_end(unsigned char *smem, int stage, unsigned phase) {
    using L = Sm90Smem<D, C>;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + L::BAR) + 1, *empty = full + STAGES;
    mbarrier_wait(&empty[stage], phase ^ 1);
    if (threadIdx.x % 32 == 0) {
        reinterpret_cast<int *>(smem + L::FLAG)[stage] = FLAG_END;
        mbarrier_arrive(&full[stage]);
    }
}

// One consumer warpgroup: the 64 queries from i0 of q head h (Q in the CTA's slot c) against every stage the
// producer fills; merges into (o, lse) at the end.
// Thread (warp w of the group, lane l; g = l / 4, t = l % 4) holds rows 16 w + g and + 8 of the tile.
template <int D, int C, bool DOCS>
static __device__ void consume(unsigned char *smem, int c, const int64_t *__restrict__ q_pos,
                        const int64_t *__restrict__ q_first, int64_t Tq, int Hq, int64_t i0, int h,
                        float scale_log2, float *__restrict__ o, float *__restrict__ lse) {
    using L = Sm90Smem<D, C>;
    const int tid = threadIdx.x % 128, warp = tid / 32, g = tid % 32 / 4, t4 = tid % 4;
    uint64_t *q_full = reinterpret_cast<uint64_t *>(smem + L::BAR), *full = q_full + 1, *empty = full + STAGES;
    const int64_t *kps = reinterpret_cast<const int64_t *>(smem + L::KPOS);
    const int *flag = reinterpret_cast<const int *>(smem + L::FLAG);
    const unsigned char *qs = smem + L::Q + c * L::BOXES * BOX_BYTES;

    const int64_t row[2] = {i0 + 16 * warp + g, i0 + 16 * warp + g + 8};
    int64_t qp[2], qf[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        qp[r] = row[r] < Tq ? q_pos[row[r]] : INT64_MIN;        // past Tq: sees nothing
        if (DOCS) qf[r] = row[r] < Tq ? q_first[row[r]] : 0;
    }
    float acc[D / 2], s[BN / 2];                // O and S: accumulator i is row 8 ((i%4)/2), column 8 (i/4) + 2 t + i%2
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    mbarrier_wait(q_full, 0);
    int stage = 0;
    unsigned phase = 0;
    for (;;) {
        mbarrier_wait(&full[stage], phase);
        const int f = flag[stage];
        if (f == FLAG_END) break;
        const unsigned char *ks = smem + L::K + stage * L::BOXES * BOX_BYTES;
        const unsigned char *vs = smem + L::V + stage * L::BOXES * BOX_BYTES;

        // S [64 x BN] = Q K^T over D in steps of 16 (32 bytes within a box's 128-byte rows).
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const int off = kk / 4 * BOX_BYTES + 32 * (kk % 4);
            wgmma_bf16<BN>(s, wgmma_descriptor(qs + off, 16, 1024, WGMMA_SWIZZLE_128B),
                           wgmma_descriptor(ks + off, 16, 1024, WGMMA_SWIZZLE_128B), kk > 0);
        }
        wgmma_commit_group();
        wgmma_wait_group<0>();

        // Online softmax of the tile (log2 units); masked pairs -inf, only on partial tiles.
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < BN / 2; i++) {
            const int r = i % 4 / 2;
            float x = s[i] * scale_log2;
            if (f != FLAG_FULL) {
                const int64_t kp = kps[stage * BN + 8 * (i / 4) + 2 * t4 + i % 2];
                if (kp > qp[r] || (DOCS && kp < qf[r])) x = -INFINITY;
            }
            s[i] = x;
            tmax[r] = fmaxf(tmax[r], x);
        }
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
            const float mn = fmaxf(m[r], tmax[r]);
            base[r] = mn == -INFINITY ? 0.0f : mn;              // a row with nothing visible yet stays at 0
            alpha[r] = exp2_approx(m[r] - base[r]);
            m[r] = mn;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int i = 0; i < BN / 2; i++) {
            const int r = i % 4 / 2;
            s[i] = exp2_approx(s[i] - base[r]);
            l[r] += s[i];
        }
#pragma unroll
        for (int i = 0; i < D / 2; i++) acc[i] *= alpha[i % 4 / 2];

        // O [64 x D] += P V: P as bf16 A fragments (keys 16 kk ..), V MN-major (D contiguous), 8 keys 1024 bytes
        // apart, the second box of D 64 .. 127 one box further.
        uint32_t p[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int j = 0; j < 4; j++) p[kk][j] = pack_bf16(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_bf16_rs<D, true>(acc, p[kk], wgmma_descriptor(vs + 16 * 128 * kk, BOX_BYTES, 1024,
                                                               WGMMA_SWIZZLE_128B), true);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        mbarrier_arrive(&empty[stage]);
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    }

    // Merge the chunk's rows into the running result (rows that saw no key are left unchanged).
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const bool valid = row[r] < Tq && m[r] != -INFINITY;   // the same for the 4 lanes of a row
        const float old = valid ? lse[h * Tq + row[r]] : 0.0f;
        __syncwarp();                                          // every lane read before lane t4 = 0 writes
        if (!valid) continue;
        const float chunk = (m[r] + __log2f(l[r])) * 0.6931471805599453f;
        const float mx = fmaxf(old, chunk);
        const float a = __expf(old - mx), b = __expf(chunk - mx);
        const float wa = a / (a + b), wb = b / (a + b) / l[r];
        float *orow = o + (row[r] * Hq + h) * (int64_t)D;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            float2 *at = reinterpret_cast<float2 *>(orow + 8 * n + 2 * t4);
            float2 prev = *at;
            prev.x = wa * prev.x + wb * acc[4 * n + 2 * r];
            prev.y = wa * prev.y + wb * acc[4 * n + 2 * r + 1];
            *at = prev;
        }
        if (t4 == 0) lse[h * Tq + row[r]] = mx + __logf(a + b);
    }
}


#endif  // sm_90a or the sim

#endif
