// cuda_check.h: CUDA_CHECK, the one way every CUDA runtime call is checked
// (C and CUDA sources alike): on an error it prints file:line, the call and
// CUDA's error string, and exits (through dist/util.h's fail_at).
// CUBLAS_CHECK does the same for cuBLASLt calls with the status name
// (cublasLtGetStatusName; the file using it includes <cublasLt.h>), and
// NCCL_CHECK for NCCL calls with ncclGetErrorString (the file includes <nccl.h>).
#ifndef MTRAIN_CUDA_CHECK_H
#define MTRAIN_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "util.h"
#ifdef __cplusplus
}
#endif

#define CUDA_CHECK(call) do { \
    cudaError_t cuda_err_ = (call); \
    if (cuda_err_ != cudaSuccess) \
        fail_at(__FILE__, __LINE__, "CUDA: %s: %s", #call, cudaGetErrorString(cuda_err_)); \
} while (0)

#define CUBLAS_CHECK(call) do { \
    cublasStatus_t cublas_st_ = (call); \
    if (cublas_st_ != CUBLAS_STATUS_SUCCESS) \
        fail_at(__FILE__, __LINE__, "cuBLASLt: %s: %s", #call, cublasLtGetStatusName(cublas_st_)); \
} while (0)

#define NCCL_CHECK(call) do { \
    ncclResult_t nccl_rc_ = (call); \
    if (nccl_rc_ != ncclSuccess) fail_at(__FILE__, __LINE__, "NCCL: %s: %s", #call, ncclGetErrorString(nccl_rc_)); \
} while (0)

#endif
