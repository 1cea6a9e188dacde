// cuda_elementwise.cuh: the small device pieces the CUDA sources share, so
// that no file keeps its own copy:
//   grid_for(n, threads)        the grid of a grid-strided launch over n items
//   FOR_EACH(i, n)              the grid-strided loop of such a kernel
//   ld / st                     an element (bf16 or fp32) as fp32, rounded once on store
//   load_group / store_group    GROUP = 8 consecutive elements in fp32
//                               registers: 16-byte loads and stores (one for
//                               bf16, two for fp32) where the caller says the
//                               group is aligned, element by element for a
//                               tail or an unaligned tensor
//   launch_convert(out, in, n)  out[n] = in[n] (fp32 <-> bf16, round to nearest even)
//   launch_add_into(y, x, n)    y[n] += x[n] (bf16 y; bf16 or fp32 x), one rounding
// Kernels of several files are templates here (one definition, as CUB's).
#ifndef MTRAIN_CUDA_ELEMENTWISE_CUH
#define MTRAIN_CUDA_ELEMENTWISE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "cuda_kernel.h"

#define ELEMENTWISE_THREADS 256   // threads per block of the kernels below
#define MAX_BLOCKS 2048           // largest grid: >= one full wave on an A100 and an H100; blocks stride beyond it
#define GROUP 8                   // elements per group: 16 bytes of bf16

// Blocks of `threads` for n grid-strided items: at least one, at most MAX_BLOCKS.
static inline unsigned grid_for(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

#define FOR_EACH(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                            i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void st(float *p, float x) { *p = x; }

// 16 bytes moved by one vector instruction: GROUP bf16 (two per word) or GROUP / 2 fp32.
struct __align__(16) Pack16 {
    uint32_t w[4];
};

// v[k] = p[k] for k < count (count <= GROUP; the rest 0). vec: p is 16-byte
// aligned, and a full group then takes one 16-byte load per 16 bytes.
__device__ __forceinline__ void load_group(float (&v)[GROUP], const __nv_bfloat16 *p, int count, bool vec) {
    if (vec && count == GROUP) {
        const Pack16 pk = *reinterpret_cast<const Pack16 *>(p);
#pragma unroll
        for (int k = 0; k < GROUP / 2; k++) {
            v[2 * k] = __uint_as_float(pk.w[k] << 16);          // bf16 bits are the fp32's upper half
            v[2 * k + 1] = __uint_as_float(pk.w[k] & 0xffff0000u);
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < GROUP; k++) v[k] = k < count ? ld(p + k) : 0.0f;
}

__device__ __forceinline__ void load_group(float (&v)[GROUP], const float *p, int count, bool vec) {
    if (vec && count == GROUP) {
        const float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        return;
    }
#pragma unroll
    for (int k = 0; k < GROUP; k++) v[k] = k < count ? p[k] : 0.0f;
}

// p[k] = v[k] (rounded to nearest even) for k < count; vec as for load_group.
__device__ __forceinline__ void store_group(__nv_bfloat16 *p, const float (&v)[GROUP], int count, bool vec) {
    if (vec && count == GROUP) {
        Pack16 pk;
#pragma unroll
        for (int k = 0; k < GROUP / 2; k++)
            pk.w[k] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16(v[2 * k])) |
                      (uint32_t)__bfloat16_as_ushort(__float2bfloat16(v[2 * k + 1])) << 16;
        *reinterpret_cast<Pack16 *>(p) = pk;
        return;
    }
#pragma unroll
    for (int k = 0; k < GROUP; k++)
        if (k < count) st(p + k, v[k]);
}

__device__ __forceinline__ void store_group(float *p, const float (&v)[GROUP], int count, bool vec) {
    if (vec && count == GROUP) {
        reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
#pragma unroll
    for (int k = 0; k < GROUP; k++)
        if (k < count) p[k] = v[k];
}

// Elements in the group starting at i of a tensor of n.
__device__ __forceinline__ int group_count(int64_t i, int64_t n) { return n - i < GROUP ? (int)(n - i) : GROUP; }

// This thread's groups of [0, n), grid-strided: i the group's first element,
// count its elements (GROUP, fewer in the tail).
#define FOR_EACH_GROUP(i, count, n) \
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * GROUP, count = group_count(i, n); \
         i < (n); i += (int64_t)gridDim.x * blockDim.x * GROUP, count = group_count(i, n))

// ---- the shared element-wise kernels ----

// out[n] = in[n]; vec: both 16-byte aligned.
template <typename Out, typename In>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) convert_kernel(Out *out, const In *in, int64_t n, bool vec) {
    FOR_EACH_GROUP(i, count, n) {
        float v[GROUP];
        load_group(v, in + i, count, vec);
        store_group(out + i, v, count, vec);
    }
}

// y[n] += x[n] in fp32, y rounded once; vec: both 16-byte aligned.
template <typename Y, typename X>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS) add_into_kernel(Y *y, const X *x, int64_t n, bool vec) {
    FOR_EACH_GROUP(i, count, n) {
        float a[GROUP], b[GROUP];
        load_group(a, y + i, count, vec);
        load_group(b, x + i, count, vec);
#pragma unroll
        for (int k = 0; k < GROUP; k++) a[k] += b[k];
        store_group(y + i, a, count, vec);
    }
}

// kernel(a, b, n, vec) over the groups of n elements.
template <typename A, typename B>
static inline void launch_groups(void (*kernel)(A *, const B *, int64_t, bool), A *a, const B *b, int64_t n,
                                 cudaStream_t stream) {
    if (n == 0) return;
    CUDA_LAUNCH(kernel, grid_for((n + GROUP - 1) / GROUP, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream,
                a, b, n, aligned16(a) && aligned16(b));
    CUDA_CHECK(cudaGetLastError());
}

template <typename Out, typename In>
static inline void launch_convert(Out *out, const In *in, int64_t n, cudaStream_t stream) {
    launch_groups(convert_kernel<Out, In>, out, in, n, stream);
}

template <typename Y, typename X>
static inline void launch_add_into(Y *y, const X *x, int64_t n, cudaStream_t stream) {
    launch_groups(add_into_kernel<Y, X>, y, x, n, stream);
}

#endif
