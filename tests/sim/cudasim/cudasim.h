// cudasim.h: the internal C++ interface of the CPU execution model of CUDA
// (tests/sim/cudasim/*.cpp), used by the sim's runtime and by its library subsets
// (CUB host algorithms, cuBLASLt, NCCL).
#ifndef CUDASIM_CUDASIM_H
#define CUDASIM_CUDASIM_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include <functional>
#include <string>
#include <vector>

namespace cudasim {

// Enqueue a host-side operation on a stream (0 = the legacy default stream); it
// runs in stream order, interleaved with other streams' work by the seeded
// scheduler, when some host call drains the queues.
void enqueue(cudaStream_t stream, const char *what, std::function<void()> op);

// Enqueue an operation that completes over several attempts (one waiting
// for other processes, as NCCL's): step is called each time the scheduler
// picks it, until it returns true; meanwhile other streams' work may run, and
// cudaEventQuery returns cudaErrorNotReady for what comes after it instead of
// waiting, so that a host can poll with a deadline.
void enqueue_polled(cudaStream_t stream, const char *what, std::function<bool()> step);

// Run what can run now, as a device does while its host is busy elsewhere,
// without waiting on an operation that cannot complete yet (one waiting for
// other processes).
void progress();

// Run every operation queued so far on `stream` (and what it depends on); 0 drains the device.
void drain(cudaStream_t stream);

// One line "cudasim: <message>" on stderr, then exit(1): every broken rule ends this way.
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// A host synchronisation made by the call `what` that returns to `caller`
// (counted for cudasim_host_syncs).
void host_sync(const char *what, const void *caller);

// The NCCL operation just enqueued on `stream` (one call or one group) over
// communicators `comms`, moving point-to-point data within a node
// (p2p_local) and between nodes (p2p_network): its stream's priority is
// recorded (cudasim_nccl_priorities); it must be ordered after every
// operation of another communicator the host has not seen complete, and no
// later cudaStreamWaitEvent may make a stream wait for a node-local and a
// network transfer at once (CUDASIM_NODE_RANKS), else the program ends with
// one line.
void nccl_enqueued(cudaStream_t stream, const std::vector<const void *> &comms, bool p2p_local, bool p2p_network,
                   const std::string &what);

// Device memory = host memory: is [p, p+bytes) inside one live device allocation? (for library checks)
bool is_device(const void *p, size_t bytes);

// The sim's encoding of a CUtensorMap (cuda.h; written by cuTensorMapEncodeTiled in tensor_map.cpp, read by
// the bulk tensor copies in grid.cpp): a tiled tensor of `rank` dimensions, dimension 0 contiguous.
struct TensorMapModel {
    uint64_t magic;               // TENSOR_MAP_MAGIC once encoded
    const unsigned char *global;  // element (0, ..., 0)
    uint64_t dim[5];              // elements per dimension
    uint64_t stride[5];           // bytes between successive indices of each dimension (stride[0] = element size)
    uint32_t box[5];              // the box copied per call, elements per dimension
    uint32_t rank, element_bytes;
    uint32_t swizzle_bytes;       // 0 (none), 32, 64 or 128
};
static const uint64_t TENSOR_MAP_MAGIC = 0x70616d726f736e74ull;

}  // namespace cudasim

#endif
