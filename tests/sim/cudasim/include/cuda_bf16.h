// cuda_bf16.h (cudasim): __nv_bfloat16 / __nv_bfloat162 and the conversions
// the project's kernels use, as host code. Conversions from float round to
// nearest even (CUDA Math API, "Bfloat16 Precision Conversion"); NaN stays NaN.
#ifndef CUDASIM_CUDA_BF16_H
#define CUDASIM_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

// A global-namespace struct, as in the toolkit, so that g++ and nvcc mangle
// kernel names alike.
struct __nv_bfloat16 {
    unsigned short __x;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) b.__x = (unsigned short)((u >> 16) | 0x40);   // quiet NaN
    else b.__x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) {
    const uint32_t u = (uint32_t)b.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 b) {
    return make_float2(__bfloat162float(b.x), __bfloat162float(b.y));
}
static inline float __low2float(__nv_bfloat162 b) { return __bfloat162float(b.x); }
static inline float __high2float(__nv_bfloat162 b) { return __bfloat162float(b.y); }

#endif
