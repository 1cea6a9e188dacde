// flash_sm90_sparse.cu: block-sparse + vertical-column flash attention
// forward for Hopper (sm_90a), warp-specialised as the dense Hopper forward
// (flash_sm90.cu), with the arguments, index and chunk semantics of
// attn_sparse_forward_part_cuda (sparse_cuda.h); a variant of the registry
// (attn_variants.cu), which chooses it or the mma.sync sparse forward.
//
// One CTA per index row (q head h, query block i of B = 64 C queries, C = 1
// for blocks of 64, 2 for blocks of 128), later query blocks first:
//   warpgroup 0   the producer (registers lowered): warp 0 loads the block's
//                 Q by TMA, then walks the row's key tiles of 64 into the ring
//                 of STAGES stages (wait on `empty`, positions and flag, then
//                 the loads completing on `full`):
//                 - its selected blocks present in the call's keys, B / 64
//                   tiles each, K and V by TMA as the dense forward's tiles;
//                 - then its columns present in the call's keys, gathered 64
//                   to a tile: K and V rows by cp.async into the stage's
//                   swizzled boxes; once the next gathered tile's copies are
//                   issued (or the walk ends), waited for, fenced for the
//                   async proxy (wgmma reads them) and announced by a plain
//                   arrive on `full`.
//                 Tiles no query of the block sees are skipped; tiles every
//                 query sees whole are flagged so that no mask is applied.
//   warpgroups 1..C  the dense forward's consumers (flash_sm90_forward.cuh),
//                 64 queries each, sharing every K/V stage of their q head.
// No chunk view is built (no scratch, no extra launch): a call's keys k_pos
// are ascending (a rank's whole blocks in ascending order, or the column
// pass's list), so a selected block is in the call when its first position
// is, and a column when its position is: a binary search each, 32 entries at
// a time (one per lane of the producer warp).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_kernel.h"
#include "attention_cuda.h"
#include "flash_sm90.h"
#include "flash_sm90_forward.cuh"

constexpr int GATHERED = 2 * BN;   // the producer's ring of gathered key tokens: the tile being filled, the next

// Byte offsets in the CTA's dynamic shared memory: the dense forward's layout, then the gathered tokens.
template <int D, int C> struct Sm90SparseSmem {
    static constexpr int TOKENS = Sm90Smem<D, C>::BYTES;               // int64 [GATHERED]
    static constexpr int BYTES = TOKENS + GATHERED * 8;
};

#if defined(__CUDASIM__) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

// 88 + 2 x 208 of 512 per thread of each warpgroup: the producer's walk (binary searches, 64-bit positions,
// the gather) spills at the dense producer's 24 or at 56; at 88 and 208 ptxas spills nothing on sm_90a.
constexpr int SPARSE_PRODUCER_REGS = 88, SPARSE_CONSUMER_REGS = 208;

// Local key token of position p among the call's ascending key positions k_pos [Tk], or -1.
static __device__ __forceinline__ int64_t key_at(const int64_t *__restrict__ k_pos, int64_t Tk, int64_t p) {
    int64_t lo = 0, hi = Tk;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (k_pos[mid] < p) lo = mid + 1; else hi = mid;
    }
    return lo < Tk && k_pos[lo] == p ? lo : -1;
}

// The producer's warp for index row r (q head h, kv head kvh, the block's queries from i0; `consumers` of
// them hold queries): Q, then `part` of the row's tiles present in the call's keys, in order, then END.
template <int D, int C, bool DOCS>
static __device__ void produce_sparse(unsigned char *smem, SparsePart part, const SparseIndexCuda &x, int64_t r,
                                      const CUtensorMap *qmap, const CUtensorMap *kmap, const CUtensorMap *vmap,
                                      const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                                      const int64_t *__restrict__ q_pos, const int64_t *__restrict__ k_pos,
                                      const int64_t *__restrict__ q_first, int64_t Tq, int64_t Tk, int Hkv,
                                      int64_t i0, int h, int kvh, int consumers) {
    using L = Sm90Smem<D, C>;
    constexpr int B = 64 * C;
    const int lane = threadIdx.x % 32;
    uint64_t *q_full = reinterpret_cast<uint64_t *>(smem + L::BAR), *full = q_full + 1, *empty = full + STAGES;
    int64_t *kps = reinterpret_cast<int64_t *>(smem + L::KPOS);
    int64_t *gathered = reinterpret_cast<int64_t *>(smem + Sm90SparseSmem<D, C>::TOKENS);
    int *flag = reinterpret_cast<int *>(smem + L::FLAG);
    if (lane == 0) {
        mbarrier_arrive_expect_tx(q_full, (unsigned)(consumers * L::BOXES * BOX_BYTES));
        for (int c = 0; c < consumers; c++)
            for (int b = 0; b < L::BOXES; b++)
                tma_load_2d(smem + L::Q + (c * L::BOXES + b) * BOX_BYTES, qmap, h * D + 64 * b, (int)(i0 + 64 * c),
                            q_full);
    }
    // The block's queries are consecutive positions: its first is the lowest, its last's document starts last.
    const int64_t last = min(Tq, i0 + B) - 1;
    const int64_t q_lo = q_pos[i0], q_hi = q_pos[last];
    const int64_t f_lo = DOCS ? q_first[i0] : 0, f_hi = DOCS ? q_first[last] : 0;

    int stage = 0;
    unsigned phase = 0;                 // parity of the stage's current use; `empty` waits on the other
    // A tile of key positions pa, pb (this lane's rows lane and lane + 32; INT64_MAX where the row is empty):
    // false when no query of the block sees it, else the stage is taken (released by the consumers), its
    // positions and flag written (FULL where every row is there and every query sees every key).
    auto take_stage = [&](int64_t pa, int64_t pb, bool rows_all) {
        int64_t k_lo, k_hi;
        warp_bounds(pa, pa != INT64_MAX, pb, pb != INT64_MAX, &k_lo, &k_hi);
        if (k_lo > q_hi || (DOCS && k_hi < f_lo)) return false;
        const bool whole = rows_all && k_hi <= q_lo && (!DOCS || k_lo >= f_hi);
        mbarrier_wait(&empty[stage], phase ^ 1);
        kps[stage * BN + lane] = pa;
        kps[stage * BN + lane + 32] = pb;
        if (lane == 0) flag[stage] = whole ? FLAG_FULL : FLAG_PARTIAL;
        __syncwarp();
        return true;
    };
    auto next_stage = [&]() {
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    };

    // The selected blocks in the call: the local token of each one's first position, 32 entries at a time.
    const int64_t b0 = x.block_start[r], b1 = part == SPARSE_COLUMNS ? b0 : x.block_start[r + 1];
    for (int64_t e0 = b0; e0 < b1; e0 += 32) {
        const int64_t mine = e0 + lane < b1 ? key_at(k_pos, Tk, x.blocks[e0 + lane] * B) : -1;
        const int n = (int)min((int64_t)32, b1 - e0);
        for (int l = 0; l < n; l++) {
            const int64_t j = (int64_t)__shfl_sync(0xffffffffu, (long long)mine, l);
            if (j < 0) continue;
            for (int64_t j0 = j; j0 < j + B && j0 < Tk; j0 += BN) {
                const int64_t pa = j0 + lane < Tk ? k_pos[j0 + lane] : INT64_MAX;
                const int64_t pb = j0 + lane + 32 < Tk ? k_pos[j0 + lane + 32] : INT64_MAX;
                if (!take_stage(pa, pb, j0 + BN <= Tk)) continue;
                if (lane == 0) {
                    mbarrier_arrive_expect_tx(&full[stage], 2 * L::BOXES * BOX_BYTES);
                    for (int b = 0; b < L::BOXES; b++) {
                        tma_load_2d(smem + L::K + (stage * L::BOXES + b) * BOX_BYTES, kmap, kvh * D + 64 * b,
                                    (int)j0, &full[stage]);
                        tma_load_2d(smem + L::V + (stage * L::BOXES + b) * BOX_BYTES, vmap, kvh * D + 64 * b,
                                    (int)j0, &full[stage]);
                    }
                }
                next_stage();
            }
        }
    }

    // The gathered stage whose cp.async are in flight (-1: none), announced on `full` once they landed, after
    // the next gathered stage's copies were issued (`newer`: one newer group in flight), so that its loads
    // overlap the consumers' work on the stages before it.
    int pending = -1;
    auto announce = [&](bool newer) {
        if (pending < 0) return;
        if (newer) cp_async_wait<1>();
        else cp_async_wait<0>();
        fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&full[pending]);
        pending = -1;
    };

    // A tile of the n gathered tokens from gathered[from] on (ring order): K and V rows of kv head kvh into the
    // stage's boxes at the 128-byte swizzle's places (chunk c of row w at c ^ (w % 8), as TMA writes them), zero
    // rows past n; the stage becomes the pending one.
    auto gather_tile = [&](int from, int n) {
        const int64_t ta = lane < n ? gathered[(from + lane) % GATHERED] : -1;
        const int64_t tb = lane + 32 < n ? gathered[(from + lane + 32) % GATHERED] : -1;
        if (!take_stage(ta >= 0 ? k_pos[ta] : INT64_MAX, tb >= 0 ? k_pos[tb] : INT64_MAX, n == BN)) return;
        for (int half = 0; half < 2; half++) {
            const int w = lane + 32 * half;
            const int64_t t = half ? tb : ta;
            const int64_t row = t >= 0 ? (t * Hkv + kvh) * (int64_t)D : 0;
#pragma unroll
            for (int c = 0; c < D / 8; c++) {
                const int at = (stage * L::BOXES + c / 8) * BOX_BYTES + 2 * swizzle<64>(w, 8 * (c % 8));
                cp_async16(smem + L::K + at, k + row + 8 * c, t >= 0);
                cp_async16(smem + L::V + at, v + row + 8 * c, t >= 0);
            }
        }
        cp_async_commit();
        announce(true);
        pending = stage;
        next_stage();
    };

    // The columns in the call, compacted by ballot into the ring of gathered tokens (at most 63 + 32 waiting).
    const int64_t c0 = x.column_start[r], c1 = part == SPARSE_BLOCKS ? c0 : x.column_start[r + 1];
    int from = 0, waiting = 0;
    for (int64_t e0 = c0; e0 < c1; e0 += 32) {
        const int64_t t = e0 + lane < c1 ? key_at(k_pos, Tk, x.columns[e0 + lane]) : -1;
        const unsigned found = __ballot_sync(0xffffffffu, t >= 0);
        if (t >= 0) gathered[(from + waiting + __popc(found & ((1u << lane) - 1))) % GATHERED] = t;
        waiting += __popc(found);
        __syncwarp();
        if (waiting >= BN) {
            gather_tile(from, BN);
            from = (from + BN) % GATHERED;
            waiting -= BN;
        }
    }
    if (waiting > 0) gather_tile(from, waiting);
    announce(false);

    sm90_forward_end<D, C>(smem, stage, phase);
}

#endif  // sm_90a or the sim

// Grid: the index's rows (Hq x num_q_blocks); 128 (1 + C) threads, C = B / 64. Maps: q [Tq][Hq D], k, v
// [Tk][Hkv D] as 2D tensors of bf16 with boxes of 64 x 64, 128-byte swizzle (k, v also by pointer: the gathered
// columns). scale_log2 = d.scale log2(e); DOCS: pos.q_first.
template <int D, int C, bool DOCS>
__global__ void __launch_bounds__(128 * (C + 1), 1)
flash_sm90_sparse_forward_kernel(AttnDims d, AttnPos pos, AttnInputsBf16 in, AttnOut out, SparseIndexCuda x,
                                 SparsePart part, const __grid_constant__ CUtensorMap qmap,
                                 const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                                 float scale_log2) {
#if defined(__CUDASIM__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char *smem = sm90_smem_aligned(smem_raw);
    const int h = (int)(blockIdx.x % d.Hq), kvh = h / d.group;
    const int64_t qb = x.num_q_blocks - 1 - blockIdx.x / d.Hq;          // later (heavier) query blocks first
    const int64_t r = h * x.num_q_blocks + qb, i0 = qb * 64 * C;
    const int consumers = (int)min((int64_t)C, (d.Tq - i0 + 63) / 64);  // a short last block may fill one
    const int wg = threadIdx.x / 128;
    sm90_forward_barriers_init<D, C>(smem, consumers);
    if (wg == 0) {
        setmaxnreg_dec<SPARSE_PRODUCER_REGS>();
        if (threadIdx.x < 32)
            produce_sparse<D, C, DOCS>(smem, part, x, r, &qmap, &kmap, &vmap, in.k, in.v, pos.q_pos, pos.k_pos,
                                       pos.q_first, d.Tq, d.Tk, d.Hkv, i0, h, kvh, consumers);
    } else {
        setmaxnreg_inc<SPARSE_CONSUMER_REGS>();
        if (wg - 1 < consumers)
            consume<D, C, DOCS>(smem, wg - 1, pos.q_pos, pos.q_first, d.Tq, d.Hq, i0 + 64 * (wg - 1), h, scale_log2,
                                out.o, out.lse);
    }
#endif
}

// ---- host side ----

// What one launch takes beyond the kernel's template arguments.
struct SparseSm90Call {
    SparsePart part;
    const AttnShape *s;
    SparseIndexCuda x;
    AttnPos pos;
    AttnInputsBf16 in;
    AttnOut out;
    CUtensorMap qmap, kmap, vmap;
};

template <int D, int C, bool DOCS>
static void sparse_forward_sm90(const SparseSm90Call &c, cudaStream_t stream) {
    const size_t smem = Sm90SparseSmem<D, C>::BYTES + 1024;      // + the alignment to 1024 bytes
    auto kernel = flash_sm90_sparse_forward_kernel<D, C, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const unsigned rows = (unsigned)((int64_t)c.x.num_heads * c.x.num_q_blocks);
    CUDA_LAUNCH(kernel, rows, 128 * (C + 1), smem, stream, attn_dims(c.s), c.pos, c.in, c.out, c.x, c.part, c.qmap,
                c.kmap, c.vmap, c.s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
}

// One consumer warpgroup per 64 queries of the index's block (64: one, 128: two); with documents or without.
template <int D>
static void sparse_forward_sm90_blocks(const SparseSm90Call &c, cudaStream_t stream) {
    const bool docs = c.pos.q_first != NULL;
    if (c.x.block_size == 64 && docs) sparse_forward_sm90<D, 1, true>(c, stream);
    else if (c.x.block_size == 64) sparse_forward_sm90<D, 1, false>(c, stream);
    else if (docs) sparse_forward_sm90<D, 2, true>(c, stream);
    else sparse_forward_sm90<D, 2, false>(c, stream);
}

extern "C" void attn_sparse_forward_part_sm90(SparsePart part, const AttnShape *s, const SparseIndexCuda *x,
                                              const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                                              const uint16_t *v, const int64_t *k_pos, float *o_acc, float *lse,
                                              cudaStream_t stream) {
    const char *why = attn_sm90_unsupported(s);
    CHECK(why == NULL, "sparse attention (sm_90): %s (q %lld x k %lld tokens, %d/%d heads, head_dim %d)", why,
          (long long)s->q_tokens, (long long)s->k_tokens, s->num_heads, s->num_kv_heads, s->head_dim);
    CHECK(x->block_size == 64 || x->block_size == 128, "sparse attention (sm_90): block size %d (supported: 64, 128)",
          x->block_size);
    const int64_t nqb = (s->q_tokens + x->block_size - 1) / x->block_size;
    CHECK(x->num_heads == s->num_heads && x->num_q_blocks == nqb && (int64_t)x->num_heads * nqb < INT32_MAX,
          "sparse attention (sm_90): index (%d heads, %lld query blocks of %d) does not match the call (%d heads, "
          "%lld queries)", x->num_heads, (long long)x->num_q_blocks, x->block_size, s->num_heads,
          (long long)s->q_tokens);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    int64_t *q_first = attn_doc_first_cuda(s, q_pos, stream);
    const SparseSm90Call c = {part, s, *x, {q_pos, k_pos, q_first},
                              {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, NULL}, {o_acc, lse},
                              tensor_map(q, s->q_tokens, s->num_heads, s->head_dim),
                              tensor_map(k, s->k_tokens, s->num_kv_heads, s->head_dim),
                              tensor_map(v, s->k_tokens, s->num_kv_heads, s->head_dim)};
    if (s->head_dim == 64) sparse_forward_sm90_blocks<64>(c, stream);
    else sparse_forward_sm90_blocks<128>(c, stream);
    if (q_first) CUDA_CHECK(cudaFreeAsync(q_first, stream));
}
