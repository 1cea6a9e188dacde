// tensor_map.cpp: cuTensorMapEncodeTiled (CUDA Driver API, "Tensor Map Object
// Management") for the CPU execution model of CUDA: the driver's checks of
// the arguments, then the sim's encoding of the map (cudasim.h,
// TensorMapModel) in its 128 opaque bytes, which grid.cpp's bulk tensor
// copies read; cudaGetDriverEntryPointByVersion finds it by name. Interleaved layouts, element strides other than 1 and the
// NaN out-of-bounds fill are not modelled: asked for, the program ends.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <string.h>

#include "cudasim.h"

static uint32_t element_bytes(CUtensorMapDataType t) {
    switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
    }
    return 0;
}

// The driver's requirements: the map 64-byte aligned; rank 1..5; the global address 16-byte aligned; each
// dimension 1..2^32 elements; the strides multiples of 16 below 2^40 bytes; each box dimension 1..256, the
// inner one a multiple of 16 bytes and, with a swizzle, at most the swizzle's span (32, 64 or 128 bytes).
CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
    (void)l2Promotion;
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || oobFill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        cudasim::fail("cuTensorMapEncodeTiled: the sim models no interleave and the zero out-of-bounds fill only");
    const uint32_t esize = element_bytes(tensorDataType);
    if (!tensorMap || (uintptr_t)tensorMap % 64 || esize == 0 || tensorRank < 1 || tensorRank > 5 ||
        !globalAddress || (uintptr_t)globalAddress % 16 || swizzle > CU_TENSOR_MAP_SWIZZLE_128B)
        return CUDA_ERROR_INVALID_VALUE;
    cudasim::TensorMapModel m;
    memset(&m, 0, sizeof m);
    m.magic = cudasim::TENSOR_MAP_MAGIC;
    m.global = (const unsigned char *)globalAddress;
    m.rank = tensorRank;
    m.element_bytes = esize;
    m.swizzle_bytes = swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0 : 16u << swizzle;
    for (uint32_t i = 0; i < tensorRank; i++) {
        if (elementStrides[i] != 1)
            cudasim::fail("cuTensorMapEncodeTiled: the sim models element strides of 1 only (dimension %u: %u)", i,
                          elementStrides[i]);
        if (globalDim[i] == 0 || globalDim[i] > (1ull << 32) || boxDim[i] == 0 || boxDim[i] > 256)
            return CUDA_ERROR_INVALID_VALUE;
        m.dim[i] = globalDim[i];
        m.box[i] = boxDim[i];
        m.stride[i] = i == 0 ? esize : globalStrides[i - 1];
        if (i > 0 && (m.stride[i] % 16 || m.stride[i] >= (1ull << 40))) return CUDA_ERROR_INVALID_VALUE;
    }
    const uint64_t inner_bytes = (uint64_t)boxDim[0] * esize;
    if (inner_bytes % 16 || (m.swizzle_bytes && inner_bytes > m.swizzle_bytes)) return CUDA_ERROR_INVALID_VALUE;
    static_assert(sizeof m <= sizeof tensorMap->opaque, "the sim's tensor map fits the opaque bytes");
    memset(tensorMap, 0, sizeof *tensorMap);
    memcpy(tensorMap->opaque, &m, sizeof m);
    return CUDA_SUCCESS;
}

// CUDA Runtime API, "Driver Entry Point Access": the sim's driver functions by name.
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status) {
    (void)cudaVersion;
    (void)flags;
    const bool found = symbol && strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    if (status) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    if (!funcPtr) return cudaErrorInvalidValue;
    *funcPtr = found ? (void *)cuTensorMapEncodeTiled : nullptr;
    return cudaSuccess;
}
