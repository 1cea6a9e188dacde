// gpu_test_cub.c: the two CUB algorithms the project calls (the toolkit's CUB
// on a GPU, the sim's under the CPU execution model), through gpu_cub.h,
// against host references: cub::DeviceScan::InclusiveSum on int64 (n = 0, 1,
// 1000, 2^20; in place and not; sums past 2^32) and
// cub::DeviceSegmentedRadixSort::SortKeysDescending on uint64 keys (empty
// segments, an end before its begin, bit ranges [0,64), [8,24), [32,64),
// [0,1); keys equal on the bit range but not elsewhere keep their input
// order). And the temporary-storage protocol: a size query does no work, a
// storage one byte short is cudaErrorInvalidValue. Outputs start poisoned.
//   gpu_test_cub [small]     every check (all small: `small` as the other GPU tests take it)
//   gpu_test_cub host-temp   a misuse the sim must stop (tests/sim/test_sim_libs.sh)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"
#include "gpu_cub.h"

static void check_inclusive_sum(int64_t n, int in_place, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    int64_t *x = xmalloc((size_t)n * sizeof(int64_t) + 1);
    for (int64_t i = 0; i < n; i++) x[i] = (int64_t)rng_below(&rng, 1ull << 34) - (1ll << 30);
    int64_t *in = to_device(x, (size_t)n * sizeof(int64_t));
    int64_t *out = in_place ? in : poisoned((size_t)n * sizeof(int64_t));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    size_t bytes = 0;
    CUDA_CHECK(gpu_cub_inclusive_sum(NULL, &bytes, in, out, n, stream));
    void *temp;
    CUDA_CHECK(cudaMalloc(&temp, bytes ? bytes : 1));
    CUDA_CHECK(gpu_cub_inclusive_sum(temp, &bytes, in, out, n, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    int64_t *got = xmalloc((size_t)n * sizeof(int64_t) + 1);
    CUDA_CHECK(cudaMemcpy(got, out, (size_t)n * sizeof(int64_t), cudaMemcpyDeviceToHost));
    int64_t sum = 0, bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        sum += x[i];
        if (got[i] != sum) bad = i;
    }
    EXPECT_COUNTED(bad < 0, "cub inclusive sum n=%lld%s (first wrong index %lld)", (long long)n,
                   in_place ? " in place" : "", (long long)bad);
    free(x);
    free(got);
    CUDA_CHECK(cudaFree(temp));
    CUDA_CHECK(cudaFree(in));
    if (!in_place) CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// The size query does no work; one byte short is refused.
static void check_scan_protocol(void) {
    const int64_t x[3] = {1, 2, 3};
    int64_t *in = to_device(x, sizeof x);
    int64_t *out = poisoned(sizeof x);
    size_t bytes = 0;
    CUDA_CHECK(gpu_cub_inclusive_sum(NULL, &bytes, in, out, 3, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    int64_t got[3];
    CUDA_CHECK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_COUNTED(bytes > 0 && got[0] == -1 && got[1] == -1 && got[2] == -1,
                   "cub inclusive sum size query: %zu bytes, output untouched", bytes);
    void *temp;
    CUDA_CHECK(cudaMalloc(&temp, bytes));
    const cudaError_t err = gpu_cub_inclusive_sum(temp, &(size_t){bytes - 1}, in, out, 3, 0);
    EXPECT_COUNTED(err == cudaErrorInvalidValue, "cub inclusive sum with %zu - 1 bytes of storage: %s", bytes,
                   cudaGetErrorString(err));
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFree(temp));
    CUDA_CHECK(cudaFree(in));
    CUDA_CHECK(cudaFree(out));
}

typedef struct {
    uint64_t key;
    int64_t index;
} IndexedKey;

static int begin_bit_g, end_bit_g;   // the bit range of compare_descending

static uint64_t digit(uint64_t key) {
    const int bits = end_bit_g - begin_bit_g;
    return bits >= 64 ? key : (key >> begin_bit_g) & ((1ull << bits) - 1);
}

// Larger digit first; equal digits in input order.
static int compare_descending(const void *pa, const void *pb) {
    const IndexedKey *a = pa, *b = pb;
    const uint64_t da = digit(a->key), db = digit(b->key);
    if (da != db) return da > db ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

// num_segments segments of random lengths (some empty, one with end < begin)
// over n keys whose bits outside [begin_bit, end_bit) are random, so that
// equal digits are common when the range is narrow.
static void check_segmented_sort(int num_segments, int begin_bit, int end_bit, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    int64_t *begin = xmalloc((size_t)num_segments * sizeof(int64_t));
    int64_t *end = xmalloc((size_t)num_segments * sizeof(int64_t));
    int64_t n = 0;
    for (int s = 0; s < num_segments; s++) {
        const int64_t len = s % 4 == 1 ? 0 : (int64_t)rng_below(&rng, 600);
        begin[s] = n;
        end[s] = n + len;
        n += len;
    }
    if (num_segments > 3) end[3] = begin[3] - 1;   // an end before its begin: empty (its keys stay unsorted)
    uint64_t *keys = xmalloc((size_t)n * sizeof(uint64_t) + 1);
    for (int64_t i = 0; i < n; i++) keys[i] = rng_next(&rng) & (rng_below(&rng, 2) ? ~0ull : 0xffff00ffull);
    uint64_t *d_in = to_device(keys, (size_t)n * sizeof(uint64_t));
    uint64_t *d_out = poisoned((size_t)n * sizeof(uint64_t));
    int64_t *d_begin = to_device(begin, (size_t)num_segments * sizeof(int64_t));
    int64_t *d_end = to_device(end, (size_t)num_segments * sizeof(int64_t));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    size_t bytes = 0;
    CUDA_CHECK(gpu_cub_sort_descending(NULL, &bytes, d_in, d_out, (int)n, num_segments, d_begin, d_end, begin_bit,
                                       end_bit, stream));
    void *temp;
    CUDA_CHECK(cudaMalloc(&temp, bytes ? bytes : 1));
    if (bytes) {
        const cudaError_t err = gpu_cub_sort_descending(temp, &(size_t){bytes - 1}, d_in, d_out, (int)n,
                                                        num_segments, d_begin, d_end, begin_bit, end_bit, stream);
        EXPECT_COUNTED(err == cudaErrorInvalidValue, "cub segmented sort with %zu - 1 bytes of storage: %s", bytes,
                       cudaGetErrorString(err));
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(gpu_cub_sort_descending(temp, &bytes, d_in, d_out, (int)n, num_segments, d_begin, d_end, begin_bit,
                                       end_bit, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    uint64_t *got = xmalloc((size_t)n * sizeof(uint64_t) + 1);
    CUDA_CHECK(cudaMemcpy(got, d_out, (size_t)n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    begin_bit_g = begin_bit;
    end_bit_g = end_bit;
    IndexedKey *ref = xmalloc((size_t)n * sizeof(IndexedKey) + 1);
    int64_t bad = -1, checked = 0;
    for (int s = 0; s < num_segments; s++) {
        const int64_t len = end[s] - begin[s];
        if (len <= 0) continue;
        for (int64_t i = 0; i < len; i++) ref[i] = (IndexedKey){keys[begin[s] + i], i};
        qsort(ref, (size_t)len, sizeof(IndexedKey), compare_descending);
        for (int64_t i = 0; i < len && bad < 0; i++)
            if (got[begin[s] + i] != ref[i].key) bad = begin[s] + i;
        checked += len;
    }
    EXPECT_COUNTED(bad < 0, "cub segmented descending sort: %d segments, %lld keys sorted, bits [%d, %d) "
                   "(first wrong index %lld)", num_segments, (long long)checked, begin_bit, end_bit, (long long)bad);
    free(ref);
    free(got);
    free(keys);
    free(begin);
    free(end);
    CUDA_CHECK(cudaFree(temp));
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(d_begin));
    CUDA_CHECK(cudaFree(d_end));
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// `host-temp`: the scan given host memory as its temporary storage (a fault
// on a GPU; the sim ends with one line naming the argument).
static void misuse_host_temp(void) {
    int64_t *x = poisoned(8 * sizeof(int64_t));
    size_t bytes = 0;
    CUDA_CHECK(gpu_cub_inclusive_sum(NULL, &bytes, x, x, 8, 0));
    void *temp = xmalloc(bytes);
    CUDA_CHECK(gpu_cub_inclusive_sum(temp, &bytes, x, x, 8, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("FAIL cub host temporary storage: accepted\n");
    exit(1);
}

int main(int argc, char **argv) {
    const int misuse = argc == 2 && strcmp(argv[1], "host-temp") == 0;
    CHECK(argc == 1 || misuse || (argc == 2 && strcmp(argv[1], "small") == 0), "usage: %s [small|host-temp]",
          argv[0]);
    if (misuse) misuse_host_temp();
    const int64_t sizes[] = {0, 1, 1000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        check_inclusive_sum(sizes[i], 0, 10 + i);
        check_inclusive_sum(sizes[i], 1, 20 + i);
    }
    check_scan_protocol();
    check_segmented_sort(1, 0, 64, 30);
    check_segmented_sort(9, 0, 64, 31);
    check_segmented_sort(9, 8, 24, 32);
    check_segmented_sort(12, 32, 64, 33);
    check_segmented_sort(6, 0, 1, 34);
    printf("%d checks\n", checks);
    return check_exit();
}
