// gpu_cub.cu: the C entry points of gpu_cub.h, compiled by nvcc against the
// toolkit's CUB and by the sim build against tests/sim/cudasim/include/cub.
#include <cub/cub.cuh>

#include "gpu_cub.h"

extern "C" cudaError_t gpu_cub_inclusive_sum(void *temp, size_t *temp_bytes, const int64_t *in, int64_t *out,
                                             int64_t n, cudaStream_t stream) {
    return cub::DeviceScan::InclusiveSum(temp, *temp_bytes, in, out, n, stream);
}

extern "C" cudaError_t gpu_cub_sort_descending(void *temp, size_t *temp_bytes, const uint64_t *keys_in,
                                               uint64_t *keys_out, int num_items, int num_segments,
                                               const int64_t *begin_offsets, const int64_t *end_offsets,
                                               int begin_bit, int end_bit, cudaStream_t stream) {
    return cub::DeviceSegmentedRadixSort::SortKeysDescending(temp, *temp_bytes, keys_in, keys_out, num_items,
                                                             num_segments, begin_offsets, end_offsets, begin_bit,
                                                             end_bit, stream);
}
