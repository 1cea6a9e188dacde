// sparse_cuda.cu: block-sparse + vertical-column flash attention on NVIDIA
// GPUs (sm_80, sm_90), forward and backward over one key chunk, driven by a
// device-resident SparseIndex (sparse_cuda.h; the CPU version and the index
// format: sparse.h, sparse_flash_cpu.c).
//
// Per call, a chunk view is built on the device (no host round trip): the
// local key block of each global block (-1 when not in this chunk) and, per
// index row, the row's columns that lie in the call's keys as local key
// tokens (count, prefix sum with CUB, ordered fill). A call computes a part
// of the index (SparsePart, as the CPU version): blocks and columns of a
// chunk (one GPU), only the blocks (a ring step), or only the columns
// against K/V rows gathered at an ascending list of positions (the ring's
// gathered columns): the view then holds no block, or no column. Then, in
// the forward and the backward's column pass, one CTA per index row (q head
// h, query block i: the query tile is the whole block of B = 64 or 128
// queries; the forward one warp per 32, the column pass one per 16) walks
// the row's key tiles of 64 keys: each selected block present in the chunk
// (B / 64 tiles; none in the column pass), then the row's columns gathered
// 64 at a time (K and V rows loaded by token with cp.async). The backward's
// blocks go key-major (below). The mask is token-exact by position, dropped
// where every key of a tile (the backward's blocks: of a warp's 32 keys) is
// at or before every query. With documents (a
// template parameter, as in flash_cuda.cu) also k_pos >= q_first, the start
// of the query's document, dropped where the tile's first (smallest)
// position is at or after the block's last query's document start; the
// index itself holds no block or column without a key of the row's
// documents (sparse_index_documents), so no tile is skipped here.
//   forward   the dense forward's tiles (4 or 2 warps of 32 queries), pipeline,
//             per-tile online softmax and final merge into the running fp32
//             (o_acc, lse) (flash_tiles.cuh); the next tile's local tokens
//             and positions are read during this tile's S, so its K and V
//             loads wait on no global read.
//   backward  the blocks key-major, on the dense backward's tiles and
//             pipeline: the index's blocks turned into, per (q head, local
//             key block), the query blocks that select it (built on the
//             device per call); one CTA per key block holds its dK, dV in
//             registers over the rows of those query blocks (BM at a time)
//             and adds them once at the end; dQ with fp32 atomics per
//             query tile. Then the columns query-major: the CTA of an index
//             row holds its dQ in registers (one writer per row) over its
//             tiles of gathered columns, whose dK, dV are added with fp32
//             atomics per tile (many rows and GQA heads gather a column).
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_elementwise.cuh"
#include "../../dist/cuda_kernel.h"
#include "attention_cuda.h"
#include "flash_tiles.cuh"
#include "sparse_cuda.h"

#define LOG2E 1.4426950408889634f
#define KEY_TILE 64          // keys per GPU key tile (BN)

// ---- the chunk view ----

// local_block[k_pos[j * B] / B] = j for every local key block j of the chunk.
__global__ void local_block_kernel(const int64_t *k_pos, int64_t Tk, int B, int64_t *local_block) {
    const int64_t nb = (Tk + B - 1) / B;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nb;
         j += (int64_t)gridDim.x * blockDim.x)
        local_block[k_pos[j * B] / B] = j;
}

// Local key token of column position col in this call, or -1: in the
// chunk's blocks (SPARSE_ALL), in the ascending list k_pos [Tk]
// (SPARSE_COLUMNS), never (SPARSE_BLOCKS).
__device__ int64_t column_key(SparsePart part, const SparseView &c, const int64_t *k_pos, int64_t Tk, int B,
                              int64_t col) {
    if (part == SPARSE_BLOCKS) return -1;
    if (part == SPARSE_ALL) return c.local_block[col / B] < 0 ? -1 : c.local_block[col / B] * B + col % B;
    int64_t lo = 0, hi = Tk;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (k_pos[mid] < col) lo = mid + 1; else hi = mid;
    }
    return lo < Tk && k_pos[lo] == col ? lo : -1;
}

// One warp per index row r: c.col_start[r + 1] = the row's columns in this call.
__global__ void column_count_kernel(SparsePart part, SparseView c, const int64_t *k_pos, int64_t Tk, int B) {
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (r >= c.rows) return;
    int n = 0;
    for (int64_t e = c.column_start[r] + lane; e < c.column_start[r + 1]; e += 32)
        n += column_key(part, c, k_pos, Tk, B, c.columns[e]) >= 0;
    for (int off = 16; off > 0; off /= 2) n += __shfl_xor_sync(0xffffffffu, n, off);
    if (lane == 0) c.col_start[r + 1] = n;
}

// One warp per index row: the row's columns in this call, in order, as
// local key tokens from c.col_key[c.col_start[r]] on.
__global__ void column_fill_kernel(SparsePart part, SparseView c, const int64_t *k_pos, int64_t Tk, int B) {
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (r >= c.rows) return;
    int64_t out = c.col_start[r];
    const int64_t end = c.column_start[r + 1];
    for (int64_t e0 = c.column_start[r]; e0 < end; e0 += 32) {
        const int64_t e = e0 + lane;
        const int64_t key = e < end ? column_key(part, c, k_pos, Tk, B, c.columns[e]) : -1;
        const unsigned mask = __ballot_sync(0xffffffffu, key >= 0);
        if (key >= 0) c.col_key[out + __popc(mask & ((1u << lane) - 1))] = key;
        out += __popc(mask);
    }
}

extern "C" void sparse_inclusive_sum_cuda(int64_t *x, int64_t n, cudaStream_t stream) {
    size_t bytes = 0;
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, x, x, n, stream));
    void *temp;
    CUDA_CHECK(cudaMallocAsync(&temp, bytes, stream));
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, bytes, x, x, n, stream));
    CUDA_CHECK(cudaFreeAsync(temp, stream));
}

// The view (attn_args.h) of `part` of the index in this call's keys: k_pos
// [Tk] are whole blocks of a chunk (SPARSE_ALL, SPARSE_BLOCKS) or an
// ascending list of column positions (SPARSE_COLUMNS). Its own arrays are
// stream-ordered scratch: local_block all -1 for SPARSE_COLUMNS (no block is
// in the call), col_start all 0 for SPARSE_BLOCKS, col_key
// [index->column_capacity].
static SparseView chunk_view(SparsePart part, const SparseIndexCuda *x, const int64_t *k_pos, int64_t Tk,
                             cudaStream_t stream) {
    const int B = x->block_size;
    const int64_t rows = (int64_t)x->num_heads * x->num_q_blocks, nglobal = (x->seq_len + B - 1) / B;
    SparseView c = {rows, x->num_q_blocks, x->block_start, x->blocks, x->column_start, x->columns,
                    NULL, NULL, NULL};
    CUDA_CHECK(cudaMallocAsync((void **)&c.local_block, (size_t)nglobal * sizeof(int64_t), stream));
    CUDA_CHECK(cudaMallocAsync((void **)&c.col_start, (size_t)(rows + 1) * sizeof(int64_t), stream));
    CUDA_CHECK(cudaMallocAsync((void **)&c.col_key, (size_t)(x->column_capacity + 1) * sizeof(int64_t),
                               stream));
    CUDA_CHECK(cudaMemsetAsync(c.local_block, 0xff, (size_t)nglobal * sizeof(int64_t), stream));   // -1
    if (part != SPARSE_COLUMNS) {
        CUDA_LAUNCH(local_block_kernel, grid_for((Tk + B - 1) / B, 128), 128, 0, stream, k_pos, Tk, B, c.local_block);
        CUDA_CHECK(cudaGetLastError());
    }
    if (part == SPARSE_BLOCKS) {
        CUDA_CHECK(cudaMemsetAsync(c.col_start, 0, (size_t)(rows + 1) * sizeof(int64_t), stream));
        return c;
    }
    CUDA_CHECK(cudaMemsetAsync(c.col_start, 0, sizeof(int64_t), stream));
    const int warps_grid = (int)((rows * 32 + 255) / 256);
    CUDA_LAUNCH(column_count_kernel, warps_grid, 256, 0, stream, part, c, k_pos, Tk, B);
    CUDA_CHECK(cudaGetLastError());
    sparse_inclusive_sum_cuda(c.col_start + 1, rows, stream);
    CUDA_LAUNCH(column_fill_kernel, warps_grid, 256, 0, stream, part, c, k_pos, Tk, B);
    CUDA_CHECK(cudaGetLastError());
    return c;
}

static void chunk_view_free(SparseView *c, cudaStream_t stream) {
    CUDA_CHECK(cudaFreeAsync(c->local_block, stream));
    CUDA_CHECK(cudaFreeAsync(c->col_start, stream));
    CUDA_CHECK(cudaFreeAsync(c->col_key, stream));
}

// ---- the key tiles of one index row ----

// Items 0 .. nbi - 1 are the row's selected blocks, B / KEY_TILE tiles each
// (item = entry * S + sub; none where the walk leaves the blocks out), then
// ceil(ncol / KEY_TILE) tiles of its columns in this chunk. Every thread
// walks the same items.
template <int B>
struct RowTiles {
    static constexpr int S = B / KEY_TILE;
    const int64_t *blocks, *local_block, *col_key;
    int64_t b0, nbi, c0, ncol, total, Tk;

    RowTiles() = default;                      // a __shared__ copy, assigned by one thread
    __device__ RowTiles(const int64_t *block_start, const int64_t *blocks_, const int64_t *local_block_,
                        const int64_t *col_start, const int64_t *col_key_, int64_t r, int64_t Tk_, bool with_blocks)
        : blocks(blocks_), local_block(local_block_), col_key(col_key_), b0(block_start[r]),
          nbi(with_blocks ? (block_start[r + 1] - block_start[r]) * S : 0), c0(col_start[r]),
          ncol(col_start[r + 1] - col_start[r]), total(nbi + (ncol + KEY_TILE - 1) / KEY_TILE), Tk(Tk_) {}

    // First local token of block item it (-1: its block is not in the chunk,
    // or this part of a short last block is empty).
    __device__ int64_t block_first(int64_t it) const {
        const int64_t lb = local_block[blocks[b0 + it / S]];
        const int64_t j0 = lb * B + (it % S) * KEY_TILE;
        return lb >= 0 && j0 < Tk ? j0 : -1;
    }

    // The first item at or after it with keys in this chunk (total: none).
    __device__ int64_t next(int64_t it) const {
        while (it < nbi && block_first(it) < 0) it++;
        return it;
    }

    // Local key token of row j of item it; -1 where the tile is short.
    __device__ int64_t token(int64_t it, int64_t j0, int j) const {
        if (it < nbi) return j0 + j < Tk ? j0 + j : -1;
        const int64_t e = (it - nbi) * KEY_TILE + j;
        return e < ncol ? col_key[c0 + e] : -1;
    }

    // The j0 of token(): item it's first local token (a block item's; 0 for columns).
    __device__ int64_t first(int64_t it) const { return it < nbi ? block_first(it) : 0; }

    // Item it's K, V rows of kv head kvh -> ks, vs [KEY_TILE][D + 8] (cp.async,
    // zero rows where short); their positions -> kps (INT64_MAX where short)
    // and local tokens -> ktok (-1 where short).
    template <int D, int NT>
    __device__ void load(int64_t it, const bf16 *k, const bf16 *v, const int64_t *k_pos, int Hkv, int kvh,
                         bf16 *ks, bf16 *vs, int64_t *kps, int64_t *ktok) const {
        const int64_t j0 = first(it);
        auto tok = [&](int j) { return token(it, j0, j); };
        load_rows<D, NT>(ks, k, KEY_TILE, Hkv, kvh, tok);
        load_rows<D, NT>(vs, v, KEY_TILE, Hkv, kvh, tok);
        if (threadIdx.x < KEY_TILE) {
            const int64_t t = tok(threadIdx.x);
            kps[threadIdx.x] = t >= 0 ? k_pos[t] : INT64_MAX;
            ktok[threadIdx.x] = t;
        }
    }
};

// ---- forward ----

// Grid (Hq * nqb) rows of c, BM / 32 warps of 32 queries: the dense
// forward's tiles and pipeline (flash_cuda.cu), at least 8 warps per
// multiprocessor; scale_log2 = d.scale log2(e). DOCS: pos.q_first as
// attn_args.h (NULL otherwise). Shared (forward_smem): q [BM][D], k, v
// [BN][D] (swizzled); per key tile of the two in flight (this one, the
// next) its local tokens (-1 where short) and positions (INT64_MAX where
// short) [2][BN]; per query the position (INT64_MIN past Tq), the document
// start (DOCS) and the lse of the running output, read once at the start.
// Per key tile: K waits, V loads while S = Q K^T and the softmax run, and
// the next tile's local tokens (block list, columns) are read from global
// memory; V waits, the next K loads from those tokens while O += P V runs
// and the next tile's key positions are read.
template <int D, int BM, bool DOCS>
__global__ void __launch_bounds__(BM, 256 / BM)
sparse_forward_kernel(AttnDims d, AttnPos pos, AttnInputsBf16 in, AttnOut out, SparseView c, float scale_log2) {
    RESTRICT_ARGS(d, pos, in);
    RESTRICT_ROWS(c);
    float *__restrict__ o = out.o, *__restrict__ lse = out.lse;
    constexpr int NT = BM, BN = KEY_TILE;
    static_assert(BN <= NT, "a thread per key of a tile");
    DYNAMIC_SHARED(unsigned char, smem);
    bf16 *qs = reinterpret_cast<bf16 *>(smem);
    bf16 *ks = qs + BM * D;
    bf16 *vs = ks + BN * D;
    int64_t *ktok = reinterpret_cast<int64_t *>(vs + BN * D);   // [2][BN]
    int64_t *kps = ktok + 2 * BN;                               // [2][BN]
    int64_t *qps = kps + 2 * BN;                                // [BM]
    int64_t *qfs = qps + BM;                                    // [BM], DOCS only
    float *lse_s = reinterpret_cast<float *>(qfs + (DOCS ? BM : 0));

    const int tid = threadIdx.x, warp = tid / 32;
    const int h = blockIdx.x % Hq, kvh = h / (Hq / Hkv);          // later query blocks first
    const int64_t r = h * nqb + nqb - 1 - blockIdx.x / Hq;
    const int64_t i0 = (r % nqb) * BM, q_lo = q_pos[i0];         // a block's first query is its lowest
    // The block's queries are consecutive positions, so the last real query's
    // document starts last (f_last).
    const int f_last = (int)(min(Tq - i0, (int64_t)BM) - 1);
    {   // this thread's query: position, document start, running lse (published by the loop's first barrier)
        const int64_t row = i0 + tid;
        qps[tid] = row < Tq ? q_pos[row] : INT64_MIN;
        if (DOCS) qfs[tid] = row < Tq ? q_first[row] : 0;
        lse_s[tid] = row < Tq ? lse[h * Tq + row] : 0.0f;
    }
    // The row's walk lives in shared memory and is read where used (registers
    // go to the tile products and the softmax state).
    STATIC_SHARED(RowTiles<BM>, row_tiles, [1]);
    if (tid == 0) row_tiles[0] = RowTiles<BM>(block_start, blocks, local_block, col_start, col_key, r, Tk, true);
    __syncthreads();
    const RowTiles<BM> &tiles = row_tiles[0];

    load_tile<D, NT, true>(qs, q, i0, BM, Tq, Hq, h);
    int64_t it = tiles.next(0);
    if (it < tiles.total) {
        const int64_t j0 = tiles.first(it);
        load_rows<D, NT, true>(ks, k, BN, Hkv, kvh, [&](int j) { return tiles.token(it, j0, j); });
        if (tid < BN) {   // this thread's key: local token, position
            const int64_t t = tiles.token(it, j0, tid);
            ktok[tid] = t;
            kps[tid] = t >= 0 ? k_pos[t] : INT64_MAX;
        }
    }
    cp_async_commit();

    SoftmaxRows32<D> rows;                        // O, max, sum of the warp's 32 rows
    softmax_rows32_init<D>(rows);
    int buf = 0;
    while (it < tiles.total) {
        cp_async_wait<0>();
        __syncthreads();   // K, its tokens and positions are in; every warp is done with V
        const int64_t *kt = ktok + buf * BN, *kp = kps + buf * BN;
        load_rows<D, NT, true>(vs, v, BN, Hkv, kvh, [&](int j) { return kt[j]; });
        cp_async_commit();
        const int64_t nxt = tiles.next(it + 1);
        const bool key_next = nxt < tiles.total && tid < BN;   // this thread's key of the next tile
        const int64_t tok_next = key_next ? tiles.token(nxt, tiles.first(nxt), tid) : -1;   // lands during S

        uint32_t p[2][BN / 16][4];                // P as the A fragments of P V
        const bool full = kp[BN - 1] <= q_lo && (!DOCS || kp[0] >= qfs[f_last]);
        forward_scores32<D, BN, DOCS>(rows, p, qs + warp * 32 * D, ks, full, kp, qps + warp * 32,
                                      qfs + warp * 32, scale_log2);
        if (key_next) ktok[(buf ^ 1) * BN + tid] = tok_next;

        cp_async_wait<0>();
        __syncthreads();   // V and the next tile's tokens are in; every warp is done with K
        const int64_t *kt_next = ktok + (buf ^ 1) * BN;
        if (nxt < tiles.total) load_rows<D, NT, true>(ks, k, BN, Hkv, kvh, [&](int j) { return kt_next[j]; });
        cp_async_commit();
        const int64_t kp_next = key_next && tok_next >= 0 ? k_pos[tok_next] : INT64_MAX;   // lands during P V
        mma_pb32<BN, D>(rows.acc, p, vs);
        if (key_next) kps[(buf ^ 1) * BN + tid] = kp_next;
        it = nxt;
        buf ^= 1;
    }
    cp_async_wait<0>();
    forward_merge32<D>(rows, i0 + warp * 32, lse_s + warp * 32, Tq, Hq, h, o, lse);
}

// ---- backward: the blocks, key-major ----

// The index's blocks in one call turned key-major (key_major_blocks): row
// r = h * nkb + j (q head h, local key block j) lists the local query blocks
// whose index rows select j's global block, ascending:
// q_block[q_start[r] .. q_start[r + 1]).
typedef struct {
    int64_t nkb;               // local key blocks, ceil(Tk / B)
    int64_t *q_start;          // [Hq * nkb + 1]
    int64_t *q_block;          // [the index's block capacity]
} KeyMajorBlocks;

// Whether the ascending blocks [lo, end) hold b.
__device__ bool holds_block(const int64_t *blocks, int64_t lo, int64_t end, int64_t b) {
    int64_t hi = end;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (blocks[mid] < b) lo = mid + 1; else hi = mid;
    }
    return lo < end && blocks[lo] == b;
}

// One warp per key-major row r: the local query blocks i (global q_blocks[i]
// at or after the key block, as the index's rows hold no later block) whose
// row selects the key block, counted into t.q_start[r + 1] (!FILL) or listed
// in order from t.q_block[t.q_start[r]] (FILL). k_pos [Tk] whole blocks of B.
template <bool FILL>
__global__ void key_major_kernel(SparseView c, const int64_t *q_blocks, const int64_t *k_pos, int B,
                                 KeyMajorBlocks t) {
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32, nqb = c.num_q_blocks;
    const int lane = threadIdx.x % 32;
    if (r >= c.rows / nqb * t.nkb) return;
    const int64_t h = r / t.nkb, kb = k_pos[r % t.nkb * B] / B;
    int64_t out = FILL ? t.q_start[r] : 0;
    for (int64_t i0 = 0; i0 < nqb; i0 += 32) {
        const int64_t i = i0 + lane, row = h * nqb + i;
        const bool has = i < nqb && q_blocks[i] >= kb &&
                         holds_block(c.blocks, c.block_start[row], c.block_start[row + 1], kb);
        const unsigned mask = __ballot_sync(0xffffffffu, has);
        if (FILL && has) t.q_block[out + __popc(mask & ((1u << lane) - 1))] = i;
        out += __popc(mask);
    }
    if (!FILL && lane == 0) t.q_start[r + 1] = out;
}

// The backward's query tile (rows a CTA takes per step): 128 at head dim 64,
// 64 at 128 (registers), as the dense backward's.
template <int D> struct SparseBackwardTile { enum { BM = D == 64 ? 128 : 64 }; };

// Whether every one of a warp's 32 keys (positions kp [32], ascending,
// INT64_MAX past the keys) sees each of its N queries (positions qp [N],
// INT64_MIN for a dead row, and with DOCS document starts qf [N]), so that
// its scores need no mask; all in shared memory.
template <int N, bool DOCS>
__device__ __forceinline__ bool warp_full(const int64_t *kp, const int64_t *qp, const int64_t *qf) {
    const int64_t k_first = kp[0], k_last = kp[31];
    bool seen = true;
    for (int c = threadIdx.x % 32; c < N; c += 32) seen = seen && qp[c] >= k_last && (!DOCS || qf[c] <= k_first);
    return __all_sync(0xffffffffu, seen);
}

// Grid (t.nkb, Hq), B / 16 warps: the dense backward's tiles and pipeline
// (flash_cuda.cu) over one local key block of B keys (BN = B), its dK, dV in
// registers over every query tile that uses it, added once at the end with
// fp32 atomics (GQA: several q heads per kv head). Its query tiles are the
// rows of its listed query blocks (t), BM at a time: a block in BM / B
// tiles (BM < B), or BM / B blocks gathered into one tile (BM > B).
// Warps: S^T, dP^T and P^T, dS^T B / 32 (32 keys) x 2 (BM / 2 queries); dK,
// dV B / 32 (32 keys) x 2 (D / 2 columns); dQ BM / 32 (32 queries) x the rest
// (columns), added to global dq with fp32 atomics. scale_log2 and DOCS as the
// forward's. Shared (backward_blocks_smem), every tile swizzled: k, v
// [BN][D]; q [2][BM][D]; dout [BM][D]; P^T, dS^T [BN][BM]; key positions
// [BN] (INT64_MAX past Tk); the local token of each row of three query tiles
// (this one, for its dQ; the next, for its loads; the one after, read
// during dK and dQ) [3][BM] (-1: none); per row of the two buffered tiles
// the position (INT64_MIN: masked, no row or lse = -inf), the document start
// (DOCS), lse (log2 units) and delta. A warp masks its scores unless every
// one of its keys sees each of its queries (warp_full).
// Per query tile (three barriers), as the dense backward: Q, dO, the
// tile's rows and the next tile's tokens wait; the next Q loads and the next
// rows are read while S^T = K Q^T runs; dP^T, P^T, dS^T; dV += P^T dO; the
// next dO loads and the tokens of the tile after it are read while
// dK += dS^T Q and dQ = dS K (in passes of at most 32 columns: registers)
// run.
template <int D, int B, bool DOCS>
__global__ void __launch_bounds__(B / 16 * 32, 1)
sparse_backward_blocks_kernel(AttnDims d, AttnPos pos, AttnInputsBf16 in, AttnGrads grads, KeyMajorBlocks t,
                              float scale_log2) {
    RESTRICT_ARGS(d, pos, in);
    RESTRICT_GRADS(grads);
    constexpr int BN = B, NW = B / 16, NT = NW * 32, BM = SparseBackwardTile<D>::BM;
    constexpr int KW = BN / 32, SQ = BM / 2, KC = D / 2;   // S^T: queries, dK and dV: columns a warp
    constexpr int QW = BM / 32, QC = D / (NW / QW);        // dQ: QW warps of 32 queries x QC columns,
    constexpr int QP = QC < 32 ? QC : 32;                   // in passes of QP (registers)
    static_assert(NW == 2 * KW && BM <= NT && SQ % 16 == 0 && QC % QP == 0 && QP % 16 == 0,
                  "sparse backward tile shape");
    DYNAMIC_SHARED(unsigned char, smem);
    bf16 *ks = reinterpret_cast<bf16 *>(smem);
    bf16 *vs = ks + BN * D;
    bf16 *qs = vs + BN * D;                                     // [2][BM][D]
    bf16 *dos = qs + 2 * BM * D;                                // [BM][D]
    bf16 *pts = dos + BM * D;                                   // P^T [BN][BM]
    bf16 *dsts = pts + BN * BM;                                 // dS^T [BN][BM]
    int64_t *kps = reinterpret_cast<int64_t *>(dsts + BN * BM); // [BN]
    int64_t *qtok = kps + BN;                                   // [3][BM]
    int64_t *qps = qtok + 3 * BM;                               // [2][BM]
    int64_t *qfs = qps + 2 * BM;                                // [2][BM], DOCS only
    float *lse_s = reinterpret_cast<float *>(qfs + (DOCS ? 2 * BM : 0));   // [2][BM]
    float *del_s = lse_s + 2 * BM;                                          // [2][BM]
    STATIC_SHARED(int64_t, list_s, [2]);          // the CTA's listed query blocks: t.q_block[list_s[0] .. list_s[1])

    const int tid = threadIdx.x, warp = tid / 32;
    const int h = blockIdx.y, kvh = h / (Hq / Hkv);
    const int64_t j0 = (int64_t)blockIdx.x * BN, r = h * t.nkb + blockIdx.x;
    const int64_t e0 = t.q_start[r], e1 = t.q_start[r + 1];
    const int nqt = (int)(((e1 - e0) * B + BM - 1) / BM);
    if (nqt == 0) return;                         // no query block selects these keys
    if (tid == 0) { list_s[0] = e0; list_s[1] = e1; }

    // The local token of row i of query tile qt: the rows of the listed blocks t.q_block[first .. end) in
    // order (-1 past them or past Tq). The loop reads first and end from shared memory where it calls it
    // (registers go to the tile products).
    auto query_token = [&](int qt, int i, int64_t first, int64_t end) {
        const int64_t at = (int64_t)qt * BM + i, e = first + at / B;
        const int64_t tok = e < end ? t.q_block[e] * B + at % B : Tq;
        return tok < Tq ? tok : (int64_t)-1;
    };
    // This thread's row of a tile (tid < BM) at token tok, with its position and document start.
    auto query_row = [&](int64_t tok) {
        return backward_row<DOCS>(lse + h * Tq, delta + h * Tq, q_pos, q_first, tok, true);
    };
    auto put_row = [&](const BackwardRow &row, int b) { put_backward_row<BM, DOCS>(row, b, lse_s, del_s, qps, qfs); };

    if (tid < BN) kps[tid] = j0 + tid < Tk ? k_pos[j0 + tid] : INT64_MAX;
    load_tile<D, NT, true>(ks, k, j0, BN, Tk, Hkv, kvh);
    load_tile<D, NT, true>(vs, v, j0, BN, Tk, Hkv, kvh);
    load_rows<D, NT, true>(qs, q, BM, Hq, h, [&](int i) { return query_token(0, i, e0, e1); });
    load_rows<D, NT, true>(dos, dout, BM, Hq, h, [&](int i) { return query_token(0, i, e0, e1); });
    cp_async_commit();
    if (tid < BM) {
        const int64_t tok = query_token(0, tid, e0, e1);
        qtok[tid] = tok;
        qtok[BM + tid] = query_token(1, tid, e0, e1);
        put_row(query_row(tok), 0);
    }

    const int kw = warp % KW, wh = warp / KW;     // S^T: keys 32 kw.., queries SQ wh..; dK, dV: columns KC wh..
    const int qw = warp % QW, qc = warp / QW;     // dQ: queries 32 qw.., columns QC qc..
    float dka[2][KC / 8][4], dva[2][KC / 8][4];   // dK / scale, dV of keys 32 kw..
#pragma unroll
    for (int m = 0; m < 2; m++) { zero<KC>(dka[m]); zero<KC>(dva[m]); }
    for (int qt = 0; qt < nqt; qt++) {
        const int buf = qt % 2;
        cp_async_wait<0>();
        __syncthreads();   // Q, dO, the tile's rows and the next tile's tokens are in; every warp is done with P^T, dS^T and the other Q
        const bool next = qt + 1 < nqt;
        const int64_t *tok_next = qtok + (qt + 1) % 3 * BM;
        if (next) load_rows<D, NT, true>(qs + (buf ^ 1) * BM * D, q, BM, Hq, h, [&](int i) { return tok_next[i]; });
        cp_async_commit();
        const BackwardRow next_row = next && tid < BM ? query_row(tok_next[tid]) : BackwardRow{};   // lands during S^T
        const int c0 = buf * BM + wh * SQ;        // the warp's queries in the row buffers
        const bool full = warp_full<SQ, DOCS>(kps + kw * 32, qps + c0, qfs + c0);

        const bf16 *qb = qs + buf * BM * D;
        backward_scores32<D, SQ, BM, DOCS>(pts, dsts, ks, vs, qb, dos, kw, wh, full, kps, lse_s + c0, del_s + c0,
                                           qps + c0, qfs + c0, scale_log2, [&] { put_row(next_row, buf ^ 1); });
        __syncthreads();   // P^T, dS^T and the rows of the next tile are in

        mma_ab32<BM, KC, BM, D, false>(dva, pts + kw * 32 * BM, 0, dos, wh * KC);
        __syncthreads();   // every warp is done with dO
        if (next) load_rows<D, NT, true>(dos, dout, BM, Hq, h, [&](int i) { return tok_next[i]; });
        cp_async_commit();
        const int64_t tok_after = tid < BM ? query_token(qt + 2, tid, list_s[0], list_s[1]) : -1;   // lands during dK, dQ
        mma_ab32<BM, KC, BM, D, false>(dka, dsts + kw * 32 * BM, 0, qb, wh * KC);

        const int64_t *tok = qtok + qt % 3 * BM + qw * 32;
#pragma unroll
        for (int c0 = qc * QC; c0 < (qc + 1) * QC; c0 += QP) {
            float dqa[2][QP / 8][4];              // dQ / scale of queries 32 qw.., columns QP c0..
#pragma unroll
            for (int m = 0; m < 2; m++) zero<QP>(dqa[m]);
            mma_ab32<BN, QP, BM, D, true>(dqa, dsts, qw * 32, ks, c0);
            atomic_add_rows32<QP>(dq, (int64_t)Hq * D, (int64_t)h * D + c0, dqa, d.scale, [&](int i) { return tok[i]; });
        }
        if (tid < BM) qtok[(qt + 2) % 3 * BM + tid] = tok_after;   // its slot's tile (qt - 1) is done
    }
    cp_async_wait<0>();

    auto key_row = [&](int i) {
        const int64_t key = j0 + kw * 32 + i;
        return key < Tk ? key : (int64_t)-1;
    };
    atomic_add_rows32<KC>(dk, (int64_t)Hkv * D, (int64_t)kvh * D + wh * KC, dka, d.scale, key_row);
    atomic_add_rows32<KC>(dv, (int64_t)Hkv * D, (int64_t)kvh * D + wh * KC, dva, 1.0f, key_row);
}

// ---- backward: the columns, query-major ----

// Grid (Hq * nqb) rows, BM / 16 warps, over the row's column tiles only (the
// blocks are the key-major kernel's): the CTA holds dQ of its row in
// registers and adds it once at the end (one writer per row); per tile of
// KEY_TILE gathered columns it recomputes S = Q K^T, dP = dO V^T,
// P = exp2(S - lse), dS = P (dP - delta), dQ += dS K; P and dS go through
// shared memory for dV = P^T dO and dK = dS^T Q of the tile, added to global
// dk, dv with fp32 atomics (a column is gathered by many rows and GQA
// heads). A row without columns in the call returns at once. KVBUF
// key/value buffers (2: the next tile loads during this one; 1 where shared
// memory is short, see backward_columns()). Shared: q, dout [BM][LD]; k, v
// [KVBUF][BN][LD]; P and dS [BM][BN + 8] (bf16); key positions and local
// tokens [KVBUF][BN]. scale_log2 and DOCS as the forward's.
template <int D, int BM, int KVBUF, bool DOCS>
__global__ void __launch_bounds__(BM * 2)
sparse_backward_columns_kernel(AttnDims d, AttnPos pos, AttnInputsBf16 in, AttnGrads grads, SparseView c,
                               float scale_log2) {
    RESTRICT_ARGS(d, pos, in);
    RESTRICT_ROWS(c);
    RESTRICT_GRADS(grads);
    const float scale = d.scale;
    constexpr int NT = BM * 2, NW = BM / 16, LD = D + 8, BN = KEY_TILE, LDP = BN + 8;
    constexpr int WR = BN / 16, WC = NW / WR, DC = D / WC;   // dK, dV: WR x WC warps of 16 x DC
    static_assert(NW % WR == 0 && D % (16 * WC) == 0, "sparse backward tile shape");
    DYNAMIC_SHARED(unsigned char, smem);
    bf16 *qs = reinterpret_cast<bf16 *>(smem);
    bf16 *dos = qs + BM * LD;
    bf16 *ks = dos + BM * LD;              // [KVBUF][BN][LD]
    bf16 *vs = ks + KVBUF * BN * LD;       // [KVBUF][BN][LD]
    bf16 *ps = vs + KVBUF * BN * LD;       // [BM][LDP]
    bf16 *dss = ps + BM * LDP;             // [BM][LDP]
    int64_t *kps = reinterpret_cast<int64_t *>(dss + BM * LDP);   // [KVBUF][BN]
    int64_t *ktok = kps + KVBUF * BN;                             // [KVBUF][BN]

    const int tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, t4 = tid % 4;
    const int h = blockIdx.x % Hq, kvh = h / (Hq / Hkv);          // later query blocks first
    const int64_t r = h * nqb + nqb - 1 - blockIdx.x / Hq;
    const int64_t i0 = (r % nqb) * BM, q_lo = q_pos[i0];
    const RowTiles<BM> tiles(block_start, blocks, local_block, col_start, col_key, r, Tk, false);
    if (tiles.total == 0) return;                 // no column of this call for the row

    // This thread's two queries (g and g + 8 of its warp's 16): lse in log2
    // units (+inf: the row is dead, past Tq or saw no key), delta, position,
    // with DOCS its document's start.
    float L[2], del[2];
    int64_t qp[2], qf[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = i0 + warp * 16 + g + half * 8;
        const float l = row < Tq ? lse[h * Tq + row] : -INFINITY;
        const bool live = l != -INFINITY;
        L[half] = live ? l * LOG2E : INFINITY;
        del[half] = live ? delta[h * Tq + row] : 0.0f;
        qp[half] = live ? q_pos[row] : INT64_MIN;
        qf[half] = DOCS && live ? q_first[row] : 0;
    }
    const int64_t f_hi = DOCS ? q_first[min(Tq, i0 + BM) - 1] : 0;   // as the forward's

    auto load_kv = [&](int64_t it, int buf) {
        tiles.template load<D, NT>(it, k, v, k_pos, Hkv, kvh, ks + buf * BN * LD, vs + buf * BN * LD,
                                   kps + buf * BN, ktok + buf * BN);
    };

    load_tile<D, NT>(qs, q, i0, BM, Tq, Hq, h);
    load_tile<D, NT>(dos, dout, i0, BM, Tq, Hq, h);
    int64_t it = 0;
    load_kv(it, 0);
    cp_async_commit();

    float dqa[D / 8][4];                          // dQ / scale: queries g, g+8 x D
    zero<D>(dqa);
    const int wr = warp % WR, wc = warp / WR;
    int buf = 0;
    while (it < tiles.total) {
        const int64_t nxt = tiles.next(it + 1);
        if (KVBUF == 2 && nxt < tiles.total) load_kv(nxt, buf ^ 1);
        cp_async_commit();
        cp_async_wait<KVBUF - 1>();
        __syncthreads();

        const bf16 *kb = ks + buf * BN * LD, *vb = vs + buf * BN * LD;
        const int64_t *kp = kps + buf * BN, *kt = ktok + buf * BN;
        const bool full = kp[BN - 1] <= q_lo && (!DOCS || kp[0] >= f_hi);

        // S = Q K^T and dP = dO V^T: 16 queries x BN keys per warp.
        float s[BN / 8][4], dp[BN / 8][4];
        zero<BN>(s);
        zero<BN>(dp);
        mma_abt<D, BN>(s, qs + warp * 16 * LD, LD, kb, LD);
        mma_abt<D, BN>(dp, dos + warp * 16 * LD, LD, vb, LD);

        // P = exp2(S scale log2e - lse), dS = P (dP - delta); masked -> 0 (the dense backward's backward_score).
#pragma unroll
        for (int n = 0; n < BN / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = full ? 0 : kp[n * 8 + 2 * t4 + (e & 1)];
                const bool visible = full || (key <= qp[e / 2] && (!DOCS || key >= qf[e / 2]));
                backward_score(s[n][e], dp[n][e], scale_log2, L[e / 2], del[e / 2], visible);
            }
        }

        // dQ += dS K.
        mma_pb<BN, D>(dqa, dp, kb, LD);

        // P, dS -> shared (query-major) for the key-side products.
#pragma unroll
        for (int n = 0; n < BN / 8; n++) {
            const int col = n * 8 + 2 * t4, row = warp * 16 + g;
            *reinterpret_cast<uint32_t *>(ps + row * LDP + col) = pack_bf16(s[n][0], s[n][1]);
            *reinterpret_cast<uint32_t *>(ps + (row + 8) * LDP + col) = pack_bf16(s[n][2], s[n][3]);
            *reinterpret_cast<uint32_t *>(dss + row * LDP + col) = pack_bf16(dp[n][0], dp[n][1]);
            *reinterpret_cast<uint32_t *>(dss + (row + 8) * LDP + col) = pack_bf16(dp[n][2], dp[n][3]);
        }
        __syncthreads();

        // dV = P^T dO and dK = scale dS^T Q of the tile: warp (wr, wc) takes keys
        // wr*16.. and columns wc*DC..; added to global with fp32 atomics.
#pragma unroll
        for (int which = 0; which < 2; which++) {
            float acc[DC / 8][4];
            zero<DC>(acc);
            mma_atb<BM, DC>(acc, (which ? dss : ps) + wr * 16, LDP, (which ? qs : dos) + wc * DC, LD);
            float *dst = which ? dk : dv;
            const float f = which ? scale : 1.0f;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int64_t t = kt[wr * 16 + g + half * 8];
                if (t < 0) continue;
                float *p = dst + (t * Hkv + kvh) * (int64_t)D + wc * DC + 2 * t4;
#pragma unroll
                for (int n = 0; n < DC / 8; n++) {
                    atomicAdd(p + n * 8, f * acc[n][2 * half]);
                    atomicAdd(p + n * 8 + 1, f * acc[n][2 * half + 1]);
                }
            }
        }
        __syncthreads();   // every warp is done with buf, P and dS before they are refilled
        if (KVBUF == 1 && nxt < tiles.total) load_kv(nxt, 0);
        it = nxt;
        buf = (buf + 1) % KVBUF;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = i0 + warp * 16 + g + half * 8;
        if (row >= Tq) continue;
        float *p = dq + (row * Hq + h) * (int64_t)D + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            p[n * 8] += scale * dqa[n][2 * half];
            p[n * 8 + 1] += scale * dqa[n][2 * half + 1];
        }
    }
}

// ---- host side ----

static void check_call(const AttnShape *s, const SparseIndexCuda *x) {
    CHECK(s->head_dim == 64 || s->head_dim == 128, "sparse attention (CUDA): head_dim %d (supported: "
          "64, 128)", s->head_dim);
    CHECK(s->num_kv_heads >= 1 && s->num_heads % s->num_kv_heads == 0,
          "sparse attention (CUDA): %d q heads not a multiple of %d kv heads", s->num_heads,
          s->num_kv_heads);
    CHECK(x->block_size == 64 || x->block_size == 128,
          "sparse attention (CUDA): block size %d (supported: 64, 128)", x->block_size);
    const int64_t nqb = (s->q_tokens + x->block_size - 1) / x->block_size;
    CHECK(x->num_heads == s->num_heads && x->num_q_blocks == nqb,
          "sparse attention (CUDA): index (%d heads, %lld query blocks of %d) does not match the "
          "call (%d heads, %lld queries)", x->num_heads, (long long)x->num_q_blocks, x->block_size,
          s->num_heads, (long long)s->q_tokens);
    CHECK((int64_t)x->num_heads * nqb < INT32_MAX, "sparse attention (CUDA): too many index rows");
}

static void check_aligned(const void *p, const char *name) {
    CHECK(((uintptr_t)p & 15) == 0, "sparse attention (CUDA): %s is not 16-byte aligned", name);
}

template <int D, int BM, bool DOCS>
static void forward_launch(const AttnShape *s, const SparseView &c, const AttnPos &pos, const AttnInputsBf16 &in,
                           const AttnOut &out, cudaStream_t stream) {
    constexpr int BN = KEY_TILE;
    // q, k, v tiles (bf16); key tokens and positions of two tiles; query positions (and document starts), lse
    const size_t smem = (size_t)(BM + 2 * BN) * D * sizeof(bf16) + (4 * BN + (DOCS ? 2 : 1) * BM) * sizeof(int64_t) +
                        BM * sizeof(float);
    auto kernel = sparse_forward_kernel<D, BM, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_LAUNCH(kernel, (unsigned)c.rows, BM, smem, stream, attn_dims(s), pos, in, out, c, s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
}

// With documents (pos.q_first not NULL) or without.
template <int D, int BM>
static void forward(const AttnShape *s, const SparseView &c, const AttnPos &pos, const AttnInputsBf16 &in,
                    const AttnOut &out, cudaStream_t stream) {
    if (pos.q_first) forward_launch<D, BM, true>(s, c, pos, in, out, stream);
    else forward_launch<D, BM, false>(s, c, pos, in, out, stream);
}

extern "C" void attn_sparse_forward_part_cuda(SparsePart part, const AttnShape *s, const SparseIndexCuda *x,
                                              const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                                              const uint16_t *v, const int64_t *k_pos, float *o_acc, float *lse,
                                              cudaStream_t stream) {
    check_call(s, x);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    check_aligned(q, "q"); check_aligned(k, "k"); check_aligned(v, "v"); check_aligned(o_acc, "o_acc");
    SparseView c = chunk_view(part, x, k_pos, s->k_tokens, stream);
    int64_t *qf = attn_doc_first_cuda(s, q_pos, stream);
    const AttnPos pos = {q_pos, k_pos, qf};
    const AttnInputsBf16 in = {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, NULL};
    const AttnOut out = {o_acc, lse};
    const int key = s->head_dim * 1000 + x->block_size;
    if (key == 64064) forward<64, 64>(s, c, pos, in, out, stream);
    else if (key == 64128) forward<64, 128>(s, c, pos, in, out, stream);
    else if (key == 128064) forward<128, 64>(s, c, pos, in, out, stream);
    else forward<128, 128>(s, c, pos, in, out, stream);
    if (qf) CUDA_CHECK(cudaFreeAsync(qf, stream));
    chunk_view_free(&c, stream);
}

// The index's blocks in this call key-major (KeyMajorBlocks) for the keys
// k_pos [Tk] (whole blocks of a chunk): counted, scanned, listed. Its arrays
// are stream-ordered scratch; free with key_major_free.
static KeyMajorBlocks key_major_blocks(const SparseView &c, const SparseIndexCuda *x, const int64_t *k_pos, int64_t Tk,
                                       cudaStream_t stream) {
    const int B = x->block_size;
    KeyMajorBlocks t = {(Tk + B - 1) / B, NULL, NULL};
    const int64_t rows = (int64_t)x->num_heads * t.nkb;
    CUDA_CHECK(cudaMallocAsync((void **)&t.q_start, (size_t)(rows + 1) * sizeof(int64_t), stream));
    CUDA_CHECK(cudaMallocAsync((void **)&t.q_block, (size_t)(x->block_capacity + 1) * sizeof(int64_t), stream));
    CUDA_CHECK(cudaMemsetAsync(t.q_start, 0, sizeof(int64_t), stream));
    const int warps_grid = (int)((rows * 32 + 255) / 256);
    CUDA_LAUNCH(key_major_kernel<false>, warps_grid, 256, 0, stream, c, x->q_blocks, k_pos, B, t);
    CUDA_CHECK(cudaGetLastError());
    sparse_inclusive_sum_cuda(t.q_start + 1, rows, stream);
    CUDA_LAUNCH(key_major_kernel<true>, warps_grid, 256, 0, stream, c, x->q_blocks, k_pos, B, t);
    CUDA_CHECK(cudaGetLastError());
    return t;
}

static void key_major_free(KeyMajorBlocks *t, cudaStream_t stream) {
    CUDA_CHECK(cudaFreeAsync(t->q_start, stream));
    CUDA_CHECK(cudaFreeAsync(t->q_block, stream));
}

// Shared memory of the key-major backward (its layout: sparse_backward_blocks_kernel).
template <int D, int B, bool DOCS>
static size_t backward_blocks_smem() {
    constexpr int BM = SparseBackwardTile<D>::BM, BN = B;
    return (size_t)(2 * BN + 3 * BM) * D * sizeof(bf16) + (size_t)2 * BN * BM * sizeof(bf16) +
           (BN + 3 * BM) * sizeof(int64_t) + 2 * BM * ((DOCS ? 2 : 1) * sizeof(int64_t) + 2 * sizeof(float)) +
           2 * (BM / 32) * sizeof(int);
}

template <int D, int B, bool DOCS>
static void backward_blocks_launch(const AttnShape *s, const KeyMajorBlocks &t, const AttnPos &pos,
                                   const AttnInputsBf16 &in, const AttnGrads &grads, cudaStream_t stream) {
    const size_t smem = backward_blocks_smem<D, B, DOCS>();
    auto kernel = sparse_backward_blocks_kernel<D, B, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)t.nkb, (unsigned)s->num_heads);
    CUDA_LAUNCH(kernel, grid, B / 16 * 32, smem, stream, attn_dims(s), pos, in, grads, t, s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
}

// With documents (pos.q_first not NULL) or without.
template <int D, int B>
static void backward_blocks(const AttnShape *s, const KeyMajorBlocks &t, const AttnPos &pos,
                            const AttnInputsBf16 &in, const AttnGrads &grads, cudaStream_t stream) {
    if (pos.q_first) backward_blocks_launch<D, B, true>(s, t, pos, in, grads, stream);
    else backward_blocks_launch<D, B, false>(s, t, pos, in, grads, stream);
}

// Shared memory of the column backward with KVBUF key/value buffers.
template <int D, int BM, int KVBUF>
static size_t backward_columns_smem() {
    constexpr int LD = D + 8, BN = KEY_TILE;
    return (size_t)(2 * BM + 2 * KVBUF * BN) * LD * sizeof(bf16) + (size_t)2 * BM * (BN + 8) * sizeof(bf16) +
           2 * KVBUF * BN * sizeof(int64_t);
}

template <int D, int BM, int KVBUF, bool DOCS>
static void backward_columns_launch(const AttnShape *s, const SparseView &c, const AttnPos &pos,
                                    const AttnInputsBf16 &in, const AttnGrads &grads, cudaStream_t stream) {
    const size_t smem = backward_columns_smem<D, BM, KVBUF>();
    auto kernel = sparse_backward_columns_kernel<D, BM, KVBUF, DOCS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_LAUNCH(kernel, (unsigned)c.rows, BM * 2, smem, stream, attn_dims(s), pos, in, grads, c, s->scale * LOG2E);
    CUDA_CHECK(cudaGetLastError());
}

// With documents (pos.q_first not NULL) or without.
template <int D, int BM, int KVBUF>
static void backward_columns_docs(const AttnShape *s, const SparseView &c, const AttnPos &pos,
                                  const AttnInputsBf16 &in, const AttnGrads &grads, cudaStream_t stream) {
    if (pos.q_first) backward_columns_launch<D, BM, KVBUF, true>(s, c, pos, in, grads, stream);
    else backward_columns_launch<D, BM, KVBUF, false>(s, c, pos, in, grads, stream);
}

// Double-buffered K/V where the device's shared memory allows (D 128 with
// B 128 needs 176 KB: sm_90 yes, sm_80 no), else single-buffered.
template <int D, int BM>
static void backward_columns(const AttnShape *s, const SparseView &c, const AttnPos &pos, const AttnInputsBf16 &in,
                             const AttnGrads &grads, cudaStream_t stream) {
    if constexpr (D == 128 && BM == 128) {
        int device, optin;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if ((size_t)optin < backward_columns_smem<D, BM, 2>()) {
            backward_columns_docs<D, BM, 1>(s, c, pos, in, grads, stream);
            return;
        }
    }
    backward_columns_docs<D, BM, 2>(s, c, pos, in, grads, stream);
}

// The blocks of `part` key-major, then its columns query-major, on one stream.
template <int D, int B>
static void backward(SparsePart part, const AttnShape *s, const SparseIndexCuda *x, const SparseView &c,
                     const AttnPos &pos, const AttnInputsBf16 &in, const AttnGrads &grads, cudaStream_t stream) {
    if (part != SPARSE_COLUMNS) {
        KeyMajorBlocks t = key_major_blocks(c, x, pos.k_pos, s->k_tokens, stream);
        backward_blocks<D, B>(s, t, pos, in, grads, stream);
        key_major_free(&t, stream);
    }
    if (part != SPARSE_BLOCKS) backward_columns<D, B>(s, c, pos, in, grads, stream);
}

extern "C" void attn_sparse_backward_part_cuda(SparsePart part, const AttnShape *s, const SparseIndexCuda *x,
                                               const uint16_t *q, const int64_t *q_pos, const uint16_t *k,
                                               const uint16_t *v, const int64_t *k_pos, const float *lse,
                                               const float *delta, const uint16_t *dout, float *dq, float *dk,
                                               float *dv, cudaStream_t stream) {
    check_call(s, x);
    if (s->q_tokens == 0 || s->k_tokens == 0) return;
    check_aligned(q, "q"); check_aligned(k, "k"); check_aligned(v, "v"); check_aligned(dout, "dout");
    SparseView c = chunk_view(part, x, k_pos, s->k_tokens, stream);
    int64_t *qf = attn_doc_first_cuda(s, q_pos, stream);
    const AttnPos pos = {q_pos, k_pos, qf};
    const AttnInputsBf16 in = {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)dout};
    const AttnGrads grads = {lse, delta, dq, dk, dv};
    const int key = s->head_dim * 1000 + x->block_size;
    if (key == 64064) backward<64, 64>(part, s, x, c, pos, in, grads, stream);
    else if (key == 64128) backward<64, 128>(part, s, x, c, pos, in, grads, stream);
    else if (key == 128064) backward<128, 64>(part, s, x, c, pos, in, grads, stream);
    else backward<128, 128>(part, s, x, c, pos, in, grads, stream);
    if (qf) CUDA_CHECK(cudaFreeAsync(qf, stream));
    chunk_view_free(&c, stream);
}

extern "C" void attn_sparse_forward_cuda(const AttnShape *s, const SparseIndexCuda *x, const uint16_t *q,
                                         const int64_t *q_pos, const uint16_t *k, const uint16_t *v,
                                         const int64_t *k_pos, float *o_acc, float *lse, cudaStream_t stream) {
    attn_sparse_forward_part_cuda(SPARSE_ALL, s, x, q, q_pos, k, v, k_pos, o_acc, lse, stream);
}

extern "C" void attn_sparse_backward_cuda(const AttnShape *s, const SparseIndexCuda *x, const uint16_t *q,
                                          const int64_t *q_pos, const uint16_t *k, const uint16_t *v,
                                          const int64_t *k_pos, const float *lse, const float *delta,
                                          const uint16_t *dout, float *dq, float *dk, float *dv,
                                          cudaStream_t stream) {
    attn_sparse_backward_part_cuda(SPARSE_ALL, s, x, q, q_pos, k, v, k_pos, lse, delta, dout, dq, dk, dv, stream);
}

// ---- the index in device memory ----

static int64_t *copy_to_device(const int64_t *host, int64_t n) {
    int64_t *dev;
    CUDA_CHECK(cudaMalloc((void **)&dev, (size_t)(n + 1) * sizeof(int64_t)));
    if (n > 0) CUDA_CHECK(cudaMemcpy(dev, host, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice));
    return dev;
}

extern "C" void sparse_index_to_cuda(const SparseIndex *h, SparseIndexCuda *d) {
    const int64_t rows = (int64_t)h->num_heads * h->num_q_blocks;
    d->num_heads = h->num_heads;
    d->block_size = h->block_size;
    d->seq_len = h->seq_len;
    d->num_q_blocks = h->num_q_blocks;
    d->block_capacity = h->block_start[rows];
    d->column_capacity = h->column_start[rows];
    d->q_block_capacity = h->num_q_blocks + 1;
    d->row_capacity = d->column_row_capacity = rows + 2;
    d->q_blocks = copy_to_device(h->q_blocks, h->num_q_blocks);
    d->block_start = copy_to_device(h->block_start, rows + 1);
    d->blocks = copy_to_device(h->blocks, d->block_capacity);
    d->column_start = copy_to_device(h->column_start, rows + 1);
    d->columns = copy_to_device(h->columns, d->column_capacity);
}

static int64_t *copy_to_host(const int64_t *dev, int64_t n) {
    int64_t *host = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (n > 0) CUDA_CHECK(cudaMemcpy(host, dev, sizeof(int64_t) * (size_t)n, cudaMemcpyDeviceToHost));
    return host;
}

extern "C" void sparse_index_to_host(const SparseIndexCuda *d, cudaStream_t stream, SparseIndex *h) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t rows = (int64_t)d->num_heads * d->num_q_blocks;
    *h = SparseIndex{d->num_heads, d->block_size, d->seq_len, d->num_q_blocks, NULL, NULL, NULL, NULL, NULL};
    h->q_blocks = copy_to_host(d->q_blocks, d->num_q_blocks);
    h->block_start = copy_to_host(d->block_start, rows + 1);
    h->column_start = copy_to_host(d->column_start, rows + 1);
    h->blocks = copy_to_host(d->blocks, h->block_start[rows]);
    h->columns = copy_to_host(d->columns, h->column_start[rows]);
}

extern "C" void sparse_index_free_cuda(SparseIndexCuda *d) {
    CUDA_CHECK(cudaFree(d->q_blocks));
    CUDA_CHECK(cudaFree(d->block_start));
    CUDA_CHECK(cudaFree(d->blocks));
    CUDA_CHECK(cudaFree(d->column_start));
    CUDA_CHECK(cudaFree(d->columns));
    *d = SparseIndexCuda{};
}
