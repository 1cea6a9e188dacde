// cuda_kernel.h: the portable spellings of the CUDA sources, so that the same
// .cu files compile with nvcc and, for the CPU execution model in
// tests/sim/cudasim/ (-D__CUDASIM__), with g++:
//   CUDA_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)  a launch
//   DYNAMIC_SHARED(type, name)            the block's dynamic shared memory, type name[]
//   STATIC_SHARED(type, name, dims)       a static __shared__ array, type name dims
// A template kernel whose arguments contain commas is named through an alias
// (auto kernel = k<A, B>) before CUDA_LAUNCH.
#ifndef MTRAIN_CUDA_KERNEL_H
#define MTRAIN_CUDA_KERNEL_H

#ifdef __CUDASIM__
#define CUDA_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
    cudasim_launch(#kernel, kernel, grid, block, smem_bytes, stream, ##__VA_ARGS__)
#define DYNAMIC_SHARED(type, name) type *name = static_cast<type *>(cudasim::shared_dynamic())
#define STATIC_SHARED(type, name, dims) \
    static const char name##_site_ = 0; \
    type(&name) dims = \
        *reinterpret_cast<type(*) dims>(cudasim::shared_static(&name##_site_, sizeof(type dims), alignof(type)))
#else
#define CUDA_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
    kernel<<<grid, block, smem_bytes, stream>>>(__VA_ARGS__)
#define DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#define STATIC_SHARED(type, name, dims) __shared__ type name dims
#endif

#endif
