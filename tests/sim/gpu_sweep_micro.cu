// gpu_sweep_micro.cu: the micro-benchmarks of gpu_sweep_attention
// (gpu_sweep_micro.h), through the wrappers of the attention kernels
// (attention/kernels/flash_tiles.cuh: mma16816, ldmatrix_x4, exp2_approx).
// Each kernel writes a value that depends on all its work, so none of it is
// dropped by the compiler; rates are per SM per clock at the measured clock.
#include <cuda_runtime.h>

#include "../../attention/kernels/flash_tiles.cuh"
#include "../../dist/cuda_check.h"
#include "../../dist/cuda_kernel.h"
#include "gpu_sweep_micro.h"

#define MICRO_THREADS 256

// Thread 0 of every block spins `cycles` of clock64.
__global__ void micro_clock_kernel(long long cycles, long long *out) {
    if (threadIdx.x != 0) return;
    const long long start = clock64();
    long long now = start;
    while (now - start < cycles) now = clock64();
    out[blockIdx.x] = now - start;
}

// Four independent mma.sync per warp per iteration.
__global__ void micro_mma_kernel(int iterations, float *out) {
    const uint32_t a[4] = {threadIdx.x, threadIdx.x + 1, threadIdx.x + 2, threadIdx.x + 3};
    float c[4][4] = {};
    for (int i = 0; i < iterations; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) mma16816(c[j], a, (uint32_t)i, (uint32_t)j);
    out[blockIdx.x * blockDim.x + threadIdx.x] = c[0][0] + c[1][1] + c[2][2] + c[3][3];
}

// ldmatrix.x4 of each warp's 32 rows of 16 bytes (512 contiguous bytes: conflict-free).
__global__ void micro_ldmatrix_kernel(int iterations, uint32_t *out) {
    STATIC_SHARED(bf16, tile, [MICRO_THREADS / 32 * 256]);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < MICRO_THREADS / 32 * 256; i += blockDim.x) tile[i] = __float2bfloat16((float)i);
    __syncthreads();
    uint32_t acc = 0, r[4];
    for (int i = 0; i < iterations; i++) {
        ldmatrix_x4(r, tile + warp * 256 + lane * 8);
        acc ^= r[0] ^ r[1] ^ r[2] ^ r[3];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// Eight independent exp2 chains per thread.
__global__ void micro_exp2_kernel(int iterations, float *out) {
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = 0.01f * (threadIdx.x % 32 + j);
    for (int i = 0; i < iterations; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = exp2_approx(x[j]) - 1.5f;
    out[blockIdx.x * blockDim.x + threadIdx.x] = x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7];
}

// fp32 atomics: each thread adds to its float of a span of `span` floats (consecutive lanes, consecutive floats).
__global__ void micro_atomic_kernel(int iterations, float *x, int64_t span) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < iterations; i++) atomicAdd(x + (t + (int64_t)i * 4096) % span, 1.0f);
}

// The same with float4 atomics (compute capability 9.0 and later): 4 floats per call.
__global__ void micro_atomic4_kernel(int iterations, float *x, int64_t span) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < iterations; i++)
        atomicAdd(reinterpret_cast<float4 *>(x) + (t + (int64_t)i * 4096) % (span / 4), make_float4(1, 1, 1, 1));
#else
    (void)iterations; (void)x; (void)span;
#endif
}

// Milliseconds of what `launch` enqueues on the default stream, after one warm-up.
template <typename F> static float time_ms(F launch) {
    cudaEvent_t start, end;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&end));
    launch();
    CUDA_CHECK(cudaEventRecord(start, 0));
    launch();
    CUDA_CHECK(cudaEventRecord(end, 0));
    CUDA_CHECK(cudaEventSynchronize(end));
    CUDA_CHECK(cudaGetLastError());
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(end));
    return ms > 0 ? ms : 1e-6f;
}

extern "C" void sweep_micro(int blocks, int iterations, SweepMicro *out) {
    int sms, major;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    const int64_t threads = (int64_t)blocks * MICRO_THREADS, span = 1 << 22;
    float *buffer;
    long long *cycles;
    CUDA_CHECK(cudaMalloc((void **)&buffer, (size_t)(threads > span ? threads : span) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&cycles, (size_t)blocks * sizeof(long long)));
    CUDA_CHECK(cudaMemset(buffer, 0, (size_t)span * sizeof(float)));
    // Per benchmark a share of `iterations` that keeps it near 20-50 ms on an H200 at iterations 100000.
    const int ld_iters = iterations / 128 > 0 ? iterations / 128 : 1, half = iterations / 2 > 0 ? iterations / 2 : 1;
    const long long spin = (long long)iterations * 200;
    const float clock_ms = time_ms([&] { CUDA_LAUNCH(micro_clock_kernel, blocks, MICRO_THREADS, 0, 0, spin, cycles); });
    out->sm_clock_mhz = spin / (clock_ms * 1e3);
    const double clocks = out->sm_clock_mhz * 1e3;   // per ms
    const double per_sm = (double)(blocks < sms ? blocks : sms);
    const double warps = threads / 32.0;

    float ms = time_ms([&] { CUDA_LAUNCH(micro_mma_kernel, blocks, MICRO_THREADS, 0, 0, iterations, buffer); });
    out->mma_tflops = warps * iterations * 4 * 4096 / (ms * 1e9);
    out->mma_per_sm_clock = warps * iterations * 4 / (ms * clocks * per_sm);
    ms = time_ms([&] { CUDA_LAUNCH(micro_ldmatrix_kernel, blocks, MICRO_THREADS, 0, 0, ld_iters, (uint32_t *)buffer); });
    out->ldmatrix_bytes_per_sm_clock = warps * ld_iters * 512 / (ms * clocks * per_sm);
    ms = time_ms([&] { CUDA_LAUNCH(micro_exp2_kernel, blocks, MICRO_THREADS, 0, 0, half, buffer); });
    out->exp2_per_sm_clock = (double)threads * half * 8 / (ms * clocks * per_sm);
    ms = time_ms([&] { CUDA_LAUNCH(micro_atomic_kernel, blocks, MICRO_THREADS, 0, 0, half, buffer, span); });
    out->scalar_atomics_per_s = (double)threads * half / (ms * 1e-3);
    out->vector_atomics_per_s = 0;
    if (major >= 9) {
        ms = time_ms([&] { CUDA_LAUNCH(micro_atomic4_kernel, blocks, MICRO_THREADS, 0, 0, half, buffer, span); });
        out->vector_atomics_per_s = (double)threads * half * 4 / (ms * 1e-3);
    }
    CUDA_CHECK(cudaFree(buffer));
    CUDA_CHECK(cudaFree(cycles));
}
