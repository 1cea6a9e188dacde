// ops_cuda.cu: the element-wise, normalisation, embedding, loss and optimizer
// kernels of the CUDA backend (API and semantics: ops_cuda.h). Every kernel
// has blocks of THREADS threads and a grid of at most MAX_BLOCKS blocks that
// stride over the tensor: element-wise kernels one group of GROUP = 8
// elements per thread (16-byte loads where the tensors are aligned, element
// by element for the tail; dist/cuda_elementwise.cuh), the RMSNorm forward
// one row per warp, the other row kernels (its backward, cross entropy) one
// row per block at a time, RMSNorm with 16-byte loads where H is a multiple
// of GROUP. Reductions
// combine in a fixed order (warp butterflies, then the warps in order, then
// blocks' partial sums in order by one more kernel), never with atomics, so
// every result is bitwise reproducible.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../dist/cuda_check.h"
#include "../dist/cuda_elementwise.cuh"
#include "../dist/cuda_kernel.h"
#include "ops_cuda.h"

typedef __nv_bfloat16 bf16;

#define THREADS ELEMENTWISE_THREADS   // threads per block of every kernel
#define WARPS (THREADS / 32)
#define RMSNORM_BWD_BLOCKS 512 // blocks, and so dweight partial sums, of the RMSNorm backward
#define RMSNORM_BWD_MAX_H 8192 // its dweight sums: H fp32 of shared memory, within the default 48 KiB
#define EMBEDDING_BWD_BLOCKS 512 // about this many (vocabulary class, column tile) blocks in the embedding backward

// Sum of v over the block, returned to every thread (scratch [WARPS]; the
// block's threads all call it). Butterflies give every lane the same bits.
__device__ __forceinline__ double block_sum(double v, double *scratch) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();   // scratch free from the previous call
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    double total = scratch[0];
    for (int w = 1; w < WARPS; w++) total += scratch[w];
    return total;
}

// ---- embedding ----

// out[t, :] = table[tokens[t], :]; each block strides over the rows.
__global__ void __launch_bounds__(THREADS)
embedding_forward_kernel(bf16 *out, const int32_t *tokens, const bf16 *table, int64_t T, int H) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const bf16 *src = table + (int64_t)tokens[t] * H;
        for (int c = threadIdx.x; c < H; c += THREADS) out[t * H + c] = src[c];
    }
}

// Block (r, y) owns the vocabulary rows v with v % gridDim.x == r (frequent
// tokens, often neighbours in a BPE vocabulary, land in different blocks) and
// the columns [y THREADS, (y + 1) THREADS), one per thread; it scans every
// token in order (THREADS at a time through shared memory, a warp ballot per
// 32) and adds the matching rows of dout. A run of equal tokens is summed in a
// register, loaded from and stored to dtable once: the additions per element
// are the CPU's, in increasing t, with no atomics.
__global__ void __launch_bounds__(THREADS)
embedding_backward_kernel(float *dtable, const int32_t *tokens, const bf16 *dout, int64_t T, int H) {
    STATIC_SHARED(int32_t, chunk, [THREADS]);
    const int col = blockIdx.y * THREADS + threadIdx.x, lane = threadIdx.x % 32;
    int64_t run = -1;   // the row being summed in acc
    float acc = 0.0f;
    for (int64_t t0 = 0; t0 < T; t0 += THREADS) {
        __syncthreads();   // every warp is done with the previous chunk
        chunk[threadIdx.x] = t0 + threadIdx.x < T ? tokens[t0 + threadIdx.x] : -1;
        __syncthreads();
        for (int w = 0; w < THREADS; w += 32) {
            const int32_t tok = chunk[w + lane];
            unsigned hits = __ballot_sync(0xffffffffu, tok >= 0 && tok % gridDim.x == blockIdx.x);
            while (hits) {
                const int i = __ffs((int)hits) - 1;
                hits &= hits - 1;
                if (col >= H) continue;
                const int64_t row = chunk[w + i];
                if (row != run) {
                    if (run >= 0) dtable[run * H + col] = acc;
                    run = row;
                    acc = dtable[run * H + col];
                }
                acc += ld(dout + (t0 + w + i) * H + col);
            }
        }
    }
    if (run >= 0) dtable[run * H + col] = acc;
}

// ---- RMSNorm ----

// This thread's groups of a row of H: columns [c, c + count).
#define FOR_EACH_ROW_GROUP(c, count, H) \
    for (int c = threadIdx.x * GROUP, count = group_count(c, H); c < (H); \
         c += THREADS * GROUP, count = group_count(c, H))

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// This lane's groups of a row of H: columns [c, c + count), lane the thread's lane in its warp.
#define FOR_EACH_LANE_GROUP(c, count, H, lane) \
    for (int c = (lane) * GROUP, count = group_count(c, H); c < (H); c += 32 * GROUP, count = group_count(c, H))

// One warp per row (WARPS rows of a block at a time): x += delta when delta
// is not NULL (x rounded once and written back by the lane that read it; the
// norm reads the rounded x, as the unfused add then norm would), then out = x
// * r * weight with r = rstd[t] = 1/sqrt(mean(x^2) + eps), the sum of squares
// by the warp's butterfly (every lane the same bits). vec: every row 16-byte
// aligned (H a multiple of GROUP, pointers aligned).
__global__ void __launch_bounds__(THREADS)
rmsnorm_forward_kernel(bf16 *out, float *rstd, bf16 *inp, const bf16 *delta, const bf16 *weight, int64_t T, int H,
                       float eps, bool vec) {
    const int lane = threadIdx.x % 32;
    for (int64_t t = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; t < T; t += (int64_t)gridDim.x * WARPS) {
        bf16 *x = inp + t * H;
        double ss = 0;
        FOR_EACH_LANE_GROUP(c, count, H, lane) {
            float v[GROUP];
            load_group(v, x + c, count, vec);
            if (delta) {
                float d[GROUP];
                load_group(d, delta + t * H + c, count, vec);
#pragma unroll
                for (int k = 0; k < GROUP; k++) v[k] = round_bf16(v[k] + d[k]);
                store_group(x + c, v, count, vec);
            }
#pragma unroll
            for (int k = 0; k < GROUP; k++) ss += (double)v[k] * v[k];   // 0 past the row's end
        }
        for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        const float r = (float)(1.0 / sqrt(ss / H + eps));
        if (lane == 0) rstd[t] = r;
        FOR_EACH_LANE_GROUP(c, count, H, lane) {
            float v[GROUP], w[GROUP];
            load_group(v, x + c, count, vec);
            load_group(w, weight + c, count, vec);
#pragma unroll
            for (int k = 0; k < GROUP; k++) v[k] = v[k] * r * w[k];
            store_group(out + t * H + c, v, count, vec);
        }
    }
}

// dinp rows as on the CPU; block b takes rows b, b + gridDim.x, ... and sums
// dy x r per column in shared memory (each thread its own columns), then
// writes them to partial[b, H]. vec as for the forward.
__global__ void __launch_bounds__(THREADS)
rmsnorm_backward_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *weight,
                        const float *rstd, int64_t T, int H, bool vec) {
    DYNAMIC_SHARED(float, dw);
    STATIC_SHARED(double, scratch, [WARPS]);
    for (int c = threadIdx.x; c < H; c += THREADS) dw[c] = 0.0f;
    __syncthreads();   // a thread's columns differ between the two loops
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const bf16 *x = inp + t * H, *dy = dout + t * H;
        double dot = 0;
        FOR_EACH_ROW_GROUP(c, count, H) {
            float w[GROUP], g[GROUP], xv[GROUP];
            load_group(w, weight + c, count, vec);
            load_group(g, dy + c, count, vec);
            load_group(xv, x + c, count, vec);
#pragma unroll
            for (int k = 0; k < GROUP; k++) dot += (double)w[k] * g[k] * xv[k];
        }
        dot = block_sum(dot, scratch);
        const float r = rstd[t], coef = (float)(dot / H) * r * r * r;
        FOR_EACH_ROW_GROUP(c, count, H) {
            float w[GROUP], g[GROUP], xv[GROUP], dx[GROUP];
            load_group(w, weight + c, count, vec);
            load_group(g, dy + c, count, vec);
            load_group(xv, x + c, count, vec);
            load_group(dx, dinp + t * H + c, count, vec);
#pragma unroll
            for (int k = 0; k < GROUP; k++) {
                dx[k] += r * w[k] * g[k] - coef * xv[k];
                if (k < count) dw[c + k] += g[k] * xv[k] * r;
            }
            store_group(dinp + t * H + c, dx, count, vec);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < H; c += THREADS) partial[(int64_t)blockIdx.x * H + c] = dw[c];
}

// out[c] += sum over r of partial[r, c], r in order (one thread per column).
__global__ void __launch_bounds__(THREADS) add_column_sums_kernel(float *out, const float *partial, int rows, int H) {
    const int c = blockIdx.x * THREADS + threadIdx.x;
    if (c >= H) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; r++) acc += partial[(int64_t)r * H + c];
    out[c] += acc;
}

// ---- RoPE ----

// Pair i of every head of dst[heads, D] = src[heads, D] rotated by (c, s).
__device__ __forceinline__ void rope_heads(bf16 *dst, const bf16 *src, int heads, int D, int i, float c, float s) {
    const int half = D / 2;
    for (int h = 0; h < heads; h++) {
        const bf16 *x = src + h * D;
        bf16 *y = dst + h * D;
        const float x1 = ld(x + i), x2 = ld(x + half + i);
        st(y + i, x1 * c - x2 * s);
        st(y + half + i, x2 * c + x1 * s);
    }
}

// Pair i of every head of dst[heads, D] = src[heads, D].
__device__ __forceinline__ void copy_heads(bf16 *dst, const bf16 *src, int heads, int D, int i) {
    const int half = D / 2;
    for (int h = 0; h < heads; h++) {
        dst[h * D + i] = src[h * D + i];
        dst[h * D + half + i] = src[h * D + half + i];
    }
}

// One thread per (t, i < D/2): the angle's cos and sin once, then pair i of
// every head of token t's q, k (rotated) and v (copied), from the fused row
// to q, k, v (inverse 0) or back (inverse 1).
__global__ void __launch_bounds__(THREADS)
rope_kernel(bf16 *qkv, bf16 *q, bf16 *k, bf16 *v, int q_heads, int k_heads, const int64_t *pos, int64_t T, int D,
            const double *inv_freq, double attention_factor, int inverse) {
    const int half = D / 2;
    const int64_t QD = (int64_t)q_heads * D, KD = (int64_t)k_heads * D;
    for (int64_t p = (int64_t)blockIdx.x * THREADS + threadIdx.x; p < T * half; p += (int64_t)gridDim.x * THREADS) {
        const int64_t t = p / half;
        const int i = (int)(p - t * half);
        // The angle reduced to [-pi, pi] in double (exact to ~1e-10 at a million positions), then its sine
        // and cosine in float: no double-precision reduction call (whose saved registers spill).
        const double angle = (double)pos[t] * inv_freq[i];
        const float reduced = (float)(angle - 2.0 * M_PI * rint(angle * (0.5 / M_PI)));
        float sin_angle, cos_angle;
        sincosf(reduced, &sin_angle, &cos_angle);
        const float c = (float)attention_factor * cos_angle;
        const float s = (float)attention_factor * (inverse ? -sin_angle : sin_angle);
        bf16 *row = qkv + t * (QD + 2 * KD), *qt = q + t * QD, *kt = k + t * KD, *vt = v + t * KD;
        if (inverse) {
            rope_heads(row, qt, q_heads, D, i, c, s);
            rope_heads(row + QD, kt, k_heads, D, i, c, s);
            copy_heads(row + QD + KD, vt, k_heads, D, i);
        } else {
            rope_heads(qt, row, q_heads, D, i, c, s);
            rope_heads(kt, row + QD, k_heads, D, i, c, s);
            copy_heads(vt, row + QD + KD, k_heads, D, i);
        }
    }
}

// ---- SwiGLU ----

// Element e of the MLP's [rows, width] activations: its gate's index in
// gate_up [rows, 2 width] (its up's is width further on).
__device__ __forceinline__ int64_t gate_index(int64_t e, int width) { return e / width * 2 * width + e % width; }

// g, u = the gates and ups of the group of count elements from e; vec: the
// group lies in one row and is 16-byte aligned (width a multiple of GROUP).
__device__ __forceinline__ void load_gate_up(float (&g)[GROUP], float (&u)[GROUP], const bf16 *gate_up, int64_t e,
                                             int count, int width, bool vec) {
    if (vec) {
        const bf16 *p = gate_up + gate_index(e, width);
        load_group(g, p, count, true);
        load_group(u, p + width, count, true);
        return;
    }
#pragma unroll
    for (int k = 0; k < GROUP; k++) {
        const bf16 *p = gate_up + gate_index(e + k, width);
        g[k] = k < count ? ld(p) : 0.0f;
        u[k] = k < count ? ld(p + width) : 0.0f;
    }
}

// One group of GROUP elements of the [rows, width] activations per thread, from e on.
__global__ void __launch_bounds__(THREADS)
swiglu_forward_kernel(bf16 *out, const bf16 *gate_up, int64_t rows, int width, bool vec) {
    FOR_EACH_GROUP(e, count, rows * width) {
        float g[GROUP], u[GROUP];
        load_gate_up(g, u, gate_up, e, (int)count, width, vec);
#pragma unroll
        for (int k = 0; k < GROUP; k++) g[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
        store_group(out + e, g, (int)count, vec);
    }
}

__global__ void __launch_bounds__(THREADS)
swiglu_backward_kernel(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int64_t rows, int width, bool vec) {
    FOR_EACH_GROUP(e, count, rows * width) {
        float g[GROUP], u[GROUP], dy[GROUP], dg[GROUP], du[GROUP];
        load_gate_up(g, u, gate_up, e, (int)count, width, vec);
        load_group(dy, dout + e, (int)count, vec);
#pragma unroll
        for (int k = 0; k < GROUP; k++) {
            const float s = 1.0f / (1.0f + expf(-g[k]));
            dg[k] = dy[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
            du[k] = dy[k] * g[k] * s;
        }
        if (vec) {
            bf16 *p = dgate_up + gate_index(e, width);
            store_group(p, dg, (int)count, true);
            store_group(p + width, du, (int)count, true);
            continue;
        }
        for (int k = 0; k < count; k++) {
            bf16 *p = dgate_up + gate_index(e + k, width);
            st(p, dg[k]);
            st(p + width, du[k]);
        }
    }
}

// ---- reductions to one double ----

// partial[b] = this block's share of sum x^2 (grid-strided, in double).
__global__ void __launch_bounds__(THREADS) sum_squares_kernel(const float *x, int64_t n, double *partial) {
    STATIC_SHARED(double, scratch, [WARPS]);
    double acc = 0;
    FOR_EACH(i, n) acc += (double)x[i] * x[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *total += sum of partial[n], one block.
__global__ void __launch_bounds__(THREADS) add_sum_kernel(double *total, const double *partial, int64_t n) {
    STATIC_SHARED(double, scratch, [WARPS]);
    double acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += THREADS) acc += partial[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) *total += acc;
}

// ---- cross entropy ----

// (max, sum of exp(x - max)) of two parts of a row; max -inf: an empty part.
__device__ __forceinline__ void softmax_merge(float &m, float &s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return;
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

// One block per row: online max and sum per thread, merged over the block,
// then the row rewritten as its gradient; row_loss[row] = lse - x[target].
__global__ void __launch_bounds__(THREADS)
cross_entropy_kernel(bf16 *logits, const int32_t *targets, int64_t C, int V, float grad_scale, double *row_loss) {
    STATIC_SHARED(float, part_max, [WARPS]);
    STATIC_SHARED(float, part_sum, [WARPS]);
    for (int64_t t = blockIdx.x; t < C; t += gridDim.x) {
        bf16 *row = logits + t * V;
        const int32_t target = targets[t];
        if (target < 0) {
            for (int c = threadIdx.x; c < V; c += THREADS) st(row + c, 0.0f);
            if (threadIdx.x == 0) row_loss[t] = 0;
            continue;
        }
        float m = -INFINITY, s = 0.0f;
        for (int c = threadIdx.x; c < V; c += THREADS) softmax_merge(m, s, ld(row + c), 1.0f);
        for (int off = 16; off > 0; off /= 2)
            softmax_merge(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
        if (threadIdx.x % 32 == 0) {
            part_max[threadIdx.x / 32] = m;
            part_sum[threadIdx.x / 32] = s;
        }
        __syncthreads();
        m = part_max[0];
        s = part_sum[0];
        for (int w = 1; w < WARPS; w++) softmax_merge(m, s, part_max[w], part_sum[w]);
        const float lse = m + logf(s);
        if (threadIdx.x == 0) row_loss[t] = (double)lse - ld(row + target);
        __syncthreads();   // x[target] and the parts are read before they are overwritten
        for (int c = threadIdx.x; c < V; c += THREADS) {
            const float g = expf(ld(row + c) - lse) * grad_scale;
            st(row + c, c == target ? g - grad_scale : g);
        }
    }
}

// ---- AdamW ----

// One step's hyperparameters; c1, c2 the bias corrections 1 - beta1^step, 1 - beta2^step.
struct AdamWHyper {
    float lr, beta1, beta2, eps, grad_scale, c1, c2;
};

// Block b takes runs b, b + gridDim.x, ...; its threads stride over each run.
__global__ void __launch_bounds__(THREADS)
adamw_kernel(float *param, bf16 *param_bf16, const float *grad, float *m, float *v, const AdamWRun *runs, int count,
             AdamWHyper hp) {
    for (int r = blockIdx.x; r < count; r += gridDim.x) {
        const AdamWRun run = runs[r];
        for (int64_t i = run.offset + threadIdx.x; i < run.offset + run.n; i += THREADS) {
            const float g = grad[i] * hp.grad_scale;
            const float mi = hp.beta1 * m[i] + (1.0f - hp.beta1) * g, vi = hp.beta2 * v[i] + (1.0f - hp.beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            const float mhat = mi / hp.c1, vhat = vi / hp.c2;
            const float p = param[i] - hp.lr * (mhat / (sqrtf(vhat) + hp.eps) + run.weight_decay * param[i]);
            param[i] = p;
            st(param_bf16 + i, p);
        }
    }
}

// ---- host side ----

static unsigned row_grid(int64_t rows) { return (unsigned)(rows > MAX_BLOCKS ? MAX_BLOCKS : rows); }

extern "C" void embedding_forward_cuda(uint16_t *out, const int32_t *tokens, const uint16_t *table, int64_t T,
                                       int H, cudaStream_t stream) {
    if (T == 0) return;
    CUDA_LAUNCH(embedding_forward_kernel, row_grid(T), THREADS, 0, stream, (bf16 *)out, tokens,
                (const bf16 *)table, T, H);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void embedding_backward_cuda(float *dtable, const int32_t *tokens, const uint16_t *dout, int64_t T,
                                        int H, cudaStream_t stream) {
    if (T == 0) return;
    const int tiles = (H + THREADS - 1) / THREADS;
    const dim3 grid((unsigned)((EMBEDDING_BWD_BLOCKS + tiles - 1) / tiles), (unsigned)tiles);
    CUDA_LAUNCH(embedding_backward_kernel, grid, THREADS, 0, stream, dtable, tokens, (const bf16 *)dout, T, H);
    CUDA_CHECK(cudaGetLastError());
}

// Whether rows of H elements at these pointers are all 16-byte aligned.
static bool rows_aligned(int H, const void *a, const void *b, const void *c, const void *d) {
    return H % GROUP == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

// x += delta (delta not NULL), then the norm of x (the forward kernel's two cases).
static void rmsnorm_rows(bf16 *out, float *rstd, bf16 *x, const bf16 *delta, const bf16 *weight, int64_t T, int H,
                         float eps, cudaStream_t stream) {
    if (T == 0) return;
    const bool vec = rows_aligned(H, out, x, delta ? (const void *)delta : (const void *)x, weight);
    CUDA_LAUNCH(rmsnorm_forward_kernel, row_grid((T + WARPS - 1) / WARPS), THREADS, 0, stream, out, rstd, x, delta,
                weight, T, H, eps, vec);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void rmsnorm_forward_cuda(uint16_t *out, float *rstd, const uint16_t *inp, const uint16_t *weight,
                                     int64_t T, int H, float eps, cudaStream_t stream) {
    // Without delta the kernel only reads x.
    rmsnorm_rows((bf16 *)out, rstd, (bf16 *)inp, NULL, (const bf16 *)weight, T, H, eps, stream);
}

extern "C" void residual_rmsnorm_forward_cuda(uint16_t *out, float *rstd, uint16_t *x, const uint16_t *delta,
                                              const uint16_t *weight, int64_t T, int H, float eps,
                                              cudaStream_t stream) {
    rmsnorm_rows((bf16 *)out, rstd, (bf16 *)x, (const bf16 *)delta, (const bf16 *)weight, T, H, eps, stream);
}

extern "C" void rmsnorm_backward_cuda(uint16_t *dinp, float *dweight, const uint16_t *dout, const uint16_t *inp,
                                      const uint16_t *weight, const float *rstd, int64_t T, int H,
                                      cudaStream_t stream) {
    CHECK(H <= RMSNORM_BWD_MAX_H, "rmsnorm_backward_cuda: H = %d is above %d (dweight sums in shared memory)", H,
          RMSNORM_BWD_MAX_H);
    const size_t smem = (size_t)H * sizeof(float);
    if (T == 0) return;
    const int blocks = T < RMSNORM_BWD_BLOCKS ? (int)T : RMSNORM_BWD_BLOCKS;
    float *partial;
    CUDA_CHECK(cudaMallocAsync((void **)&partial, (size_t)blocks * smem, stream));
    CUDA_LAUNCH(rmsnorm_backward_kernel, blocks, THREADS, smem, stream, (bf16 *)dinp, partial, (const bf16 *)dout,
                (const bf16 *)inp, (const bf16 *)weight, rstd, T, H, rows_aligned(H, dinp, dout, inp, weight));
    CUDA_CHECK(cudaGetLastError());
    CUDA_LAUNCH(add_column_sums_kernel, (H + THREADS - 1) / THREADS, THREADS, 0, stream, dweight, partial, blocks, H);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(partial, stream));
}

extern "C" void rope_cuda(uint16_t *qkv, uint16_t *q, uint16_t *k, uint16_t *v, int q_heads, int k_heads,
                          const int64_t *pos, int64_t T, int D, const double *inv_freq, double attention_factor,
                          int inverse, cudaStream_t stream) {
    CHECK(D > 0 && D % 2 == 0, "rope_cuda: head dim %d is not even", D);
    if (T == 0) return;
    CUDA_LAUNCH(rope_kernel, grid_for(T * (D / 2), THREADS), THREADS, 0, stream, (bf16 *)qkv, (bf16 *)q, (bf16 *)k,
                (bf16 *)v, q_heads, k_heads, pos, T, D, inv_freq, attention_factor, inverse);
    CUDA_CHECK(cudaGetLastError());
}

// 16-byte groups when every row's gates and ups are whole aligned groups.
static bool gate_up_aligned(const void *out, const void *gate_up, int width) {
    return width % GROUP == 0 && aligned16(out) && aligned16(gate_up);
}

extern "C" void swiglu_forward_cuda(uint16_t *out, const uint16_t *gate_up, int64_t rows, int width,
                                    cudaStream_t stream) {
    if (rows * width == 0) return;
    CUDA_LAUNCH(swiglu_forward_kernel, grid_for((rows * width + GROUP - 1) / GROUP, THREADS), THREADS, 0, stream,
                (bf16 *)out, (const bf16 *)gate_up, rows, width, gate_up_aligned(out, gate_up, width));
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void swiglu_backward_cuda(uint16_t *dgate_up, const uint16_t *dout, const uint16_t *gate_up, int64_t rows,
                                     int width, cudaStream_t stream) {
    if (rows * width == 0) return;
    CUDA_LAUNCH(swiglu_backward_kernel, grid_for((rows * width + GROUP - 1) / GROUP, THREADS), THREADS, 0, stream,
                (bf16 *)dgate_up, (const bf16 *)dout, (const bf16 *)gate_up, rows, width,
                gate_up_aligned(dout, gate_up, width) && aligned16(dgate_up));
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void accumulate_cuda(uint16_t *y, const uint16_t *x, int64_t n, cudaStream_t stream) {
    launch_add_into((bf16 *)y, (const bf16 *)x, n, stream);
}

// *total += sum of partial[n], then partial released (stream order).
static void add_partials(double *total, double *partial, int64_t n, cudaStream_t stream) {
    CUDA_LAUNCH(add_sum_kernel, 1, THREADS, 0, stream, total, (const double *)partial, n);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(partial, stream));
}

extern "C" void sum_squares_cuda(const float *x, int64_t n, double *total, cudaStream_t stream) {
    if (n == 0) return;
    const unsigned blocks = grid_for(n, THREADS);
    double *partial;
    CUDA_CHECK(cudaMallocAsync((void **)&partial, blocks * sizeof(double), stream));
    CUDA_LAUNCH(sum_squares_kernel, blocks, THREADS, 0, stream, x, n, partial);
    CUDA_CHECK(cudaGetLastError());
    add_partials(total, partial, blocks, stream);
}

extern "C" void cross_entropy_cuda(uint16_t *logits, const int32_t *targets, int64_t C, int V, float grad_scale,
                                   double *loss, cudaStream_t stream) {
    if (C == 0) return;
    double *row_loss;
    CUDA_CHECK(cudaMallocAsync((void **)&row_loss, (size_t)C * sizeof(double), stream));
    CUDA_LAUNCH(cross_entropy_kernel, row_grid(C), THREADS, 0, stream, (bf16 *)logits, targets, C, V, grad_scale,
                row_loss);
    CUDA_CHECK(cudaGetLastError());
    add_partials(loss, row_loss, C, stream);
}

extern "C" void adamw_cuda(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v,
                           const AdamWRun *runs, int count, float lr, float beta1, float beta2, float eps,
                           float grad_scale, int64_t step, cudaStream_t stream) {
    if (count == 0) return;
    const AdamWHyper hp = {lr, beta1, beta2, eps, grad_scale, 1.0f - powf(beta1, (float)step),
                           1.0f - powf(beta2, (float)step)};
    CUDA_LAUNCH(adamw_kernel, row_grid(count), THREADS, 0, stream, param, (bf16 *)param_bf16, grad, m, v, runs,
                count, hp);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void f32_to_bf16_cuda(uint16_t *out, const float *in, int64_t n, cudaStream_t stream) {
    launch_convert((bf16 *)out, in, n, stream);
}

extern "C" void bf16_to_f32_cuda(float *out, const uint16_t *in, int64_t n, cudaStream_t stream) {
    launch_convert(out, (const bf16 *)in, n, stream);
}
