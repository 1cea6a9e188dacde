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
//                 into the running fp32 (o_acc, lse), as the mma.sync kernels
//                 (the consumer and the layout: flash_sm90_forward.cuh, shared
//                 with the sparse forward).
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
#include "flash_sm90_forward.cuh"

#if defined(__CUDASIM__) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

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
    sm90_forward_end<D, C>(smem, stage, phase);
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
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char *smem = sm90_smem_aligned(smem_raw);
    const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BM;                // heavier (later) tiles first
    const int slices = (d.group + C - 1) / C, kvh = (int)blockIdx.y / slices, slice = (int)blockIdx.y % slices;
    const int h0 = kvh * d.group + slice * C, heads = min(C, d.group - slice * C);
    const int wg = threadIdx.x / 128;
    sm90_forward_barriers_init<D, C>(smem, heads);
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
