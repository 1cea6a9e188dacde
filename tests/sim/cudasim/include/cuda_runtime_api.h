// cuda_runtime_api.h (cudasim): the subset of the CUDA runtime API that the
// project calls, declared for the CPU execution model in tests/sim/cudasim/
// (found before the toolkit's header on the sim build's include path).
// Compiles as C (the gpu_*.c test programs) and as C++ (the .cu sources).
#ifndef CUDASIM_CUDA_RUNTIME_API_H
#define CUDASIM_CUDA_RUNTIME_API_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Values as in the toolkit's driver_types.h.
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaMemPoolAttr {
    cudaMemPoolAttrReleaseThreshold = 4
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;

// The fields of the toolkit's cudaDeviceProp that the sim fills in (an A100-SXM4-80GB).
typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int maxThreadsPerMultiProcessor;
    int multiProcessorCount;
    int major;
    int minor;
} cudaDeviceProp;

// The fields of the toolkit's cudaFuncAttributes that the sim fills in
// (cudaFuncGetAttributes: the dynamic shared memory allowed and the
// __launch_bounds__ threads; no SASS, so registers and bytes are 0).
typedef struct cudaFuncAttributes {
    size_t sharedSizeBytes;
    size_t localSizeBytes;
    int maxThreadsPerBlock;
    int numRegs;
    int maxDynamicSharedSizeBytes;
} cudaFuncAttributes;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault 0x00
#define cudaHostRegisterDefault 0x00
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02   /* the sim records a time either way */

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, const void *func);
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *func, int block_size,
                                                          size_t dynamic_smem);
// A driver API function by name (the sim has cuTensorMapEncodeTiled), so that a program needs no libcuda.
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1, cudaDriverEntryPointVersionNotSufficent = 2
};
#define cudaEnableDefault 0x0
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status);

cudaError_t cudaMalloc(void **ptr, size_t size);
// The sim's own query (no CUDA runtime has it; code that reads it tests
// CUDASIM_MEMORY_PEAK): the peak so far of the device memory this process
// holds: cudaMalloc's live bytes plus what the stream-ordered pool keeps
// (with a release threshold of UINT64_MAX: its high-water mark of live
// cudaMallocAsync bytes; below that the pool gives memory back down to it).
#define CUDASIM_MEMORY_PEAK 1
cudaError_t cudasimMemoryPeak(size_t *bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream);

cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority);
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
// Events time the CPU running the model of the device, not a device
// (CUDASIM_CPU_TIMING marks it): a choice made by timing here would change
// from run to run, and code that chooses by timing tests this mark.
#define CUDASIM_CPU_TIMING 1

// Extensions of the sim, no toolkit counterpart (CUDASIM_HOST_SYNCS marks
// them): the host synchronisations counted by call site since the reset
// (their number; one line "  FILE:LINE (FUNCTION): CALL: COUNT" per site into
// sites unless NULL), and the NCCL operations enqueued since the reset (their
// number; the least and greatest priority of their streams, numerically the
// highest and lowest), and the device launches enqueued since the reset
// (their number: kernels, cuBLASLt matmuls and memsets, each also by kind).
#define CUDASIM_HOST_SYNCS 1
void cudasim_host_syncs_reset(void);
long cudasim_host_syncs(FILE *sites);
long cudasim_device_launches(long *kernels, long *matmuls, long *memsets);
long cudasim_nccl_priorities(int *least, int *greatest);

// The work that passed through the device wrappers of every kernel run since
// the reset (CUDASIM_KERNEL_COUNTS marks them), summed by kernel name (the
// demangled symbol): launches, blocks, mma.sync.m16n8k16 instructions (one per
// warp), bytes read by ldmatrix (128 per 8x8 matrix), bytes copied by cp.async
// (16 per call, zero-filled or not), warp shuffles (one per warp), block
// barriers (one per block per __syncthreads) and atomics (one per thread per
// call); the shared-memory wavefronts of ldmatrix and of cp.async's shared
// destinations, each with its conflict-free minimum (equal when the kernel
// has no bank conflict there; docs/SIM.md gives the model); the Hopper
// operations: wgmma.mma_async instructions (one per warpgroup) and their
// FLOPs (2 x 64 x N x 16 each), bytes of bulk and bulk tensor copies, and
// mbarrier waits (one per thread per try_wait or test_wait). cudasim_kernel_counts sums the kernels whose name contains `name`
// into out and returns how many there were. With CUDASIM_COUNTS=FILE the
// program writes at exit one line per kernel (tab-separated, a header line
// naming the columns) to FILE.
#define CUDASIM_KERNEL_COUNTS 1
typedef struct {
    unsigned long long launches, blocks, mma, ldmatrix_bytes, cp_async_bytes, shuffles, barriers, atomics;
    unsigned long long ldmatrix_wavefronts, ldmatrix_wavefronts_min, cp_async_wavefronts, cp_async_wavefronts_min;
    unsigned long long wgmma, wgmma_flops, tma_bytes, mbarrier_waits;
} cudasimKernelCounts;
void cudasim_kernel_counts_reset(void);
int cudasim_kernel_counts(const char *name, cudasimKernelCounts *out);

#ifdef __cplusplus
}

// The C++ overload of the toolkit: any kernel pointer.
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}
#endif

#endif
