// sim_selftest.cu: small kernels, deliberately wrong and right, with which the
// CPU execution model of CUDA (tests/sim/cudasim/) shows that it catches each
// class of bug; built only for the sim (build/sim/tests/sim_selftest, and
// sim_selftest_asan with AddressSanitizer). `sim_selftest CASE` runs one:
//   reuse_nosync / reuse_sync    shared buffer rewritten without / with a barrier: prints wrong / correct
//   cp_async_early / cp_async_waited   read before / after cp.async.wait_group: prints poison / correct
//   streams_nowait / streams_event / streams_legacy   a kernel on stream 2 reads what one on stream 1
//                                wrote: no dependency / cudaStreamWaitEvent / stream 2 is the legacy
//                                default stream: prints wrong / correct / correct
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
//   banks                        shared-memory wavefronts of cp.async and ldmatrix: rows 128 bytes apart
//                                counted 8-way conflicting, swizzled and padded rows conflict-free (ok / FAIL)
// tests/sim/test_sim.sh runs each in a child process and asserts its outcome.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "../../attention/kernels/flash_tiles.cuh"
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

// Eight rounds (the interleaving is drawn anew each time): "wrong" when any round read stale data.
static void streams(const char *how) {
    cudaStream_t s1, s2 = 0;
    CUDA_CHECK(cudaStreamCreate(&s1));
    if (strcmp(how, "legacy")) CUDA_CHECK(cudaStreamCreate(&s2));
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreate(&done));
    float *d_x, *d_y, y[32];
    CUDA_CHECK(cudaMalloc((void **)&d_x, sizeof y));
    CUDA_CHECK(cudaMalloc((void **)&d_y, sizeof y));
    int wrong = 0;
    for (int round = 1; round <= 8; round++) {
        CUDA_CHECK(cudaMemset(d_x, 0, sizeof y));
        CUDA_LAUNCH(produce_kernel, 1, 32, 0, s1, d_x, (float)round);
        CUDA_CHECK(cudaGetLastError());
        if (!strcmp(how, "event")) {
            CUDA_CHECK(cudaEventRecord(done, s1));
            CUDA_CHECK(cudaStreamWaitEvent(s2, done, 0));
        }
        CUDA_LAUNCH(consume_kernel, 1, 32, 0, s2, d_x, d_y);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 32; i++) wrong += y[i] != (float)round + 1.0f;
    }
    printf("%s\n", wrong ? "wrong" : "correct");
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaEventDestroy(done));
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
    else CHECK(0, "sim_selftest: unknown case %s", c);
    return check_exit();
}
