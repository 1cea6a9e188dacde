// gpu_common.h: helpers shared by the GPU test programs (tests/sim/gpu_test_*.c):
// counted checks, bf16 random inputs with their fp32 values, device copies,
// poisoned (NaN-filled) device outputs and the relative Frobenius error.
// Include after check.h.
#ifndef MTRAIN_GPU_COMMON_H
#define MTRAIN_GPU_COMMON_H

#include <math.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"

static int checks = 0;         // checks run (check.h counts the failures)
#define EXPECT_COUNTED(cond, ...) do { checks++; EXPECT(cond, __VA_ARGS__); } while (0)

// ||a - b|| / max(||b||, floor sqrt(n)); equal entries (both -inf too) count
// zero, NaN gives NaN. The floor is for quantities that can cancel to rounding
// noise (a dQ increment where every query sees one key: dS = P (dP - delta) = 0).
static inline double rel_frobenius_floor(const float *a, const float *b, int64_t n, double floor) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] == b[i]) { norm += isfinite(b[i]) ? (double)b[i] * b[i] : 0; continue; }
        const double d = (double)a[i] - (double)b[i];
        diff += d * d;
        norm += (double)b[i] * b[i];
    }
    return sqrt(diff) / (fmax(sqrt(norm), floor * sqrt((double)n)) + 1e-30);
}

static inline double rel_frobenius(const float *a, const float *b, int64_t n) {
    return rel_frobenius_floor(a, b, n, 0.0);
}

// RMS below which a dQ or dK increment is rounding noise (N = 1: one key per query).
#define GRAD_FLOOR 1e-3

// n standard normal values rounded to bf16: bits and their fp32 values.
static inline void random_bf16(Rng *rng, int64_t n, uint16_t **bits, float **values) {
    *bits = xmalloc((size_t)n * sizeof(uint16_t));
    *values = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        (*bits)[i] = f32_to_bf16((float)rng_normal(rng));
        (*values)[i] = bf16_to_f32((*bits)[i]);
    }
}

static inline float *random_f32(Rng *rng, int64_t n) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_normal(rng);
    return x;
}

static inline void *to_device(const void *host, size_t bytes) {
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, bytes ? bytes : 1));
    if (bytes) CUDA_CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return dev;
}

// A device buffer filled with 0xff bytes: NaN as fp32 and as bf16.
static inline void *poisoned(size_t bytes) {
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(dev, 0xff, bytes));
    return dev;
}

static inline float *from_device_f32(const float *dev, int64_t n) {
    float *x = xmalloc((size_t)n * sizeof(float) + 1);
    CUDA_CHECK(cudaMemcpy(x, dev, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return x;
}

static inline float *from_device_bf16(const uint16_t *dev, int64_t n) {
    uint16_t *bits = xmalloc((size_t)n * sizeof(uint16_t) + 1);
    CUDA_CHECK(cudaMemcpy(bits, dev, (size_t)n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    float *x = xmalloc((size_t)n * sizeof(float) + 1);
    for (int64_t i = 0; i < n; i++) x[i] = bf16_to_f32(bits[i]);
    free(bits);
    return x;
}

// x - base, elementwise, in place: the increment of an accumulated gradient.
static inline void subtract(float *x, const float *base, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] -= base[i];
}

#endif
