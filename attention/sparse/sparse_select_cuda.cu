// sparse_select_cuda.cu: the vertical-slash pattern on the GPU, from
// estimation to index, without a host read (sparse_cuda.h; the CPU
// version: sparse_estimate.c, sparse_index.c, docs/ARCHITECTURE.md).
//   estimation  per (q head, tile of 128 keys) CTA, fp32 on CUDA cores (the
//               estimation queries are few): the scores S = Q K^T of the tile
//               register-blocked into shared memory (a thread's 24 shared
//               loads per d feed 128 FMAs), then pass 1 writes each tile's
//               (max, sum) per query, a merge kernel folds them into lse_est;
//               pass 2 adds the softmax column sums to vertical (one owner
//               per key) and the diagonal sums to slash (shared-memory
//               window, then one global atomic per offset). With documents
//               a key counts for a query only at or after the start of the
//               query's document (qe_first, attn_doc_first_cuda).
//   selection   per (q head, kind) segment: keys (score bits << 32 | ~index),
//               sorted descending by CUB's segmented radix sort (unique keys:
//               descending score, ties to the smaller index, as the CPU);
//               the number taken (fixed, or top-p summed in double in the
//               CPU's order by one thread per segment), marks, and an ordered
//               compaction into per-head lists.
//   index       one CTA per index row: a bitmap of the key blocks (diagonal
//               and the slashes' blocks), then blocks and columns counted,
//               prefix-summed (CUB), and filled in ascending order into
//               lists held at the pattern's bound (sparse_index_bound:
//               nothing is read back); with documents only from the start
//               of the row's first document on, with that document's sink
//               as columns. The pattern and index buffers are reused by
//               later calls (grow_device).
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/cuda_kernel.h"
#include "../kernels/attention_cuda.h"
#include "../kernels/flash_tiles.cuh"
#include "sparse_select_cuda.h"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define EST_KEYS 128         // keys per estimation CTA
#define EST_THREADS 64       // threads per estimation CTA: 8 key groups x 8 query groups of the score tile
#define EST_MAX_Q 128        // at most this many estimation queries
#define EST_Q_CHUNK 64       // queries per register block of the score tile (16 keys x 8 queries per thread)
#define SEL_THREADS 256
#define SEL_MAX_HEADS 128    // fixed budgets: counts of at most this many q heads, passed by value

// The lines to take per segment (vertical of head h at h, slash at Hq + h):
// fixed, n of them; otherwise the fewest reaching top_p of the segment's
// mass, at most cap_v (vertical) or cap_s (slash).
struct SegmentBudget {
    bool fixed;
    int n[2 * SEL_MAX_HEADS];  // fixed only
    double top_p;
    int64_t cap_v, cap_s;
};

// ---- estimation ----

// The estimation kernels' arguments (attn_args.h): dims the sizes (dims.Tq = Lq
// estimation queries), pos the positions (pos.q_pos [Lq] and pos.q_first
// [Lq] of the estimation queries, pos.k_pos [Tk]), in.q the estimation
// queries qe [Lq, Hq, D], in.k the keys [Tk, Hkv, D] (in.v, in.dout unused).

// A key's row of the score tile in shared memory: the chunk's queries and 4
// more, so that rows lie 4 banks apart (the tile's stores conflict-free).
#define EST_TILE_ROW (EST_Q_CHUNK + 4)

// Shared tiles of one estimation CTA (q head h, keys j0 .. j0 + EST_KEYS):
// keys ks [EST_KEYS][D + 1] (zero past Tk), their positions kps (INT64_MAX
// past Tk), the queries' positions qps [Lq], and qfs [Lq] the first key
// position each query sees (pos.q_first; INT64_MIN for every query when it
// is NULL: no documents).
template <int D>
__device__ void est_load_keys(const AttnDims &dims, const AttnPos &pos, const AttnInputsBf16 &in, int h,
                              int64_t j0, float *ks, int64_t *kps, int64_t *qps, int64_t *qfs) {
    const int Lq = (int)dims.Tq, Hq = dims.Hq, Hkv = dims.Hkv;
    const int64_t Tk = dims.Tk;
    const bf16 *k = in.k;
    const int64_t *qe_pos = pos.q_pos, *qe_first = pos.q_first, *k_pos = pos.k_pos;
    const int kvh = h / (Hq / Hkv);
    for (int i = threadIdx.x; i < EST_KEYS * D; i += blockDim.x) {
        const int j = i / D, d = i % D;
        const int64_t t = j0 + j;
        ks[j * (D + 1) + d] = t < Tk ? __bfloat162float(k[(t * Hkv + kvh) * D + d]) : 0.0f;
    }
    for (int i = threadIdx.x; i < EST_KEYS; i += blockDim.x) kps[i] = j0 + i < Tk ? k_pos[j0 + i] : INT64_MAX;
    for (int i = threadIdx.x; i < Lq; i += blockDim.x) {
        qps[i] = qe_pos[i];
        qfs[i] = qe_first ? qe_first[i] : INT64_MIN;
    }
}

// The scores of one chunk of queries e0 .. e0 + EST_Q_CHUNK (q head h) against
// the CTA's keys ks: the queries into qs [EST_Q_CHUNK][D + 1], scaled to log2
// units (zero past Lq), then S [EST_KEYS][EST_TILE_ROW] = ks qs^T (keys
// past Tk score against zero rows, masked by their positions). EST_THREADS
// threads: thread t holds the 16 x 8 block of keys t % 8 + 8 a and queries
// t / 8 + 8 b (a < 16, b < 8) in registers; per d its 24 shared loads (8
// key rows and 4 query rows per warp, D + 1 apart: conflict-free) feed 128
// FMAs. Each score is summed over d in order, as a dot product. Callers
// synchronise before the next chunk overwrites qs and S.
template <int D>
__device__ void est_score_tile(const AttnDims &dims, const AttnInputsBf16 &in, int h, int e0, float scale_log2,
                               float *qs, const float *ks, float *S) {
    const int Lq = (int)dims.Tq, Hq = dims.Hq;
    for (int i = threadIdx.x; i < EST_Q_CHUNK * D; i += blockDim.x) {
        const int e = e0 + i / D, d = i % D;
        qs[(i / D) * (D + 1) + d] = e < Lq ? __bfloat162float(in.q[((int64_t)e * Hq + h) * D + d]) * scale_log2 : 0.0f;
    }
    __syncthreads();
    const int kg = threadIdx.x % 8, qg = threadIdx.x / 8;
    float acc[16][8];
#pragma unroll
    for (int a = 0; a < 16; a++)
#pragma unroll
        for (int b = 0; b < 8; b++) acc[a][b] = 0.0f;
    for (int d = 0; d < D; d++) {
        float kr[16], qr[8];
#pragma unroll
        for (int a = 0; a < 16; a++) kr[a] = ks[(kg + 8 * a) * (D + 1) + d];
#pragma unroll
        for (int b = 0; b < 8; b++) qr[b] = qs[(qg + 8 * b) * (D + 1) + d];
#pragma unroll
        for (int a = 0; a < 16; a++)
#pragma unroll
            for (int b = 0; b < 8; b++) acc[a][b] += qr[b] * kr[a];
    }
#pragma unroll
    for (int a = 0; a < 16; a++)
#pragma unroll
        for (int b = 0; b < 8; b++) S[(kg + 8 * a) * EST_TILE_ROW + qg + 8 * b] = acc[a][b];
    __syncthreads();
}

// Grid (key tiles, Hq), EST_THREADS threads; per chunk of queries one thread
// per query: part [Hq][tiles][Lq] = (max, sum) of its visible scores in the
// tile (log2 units).
template <int D>
__global__ void est_lse_kernel(AttnDims dims, AttnPos pos, AttnInputsBf16 in, float scale_log2, float2 *part) {
    const int Lq = (int)dims.Tq;
    DYNAMIC_SHARED(unsigned char, smem);
    int64_t *kps = reinterpret_cast<int64_t *>(smem), *qps = kps + EST_KEYS;
    float *qs = reinterpret_cast<float *>(qps + EST_MAX_Q), *ks = qs + EST_Q_CHUNK * (D + 1);
    float *S = ks + EST_KEYS * (D + 1);
    STATIC_SHARED(int64_t, qfs, [EST_MAX_Q]);
    const int h = blockIdx.y;
    est_load_keys<D>(dims, pos, in, h, (int64_t)blockIdx.x * EST_KEYS, ks, kps, qps, qfs);
    for (int e0 = 0; e0 < Lq; e0 += EST_Q_CHUNK) {
        est_score_tile<D>(dims, in, h, e0, scale_log2, qs, ks, S);
        for (int c = threadIdx.x; c < EST_Q_CHUNK && e0 + c < Lq; c += blockDim.x) {
            const int e = e0 + c;
            float m = -INFINITY, l = 0.0f;
            for (int j = 0; j < EST_KEYS; j++) {
                if (kps[j] > qps[e] || kps[j] < qfs[e]) continue;
                const float s = S[j * EST_TILE_ROW + c];
                if (s > m) { l = l * exp2f(m - s) + 1.0f; m = s; }
                else l += exp2f(s - m);
            }
            part[((int64_t)h * gridDim.x + blockIdx.x) * Lq + e] = make_float2(m, l);
        }
        __syncthreads();
    }
}

__device__ __forceinline__ void merge_max_sum(float &m, float &l, float m2, float l2) {
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return;
    l = l * exp2f(m - mx) + l2 * exp2f(m2 - mx);
    m = mx;
}

// One warp per (q head, estimation query): folds the tiles' (max, sum) into
// lse_est [Hq, Lq] (natural log, -inf while nothing was seen).
__global__ void est_lse_merge_kernel(const float2 *part, int64_t tiles, int Lq, int Hq, float *lse_est) {
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (int64_t)Hq * Lq) return;
    const int64_t h = w / Lq, e = w % Lq;
    float m = -INFINITY, l = 0.0f;
    for (int64_t t = lane; t < tiles; t += 32) {
        const float2 p = part[(h * tiles + t) * Lq + e];
        merge_max_sum(m, l, p.x, p.y);
    }
    for (int off = 16; off > 0; off /= 2) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off), l2 = __shfl_xor_sync(0xffffffffu, l, off);
        merge_max_sum(m, l, m2, l2);
    }
    if (lane == 0 && m != -INFINITY) {
        const float chunk = (m + log2f(l)) * LN2, old = lse_est[w];
        const float mx = fmaxf(old, chunk);
        lse_est[w] = mx + logf(expf(old - mx) + expf(chunk - mx));
    }
}

// Grid (key tiles, Hq), EST_THREADS threads; one thread per key (two keys
// each): P = exp(S - lse_est) over the estimation queries that see it, a
// chunk of queries at a time; vertical [Hq, N] at the key's position += its
// column sum; slash [Hq, N] at q - k += each P.
template <int D>
__global__ void est_scores_kernel(AttnDims dims, AttnPos pos, AttnInputsBf16 in, const float *lse_est, int64_t N,
                                  float scale_log2, float *vertical, float *slash) {
    const int Lq = (int)dims.Tq;
    constexpr int W = EST_KEYS + EST_MAX_Q;        // slash window: offsets base .. base + W
    constexpr int KEYS_PER_THREAD = EST_KEYS / EST_THREADS;
    DYNAMIC_SHARED(unsigned char, smem);
    int64_t *kps = reinterpret_cast<int64_t *>(smem), *qps = kps + EST_KEYS;
    float *qs = reinterpret_cast<float *>(qps + EST_MAX_Q), *ks = qs + EST_Q_CHUNK * (D + 1);
    float *S = ks + EST_KEYS * (D + 1);
    STATIC_SHARED(float, lse2, [EST_MAX_Q]);
    STATIC_SHARED(float, window, [W]);
    STATIC_SHARED(int64_t, qfs, [EST_MAX_Q]);
    const int h = blockIdx.y;
    for (int i = threadIdx.x; i < W; i += blockDim.x) window[i] = 0.0f;
    for (int i = threadIdx.x; i < Lq; i += blockDim.x) lse2[i] = lse_est[h * Lq + i] * LOG2E;
    est_load_keys<D>(dims, pos, in, h, (int64_t)blockIdx.x * EST_KEYS, ks, kps, qps, qfs);
    __syncthreads();
    // Offsets of contiguous keys and queries fall in the window; others go
    // straight to global memory.
    const int64_t base = qps[0] - kps[0] - (EST_KEYS - 1);
    float col[KEYS_PER_THREAD] = {};
    for (int e0 = 0; e0 < Lq; e0 += EST_Q_CHUNK) {
        est_score_tile<D>(dims, in, h, e0, scale_log2, qs, ks, S);
        for (int r = 0; r < KEYS_PER_THREAD; r++) {
            const int j = threadIdx.x + r * EST_THREADS;
            const int64_t kp = kps[j];
            if (kp == INT64_MAX) continue;
            for (int c = 0; c < EST_Q_CHUNK && e0 + c < Lq; c++) {
                const int e = e0 + c;
                if (kp > qps[e] || kp < qfs[e] || lse2[e] == -INFINITY) continue;
                const float p = exp2f(S[j * EST_TILE_ROW + c] - lse2[e]);
                col[r] += p;
                const int64_t d = qps[e] - kp, w = d - base;
                if (w >= 0 && w < W) atomicAdd(&window[w], p);
                else atomicAdd(&slash[h * N + d], p);
            }
        }
        __syncthreads();
    }
    for (int r = 0; r < KEYS_PER_THREAD; r++) {
        const int64_t kp = kps[threadIdx.x + r * EST_THREADS];
        if (kp != INT64_MAX) vertical[h * N + kp] += col[r];
    }
    for (int i = threadIdx.x; i < W; i += blockDim.x)
        if (window[i] != 0.0f) atomicAdd(&slash[h * N + base + i], window[i]);
}

// *buf with room for at least `need` int64 (*allocated of them now): a
// larger buffer replaces a smaller one (cudaFree waits for the device, so no
// queued work still reads the old one); otherwise the call costs nothing.
static void grow_device(int64_t **buf, int64_t *allocated, int64_t need) {
    if (need <= *allocated) return;
    CUDA_CHECK(cudaFree(*buf));
    CUDA_CHECK(cudaMalloc((void **)buf, (size_t)need * sizeof(int64_t)));
    *allocated = need;
}

static int blocks_for(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return (int)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

static void check_estimate(const AttnShape *s) {
    CHECK(s->head_dim == 64 || s->head_dim == 128, "sparse estimation (CUDA): head_dim %d (supported: 64, "
          "128)", s->head_dim);
    CHECK(s->q_tokens >= 1 && s->q_tokens <= EST_MAX_Q, "sparse estimation (CUDA): %lld estimation queries "
          "(supported: 1 to %d)", (long long)s->q_tokens, EST_MAX_Q);
    CHECK(s->num_kv_heads >= 1 && s->num_heads % s->num_kv_heads == 0,
          "sparse estimation (CUDA): %d q heads not a multiple of %d kv heads", s->num_heads, s->num_kv_heads);
}

// kps, qps; qs, ks; the score tile S.
static size_t est_smem(int D) {
    return (size_t)(EST_KEYS + EST_MAX_Q) * sizeof(int64_t) + (size_t)(EST_Q_CHUNK + EST_KEYS) * (D + 1) * sizeof(float) +
           (size_t)EST_KEYS * EST_TILE_ROW * sizeof(float);
}

template <int D>
static void estimate_lse(const AttnShape *s, const bf16 *qe, const int64_t *qe_pos, const bf16 *k,
                         const int64_t *k_pos, float *lse_est, cudaStream_t stream) {
    const int Lq = (int)s->q_tokens;
    const int64_t tiles = (s->k_tokens + EST_KEYS - 1) / EST_KEYS;
    const size_t smem = est_smem(D);
    CUDA_CHECK(cudaFuncSetAttribute(est_lse_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    float2 *part;
    CUDA_CHECK(cudaMallocAsync((void **)&part, (size_t)(tiles * s->num_heads * Lq) * sizeof(float2), stream));
    int64_t *qe_first = attn_doc_first_cuda(s, qe_pos, stream);
    const AttnPos pos = {qe_pos, k_pos, qe_first};
    const AttnInputsBf16 in = {qe, k, NULL, NULL};
    CUDA_LAUNCH(est_lse_kernel<D>, dim3((unsigned)tiles, (unsigned)s->num_heads), EST_THREADS, smem, stream,
                attn_dims(s), pos, in, s->scale * LOG2E, part);
    CUDA_CHECK(cudaGetLastError());
    if (qe_first) CUDA_CHECK(cudaFreeAsync(qe_first, stream));
    CUDA_LAUNCH(est_lse_merge_kernel, blocks_for((int64_t)s->num_heads * Lq * 32, 256), 256, 0, stream,
                part, tiles, Lq, s->num_heads, lse_est);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(part, stream));
}

extern "C" void sparse_estimate_lse_cuda(const AttnShape *s, const uint16_t *qe, const int64_t *qe_pos,
                                         const uint16_t *k, const int64_t *k_pos, float *lse_est,
                                         cudaStream_t stream) {
    check_estimate(s);
    if (s->k_tokens == 0) return;
    const bf16 *qb = (const bf16 *)qe, *kb = (const bf16 *)k;
    if (s->head_dim == 64) estimate_lse<64>(s, qb, qe_pos, kb, k_pos, lse_est, stream);
    else estimate_lse<128>(s, qb, qe_pos, kb, k_pos, lse_est, stream);
}

template <int D>
static void estimate_scores(const AttnShape *s, const bf16 *qe, const int64_t *qe_pos, const bf16 *k,
                            const int64_t *k_pos, const float *lse_est, int64_t N, float *vertical,
                            float *slash, cudaStream_t stream) {
    const int64_t tiles = (s->k_tokens + EST_KEYS - 1) / EST_KEYS;
    const size_t smem = est_smem(D);
    CUDA_CHECK(cudaFuncSetAttribute(est_scores_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    int64_t *qe_first = attn_doc_first_cuda(s, qe_pos, stream);
    const AttnPos pos = {qe_pos, k_pos, qe_first};
    const AttnInputsBf16 in = {qe, k, NULL, NULL};
    CUDA_LAUNCH(est_scores_kernel<D>, dim3((unsigned)tiles, (unsigned)s->num_heads), EST_THREADS, smem, stream,
                attn_dims(s), pos, in, lse_est, N, s->scale * LOG2E, vertical, slash);
    CUDA_CHECK(cudaGetLastError());
    if (qe_first) CUDA_CHECK(cudaFreeAsync(qe_first, stream));
}

extern "C" void sparse_estimate_scores_cuda(const AttnShape *s, const uint16_t *qe, const int64_t *qe_pos,
                                            const uint16_t *k, const int64_t *k_pos, const float *lse_est,
                                            int64_t seq_len, float *vertical, float *slash,
                                            cudaStream_t stream) {
    check_estimate(s);
    if (s->k_tokens == 0) return;
    const bf16 *qb = (const bf16 *)qe, *kb = (const bf16 *)k;
    if (s->head_dim == 64) estimate_scores<64>(s, qb, qe_pos, kb, k_pos, lse_est, seq_len, vertical, slash, stream);
    else estimate_scores<128>(s, qb, qe_pos, kb, k_pos, lse_est, seq_len, vertical, slash, stream);
}

// ---- selection ----

// key [S][N] of segment s (vertical of head s, then slash of head s - H):
// score bits << 32 | (UINT32_MAX - index), -0 made +0.
__global__ void select_keys_kernel(const float *vertical, const float *slash, int H, int64_t N, uint64_t *key) {
    const int64_t n = 2 * H * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = i / N, t = i % N;
        const float x = (s < H ? vertical[s * N + t] : slash[(s - H) * N + t]) + 0.0f;
        key[i] = ((uint64_t)__float_as_uint(x) << 32) | (uint64_t)(UINT32_MAX - (uint32_t)t);
    }
}

// One thread per segment: how many of its sorted lines to take (the CPU's
// select_lines: fixed count, or the fewest reaching top_p of the mass, summed
// in double in sorted order, capped).
__global__ void select_take_kernel(const uint64_t *sorted, const float *vertical, const float *slash, int H,
                                   int64_t N, const SegmentBudget budget, int64_t *take) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= 2 * H) return;
    const uint64_t *key = sorted + (int64_t)s * N;
    const float *score = s < H ? vertical + (int64_t)s * N : slash + (int64_t)(s - H) * N;
    if (budget.fixed) { take[s] = budget.n[s] < N ? budget.n[s] : N; return; }
    int64_t positive = 0;
    double total = 0.0;
    for (; positive < N && (key[positive] >> 32) != 0; positive++)
        total += score[UINT32_MAX - (uint32_t)key[positive]];
    int64_t n = 0;
    if (budget.top_p >= 1.0) n = positive;
    else {
        const double target = budget.top_p * total;
        double mass = 0.0;
        while (n < positive && mass < target) mass += score[UINT32_MAX - (uint32_t)key[n++]];
    }
    const int64_t cap = s < H ? budget.cap_v : budget.cap_s;
    take[s] = n < cap ? n : cap;
}

// offsets [S + 1]: segment s starts at s * N.
__global__ void segment_offsets_kernel(int64_t S, int64_t N, int64_t *offsets) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= S; i += (int64_t)gridDim.x * blockDim.x)
        offsets[i] = i * N;
}

// sel [S][N]: the taken lines of every segment and the always-kept first
// `always` (sink for vertical, local for slash).
__global__ void select_mark_kernel(const uint64_t *sorted, const int64_t *take, int H, int64_t N, int sink,
                                   int local, unsigned char *sel) {
    const int64_t n = 2 * H * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = i / N, t = i % N;
        if (t < take[s]) sel[s * N + (UINT32_MAX - (uint32_t)sorted[i])] = 1;
        if (t < (s < H ? sink : local)) sel[i] = 1;
    }
}

// One CTA per segment: the marked positions ascending into list [S][cap],
// count [S] (at most cap by construction).
__global__ void select_gather_kernel(const unsigned char *sel, int H, int64_t N, int64_t cap_v, int64_t cap_s,
                                     int64_t *vertical, int64_t *slash, int64_t *v_count, int64_t *s_count) {
    STATIC_SHARED(int, scan, [SEL_THREADS / 32]);
    const int s = blockIdx.x;
    const unsigned char *mark = sel + (int64_t)s * N;
    int64_t *list = s < H ? vertical + (int64_t)s * cap_v : slash + (int64_t)(s - H) * cap_s;
    int64_t out = 0;
    for (int64_t t0 = 0; t0 < N; t0 += SEL_THREADS) {
        const int64_t t = t0 + threadIdx.x;
        const int flag = t < N && mark[t];
        int offset, total;
        block_exclusive_sum<SEL_THREADS>(flag, scan, offset, total);
        if (flag) list[out + offset] = t;
        out += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (s < H) v_count[s] = out;
        else s_count[s - H] = out;
    }
}

extern "C" void sparse_select_cuda(const AttentionConfig *cfg, const float *vertical, const float *slash,
                                   int num_heads, int64_t seq_len, const int *fixed_vertical,
                                   const int *fixed_slash, SparsePatternCuda *p, cudaStream_t stream) {
    const int H = num_heads;
    const int64_t N = seq_len, S = 2 * (int64_t)H;
    const int fixed = cfg->budget == BUDGET_FIXED;
    CHECK(N >= 1 && N <= UINT32_MAX && S * N < INT32_MAX, "selection (CUDA): sequence length %lld",
          (long long)N);
    // Per-segment fixed counts and the lists' capacities (taken + always kept).
    CHECK(!fixed || H <= SEL_MAX_HEADS, "selection (CUDA): fixed budgets for %d q heads (supported: up to %d)", H,
          SEL_MAX_HEADS);
    SegmentBudget budget = {};
    budget.fixed = fixed;
    budget.top_p = cfg->top_p;
    budget.cap_v = cfg->max_vertical;
    budget.cap_s = cfg->max_slash;
    int64_t most_v = cfg->max_vertical, most_s = cfg->max_slash;
    if (fixed) {
        most_v = most_s = 0;
        for (int h = 0; h < H; h++) {
            budget.n[h] = fixed_vertical ? fixed_vertical[h] : cfg->vertical;
            budget.n[H + h] = fixed_slash ? fixed_slash[h] : cfg->slash;
            most_v = budget.n[h] > most_v ? budget.n[h] : most_v;
            most_s = budget.n[H + h] > most_s ? budget.n[H + h] : most_s;
        }
    }
    p->num_heads = H;
    p->seq_len = N;
    p->vertical_capacity = most_v + cfg->sink < N ? most_v + cfg->sink : N;
    p->slash_capacity = most_s + cfg->local < N ? most_s + cfg->local : N;
    grow_device(&p->vertical, &p->vertical_allocated, H * p->vertical_capacity + 1);
    grow_device(&p->slash, &p->slash_allocated, H * p->slash_capacity + 1);
    grow_device(&p->vertical_count, &p->count_allocated, S);
    p->slash_count = p->vertical_count + H;

    uint64_t *key, *sorted;
    int64_t *offsets, *take;
    unsigned char *sel;
    CUDA_CHECK(cudaMallocAsync((void **)&key, (size_t)(2 * S * N) * sizeof(uint64_t), stream));
    sorted = key + S * N;
    CUDA_CHECK(cudaMallocAsync((void **)&offsets, (size_t)(2 * S + 1) * sizeof(int64_t), stream));
    take = offsets + S + 1;
    CUDA_CHECK(cudaMallocAsync((void **)&sel, (size_t)(S * N), stream));
    CUDA_LAUNCH(segment_offsets_kernel, blocks_for(S + 1, 256), 256, 0, stream, S, N, offsets);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(sel, 0, (size_t)(S * N), stream));

    CUDA_LAUNCH(select_keys_kernel, blocks_for(S * N, 256), 256, 0, stream, vertical, slash, H, N, key);
    CUDA_CHECK(cudaGetLastError());
    size_t bytes = 0;
    CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, bytes, key, sorted, (int)(S * N),
                                                                 (int)S, offsets, offsets + 1, 0, 64, stream));
    void *temp;
    CUDA_CHECK(cudaMallocAsync(&temp, bytes, stream));
    CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(temp, bytes, key, sorted, (int)(S * N), (int)S,
                                                                 offsets, offsets + 1, 0, 64, stream));
    CUDA_CHECK(cudaFreeAsync(temp, stream));
    CUDA_LAUNCH(select_take_kernel, blocks_for(S, 32), 32, 0, stream, sorted, vertical, slash, H, N, budget, take);
    CUDA_CHECK(cudaGetLastError());
    CUDA_LAUNCH(select_mark_kernel, blocks_for(S * N, 256), 256, 0, stream, sorted, take, H, N, cfg->sink,
                cfg->local, sel);
    CUDA_CHECK(cudaGetLastError());
    CUDA_LAUNCH(select_gather_kernel, (unsigned)S, SEL_THREADS, 0, stream, sel, H, N, p->vertical_capacity,
                p->slash_capacity, p->vertical, p->slash,
                p->vertical_count, p->slash_count);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(key, stream));
    CUDA_CHECK(cudaFreeAsync(offsets, stream));
    CUDA_CHECK(cudaFreeAsync(sel, stream));
}

extern "C" void sparse_pattern_free_cuda(SparsePatternCuda *p) {
    CUDA_CHECK(cudaFree(p->vertical));
    CUDA_CHECK(cudaFree(p->slash));
    CUDA_CHECK(cudaFree(p->vertical_count));
    *p = SparsePatternCuda{};
}

// ---- index ----

// The document bounds of a row whose queries start at q_lo: *lo the first
// key any of its queries may see (the start of q_lo's document, 0 before the
// first start or without documents), *sink_end the end of the sink columns
// at lo (lo + sink clipped to that document and to q_hi + 1; lo without
// documents). As sparse_index_documents: a later document of the row starts
// inside the query block, which the row always keeps, so its sink adds no
// column; only the sink at lo can.
__device__ void row_documents(const int64_t *doc_starts, int64_t doc_count, int sink, int64_t q_lo, int64_t q_hi,
                              int64_t N, int64_t *lo, int64_t *sink_end) {
    int64_t a = 0, b = doc_count;                    // a: the number of starts <= q_lo
    while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        if (doc_starts[mid] <= q_lo) a = mid + 1; else b = mid;
    }
    *lo = a > 0 ? doc_starts[a - 1] : 0;
    if (doc_count == 0) { *sink_end = *lo; return; }
    const int64_t doc_end = a < doc_count ? doc_starts[a] : N;
    int64_t end = *lo + sink < doc_end ? *lo + sink : doc_end;
    *sink_end = end < q_hi + 1 ? end : q_hi + 1;
}

// The number of entries of the ascending list a [n] that are at most x.
__device__ int64_t count_at_most(const int64_t *a, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// One CTA per row r = h * nqb + i of the index x (nqb = x.num_q_blocks,
// global query block qb = x.q_blocks[i], B = x.block_size): marks the row's
// key blocks in a shared bitmap, then (FILL = false) counts them and the
// columns into x.block_start[r + 1], x.column_start[r + 1], or (FILL) writes
// them ascending into x.blocks from x.block_start[r] and x.columns from
// x.column_start[r]. With documents (doc_starts [doc_count], device) the row
// keeps only blocks and columns at or after lo (row_documents) and gets the
// sink columns lo .. sink_end - 1, all where no kept block holds them.
// Only the lines up to the row's last query reach it: slash offsets and
// vertical positions at most q_hi (both lists ascending), so a row reads no
// other line.
template <bool FILL>
__global__ void __launch_bounds__(SEL_THREADS) index_row_kernel(const SparsePatternCuda p, const SparseIndexCuda x,
                                                                const int64_t *doc_starts, int64_t doc_count,
                                                                int sink) {
    const int B = x.block_size;
    const int64_t nqb = x.num_q_blocks, *q_blocks = x.q_blocks;
    int64_t *block_start = x.block_start, *blocks = x.blocks, *column_start = x.column_start, *columns = x.columns;
    STATIC_SHARED(int, scan, [SEL_THREADS / 32]);
    DYNAMIC_SHARED(unsigned int, bits);
    const int64_t r = blockIdx.x, N = p.seq_len;
    const int h = (int)(r / nqb);
    const int64_t qb = q_blocks[r % nqb], q_lo = qb * B, q_hi = ((qb + 1) * B < N ? (qb + 1) * B : N) - 1;
    const int64_t words = qb / 32 + 1;
    int64_t lo, sink_end;
    row_documents(doc_starts, doc_count, sink, q_lo, q_hi, N, &lo, &sink_end);
    for (int64_t w = threadIdx.x; w < words; w += SEL_THREADS) bits[w] = 0;
    __syncthreads();
    if (threadIdx.x == 0) atomicOr(&bits[qb / 32], 1u << (qb % 32));
    const int64_t *slash = p.slash + h * p.slash_capacity, *vertical = p.vertical + h * p.vertical_capacity;
    const int64_t ns = count_at_most(slash, p.slash_count[h], q_hi);
    const int64_t nv = count_at_most(vertical, p.vertical_count[h], q_hi);
    for (int64_t s = threadIdx.x; s < ns; s += SEL_THREADS) {
        const int64_t d = slash[s];
        const int64_t k_lo = q_lo - d > 0 ? q_lo - d : 0;
        for (int64_t kb = k_lo / B; kb <= (q_hi - d) / B; kb++) atomicOr(&bits[kb / 32], 1u << (kb % 32));
    }
    __syncthreads();
    auto marked = [&](int64_t kb) { return (bits[kb / 32] >> (kb % 32)) & 1u; };
    const int64_t first_block = lo / B;
    int64_t nb = FILL ? block_start[r] : 0, nc = FILL ? column_start[r] : 0;
    // Blocks from first_block on (the blocks before it end before lo).
    for (int64_t w0 = first_block / 32; w0 < words; w0 += SEL_THREADS) {
        const int64_t w = w0 + threadIdx.x;
        unsigned word = w < words ? bits[w] : 0u;
        if (w == first_block / 32) word &= ~0u << (first_block % 32);
        int offset, total;
        block_exclusive_sum<SEL_THREADS>(__popc(word), scan, offset, total);
        if (FILL)
            for (unsigned x = word; x; x &= x - 1) blocks[nb + offset++] = w * 32 + __ffs(x) - 1;
        nb += total;
        __syncthreads();
    }
    // Columns: the sink lo .. sink_end - 1, then the vertical lines after it up to the last query.
    for (int64_t p0 = lo; p0 < sink_end; p0 += SEL_THREADS) {
        const int64_t kp = p0 + threadIdx.x;
        const int flag = kp < sink_end && !marked(kp / B);
        int offset, total;
        block_exclusive_sum<SEL_THREADS>(flag, scan, offset, total);
        if (FILL && flag) columns[nc + offset] = kp;
        nc += total;
        __syncthreads();
    }
    for (int64_t v0 = 0; v0 < nv; v0 += SEL_THREADS) {
        const int64_t v = v0 + threadIdx.x;
        const int64_t kp = v < nv ? vertical[v] : INT64_MAX;
        const int flag = kp >= sink_end && kp <= q_hi && !marked(kp / B);
        int offset, total;
        block_exclusive_sum<SEL_THREADS>(flag, scan, offset, total);
        if (FILL && flag) columns[nc + offset] = kp;
        nc += total;
        __syncthreads();
    }
    if (!FILL && threadIdx.x == 0) {
        block_start[r + 1] = nb;
        column_start[r + 1] = nc;
    }
}

extern "C" void sparse_index_bound(const SparsePatternCuda *p, int block_size, int sink, int64_t *row_blocks,
                                   int64_t *row_columns) {
    const int64_t N = p->seq_len, nglobal = (N + block_size - 1) / block_size;
    *row_blocks = 1 + 2 * p->slash_capacity < nglobal ? 1 + 2 * p->slash_capacity : nglobal;
    *row_columns = p->vertical_capacity + sink < N ? p->vertical_capacity + sink : N;
}

// q_blocks [ceil(T / B)]: the global block of each local block's first token.
__global__ void query_blocks_kernel(const int64_t *pos, int64_t T, int B, int64_t *q_blocks) {
    const int64_t n = (T + B - 1) / B;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        q_blocks[i] = pos[i * B] / B;
}

extern "C" void sparse_query_blocks_cuda(const int64_t *pos, int64_t T, int block_size, int64_t *q_blocks,
                                         cudaStream_t stream) {
    const int64_t n = (T + block_size - 1) / block_size;
    if (n == 0) return;
    CUDA_LAUNCH(query_blocks_kernel, blocks_for(n, 256), 256, 0, stream, pos, T, block_size, q_blocks);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void sparse_index_build_cuda(const SparsePatternCuda *p, int block_size, const int64_t *q_blocks,
                                        int64_t num_q_blocks, const int64_t *doc_starts, int64_t doc_count,
                                        int sink, SparseIndexCuda *x, cudaStream_t stream) {
    const int B = block_size, H = p->num_heads;
    const int64_t N = p->seq_len, nqb = num_q_blocks, rows = H * nqb, nglobal = (N + B - 1) / B;
    CHECK(B >= 1 && rows >= 0 && rows < INT32_MAX, "index (CUDA): block size %d, %lld rows", B, (long long)rows);
    const int64_t docs = doc_starts ? doc_count : 0;
    x->num_heads = H;
    x->block_size = B;
    x->seq_len = N;
    x->num_q_blocks = nqb;
    grow_device(&x->q_blocks, &x->q_block_capacity, nqb + 1);
    grow_device(&x->block_start, &x->row_capacity, rows + 1);
    grow_device(&x->column_start, &x->column_row_capacity, rows + 1);
    int64_t row_blocks, row_columns;
    sparse_index_bound(p, B, docs > 0 ? sink : 0, &row_blocks, &row_columns);
    grow_device(&x->blocks, &x->block_capacity, rows * row_blocks + 1);
    grow_device(&x->columns, &x->column_capacity, rows * row_columns + 1);
    CUDA_CHECK(cudaMemcpyAsync(x->q_blocks, q_blocks, (size_t)nqb * sizeof(int64_t), cudaMemcpyDeviceToDevice,
                               stream));
    CUDA_CHECK(cudaMemsetAsync(x->block_start, 0, sizeof(int64_t), stream));
    CUDA_CHECK(cudaMemsetAsync(x->column_start, 0, sizeof(int64_t), stream));
    if (rows == 0) return;                           // a rank without query rows: the empty index
    const size_t smem = (size_t)(nglobal / 32 + 1) * sizeof(unsigned);
    CUDA_CHECK(cudaFuncSetAttribute(index_row_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_CHECK(cudaFuncSetAttribute(index_row_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_LAUNCH(index_row_kernel<false>, (unsigned)rows, SEL_THREADS, smem, stream, *p, *x, doc_starts, docs, sink);
    CUDA_CHECK(cudaGetLastError());
    sparse_inclusive_sum_cuda(x->block_start + 1, rows, stream);
    sparse_inclusive_sum_cuda(x->column_start + 1, rows, stream);
    CUDA_LAUNCH(index_row_kernel<true>, (unsigned)rows, SEL_THREADS, smem, stream, *p, *x, doc_starts, docs, sink);
    CUDA_CHECK(cudaGetLastError());
}
