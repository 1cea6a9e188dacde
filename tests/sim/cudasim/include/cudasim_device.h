// cudasim_device.h: the device side of CUDA for g++ (included by the sim's
// cuda_runtime.h in C++): qualifiers, vector types, threadIdx & co. per
// fiber, warp collectives, barriers, atomics, fast math, cp.async, ldmatrix,
// mma.sync, the Hopper operations (mbarrier, bulk and tensor copies, wgmma,
// setmaxnreg) and the kernel launch (cudasim_launch, behind CUDA_LAUNCH).
// The semantics live in tests/sim/cudasim/grid.cpp; each names its source there.
#ifndef CUDASIM_DEVICE_H
#define CUDASIM_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(8) uint2 { unsigned int x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace cudasim {

// The fiber of the CUDA thread running on this OS thread (see grid.cpp).
struct ThreadState {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
extern thread_local ThreadState *current;

// Warp collectives: every lane of `mask` reaches the same call, then the sim
// computes all lanes' results at once.
enum ShuffleMode { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
uint64_t shuffle(ShuffleMode mode, unsigned mask, uint64_t value, int lane_arg, int width);
enum VoteMode { VOTE_BALLOT, VOTE_ANY, VOTE_ALL };
unsigned vote(VoteMode mode, unsigned mask, int predicate);
void syncwarp(unsigned mask);
unsigned activemask();
void syncthreads();
void ldmatrix(uint32_t *r, int count, bool trans, const void *smem_row);
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4]);
void cp_async16(void *smem, const void *gmem, int src_bytes);
void cp_async_commit();
void cp_async_wait(int n);
void *shared_dynamic();
// Hopper (sm_90) operations, each as the PTX ISA describes it (grid.cpp names the sections; docs/SIM.md).
// The shared-memory address of p (its offset in the block's dynamic shared memory, which starts at 0).
uint32_t shared_address(const void *p);
void mbarrier_init(uint64_t *bar, unsigned count);
// expect-tx of tx_bytes (0: none), then one arrival.
void mbarrier_arrive(uint64_t *bar, unsigned tx_bytes);
bool mbarrier_test_wait_parity(uint64_t *bar, unsigned parity);
void mbarrier_wait_parity(uint64_t *bar, unsigned parity);
// cp.async.bulk (1D, bytes a multiple of 16) and cp.async.bulk.tensor (rank coordinates of a tensor map from
// cuTensorMapEncodeTiled) global -> shared, completing their bytes on the mbarrier bar.
void bulk_copy(void *smem, const void *gmem, unsigned bytes, uint64_t *bar);
void bulk_tensor_load(void *smem, const void *tensor_map, const int *coords, int rank, uint64_t *bar);
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16: d holds the thread's n/2 accumulators; A from the
// descriptor a_desc, or (a_regs != nullptr) from the thread's 4 registers; B from b_desc, K-major or (b_mn_major,
// the transposed layout) MN-major.
void wgmma_bf16(float *d, int n, uint64_t a_desc, const uint32_t *a_regs, uint64_t b_desc, bool b_mn_major,
                bool accumulate);
void wgmma_fence();
void wgmma_commit_group();
void wgmma_wait_group(int n);
void setmaxnreg(unsigned count, bool increase);
// Work counted per kernel (cuda_runtime_api.h, cudasim_kernel_counts): the
// warp collectives, barriers and cp.async count themselves in grid.cpp; an
// atomic adds one here (nothing outside a kernel).
void count_atomic();
void *shared_static(const void *site, size_t bytes, size_t align);

// A launch: checks as the hardware's, then one call of `body` per CUDA thread.
void launch_grid(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                 std::function<void()> body);

}  // namespace cudasim

#define threadIdx (cudasim::current->thread_idx)
#define blockIdx (cudasim::current->block_idx)
#define blockDim (cudasim::current->block_dim)
#define gridDim (cudasim::current->grid_dim)
static constexpr int warpSize = 32;

template <typename... P, typename... A>
static inline void cudasim_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                  cudaStream_t stream, A &&...args) {
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    cudasim::launch_grid(name, (const void *)kernel, grid, block, smem, stream,
                         [kernel, params]() { std::apply(kernel, params); });
}

// ---- barriers and warp collectives (CUDA C++ Programming Guide, "Synchronization Functions",
// "Warp Shuffle Functions", "Warp Vote Functions") ----

static inline void __syncthreads() { cudasim::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { cudasim::syncwarp(mask); }
static inline unsigned __activemask() { return cudasim::activemask(); }
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return cudasim::vote(cudasim::VOTE_BALLOT, mask, pred);
}
static inline int __any_sync(unsigned mask, int pred) { return (int)cudasim::vote(cudasim::VOTE_ANY, mask, pred); }
static inline int __all_sync(unsigned mask, int pred) { return (int)cudasim::vote(cudasim::VOTE_ALL, mask, pred); }

template <typename T>
static inline T cudasim_shuffle(cudasim::ShuffleMode mode, unsigned mask, T var, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a 1..8 byte value");
    uint64_t u = 0;
    memcpy(&u, &var, sizeof(T));
    u = cudasim::shuffle(mode, mask, u, arg, width);
    memcpy(&var, &u, sizeof(T));
    return var;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
    return cudasim_shuffle(cudasim::SHFL_IDX, mask, var, src, width);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return cudasim_shuffle(cudasim::SHFL_UP, mask, var, (int)delta, width);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return cudasim_shuffle(cudasim::SHFL_DOWN, mask, var, (int)delta, width);
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return cudasim_shuffle(cudasim::SHFL_XOR, mask, var, lane_mask, width);
}

// ---- integer and float intrinsics (CUDA Math API, "Integer Intrinsics", "Single Precision Intrinsics") ----

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
// glibc declares these names (extern "C", not exported): define them inline with that declaration.
inline float __expf(float x) noexcept { return expf(x); }
inline float __logf(float x) noexcept { return logf(x); }
inline float __log2f(float x) noexcept { return log2f(x); }
inline float __exp2f(float x) noexcept { return exp2f(x); }
static inline float __fdividef(float a, float b) { return a / b; }
// clock64 (CUDA C++ Programming Guide, "Time Function"): the sim's SM clock counts nanoseconds of the host's
// monotonic clock, a 1 GHz clock.
static inline long long clock64() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

#define CUDASIM_MINMAX(T) \
    static inline T min(T a, T b) { return a < b ? a : b; } \
    static inline T max(T a, T b) { return a > b ? a : b; }
CUDASIM_MINMAX(int)
CUDASIM_MINMAX(unsigned int)
CUDASIM_MINMAX(long)
CUDASIM_MINMAX(unsigned long)
CUDASIM_MINMAX(long long)
CUDASIM_MINMAX(unsigned long long)
CUDASIM_MINMAX(float)
CUDASIM_MINMAX(double)
#undef CUDASIM_MINMAX

// ---- atomics (CUDA C++ Programming Guide, "Atomic Functions"): real atomics, blocks run on several threads ----

template <typename T> static inline T cudasim_atomic_add(T *p, T v) {
    cudasim::count_atomic();
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int atomicAdd(int *p, int v) { return cudasim_atomic_add(p, v); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return cudasim_atomic_add(p, v); }
typedef unsigned long long cudasim_ull;
static inline cudasim_ull atomicAdd(cudasim_ull *p, cudasim_ull v) { return cudasim_atomic_add(p, v); }
static inline long long atomicAdd(long long *p, long long v) { return cudasim_atomic_add(p, v); }
static inline float atomicAdd(float *p, float v) {
    cudasim::count_atomic();
    uint32_t old = __atomic_load_n((uint32_t *)p, __ATOMIC_RELAXED), next;
    do next = __float_as_uint(__uint_as_float(old) + v);
    while (!__atomic_compare_exchange_n((uint32_t *)p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return __uint_as_float(old);
}
static inline double atomicAdd(double *p, double v) {
    cudasim::count_atomic();
    uint64_t old = __atomic_load_n((uint64_t *)p, __ATOMIC_RELAXED), next;
    do { double d; memcpy(&d, &old, 8); d += v; memcpy(&next, &d, 8); }
    while (!__atomic_compare_exchange_n((uint64_t *)p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    double d;
    memcpy(&d, &old, 8);
    return d;
}
static inline unsigned atomicOr(unsigned *p, unsigned v) { cudasim::count_atomic(); return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline int atomicOr(int *p, int v) { cudasim::count_atomic(); return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline cudasim_ull atomicOr(cudasim_ull *p, cudasim_ull v) {
    cudasim::count_atomic();
    return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicAnd(unsigned *p, unsigned v) { cudasim::count_atomic(); return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T cudasim_atomic_cas(T *p, T expected, T desired) {
    cudasim::count_atomic();
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}
static inline int atomicCAS(int *p, int e, int d) { return cudasim_atomic_cas(p, e, d); }
static inline unsigned atomicCAS(unsigned *p, unsigned e, unsigned d) { return cudasim_atomic_cas(p, e, d); }
static inline cudasim_ull atomicCAS(cudasim_ull *p, cudasim_ull e, cudasim_ull d) {
    return cudasim_atomic_cas(p, e, d);
}
template <typename T> static inline T cudasim_atomic_max(T *p, T v) {
    cudasim::count_atomic();
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
template <typename T> static inline T cudasim_atomic_min(T *p, T v) {
    cudasim::count_atomic();
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
static inline int atomicMax(int *p, int v) { return cudasim_atomic_max(p, v); }
static inline unsigned atomicMax(unsigned *p, unsigned v) { return cudasim_atomic_max(p, v); }
static inline long long atomicMax(long long *p, long long v) { return cudasim_atomic_max(p, v); }
static inline cudasim_ull atomicMax(cudasim_ull *p, cudasim_ull v) { return cudasim_atomic_max(p, v); }
static inline int atomicMin(int *p, int v) { return cudasim_atomic_min(p, v); }
static inline long long atomicMin(long long *p, long long v) { return cudasim_atomic_min(p, v); }
static inline int atomicExch(int *p, int v) { cudasim::count_atomic(); return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicExch(unsigned *p, unsigned v) { cudasim::count_atomic(); return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }

#endif
