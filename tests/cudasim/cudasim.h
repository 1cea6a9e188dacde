// cudasim.h: the internal C++ interface of the CPU execution model of CUDA
// (tests/cudasim/*.cpp), used by the sim's runtime and by its library subsets
// (CUB host algorithms, cuBLASLt, NCCL).
#ifndef CUDASIM_CUDASIM_H
#define CUDASIM_CUDASIM_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include <functional>

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

// Run every operation queued so far on `stream` (and what it depends on); 0 drains the device.
void drain(cudaStream_t stream);

// One line "cudasim: <message>" on stderr, then exit(1): every broken rule ends this way.
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// A host synchronisation made by the call `what` that returns to `caller`
// (counted for cudasim_host_syncs).
void host_sync(const char *what, const void *caller);

// An NCCL operation enqueued on `stream` (its priority, for cudasim_nccl_priorities).
void nccl_stream(cudaStream_t stream);

// Device memory = host memory: is [p, p+bytes) inside one live device allocation? (for library checks)
bool is_device(const void *p, size_t bytes);

}  // namespace cudasim

#endif
