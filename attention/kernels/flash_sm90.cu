// flash_sm90.cu: dense causal flash attention forward for Hopper (sm_90a),
// warp-specialised, with the chunk semantics and arguments of
// attn_dense_forward_cuda (attention_cuda.h, flash_sm90.h); a variant of
// the registry (attn_variants.cu), which chooses it or the mma.sync kernels.
//
// One CTA per (tile of 64 queries, kv head, slice of C of its q heads):
//   warpgroup 0   the producer (registers lowered by setmaxnreg): warp 0 loads
//                 the C heads' Q tiles by TMA, then walks the key tiles of 64:
//                 it reads their positions, skips tiles no query of the tile
//                 sees (causal, documents), marks tiles every query sees whole
//                 (no mask), and loads K and V by TMA into a ring of STAGES
//                 stages: wait on the stage's `empty` mbarrier, write the
//                 positions and the flag, expect-tx and copy on `full`. A
//                 last stage flagged END closes the walk.
//   warpgroups 1..C  the consumers (registers raised), one q head each (GQA:
//                 the C heads of one kv head share every K/V stage): per stage
//                 S = Q K^T by wgmma m64n64k16 (Q, K K-major from 128-byte
//                 swizzled shared memory), the mask only on flagged tiles,
//                 online softmax in registers (log2 domain), O += P V by
//                 wgmma with P from registers and V read MN-major; then an
//                 arrive on `empty`. At the end the chunk's (O, LSE) merged
//                 into the running fp32 (o_acc, lse), as the mma.sync kernels.
// Shared tiles are TMA boxes of 64 rows x 64 bf16 (128 bytes, the 128-byte
// swizzle: 16-byte chunk c of row r at c ^ (r % 8)), 1024-byte aligned; a
// head dim of 128 is two boxes side by side.
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_kernel.h"
#include "attention_cuda.h"
#include "flash_sm90.h"
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

// The producer's warp: Q of the CTA's heads, then every key tile some query of the tile sees, in order.
template <int D, int C, bool DOCS>
static __device__ void produce(unsigned char *smem, const CUtensorMap *qmap, const CUtensorMap *kmap,
                        const CUtensorMap *vmap, const int64_t *__restrict__ q_pos,
                        const int64_t *__restrict__ k_pos, const int64_t *__restrict__ q_first, int64_t Tq,
                        int64_t Tk, int64_t i0, int h0, int heads, int kvh) {
    using L = Sm90Smem<D, C>;
    const int lane = threadIdx.x % 32;
    uint64_t *q_full = reinterpret_cast<uint64_t *>(smem + L::BAR), *full = q_full + 1, *empty = full + STAGES;
    int64_t *kps = reinterpret_cast<int64_t *>(smem + L::KPOS);
    int *flag = reinterpret_cast<int *>(smem + L::FLAG);
    if (lane == 0) {
        mbarrier_arrive_expect_tx(q_full, (unsigned)(heads * L::BOXES * BOX_BYTES));
        for (int c = 0; c < heads; c++)
            for (int b = 0; b < L::BOXES; b++)
                tma_load_2d(smem + L::Q + (c * L::BOXES + b) * BOX_BYTES, qmap, (h0 + c) * D + 64 * b, (int)i0, q_full);
    }
    int64_t q_lo, q_hi, f_lo = 0, f_hi = 0;
    const bool qa = i0 + lane < Tq, qb = i0 + lane + 32 < Tq;
    warp_bounds(qa ? q_pos[i0 + lane] : 0, qa, qb ? q_pos[i0 + lane + 32] : 0, qb, &q_lo, &q_hi);
    if (DOCS) warp_bounds(qa ? q_first[i0 + lane] : 0, qa, qb ? q_first[i0 + lane + 32] : 0, qb, &f_lo, &f_hi);

    int stage = 0;
    unsigned phase = 0;                 // parity of the stage's current use; `empty` waits on the other
    for (int64_t j0 = 0; j0 < Tk; j0 += BN) {
        const bool ka = j0 + lane < Tk, kb = j0 + lane + 32 < Tk;
        const int64_t pa = ka ? k_pos[j0 + lane] : INT64_MAX, pb = kb ? k_pos[j0 + lane + 32] : INT64_MAX;
        int64_t k_lo, k_hi;
        warp_bounds(pa, ka, pb, kb, &k_lo, &k_hi);
        if (k_lo > q_hi || (DOCS && k_hi < f_lo)) continue;      // no query of the tile sees a key of it
        const bool whole = j0 + BN <= Tk && k_hi <= q_lo && (!DOCS || k_lo >= f_hi);
        mbarrier_wait(&empty[stage], phase ^ 1);
        kps[stage * BN + lane] = pa;
        kps[stage * BN + lane + 32] = pb;
        __syncwarp();
        if (lane == 0) {
            flag[stage] = whole ? FLAG_FULL : FLAG_PARTIAL;
            mbarrier_arrive_expect_tx(&full[stage], 2 * L::BOXES * BOX_BYTES);
            for (int b = 0; b < L::BOXES; b++) {
                tma_load_2d(smem + L::K + (stage * L::BOXES + b) * BOX_BYTES, kmap, kvh * D + 64 * b, (int)j0,
                            &full[stage]);
                tma_load_2d(smem + L::V + (stage * L::BOXES + b) * BOX_BYTES, vmap, kvh * D + 64 * b, (int)j0,
                            &full[stage]);
            }
        }
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    }
    mbarrier_wait(&empty[stage], phase ^ 1);
    if (lane == 0) {
        flag[stage] = FLAG_END;
        mbarrier_arrive(&full[stage]);
    }
}

// One consumer warpgroup: q head h against every stage the producer fills; merges into (o, lse) at the end.
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

// Grid (ceil(Tq / 64), Hkv x ceil(group / C)); 128 (1 + C) threads. Maps: q [Tq][Hq D], k, v [Tk][Hkv D] as
// 2D tensors of bf16 with boxes of 64 x 64, 128-byte swizzle. scale_log2 = d.scale log2(e); DOCS: pos.q_first.
template <int D, int C, bool DOCS>
__global__ void __launch_bounds__(128 * (C + 1), 1)
flash_sm90_forward_kernel(AttnDims d, AttnPos pos, AttnOut out, const __grid_constant__ CUtensorMap qmap,
                          const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                          float scale_log2) {
#if defined(__CUDASIM__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = Sm90Smem<D, C>;
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char *smem = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;   // swizzle atoms: 1024 bytes
    const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BM;                // heavier (later) tiles first
    const int slices = (d.group + C - 1) / C, kvh = (int)blockIdx.y / slices, slice = (int)blockIdx.y % slices;
    const int h0 = kvh * d.group + slice * C, heads = min(C, d.group - slice * C);
    const int wg = threadIdx.x / 128;
    uint64_t *q_full = reinterpret_cast<uint64_t *>(smem + L::BAR), *full = q_full + 1, *empty = full + STAGES;
    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 128 * heads);
        }
        mbarrier_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x < 32)
            produce<D, C, DOCS>(smem, &qmap, &kmap, &vmap, pos.q_pos, pos.k_pos, pos.q_first, d.Tq, d.Tk, i0, h0,
                                heads, kvh);
    } else {
        setmaxnreg_inc<CONSUMER_REGS>();
        if (wg - 1 < heads)
            consume<D, C, DOCS>(smem, wg - 1, pos.q_pos, pos.q_first, d.Tq, d.Hq, i0, h0 + wg - 1, scale_log2,
                                out.o, out.lse);
    }
#endif
}

// ---- host side ----

static bool device_is_sm90(void) {
    int device, major;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major == 9;
}

extern "C" const char *attn_sm90_unsupported(const AttnShape *s) {
    if (!device_is_sm90()) return "a GPU without compute capability 9.0";
    if (s->head_dim != 64 && s->head_dim != 128) return "head_dim other than 64 and 128";
    if (s->num_kv_heads < 1 || s->num_heads % s->num_kv_heads) return "q heads not a multiple of the kv heads";
    if (s->q_tokens > INT32_MAX || s->k_tokens > INT32_MAX) return "more than 2^31 tokens";
    return NULL;
}

template <int D, int C, bool DOCS>
static void forward_sm90(const AttnShape *s, const AttnPos &pos, const AttnOut &out, const CUtensorMap &qmap,
                         const CUtensorMap &kmap, const CUtensorMap &vmap, cudaStream_t stream) {
    const size_t smem = Sm90Smem<D, C>::BYTES + 1024;            // + the alignment to 1024 bytes
    auto kernel = flash_sm90_forward_kernel<D, C, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const AttnDims d = attn_dims(s);
    const dim3 grid((unsigned)((s->q_tokens + BM - 1) / BM), (unsigned)(d.Hkv * ((d.group + C - 1) / C)));
    CUDA_LAUNCH(kernel, grid, 128 * (C + 1), smem, stream, d, pos, out, qmap, kmap, vmap, s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
}

// One head per consumer warpgroup, two warpgroups where the GQA group has two heads or more.
template <int D, bool DOCS>
static void forward_sm90_heads(const AttnShape *s, const AttnPos &pos, const AttnOut &out, const CUtensorMap &qmap,
                               const CUtensorMap &kmap, const CUtensorMap &vmap, cudaStream_t stream) {
    if (s->num_heads / s->num_kv_heads >= 2) forward_sm90<D, 2, DOCS>(s, pos, out, qmap, kmap, vmap, stream);
    else forward_sm90<D, 1, DOCS>(s, pos, out, qmap, kmap, vmap, stream);
}

extern "C" void attn_dense_forward_sm90(const AttnShape *s, const uint16_t *q, const int64_t *q_pos,
                                        const uint16_t *k, const uint16_t *v, const int64_t *k_pos,
                                        float *o_acc, float *lse, cudaStream_t stream) {
    const char *why = attn_sm90_unsupported(s);
    CHECK(why == NULL, "attention (sm_90): %s (q %lld x k %lld tokens, %d/%d heads, head_dim %d)", why,
          (long long)s->q_tokens, (long long)s->k_tokens, s->num_heads, s->num_kv_heads, s->head_dim);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    int64_t *q_first = attn_doc_first_cuda(s, q_pos, stream);
    const AttnPos pos = {q_pos, k_pos, q_first};
    const AttnOut out = {o_acc, lse};
    const CUtensorMap qmap = tensor_map(q, s->q_tokens, s->num_heads, s->head_dim);
    const CUtensorMap kmap = tensor_map(k, s->k_tokens, s->num_kv_heads, s->head_dim);
    const CUtensorMap vmap = tensor_map(v, s->k_tokens, s->num_kv_heads, s->head_dim);
    if (s->head_dim == 64 && q_first) forward_sm90_heads<64, true>(s, pos, out, qmap, kmap, vmap, stream);
    else if (s->head_dim == 64) forward_sm90_heads<64, false>(s, pos, out, qmap, kmap, vmap, stream);
    else if (q_first) forward_sm90_heads<128, true>(s, pos, out, qmap, kmap, vmap, stream);
    else forward_sm90_heads<128, false>(s, pos, out, qmap, kmap, vmap, stream);
    if (q_first) CUDA_CHECK(cudaFreeAsync(q_first, stream));
}
