// runtime.h: what the sim's runtime (runtime.cpp) and its grid executor
// (grid.cpp) share: the seed, the device, the error state, one launch.
#ifndef CUDASIM_RUNTIME_H
#define CUDASIM_RUNTIME_H

#include <stdint.h>

#include <functional>
#include <string>

#include "cudasim.h"
#include "include/cudasim_device.h"

namespace cudasim {

// Static shared memory per block (CUDA C++ Programming Guide, Compute Capabilities: 48 KiB).
static const size_t STATIC_SMEM_LIMIT = 48 * 1024;

// CUDASIM_SEED (default 1): block order, thread order per phase, stream interleaving.
uint64_t seed();
// The sim's device: an A100-SXM4-80GB.
const cudaDeviceProp &device_props();
// The calling host thread's last error (cudaGetLastError clears it).
void set_error(cudaError_t e);
uint64_t next_launch_number();

struct Launch {
    std::string name;
    dim3 grid, block;
    size_t smem;
    std::function<void()> body;   // one CUDA thread
    uint64_t number;
};

cudaError_t set_max_dynamic_smem(const void *fn, int bytes);
void func_attributes(const void *fn, cudaFuncAttributes *attr);

}  // namespace cudasim

#endif
