// gpu_cub.h: C entry points to the two CUB algorithms the project calls, with
// the key and offset types it uses, for the C test program gpu_test_cub.c
// (CUB itself is C++ templates). Each forwards its arguments unchanged and
// returns CUB's cudaError_t (tests/sim/gpu_cub.cu).
#ifndef MTRAIN_GPU_CUB_H
#define MTRAIN_GPU_CUB_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// cub::DeviceScan::InclusiveSum on int64_t (in == out allowed).
cudaError_t gpu_cub_inclusive_sum(void *temp, size_t *temp_bytes, const int64_t *in, int64_t *out, int64_t n,
                                  cudaStream_t stream);

// cub::DeviceSegmentedRadixSort::SortKeysDescending on uint64_t keys, int64_t offsets.
cudaError_t gpu_cub_sort_descending(void *temp, size_t *temp_bytes, const uint64_t *keys_in, uint64_t *keys_out,
                                    int num_items, int num_segments, const int64_t *begin_offsets,
                                    const int64_t *end_offsets, int begin_bit, int end_bit, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
