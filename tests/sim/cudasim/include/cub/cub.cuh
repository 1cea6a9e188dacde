// cub/cub.cuh (cudasim): the device-wide CUB algorithms the project calls,
// run on the host in stream order by the CPU execution model (tests/sim/cudasim/):
// cub::DeviceScan::InclusiveSum and
// cub::DeviceSegmentedRadixSort::SortKeysDescending, with CUB's two-phase
// temporary-storage protocol. Raw pointers only (what the project passes).
#ifndef CUDASIM_CUB_CUH
#define CUDASIM_CUB_CUH

#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#include "../../cudasim.h"

namespace cub {
namespace sim {

// The two-phase protocol (CUB documentation, "Device-wide primitives": temporary
// storage). temp == nullptr: set *bytes to `need` and return cudaSuccess (nothing
// runs). Otherwise: *bytes < need is cudaErrorInvalidValue, as CUB's
// AliasTemporaries returns; temp outside device memory ends the program.
// Returns true when the algorithm is to run.
bool temp_storage(const char *algorithm, void *temp, size_t *bytes, size_t need, cudaError_t *err);

// The whole [p, p + bytes) inside one device allocation, else one line and exit.
void require_device(const char *algorithm, const char *what, const void *p, size_t bytes);

}  // namespace sim

struct DeviceScan {
    // CUB documentation, cub::DeviceScan::InclusiveSum: out[i] = in[0] + ... + in[i],
    // i < num_items; in place (d_in == d_out) allowed. Temporary storage: 256 bytes.
    template <typename T, typename NumItemsT>
    static cudaError_t InclusiveSum(void *d_temp_storage, size_t &temp_storage_bytes, const T *d_in, T *d_out,
                                    NumItemsT num_items, cudaStream_t stream = 0) {
        cudaError_t err;
        if (!sim::temp_storage("cub::DeviceScan::InclusiveSum", d_temp_storage, &temp_storage_bytes, 256, &err))
            return err;
        const size_t n = num_items > 0 ? (size_t)num_items : 0;
        sim::require_device("cub::DeviceScan::InclusiveSum", "d_in", d_in, n * sizeof(T));
        sim::require_device("cub::DeviceScan::InclusiveSum", "d_out", d_out, n * sizeof(T));
        cudasim::enqueue(stream, "cub::DeviceScan::InclusiveSum", [=] {
            std::fill_n((unsigned char *)d_temp_storage, temp_storage_bytes, (unsigned char)0xa5);
            T sum = T();
            for (size_t i = 0; i < n; i++) {
                sum = sum + d_in[i];
                d_out[i] = sum;
            }
        });
        return cudaSuccess;
    }
};

struct DeviceSegmentedRadixSort {
    // CUB documentation, cub::DeviceSegmentedRadixSort::SortKeysDescending: each
    // segment [d_begin_offsets[s], d_end_offsets[s]) of d_keys_in is sorted into
    // the same range of d_keys_out, largest first, comparing only the key bits
    // [begin_bit, end_bit); equal keys keep their input order (stable). A segment
    // whose end is not after its begin is empty. Input and output shall not
    // overlap. Unsigned integer keys (the project's); temporary storage holds one
    // copy of the keys. Offsets are read when the sort runs (stream order).
    template <typename KeyT, typename BeginOffsetT, typename EndOffsetT>
    static cudaError_t SortKeysDescending(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in,
                                          KeyT *d_keys_out, int num_items, int num_segments,
                                          const BeginOffsetT *d_begin_offsets, const EndOffsetT *d_end_offsets,
                                          int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                                          cudaStream_t stream = 0) {
        static_assert(std::is_unsigned<KeyT>::value, "cudasim: radix sort of unsigned integer keys only");
        const char *name = "cub::DeviceSegmentedRadixSort::SortKeysDescending";
        const size_t n = num_items > 0 ? (size_t)num_items : 0;
        const size_t segments = num_segments > 0 ? (size_t)num_segments : 0;
        cudaError_t err;
        if (!sim::temp_storage(name, d_temp_storage, &temp_storage_bytes, 256 + n * sizeof(KeyT), &err)) return err;
        if (begin_bit < 0 || end_bit > (int)sizeof(KeyT) * 8 || begin_bit > end_bit) return cudaErrorInvalidValue;
        sim::require_device(name, "d_keys_in", d_keys_in, n * sizeof(KeyT));
        sim::require_device(name, "d_keys_out", d_keys_out, n * sizeof(KeyT));
        sim::require_device(name, "d_begin_offsets", d_begin_offsets, segments * sizeof(BeginOffsetT));
        sim::require_device(name, "d_end_offsets", d_end_offsets, segments * sizeof(EndOffsetT));
        if (n && d_keys_in < d_keys_out + n && d_keys_out < d_keys_in + n)
            cudasim::fail("%s: d_keys_in and d_keys_out overlap", name);
        cudasim::enqueue(stream, name, [=] {
            KeyT *scratch = (KeyT *)d_temp_storage;
            const int bits = end_bit - begin_bit;
            const KeyT mask = bits >= (int)sizeof(KeyT) * 8 ? (KeyT)~(KeyT)0 : (KeyT)(((KeyT)1 << bits) - 1);
            auto digit = [=](KeyT key) { return (KeyT)(bits ? (key >> begin_bit) & mask : 0); };
            for (size_t s = 0; s < segments; s++) {
                const int64_t lo = (int64_t)d_begin_offsets[s], hi = (int64_t)d_end_offsets[s];
                if (hi <= lo) continue;
                if (lo < 0 || hi > (int64_t)n)
                    cudasim::fail("%s: segment %zu is [%lld, %lld), outside the %zu keys", name, s, (long long)lo,
                                  (long long)hi, n);
                std::copy(d_keys_in + lo, d_keys_in + hi, scratch + lo);
                std::stable_sort(scratch + lo, scratch + hi, [=](KeyT a, KeyT b) { return digit(a) > digit(b); });
                std::copy(scratch + lo, scratch + hi, d_keys_out + lo);
            }
        });
        return cudaSuccess;
    }
};

}  // namespace cub

#endif
