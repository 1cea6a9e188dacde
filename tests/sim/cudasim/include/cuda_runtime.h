// cuda_runtime.h (cudasim): the runtime API (cuda_runtime_api.h) and, for
// C++, the device side of CUDA as the CPU execution model implements it
// (cudasim_device.h): qualifiers, built-in variables, intrinsics, launches.
#ifndef CUDASIM_CUDA_RUNTIME_H
#define CUDASIM_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "cudasim_device.h"
#endif

#endif
