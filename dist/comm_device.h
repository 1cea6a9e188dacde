// comm_device.h: the device side of the communicators (docs/ARCHITECTURE.md,
// Dist), for the CUDA backend. Each rank binds to one GPU of its node, and
// under parallel.comm: nccl every communicator of dist/comm.h with more than
// one rank gets an NCCL communicator beside its MPI one (Comm.nccl: same
// ranks, same order, made from a unique id broadcast over the MPI one).
// The operations take device buffers and a stream: through NCCL when the
// communicator has one, otherwise staged through host memory and the MPI
// operation of dist/comm.h (parallel.comm: mpi). Built with MTRAIN_CUDA only.
#ifndef MTRAIN_COMM_DEVICE_H
#define MTRAIN_COMM_DEVICE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm.h"

// Bind this rank to visible GPU (node-local rank) modulo (GPUs it sees),
// before the CUDA backend is first used: all the node's GPUs, or one per
// rank under a per-task binding (Slurm's CUDA_VISIBLE_DEVICES). With nccl,
// more ranks on a node than distinct GPUs bound (by PCI bus id) ends every
// rank with one line (NCCL needs a GPU per rank), else the NCCL
// communicators of world, dp and cp are made. A
// collective over the world: every rank calls it.
void comm_device_join(Dist *d, bool nccl);

// A new non-blocking stream at the device's greatest priority, for
// communication: NCCL's kernels then get SMs ahead of the attention kernels
// that fill them, so transfers overlap compute.
cudaStream_t comm_device_stream_new(void);

// Every NCCL operation below is watched until it completes: a failure
// reported by NCCL, or no completion within parallel.timeout_s (a rank that
// skipped the collective), aborts the communicator and ends the whole job
// with "mtrain: rank R: OP on COMM did not complete within S s" (or "...
// failed: NCCL: ..."). The staged path waits through dist/comm.h's deadline.
// NCCL operations of two communicators are never in flight at once (NCCL
// documentation, "Using multiple NCCL communicators concurrently": they may
// deadlock): each is ordered by an event after the last operation of every
// other communicator, so the bucketed gradient all-reduce (world) and the
// ring's groups (cp) take turns.

// In place, the sum over c of every rank's buf [count] (device memory, fp32),
// ordered on stream; returns when the sum is in buf.
void comm_device_allreduce(const Comm *c, float *buf, int64_t count, cudaStream_t stream);

// The all-reduce in buckets: start the sum over c of buf [count] (in place)
// on comm_stream once the work queued so far on stream is done (an event),
// and return; finish waits for every sum started on comm_stream (watched as
// above), so that work enqueued afterwards sees them. parallel.comm: mpi:
// start sums at once, staged through the host on stream; finish has nothing
// left to wait for.
void comm_device_allreduce_start(const Comm *c, float *buf, int64_t count, cudaStream_t stream,
                                 cudaStream_t comm_stream);
void comm_device_allreduce_finish(const Comm *c, cudaStream_t comm_stream);

// In place on arena [c->size * count] (device memory, fp32): block r of the
// sum over c into block r on rank r (ZeRO-1's gradient reduction, the sparse
// ring's plan); the other blocks are undefined afterwards. Ordered on
// stream: work enqueued on it afterwards sees the sum. With NCCL it returns
// once enqueued (no host wait; comm_device_settle watches it), staged
// through the host it returns when the sum is in place.
void comm_device_reduce_scatter(const Comm *c, float *arena, int64_t count, cudaStream_t stream);

// In place on arena [c->size * count] (device memory, bf16 bits): block r of
// rank r to every rank (the compute weights after a ZeRO-1 update, the
// sparse ring's plan and gathered columns). Ordered and watched as the
// reduce-scatter.
void comm_device_allgather_bf16(const Comm *c, uint16_t *arena, int64_t count, cudaStream_t stream);

// Point-to-point transfers of device buffers over c, posted one by one and
// waited for later (the ring attention's, attention/ring/ring_cuda.c); bytes a
// multiple of 4. Every transfer is ordered after the work enqueued on
// `compute` before it was posted; a wait orders the work enqueued on
// `compute` after it behind the transfer. With NCCL the host never waits: the
// posted transfers are collected and handed to NCCL at every wait (the
// transfers posted since the previous wait, in order; between two ranks,
// transfers pair up in the order they are posted), one group per lane on the
// lane's communication stream: peers in this rank's inner ring of `inner`
// consecutive ranks (its node), then the others (the hierarchical ring's
// outer hops, over the network); inner = c->size: one lane. A group
// completes as a unit, so an outer hop never shares one with an inner hop:
// the compute stream waits by an event for the group of the transfer it
// reads only. A lane's groups run one after the other: each message's send
// and receive must be posted between the same two waits of their ranks
// (which wait at the same points), and nothing may wait for the whole device
// (cudaFree, cudaDeviceSynchronize) while transfers are outstanding. Without
// NCCL (parallel.comm: mpi) a send waits for the compute stream and goes
// through host memory and MPI non-blocking, a receive is copied to the
// device at its wait. The no-hang rule: with NCCL a wait makes only the
// compute stream wait (no host wait inside a ring step);
// comm_device_settle, called before the host blocks on the device, and
// freeing the exchange watch each lane's groups handed over (the watchdog
// above; a time-out names the oldest kept group not complete, by the wait
// that handed it over). Without NCCL, comm_wait's deadline.
typedef struct DeviceExchange DeviceExchange;
DeviceExchange *comm_device_exchange_new(const Comm *c, int inner, cudaStream_t compute);   // inner divides c's size
void comm_device_exchange_free(DeviceExchange *x);
// Each returns the transfer's id (>= 0) for comm_device_wait.
int64_t comm_device_send(DeviceExchange *x, const void *buf, size_t bytes, int to, int tag);
int64_t comm_device_recv(DeviceExchange *x, void *buf, size_t bytes, int from, int tag);
// Hands the transfers posted so far over (NCCL), then waits for transfer id
// (-1: none). op names the transfer in a time-out message.
void comm_device_wait(DeviceExchange *x, int64_t id, const char *op);
// Every live exchange's groups handed over so far, and the reduce-scatters
// and all-gathers enqueued since the last call, through the watchdog: called
// before the host blocks on a stream that may wait for them (the CUDA
// backend's reads of device memory, the sparse ring's read of its need
// rows), so that a peer that never posts its half ends the job naming the
// transfer or collective instead of leaving the host blocked.
void comm_device_settle(void);

#endif
