// sim_selftest.cu: small kernels, deliberately wrong and right, with which the
// CPU execution model of CUDA (tests/sim/cudasim/) shows that it catches each
// class of bug; built only for the sim (build/sim/tests/sim_selftest, and
// sim_selftest_asan with AddressSanitizer). `sim_selftest CASE` runs one:
//   reuse_nosync / reuse_sync    shared buffer rewritten without / with a barrier: prints wrong / correct
//   cp_async_early / cp_async_waited   read before / after cp.async.wait_group: prints poison / correct
//   streams_nowait / streams_event / streams_legacy   a kernel on stream 2 reads what one on stream 1
//                                wrote: no dependency / cudaStreamWaitEvent / stream 2 is the legacy
//                                default stream: prints wrong / correct / correct
//   streams_far_nowait / streams_far_event   stream 1 overwrites, 16 launches later, what a kernel on
//                                stream 2 reads: no dependency / stream 1 waits for the read by an
//                                event: prints wrong / correct
//   shfl_missing_lane            a lane exits before a full-mask shuffle: one cudasim line, exit 1
//   misaligned_cp_async          cp.async to an 8-byte aligned address: one cudasim line, exit 1
//   barrier_divergence           __syncthreads in half the block: one cudasim line, exit 1
//   oob_read                     reads one float past a cudaMalloc (ASan build: heap-buffer-overflow)
//   launch_limits                launch errors as the hardware gives them (ok / FAIL lines)
//   polled                       cudaEventQuery over an operation complete on its 10th attempt; the
//                                not-ready answer as the last error until cudaGetLastError (ok / FAIL lines)
//   host_memory                  async copies with pinned and pageable host memory, the host
//                                synchronisations by call site, stream priorities (ok / FAIL lines)
//   devices                      the visible devices: count and PCI bus ids (CUDA_VISIBLE_DEVICES)
//   fragments                    mma.sync and ldmatrix element by element against the PTX ISA tables
//   memory_peak                  cudasimMemoryPeak: cudaMalloc's bytes plus the pool's high-water mark (ok / FAIL)
//   hopper_gemm                  TMA (every swizzle, out-of-bounds zero fill) on an mbarrier, then wgmma
//                                m64nNk16 (N 64, 128, 256) against a CPU GEMM, also with B MN-major; a
//                                descriptor of the wrong swizzle or major-ness wrong; the Hopper counts (ok / FAIL)
//   mbarrier_wrong_phase / wgmma_early_read   a wait on the wrong parity / the accumulators read before
//                                wgmma.wait_group: prints poison
//   mbarrier_no_expect_tx / mbarrier_missing_bytes / wgmma_early_write / wgmma_no_fence /
//   wgmma_operand_overwritten / setmaxnreg_odd / setmaxnreg_over   one cudasim line, exit 1
//   pipeline / pipeline_wrong_parity   a producer thread and a consumer warpgroup over two stages of TMA
//                                tiles (full and empty mbarriers, phases reused): waits on the stage's
//                                parity / always on parity 0: prints correct / one cudasim line, exit 1
//   setmaxnreg                   producer .dec 40, consumers .inc 232 in any order: prints correct
//   banks                        shared-memory wavefronts of cp.async and ldmatrix: rows 128 bytes apart
//                                counted 8-way conflicting, swizzled and padded rows conflict-free (ok / FAIL)
// tests/sim/test_sim.sh runs each in a child process and asserts its outcome.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "../../attention/kernels/flash_tiles.cuh"
#include "../../attention/kernels/hopper.cuh"
#include "../../dist/cuda_check.h"
#include "../../dist/cuda_kernel.h"
#include "../lib/check.h"
#include "cudasim.h"

// ---- a shared buffer reused across rounds: thread t reads what thread t+1 wrote ----

template <bool SYNC>
__global__ void reuse_kernel(int *out, int rounds) {
    STATIC_SHARED(int, buf, [64]);
    const int t = threadIdx.x;
    for (int r = 0; r < rounds; r++) {
        buf[t] = r * 1000 + t;
        __syncthreads();
        out[r * 64 + t] = buf[(t + 1) % 64];
        if (SYNC) __syncthreads();   // every read done before the next round's writes
    }
}

static void reuse(bool sync) {
    const int rounds = 4;
    int *d_out, out[4 * 64];
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    if (sync) CUDA_LAUNCH(reuse_kernel<true>, 1, 64, 0, 0, d_out, rounds);
    else CUDA_LAUNCH(reuse_kernel<false>, 1, 64, 0, 0, d_out, rounds);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int r = 0; r < rounds; r++)
        for (int t = 0; t < 64; t++) wrong += out[r * 64 + t] != r * 1000 + (t + 1) % 64;
    printf("%s\n", wrong ? "wrong" : "correct");
    CUDA_CHECK(cudaFree(d_out));
}

// ---- cp.async: the data is there only after the wait ----

template <bool WAIT>
__global__ void cp_async_kernel(const float *src, float *out) {
    DYNAMIC_SHARED(unsigned char, smem);
    float *s = reinterpret_cast<float *>(smem);
    const int t = threadIdx.x;
    cp_async16(s + 4 * t, src + 4 * t, true);
    cp_async_commit();
    if (WAIT) cp_async_wait<0>();
    out[t] = s[4 * t];
    cp_async_wait<0>();
}

static void cp_async(bool wait) {
    float src[128], out[32], *d_src, *d_out;
    for (int i = 0; i < 128; i++) src[i] = (float)i;
    CUDA_CHECK(cudaMalloc((void **)&d_src, sizeof src));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    CUDA_CHECK(cudaMemcpy(d_src, src, sizeof src, cudaMemcpyHostToDevice));
    if (wait) CUDA_LAUNCH(cp_async_kernel<true>, 1, 32, sizeof src, 0, d_src, d_out);
    else CUDA_LAUNCH(cp_async_kernel<false>, 1, 32, sizeof src, 0, d_src, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    int nan = 0, wrong = 0;
    for (int t = 0; t < 32; t++) {
        nan += isnan(out[t]);
        wrong += out[t] != (float)(4 * t);
    }
    printf("%s\n", nan ? "poison" : wrong ? "wrong" : "correct");
    CUDA_CHECK(cudaFree(d_src));
    CUDA_CHECK(cudaFree(d_out));
}

// ---- streams: a consumer on one stream of what a producer on another wrote ----

__global__ void produce_kernel(float *x, float v) { x[threadIdx.x] = v; }
__global__ void consume_kernel(const float *x, float *y) { y[threadIdx.x] = x[threadIdx.x] + 1.0f; }

// Eight rounds (the interleaving is drawn anew each time): "wrong" when any round read stale data. how:
// "nowait", "event", "legacy" (stream 2 the legacy default stream); "far_nowait" and "far_event": the
// reader waits for the writer by an event, and stream 1 then overwrites what it read 16 launches of other
// work later (a backward's weight-gradient GEMM beside the input-gradient chain), without / after waiting
// for the read by an event.
static void streams(const char *how) {
    const bool far = !strncmp(how, "far_", 4);
    cudaStream_t s1, s2 = 0;
    CUDA_CHECK(cudaStreamCreate(&s1));
    if (strcmp(how, "legacy")) CUDA_CHECK(cudaStreamCreate(&s2));
    cudaEvent_t written, read;
    CUDA_CHECK(cudaEventCreate(&written));
    CUDA_CHECK(cudaEventCreate(&read));
    float *d_x, *d_y, *d_other, y[32];
    CUDA_CHECK(cudaMalloc((void **)&d_x, sizeof y));
    CUDA_CHECK(cudaMalloc((void **)&d_y, sizeof y));
    CUDA_CHECK(cudaMalloc((void **)&d_other, sizeof y));
    int wrong = 0;
    for (int round = 1; round <= 8; round++) {
        CUDA_CHECK(cudaMemset(d_x, 0, sizeof y));
        CUDA_LAUNCH(produce_kernel, 1, 32, 0, s1, d_x, (float)round);
        CUDA_CHECK(cudaGetLastError());
        if (far || !strcmp(how, "event")) {
            CUDA_CHECK(cudaEventRecord(written, s1));
            CUDA_CHECK(cudaStreamWaitEvent(s2, written, 0));
        }
        CUDA_LAUNCH(consume_kernel, 1, 32, 0, s2, d_x, d_y);
        CUDA_CHECK(cudaGetLastError());
        if (!strcmp(how, "far_event")) {
            CUDA_CHECK(cudaEventRecord(read, s2));
            CUDA_CHECK(cudaStreamWaitEvent(s1, read, 0));
        }
        for (int i = 0; far && i <= 16; i++) {   // 16 launches elsewhere, then the overwrite
            CUDA_LAUNCH(produce_kernel, 1, 32, 0, s1, i < 16 ? d_other : d_x, i < 16 ? (float)i : -1.0f);
            CUDA_CHECK(cudaGetLastError());
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 32; i++) wrong += y[i] != (float)round + 1.0f;
    }
    printf("%s\n", wrong ? "wrong" : "correct");
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaFree(d_other));
    CUDA_CHECK(cudaEventDestroy(written));
    CUDA_CHECK(cudaEventDestroy(read));
    CUDA_CHECK(cudaStreamDestroy(s1));
    if (s2) CUDA_CHECK(cudaStreamDestroy(s2));
}

// ---- polling: cudaEventQuery over an operation that completes over several
// attempts (cudasim::enqueue_polled, as the sim's NCCL operations) ----

__global__ void add_one_kernel(float *x) { x[threadIdx.x] += 1.0f; }

// A kernel, then an operation complete on its 10th attempt, then an event, on
// one stream: the first query answers not ready (it must not wait), having
// run the kernel and attempted the operation meanwhile; later queries finish the operation, the
// event becomes ready, and the operation was attempted exactly 10 times.
static void polled() {
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    cudaEvent_t after;
    CUDA_CHECK(cudaEventCreate(&after));
    float *d_x, x[32];
    CUDA_CHECK(cudaMalloc((void **)&d_x, sizeof x));
    CUDA_CHECK(cudaMemset(d_x, 0, sizeof x));
    CUDA_LAUNCH(add_one_kernel, 1, 32, 0, s, d_x);
    CUDA_CHECK(cudaGetLastError());
    int attempts = 0;
    cudasim::enqueue_polled(s, "polled op", [&attempts] { return ++attempts >= 10; });
    CUDA_CHECK(cudaEventRecord(after, s));
    cudaError_t first = cudaEventQuery(after);
    int ran_before = attempts;
    EXPECT(cudaPeekAtLastError() == cudaErrorNotReady, "polled_not_ready_is_last_error (peek)");
    EXPECT(cudaGetLastError() == cudaErrorNotReady && cudaGetLastError() == cudaSuccess,
           "polled_not_ready_cleared_by_get_last_error");
    int queries = 1;
    while (cudaEventQuery(after) == cudaErrorNotReady && queries < 100) queries++;
    (void)cudaGetLastError();
    EXPECT(cudaEventQuery(after) == cudaSuccess && cudaGetLastError() == cudaSuccess,
           "polled_ready_query_sets_no_error");
    EXPECT(cudaSetDevice(-1) == cudaErrorInvalidDevice && cudaPeekAtLastError() == cudaErrorInvalidDevice &&
           cudaGetLastError() == cudaErrorInvalidDevice && cudaGetLastError() == cudaSuccess,
           "every_failed_call_sets_the_last_error");
    CUDA_CHECK(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    EXPECT(first == cudaErrorNotReady && ran_before > 0 && ran_before < 10,
           "polled_first_query_not_ready (attempts %d, %s)", ran_before, cudaGetErrorString(first));
    EXPECT(queries > 1 && queries < 100 && attempts == 10, "polled_ready_after_10_attempts (queries %d, attempts %d)",
           queries, attempts);
    EXPECT(x[0] == 1.0f && x[31] == 1.0f, "polled_kernel_ran_once (x[0] %g)", x[0]);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaEventDestroy(after));
    CUDA_CHECK(cudaStreamDestroy(s));
}

// ---- the device memory peak (cudasimMemoryPeak): cudaMalloc's live bytes plus the pool's keep ----

static void memory_peak() {
    const size_t MIB = 1 << 20;
    size_t base, peak;
    CUDA_CHECK(cudasimMemoryPeak(&base));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    void *a, *b, *c;
    CUDA_CHECK(cudaMalloc(&a, 1 * MIB));
    CUDA_CHECK(cudaMallocAsync(&b, 4 * MIB, s));
    CUDA_CHECK(cudaFreeAsync(b, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMallocAsync(&c, 2 * MIB, s));   // within what the pool keeps
    CUDA_CHECK(cudaFreeAsync(c, s));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaMalloc(&a, 2 * MIB));           // 2 MiB live beside the pool's 4 MiB
    CUDA_CHECK(cudasimMemoryPeak(&peak));
    EXPECT(peak - base == 6 * MIB, "memory_peak_pool_kept (peak %zu bytes above the start, expected 6 MiB)",
           peak - base);
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaStreamDestroy(s));
}

// ---- host memory, host synchronisations, stream priorities ----

// A pinned host buffer is read by an async copy when the copy runs, a
// pageable one at the call (staged); a device-to-host copy into pinned
// memory lands when it runs, into pageable memory before the call returns
// (counted as a host synchronisation). Stream priorities are clamped to the
// device's range; the sync counts name their call.
static void host_memory() {
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d_x, *pinned, pageable[2] = {1, 1};
    CUDA_CHECK(cudaMalloc((void **)&d_x, 2 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost((void **)&pinned, 2 * sizeof(int)));
    pinned[0] = pinned[1] = 1;
    cudasim_host_syncs_reset();
    CUDA_CHECK(cudaMemcpyAsync(d_x, pinned, sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d_x + 1, pageable, sizeof(int), cudaMemcpyHostToDevice, s));
    pinned[0] = pageable[0] = 2;   // before the copies ran
    const long h2d_syncs = cudasim_host_syncs(NULL);
    CUDA_CHECK(cudaStreamSynchronize(s));
    int got[2] = {0, 0};
    CUDA_CHECK(cudaMemcpy(got, d_x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got[0] == 2 && got[1] == 1, "host_memory_h2d: pinned read when the copy runs (%d = 2), pageable at the "
           "call (%d = 1)", got[0], got[1]);
    EXPECT(h2d_syncs == 1, "host_memory_h2d_syncs: only the pageable copy is a host synchronisation (%ld)", h2d_syncs);
    pinned[1] = pageable[1] = 0;
    CUDA_CHECK(cudaMemcpyAsync(&pinned[1], d_x, sizeof(int), cudaMemcpyDeviceToHost, s));
    const int pinned_early = pinned[1];
    CUDA_CHECK(cudaMemcpyAsync(&pageable[1], d_x, sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT(pinned_early == 0 && pinned[1] == 2 && pageable[1] == 2, "host_memory_d2h: pinned lands when the copy "
           "runs (%d before a wait, %d after), pageable at the call (%d)", pinned_early, pinned[1], pageable[1]);
    cudasim_host_syncs_reset();
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    char sites[512] = "";
    FILE *f = fmemopen(sites, sizeof sites, "w");
    const long n = cudasim_host_syncs(f);
    fclose(f);
    EXPECT(n == 2 && strstr(sites, "sim_selftest.cu:") && strstr(sites, "(host_memory()): cudaStreamSynchronize: 1"),
           "host_memory_sites: two synchronisations at two lines of host_memory (%ld: %s)", n, sites);
    EXPECT(cudaHostRegister(pinned, sizeof(int), cudaHostRegisterDefault) == cudaErrorHostMemoryAlreadyRegistered &&
           cudaGetLastError() == cudaErrorHostMemoryAlreadyRegistered, "host_memory_register_twice");
    int least = 1, greatest = 1, p = 1;
    cudaStream_t hi, lo;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, -100));
    CUDA_CHECK(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, 7));
    CUDA_CHECK(cudaStreamGetPriority(hi, &p));
    EXPECT(least == 0 && greatest == -5 && p == greatest, "stream_priority_clamped_to_greatest (%d of %d..%d)", p,
           least, greatest);
    CUDA_CHECK(cudaStreamGetPriority(lo, &p));
    EXPECT(p == least, "stream_priority_clamped_to_least (%d)", p);
    CUDA_CHECK(cudaStreamGetPriority(s, &p));
    EXPECT(p == 0, "stream_priority_default_least (%d)", p);
    CUDA_CHECK(cudaStreamDestroy(hi));
    CUDA_CHECK(cudaStreamDestroy(lo));
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFreeHost(pinned));
    CUDA_CHECK(cudaFree(d_x));
}

// CUDA_VISIBLE_DEVICES over CUDASIM_DEVICES: prints the visible count and their PCI bus ids.
static void devices() {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    printf("%d", n);
    for (int d = 0; d < n; d++) {
        char bus[16];
        CUDA_CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, d));
        printf(" %s", bus);
    }
    printf("\n");
}

// ---- rule violations: each ends the program with one cudasim line ----

__global__ void shfl_missing_lane_kernel(float *out) {
    const int lane = threadIdx.x % 32;
    if (lane == 5) return;
    out[lane] = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
}

__global__ void misaligned_cp_async_kernel(const float *src) {
    DYNAMIC_SHARED(unsigned char, smem);
    cp_async16(smem + 8, src, true);
    cp_async_commit();
    cp_async_wait<0>();
}

__global__ void barrier_divergence_kernel(float *out) {
    if (threadIdx.x < 32) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void oob_read_kernel(const float *src, int n, float *out) {
    float s = 0.0f;
    for (int i = threadIdx.x; i <= n; i += blockDim.x) s += src[i];   // <= n: one past the end
    out[threadIdx.x] = s;
}

static void violation(const char *which) {
    float *d_a, *d_b;
    CUDA_CHECK(cudaMalloc((void **)&d_a, 64 * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_b, 64 * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_a, 0, 64 * sizeof(float)));
    if (!strcmp(which, "shfl_missing_lane")) CUDA_LAUNCH(shfl_missing_lane_kernel, 1, 32, 0, 0, d_b);
    else if (!strcmp(which, "misaligned_cp_async")) CUDA_LAUNCH(misaligned_cp_async_kernel, 1, 32, 64, 0, d_a);
    else if (!strcmp(which, "barrier_divergence")) CUDA_LAUNCH(barrier_divergence_kernel, 1, 64, 0, 0, d_b);
    else CUDA_LAUNCH(oob_read_kernel, 1, 32, 0, 0, d_a, 64, d_b);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("no violation reported\n");
    CUDA_CHECK(cudaFree(d_a));
    CUDA_CHECK(cudaFree(d_b));
}

// ---- launch checks: the cudaError_t of a real launch, non-sticky ----

__global__ void empty_kernel() {}

static void launch_limits() {
    CUDA_LAUNCH(empty_kernel, 1, 1025, 0, 0);
    EXPECT(cudaPeekAtLastError() == cudaErrorInvalidConfiguration, "1025 threads: peek gives the error");
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads: cudaErrorInvalidConfiguration");
    EXPECT(cudaGetLastError() == cudaSuccess, "launch errors are not sticky");
    CUDA_LAUNCH(empty_kernel, dim3(1, 65536), 32, 0, 0);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y 65536: cudaErrorInvalidConfiguration");
    CUDA_LAUNCH(empty_kernel, dim3(1, 1, 1), dim3(32, 1, 65), 0, 0);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "block z 65: cudaErrorInvalidConfiguration");
    CUDA_LAUNCH(empty_kernel, 1, 32, 48 * 1024 + 16, 0);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue,
           "48 KiB + 16 dynamic smem without opt-in: cudaErrorInvalidValue");
    CUDA_LAUNCH(empty_kernel, 1, 32, 48 * 1024, 0);
    EXPECT(cudaGetLastError() == cudaSuccess, "48 KiB dynamic smem: launches");
    EXPECT(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) == cudaSuccess,
           "opt-in to 100 KiB");
    CUDA_LAUNCH(empty_kernel, 1, 32, 100 * 1024, 0);
    EXPECT(cudaGetLastError() == cudaSuccess, "100 KiB after the opt-in: launches");
    CUDA_LAUNCH(empty_kernel, 1, 32, 100 * 1024 + 16, 0);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "above the opt-in: cudaErrorInvalidValue");
    EXPECT(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 164 * 1024) ==
           cudaErrorInvalidValue, "opt-in above the A100's 163 KiB: cudaErrorInvalidValue");
    (void)cudaGetLastError();
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    EXPECT(optin == 163 * 1024, "device opt-in limit %d = 163 KiB (A100)", optin);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- mma.sync.m16n8k16 and ldmatrix against the PTX ISA's fragment tables ----
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and
// "ldmatrix"), written from the tables, not from the sim: groupID = lane >> 2,
// threadID_in_group = lane % 4.

static int a_row(int lane, int i) { return (lane >> 2) + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0); }
static int a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
static int b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
static int b_col(int lane, int i) { (void)i; return lane >> 2; }
static int c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
static int c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

static uint16_t bf16_of(float f) { return __float2bfloat16_rn(f).__x; }
static float float_of(uint16_t b) { __nv_bfloat16 x; x.__x = b; return __bfloat162float(x); }

// frag [32][10]: per lane the A registers, the B registers, then the C values as bits; out [32][4].
__global__ void mma_kernel(const uint32_t *frag, float *out) {
    const int lane = threadIdx.x;
    const uint32_t *f = frag + lane * 10;
    float c[4];
    memcpy(c, f + 6, sizeof c);
    mma16816(c, f, f[4], f[5]);
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = c[i];
}

static void check_mma() {
    uint16_t A[16][16], B[16][8];
    float C[16][8];
    srand(7);
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) A[r][k] = bf16_of((float)(rand() % 17 - 8) / 4.0f);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = bf16_of((float)(rand() % 13 - 6) / 8.0f);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) C[r][n] = (float)(rand() % 100) / 16.0f;
    uint32_t frag[32][10];
    for (int lane = 0; lane < 32; lane++) {
        for (int reg = 0; reg < 4; reg++)   // a0..a7: two per register, the lower index in the low half
            frag[lane][reg] = A[a_row(lane, 2 * reg)][a_col(lane, 2 * reg)] |
                              (uint32_t)A[a_row(lane, 2 * reg + 1)][a_col(lane, 2 * reg + 1)] << 16;
        for (int reg = 0; reg < 2; reg++)
            frag[lane][4 + reg] = B[b_row(lane, 2 * reg)][b_col(lane, 2 * reg)] |
                                  (uint32_t)B[b_row(lane, 2 * reg + 1)][b_col(lane, 2 * reg + 1)] << 16;
        for (int i = 0; i < 4; i++) memcpy(&frag[lane][6 + i], &C[c_row(lane, i)][c_col(lane, i)], 4);
    }
    uint32_t *d_frag;
    float *d_out, out[32][4];
    CUDA_CHECK(cudaMalloc((void **)&d_frag, sizeof frag));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    CUDA_CHECK(cudaMemcpy(d_frag, frag, sizeof frag, cudaMemcpyHostToDevice));
    CUDA_LAUNCH(mma_kernel, 1, 32, 0, 0, d_frag, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int m = c_row(lane, i), n = c_col(lane, i);
            double ref = C[m][n];
            for (int k = 0; k < 16; k++) ref += (double)float_of(A[m][k]) * float_of(B[k][n]);
            if (fabs(out[lane][i] - ref) > 1e-5 * (1 + fabs(ref))) bad++;
        }
    EXPECT(bad == 0, "mma.m16n8k16 bf16: %d of 512 D elements differ from the PTX table reference", bad);
    CUDA_CHECK(cudaFree(d_frag));
    CUDA_CHECK(cudaFree(d_out));
}

// Four 8x8 bf16 matrices in shared memory, rows 40 elements apart (80 bytes:
// 16-byte aligned, not contiguous); lane l points at row l % 8 of matrix l / 8
// given in reverse row order through the address (row 7 - l % 8), so that the
// test also sees which lane's address feeds which row. out [6][32][4]:
// x1, x2, x4, each plain and .trans.
__global__ void ldmatrix_kernel(const uint16_t *m, uint32_t *out) {
    DYNAMIC_SHARED(unsigned char, smem);
    uint16_t *s = reinterpret_cast<uint16_t *>(smem);
    const int lane = threadIdx.x;
    for (int i = lane; i < 4 * 8 * 8; i += 32) s[(i / 8) * 40 + 8 + i % 8] = m[i];
    __syncthreads();
    const int mat = lane / 8, row = 7 - lane % 8;
    const bf16 *addr = reinterpret_cast<const bf16 *>(s + (mat * 8 + row) * 40 + 8);
    uint32_t r[4];
    const int counts[3] = {1, 2, 4};
    for (int v = 0; v < 6; v++) {
        memset(r, 0, sizeof r);
        if (counts[v / 2] == 4 && v % 2 == 0) ldmatrix_x4(r, addr);
        else if (counts[v / 2] == 4) ldmatrix_x4_trans(r, addr);
        else cudasim::ldmatrix(r, counts[v / 2], v % 2, addr);
        for (int i = 0; i < 4; i++) out[(v * 32 + lane) * 4 + i] = r[i];
    }
}

static void check_ldmatrix() {
    uint16_t m[4][8][8];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 8; c++) m[i][r][c] = bf16_of((float)(i * 64 + r * 8 + c));
    uint16_t *d_m;
    uint32_t *d_out, out[6][32][4];
    CUDA_CHECK(cudaMalloc((void **)&d_m, sizeof m));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    CUDA_CHECK(cudaMemcpy(d_m, m, sizeof m, cudaMemcpyHostToDevice));
    CUDA_LAUNCH(ldmatrix_kernel, 1, 32, 32 * 40 * sizeof(uint16_t), 0, d_m, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    const int counts[3] = {1, 2, 4};
    for (int v = 0; v < 6; v++) {
        const int count = counts[v / 2];
        const bool trans = v % 2;
        int bad = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++) {
                // Row q of matrix i as loaded is row 7 - q of m[i] (the addresses are reversed).
                // The table: row groupID, elements 2t, 2t+1 (.trans: column groupID, rows 2t, 2t+1).
                uint32_t want = 0;
                if (i < count) {
                    const int g = lane >> 2, t2 = (lane % 4) * 2;
                    const uint16_t lo = trans ? m[i][7 - t2][g] : m[i][7 - g][t2];
                    const uint16_t hi = trans ? m[i][7 - (t2 + 1)][g] : m[i][7 - g][t2 + 1];
                    want = lo | (uint32_t)hi << 16;
                }
                bad += out[v][lane][i] != want;
            }
        EXPECT(bad == 0, "ldmatrix .x%d%s: %d of %d registers differ from the PTX table reference", count,
               trans ? ".trans" : "", bad, 32 * 4);
    }
    CUDA_CHECK(cudaFree(d_m));
    CUDA_CHECK(cudaFree(d_out));
}

// ---- shared-memory bank conflicts: a 32 x 64 bf16 tile copied in by cp.async and read by ldmatrix.x4 ----

// Where row r's 16-byte chunk c lies: rows 128 bytes apart (chunk c of every
// row in the same 4 banks), the same rows with chunk c stored at c ^ (r % 8)
// (the 8 rows of a matrix in 8 distinct 4-bank groups), rows padded to 144
// bytes (the attention tiles' D + 8).
enum BankLayout { ROWS_128, SWIZZLED, PADDED };
static const char *bank_layout_name[] = {"rows 128 bytes apart", "rows 128 bytes apart, chunks swizzled by row",
                                         "rows padded to 144 bytes"};

template <BankLayout L> __device__ int chunk_offset(int r, int c) {
    return L == PADDED ? r * 72 + 8 * c : r * 64 + 8 * (L == SWIZZLED ? c ^ (r % 8) : c);
}

// One warp: lane l copies row l of src [32][64] chunk by chunk (8 cp.async),
// then reads chunk c of rows 0..31 as four 8x8 matrices (8 ldmatrix.x4, lane l
// giving row l): out [8][32][4] the registers, the same whatever the layout.
template <BankLayout L> __global__ void bank_layout_kernel(const bf16 *src, uint32_t *out) {
    DYNAMIC_SHARED(bf16, s);
    const int lane = threadIdx.x;
    for (int c = 0; c < 8; c++) cp_async16(s + chunk_offset<L>(lane, c), src + lane * 64 + 8 * c, true);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    for (int c = 0; c < 8; c++) {
        uint32_t r[4];
        ldmatrix_x4(r, s + chunk_offset<L>(lane, c));
        for (int i = 0; i < 4; i++) out[(c * 32 + lane) * 4 + i] = r[i];
    }
}

// Per layout the counted wavefronts against their minimum (8 calls x 4
// phases of 8 lanes, 8 ldmatrix.x4 x 4 matrices: 32 each): an 8-way conflict
// for rows 128 bytes apart, none when swizzled or padded; the registers alike.
static void banks() {
    uint16_t src[32 * 64];
    for (int i = 0; i < 32 * 64; i++) src[i] = bf16_of((float)(i % 251));
    uint16_t *d_src;
    uint32_t *d_out, out[3][8 * 32 * 4];
    CUDA_CHECK(cudaMalloc((void **)&d_src, sizeof src));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out[0]));
    CUDA_CHECK(cudaMemcpy(d_src, src, sizeof src, cudaMemcpyHostToDevice));
    const size_t smem = 32 * 72 * sizeof(uint16_t);
    const bf16 *bsrc = reinterpret_cast<const bf16 *>(d_src);
    for (int l = 0; l < 3; l++) {
        cudasim_kernel_counts_reset();
        if (l == ROWS_128) CUDA_LAUNCH(bank_layout_kernel<ROWS_128>, 1, 32, smem, 0, bsrc, d_out);
        else if (l == SWIZZLED) CUDA_LAUNCH(bank_layout_kernel<SWIZZLED>, 1, 32, smem, 0, bsrc, d_out);
        else CUDA_LAUNCH(bank_layout_kernel<PADDED>, 1, 32, smem, 0, bsrc, d_out);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpy(out[l], d_out, sizeof out[l], cudaMemcpyDeviceToHost));
        cudasimKernelCounts k;
        CHECK(cudasim_kernel_counts("bank_layout_kernel", &k) == 1, "banks: the kernel was not counted");
        const unsigned long long want = l == ROWS_128 ? 8 * 32 : 32;
        EXPECT(k.cp_async_wavefronts == want && k.cp_async_wavefronts_min == 32,
               "cp.async destinations, %s: %llu wavefronts, minimum %llu (want %llu, 32)", bank_layout_name[l],
               k.cp_async_wavefronts, k.cp_async_wavefronts_min, want);
        EXPECT(k.ldmatrix_wavefronts == want && k.ldmatrix_wavefronts_min == 32,
               "ldmatrix.x4, %s: %llu wavefronts, minimum %llu (want %llu, 32)", bank_layout_name[l],
               k.ldmatrix_wavefronts, k.ldmatrix_wavefronts_min, want);
    }
    EXPECT(!memcmp(out[0], out[1], sizeof out[0]) && !memcmp(out[0], out[2], sizeof out[0]),
           "the three layouts give ldmatrix the same registers");
    CUDA_CHECK(cudaFree(d_src));
    CUDA_CHECK(cudaFree(d_out));
}

// ---- Hopper: tiles loaded by TMA on an mbarrier, multiplied by wgmma (tests/sim/cudasim/grid.cpp) ----

// A (64 x 64, of which the tensor's 60 rows: rows 60..63 are the out-of-bounds zero fill) times B^T (B: N x
// 64), both K-major bf16, loaded by tma_load_2d in boxes of SPAN bytes a row (16: no swizzle, the core-matrix
// layout; 32, 64, 128: that swizzle) and multiplied by 4 wgmma of k16 with descriptors of swizzle DESC_SPAN
// (the loads' own, or a wrong one). out: the 64 x N accumulators by the documented fragment layout. MODE:
// 0 right; 1 waits on the wrong parity; 2 arrives without expect-tx; 3 expects twice the bytes; 4 reads the
// accumulators before the wait; 5 writes them before the wait; 6 no wgmma.fence; 7 right, A from registers
// (each thread's fragment of a_rows, the tensor's 60 rows); 8 thread 0 rewrites a byte of B before the wait;
// 9 right, A from registers and B MN-major: map_b holds B^T (64 x N, N contiguous), loaded in boxes along N,
// read through MN-major descriptors; 10 the same read as K-major.
static int swizzle_of(int span) { return span == 128 ? 1 : span == 64 ? 2 : span == 32 ? 3 : 0; }

template <int N>
__global__ void tma_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                                 const bf16 *a_rows, int span, int desc_span, int mode, float *out) {
    DYNAMIC_SHARED(unsigned char, smem);
    STATIC_SHARED(uint64_t, bar, [1]);
    unsigned char *tile_a = smem, *tile_b = smem + 64 * 128;
    const int e = span / 2, boxes = 64 / e;   // elements a box row, boxes along K
    const unsigned bytes = (64 + N) * 64 * 2;
    if (threadIdx.x == 0) {
        mbarrier_init(bar, 1);
        if (mode == 2) mbarrier_arrive(bar);
        else mbarrier_arrive_expect_tx(bar, mode == 3 ? 2 * bytes : bytes);
        for (int b = 0; b < boxes; b++) {
            tma_load_2d(tile_a + b * 64 * span, &map_a, b * e, 0, bar);
            if (mode < 9) tma_load_2d(tile_b + b * N * span, &map_b, b * e, 0, bar);
        }
        for (int b = 0; mode >= 9 && b < N / e; b++) tma_load_2d(tile_b + b * 64 * span, &map_b, b * e, 0, bar);
    }
    __syncthreads();
    mbarrier_wait(bar, mode == 1 ? 1 : 0);
    float d[N / 2];
    const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    uint32_t a[4][4];   // [k16 step][register]: rows 16 w + g (+ 8), columns 16 step + 2 t (+ 8), pairs
    for (int j = 0; (mode == 7 || mode >= 9) && j < 4; j++)
        for (int r = 0; r < 4; r++) {
            const int row = 16 * w + g + 8 * (r % 2), col = 16 * j + 2 * t + 8 * (r / 2);
            const bf16 zero = __float2bfloat16_rn(0.0f), lo = row < 60 ? a_rows[row * 64 + col] : zero,
                       hi = row < 60 ? a_rows[row * 64 + col + 1] : zero;
            a[j][r] = (uint32_t)lo.__x | (uint32_t)hi.__x << 16;
        }
    if (mode != 6) wgmma_fence();
    for (int j = 0; j < 4; j++) {   // k16 step j: 32 bytes at K offset 32 j
        const int box = 32 * j / (span < 32 ? 16 : span), within = span < 32 ? 0 : 32 * j % span;
        const int sw = swizzle_of(desc_span);
        const uint64_t da = wgmma_descriptor(tile_a + (span < 32 ? 2 * j : box) * 64 * span + within, 64 * 16,
                                             span < 32 ? 128 : 8 * span, (WgmmaSwizzle)sw);
        const uint64_t db = wgmma_descriptor(tile_b + (span < 32 ? 2 * j : box) * N * span + within, N * 16,
                                             span < 32 ? 128 : 8 * span, (WgmmaSwizzle)sw);
        // B^T's rows 16 j..: 8 rows (k) of a box SBO apart, the next box of N (span / 2 elements) LBO apart.
        const uint64_t dt = wgmma_descriptor(tile_b + 16 * j * span, span < 32 ? 128 : 64 * span,
                                             span < 32 ? 1024 : 8 * span, (WgmmaSwizzle)sw);
        if (mode == 7) wgmma_bf16_rs<N>(d, a[j], db, j > 0);
        else if (mode == 9) wgmma_bf16_rs<N, true>(d, a[j], dt, j > 0);
        else if (mode == 10) wgmma_bf16_rs<N, false>(d, a[j], dt, j > 0);
        else wgmma_bf16<N>(d, da, db, j > 0);
    }
    wgmma_commit_group();
    const float early = d[0];
    if (mode == 5) d[1] = 0.0f;
    if (mode == 8 && threadIdx.x == 0) tile_b[0] ^= 1;
    wgmma_wait_group<0>();
    if (mode == 4) d[0] = early;
    for (int i = 0; i < N / 2; i++)
        out[(16 * w + g + 8 * (i % 4 / 2)) * N + 8 * (i / 4) + 2 * t + i % 2] = d[i];
}

// A row-major bf16 tensor of rows x cols, boxes of SPAN bytes (16: no swizzle) by box_rows.
static CUtensorMap tensor_map_2d(const uint16_t *d, uint64_t cols, uint64_t rows, uint32_t box_rows, int span) {
    CUtensorMap map;
    const cuuint64_t dim[2] = {cols, rows}, stride[1] = {cols * 2};
    const cuuint32_t box[2] = {(cuuint32_t)span / 2, box_rows}, one[2] = {1, 1};
    const CUtensorMapSwizzle swizzle = span == 16   ? CU_TENSOR_MAP_SWIZZLE_NONE
                                       : span == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                       : span == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                    : CU_TENSOR_MAP_SWIZZLE_128B;
    const CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)d, dim, stride, box,
                                              one, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                              CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled: %d", (int)r);
    return map;
}

// Runs the kernel; "correct", "wrong" or "poison" (a NaN) against a CPU GEMM (fp64), and the counts.
template <int N>
static const char *tma_wgmma(int span, int desc_span, int mode, cudasimKernelCounts *k) {
    static uint16_t a[60 * 64], b[N * 64], bt[64 * N];
    static float out[64 * N];
    for (int i = 0; i < 60 * 64; i++) a[i] = bf16_of((float)((i * 7) % 13 - 6) / 8);
    for (int i = 0; i < N * 64; i++) b[i] = bf16_of((float)((i * 5) % 11 - 5) / 4);
    for (int i = 0; i < N * 64; i++) bt[i % 64 * N + i / 64] = b[i];
    uint16_t *d_a, *d_b;
    float *d_out;
    CUDA_CHECK(cudaMalloc((void **)&d_a, sizeof a));
    CUDA_CHECK(cudaMalloc((void **)&d_b, sizeof b));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    CUDA_CHECK(cudaMemcpy(d_a, a, sizeof a, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, mode >= 9 ? bt : b, sizeof b, cudaMemcpyHostToDevice));
    const CUtensorMap map_a = tensor_map_2d(d_a, 64, 60, 64, span),
                      map_b = mode >= 9 ? tensor_map_2d(d_b, N, 64, 64, span) : tensor_map_2d(d_b, 64, N, N, span);
    cudasim_kernel_counts_reset();
    // the tiles and 8 KiB beyond them that a wrong descriptor may read (poison)
    CUDA_LAUNCH(tma_wgmma_kernel<N>, 1, 128, (64 + N) * 128 + 8192, 0, map_a, map_b,
                reinterpret_cast<const bf16 *>(d_a), span, desc_span, mode, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    cudasim_kernel_counts("tma_wgmma_kernel", k);
    const char *verdict = "correct";
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < N; c++) {
            double s = 0;
            for (int kk = 0; r < 60 && kk < 64; kk++) s += (double)float_of(a[r * 64 + kk]) * float_of(b[c * 64 + kk]);
            if (isnan(out[r * N + c])) verdict = "poison";
            else if (fabs(out[r * N + c] - s) > 1e-3 && strcmp(verdict, "poison")) verdict = "wrong";
        }
    CUDA_CHECK(cudaFree(d_a));
    CUDA_CHECK(cudaFree(d_b));
    CUDA_CHECK(cudaFree(d_out));
    return verdict;
}

// One box of 8 rows of SPAN bytes (uint16 r * 64 + e at row r, element e) loaded by TMA, its shared bytes as
// they lie.
__global__ void tma_layout_kernel(const __grid_constant__ CUtensorMap map, int bytes, uint16_t *out) {
    DYNAMIC_SHARED(uint16_t, box);
    STATIC_SHARED(uint64_t, bar, [1]);
    if (threadIdx.x == 0) {
        mbarrier_init(bar, 1);
        mbarrier_arrive_expect_tx(bar, bytes);
        tma_load_2d(box, &map, 0, 0, bar);
    }
    __syncthreads();
    mbarrier_wait(bar, 0);
    for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) out[i] = box[i];
}

// The swizzle as the CUDA C++ Programming Guide's TMA section gives it: with a span of S bytes, 16-byte chunk c
// of row r (rows of S bytes) lies at chunk c ^ ((r S / 128) mod (S / 16)) of its row.
static void tma_layout(int span) {
    uint16_t src[8 * 64], out[8 * 64];
    for (int i = 0; i < 8 * 64; i++) src[i] = (uint16_t)i;
    uint16_t *d_src, *d_out;
    CUDA_CHECK(cudaMalloc((void **)&d_src, sizeof src));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    CUDA_CHECK(cudaMemcpy(d_src, src, sizeof src, cudaMemcpyHostToDevice));
    const CUtensorMap map = tensor_map_2d(d_src, 64, 8, 8, span);
    const int bytes = 8 * span, e = span / 2;
    CUDA_LAUNCH(tma_layout_kernel, 1, 32, bytes, 0, map, bytes, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, bytes, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int r = 0; r < 8; r++)
        for (int x = 0; x < e; x++) {
            const int c = x / 8, at = r * e + 8 * (c ^ (r * span / 128 % (span / 16))) + x % 8;
            wrong += out[at] != r * 64 + x;
        }
    EXPECT(wrong == 0, "TMA box of 8 rows of %d bytes, swizzled: %d elements away from the documented chunk", span,
           wrong);
    CUDA_CHECK(cudaFree(d_src));
    CUDA_CHECK(cudaFree(d_out));
}

// Every N and swizzle against the CPU GEMM, a descriptor of the wrong swizzle wrong, and the counts.
static void hopper_gemm() {
    const int spans[4] = {16, 32, 64, 128};
    for (int s = 1; s < 4; s++) tma_layout(spans[s]);
    for (int s = 0; s < 4; s++) {
        cudasimKernelCounts k;
        const char *r64 = tma_wgmma<64>(spans[s], spans[s], 0, &k);
        const char *r128 = tma_wgmma<128>(spans[s], spans[s], 0, &k);
        const char *r256 = tma_wgmma<256>(spans[s], spans[s], 0, &k);
        EXPECT(!strcmp(r64, "correct") && !strcmp(r128, "correct") && !strcmp(r256, "correct"),
               "TMA boxes of %d-byte rows, wgmma m64nNk16 N 64/128/256 against a CPU GEMM: %s %s %s", spans[s], r64,
               r128, r256);
        EXPECT(k.wgmma == 4 && k.wgmma_flops == 4ull * 2 * 64 * 256 * 16 && k.tma_bytes == (64 + 256) * 128 &&
                   k.mbarrier_waits == 128,
               "counts of N 256: %llu wgmma, %llu FLOPs, %llu TMA bytes, %llu mbarrier waits (want 4, %llu, %d, 128)",
               k.wgmma, k.wgmma_flops, k.tma_bytes, k.mbarrier_waits, 4ull * 2 * 64 * 256 * 16, (64 + 256) * 128);
        const char *rs = tma_wgmma<128>(spans[s], spans[s], 7, &k);
        EXPECT(!strcmp(rs, "correct"), "the same with A from registers, N 128: %s", rs);
        const char *mn64 = tma_wgmma<64>(spans[s], spans[s], 9, &k), *mn128 = tma_wgmma<128>(spans[s], spans[s], 9, &k);
        const char *as_k = tma_wgmma<128>(spans[s], spans[s], 10, &k);
        EXPECT(!strcmp(mn64, "correct") && !strcmp(mn128, "correct") && strcmp(as_k, "correct"),
               "B MN-major (B^T in boxes along N), N 64/128: %s %s; read as K-major: %s (want wrong or poison)", mn64,
               mn128, as_k);
        if (spans[s] > 16) {
            const int wrong = spans[s] / 2;
            const char *r = tma_wgmma<128>(spans[s], wrong, 0, &k);
            EXPECT(strcmp(r, "correct"), "tiles swizzled by %d bytes read through descriptors of %d bytes (16: none): "
                   "%s (want wrong or poison)", spans[s], wrong, r);
        }
    }
}

// A pipeline of two stages: one producer thread (warp 4) loads the k-th 64 x 64 tiles of A (64 x 64 tiles) and B
// (64 x 64 tiles) by TMA (128-byte swizzle) into stage k % 2 on mbarrier full[k % 2], after the consumers
// released the stage's previous use on empty[k % 2]; the consumer warpgroup waits for full[k % 2] on the
// parity of the stage's use, multiplies (wgmma, N 64), and arrives on empty. WRONG_PARITY waits on parity 0
// every time.
__global__ void pipeline_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                                int tiles, int wrong_parity, float *out) {
    DYNAMIC_SHARED(unsigned char, smem);   // stage s: A at 16384 s, B at 16384 s + 8192
    STATIC_SHARED(uint64_t, full, [2]);
    STATIC_SHARED(uint64_t, empty, [2]);
    if (threadIdx.x == 0)
        for (int s = 0; s < 2; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 128);
        }
    __syncthreads();
    if (threadIdx.x >= 128) {
        for (int k = 0; threadIdx.x == 128 && k < tiles; k++) {
            const int s = k % 2;
            if (k >= 2) mbarrier_wait(&empty[s], (k / 2 - 1) % 2);
            mbarrier_arrive_expect_tx(&full[s], 2 * 64 * 128);
            tma_load_2d(smem + 16384 * s, &map_a, 64 * k, 0, &full[s]);
            tma_load_2d(smem + 16384 * s + 8192, &map_b, 64 * k, 0, &full[s]);
        }
        return;
    }
    float d[32];
    for (int k = 0; k < tiles; k++) {
        const int s = k % 2;
        mbarrier_wait(&full[s], wrong_parity ? 0 : k / 2 % 2);
        wgmma_fence();
        for (int j = 0; j < 4; j++)
            wgmma_bf16<64>(d, wgmma_descriptor(smem + 16384 * s + 32 * j, 16, 1024, WGMMA_SWIZZLE_128B),
                           wgmma_descriptor(smem + 16384 * s + 8192 + 32 * j, 16, 1024, WGMMA_SWIZZLE_128B),
                           k > 0 || j > 0);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        mbarrier_arrive(&empty[s]);
    }
    const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int i = 0; i < 32; i++) out[(16 * w + g + 8 * (i % 4 / 2)) * 64 + 8 * (i / 4) + 2 * t + i % 2] = d[i];
}

// Prints correct, wrong or poison against a CPU GEMM over 6 tiles of K.
static void pipeline(bool wrong_parity) {
    const int tiles = 6, K = 64 * tiles;
    static uint16_t a[64 * K], b[64 * K];
    static float out[64 * 64];
    for (int i = 0; i < 64 * K; i++) {
        a[i] = bf16_of((float)((i * 7) % 13 - 6) / 8);
        b[i] = bf16_of((float)((i * 5) % 11 - 5) / 4);
    }
    uint16_t *d_a, *d_b;
    float *d_out;
    CUDA_CHECK(cudaMalloc((void **)&d_a, sizeof a));
    CUDA_CHECK(cudaMalloc((void **)&d_b, sizeof b));
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    CUDA_CHECK(cudaMemcpy(d_a, a, sizeof a, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, b, sizeof b, cudaMemcpyHostToDevice));
    const CUtensorMap map_a = tensor_map_2d(d_a, K, 64, 64, 128), map_b = tensor_map_2d(d_b, K, 64, 64, 128);
    CUDA_LAUNCH(pipeline_kernel, 1, 160, 2 * 16384, 0, map_a, map_b, tiles, (int)wrong_parity, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    const char *verdict = "correct";
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 64; c++) {
            double sum = 0;
            for (int k = 0; k < K; k++) sum += (double)float_of(a[r * K + k]) * float_of(b[c * K + k]);
            if (isnan(out[r * 64 + c])) verdict = "poison";
            else if (fabs(out[r * 64 + c] - sum) > 1e-3 && strcmp(verdict, "poison")) verdict = "wrong";
        }
    printf("%s\n", verdict);
    CUDA_CHECK(cudaFree(d_a));
    CUDA_CHECK(cudaFree(d_b));
    CUDA_CHECK(cudaFree(d_out));
}

// A misuse of the pipeline: prints what the kernel computed, or the sim stops it with one line.
static void hopper_misuse(const char *which) {
    const char *names[] = {"", "mbarrier_wrong_phase", "mbarrier_no_expect_tx", "mbarrier_missing_bytes",
                           "wgmma_early_read", "wgmma_early_write", "wgmma_no_fence", "", "wgmma_operand_overwritten"};
    const int modes = (int)(sizeof names / sizeof names[0]);
    int mode = 1;
    while (mode < modes && strcmp(names[mode], which)) mode++;
    CHECK(mode < modes, "sim_selftest: unknown case %s", which);
    cudasimKernelCounts k;
    printf("%s\n", tma_wgmma<64>(128, 128, mode, &k));
}

// setmaxnreg: the producer warpgroup gives up registers, two consumers take them, in any order (an .inc waits
// for room); a count that is no multiple of 8, or more than the block holds, is stopped.
template <int CONSUMER>
__global__ void setmaxnreg_kernel(int *out) {
    if (threadIdx.x < 128) setmaxnreg_dec<40>();
    else setmaxnreg_inc<CONSUMER>();
    out[threadIdx.x] = 1;
}

static void setmaxnreg_case(int consumer) {
    int *d_out, out[384];
    CUDA_CHECK(cudaMalloc((void **)&d_out, sizeof out));
    if (consumer == 232) CUDA_LAUNCH(setmaxnreg_kernel<232>, 1, 384, 0, 0, d_out);
    else if (consumer == 256) CUDA_LAUNCH(setmaxnreg_kernel<256>, 1, 384, 0, 0, d_out);
    else CUDA_LAUNCH(setmaxnreg_kernel<100>, 1, 384, 0, 0, d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    int ran = 0;
    for (int i = 0; i < 384; i++) ran += out[i] == 1;
    printf("%s\n", ran == 384 ? "correct" : "wrong");
    CUDA_CHECK(cudaFree(d_out));
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: %s CASE (see tests/sim/sim_selftest.cu)", argv[0]);
    const char *c = argv[1];
    if (!strcmp(c, "reuse_nosync") || !strcmp(c, "reuse_sync")) reuse(!strcmp(c, "reuse_sync"));
    else if (!strcmp(c, "cp_async_early") || !strcmp(c, "cp_async_waited")) cp_async(!strcmp(c, "cp_async_waited"));
    else if (!strncmp(c, "streams_", 8)) streams(c + 8);
    else if (!strcmp(c, "shfl_missing_lane") || !strcmp(c, "misaligned_cp_async") ||
             !strcmp(c, "barrier_divergence") || !strcmp(c, "oob_read"))
        violation(c);
    else if (!strcmp(c, "launch_limits")) launch_limits();
    else if (!strcmp(c, "polled")) polled();
    else if (!strcmp(c, "memory_peak")) memory_peak();
    else if (!strcmp(c, "host_memory")) host_memory();
    else if (!strcmp(c, "devices")) devices();
    else if (!strcmp(c, "fragments")) { check_mma(); check_ldmatrix(); }
    else if (!strcmp(c, "banks")) banks();
    else if (!strcmp(c, "hopper_gemm")) hopper_gemm();
    else if (!strncmp(c, "mbarrier_", 9) || !strncmp(c, "wgmma_", 6)) hopper_misuse(c);
    else if (!strcmp(c, "setmaxnreg")) setmaxnreg_case(232);
    else if (!strcmp(c, "pipeline") || !strcmp(c, "pipeline_wrong_parity"))
        pipeline(!strcmp(c, "pipeline_wrong_parity"));
    else if (!strcmp(c, "setmaxnreg_over")) setmaxnreg_case(256);
    else if (!strcmp(c, "setmaxnreg_odd")) setmaxnreg_case(100);
    else CHECK(0, "sim_selftest: unknown case %s", c);
    return check_exit();
}
