// comm_device.c: GPU choice, the NCCL communicators beside the MPI ones, and
// the operations on device buffers (see comm_device.h).
#ifdef MTRAIN_CUDA

#include "comm_device.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"
#include "util.h"

// The communicators that get a device side, in the order every rank makes them.
static Comm *dist_comms(Dist *d, int i) {
    Comm *comms[] = {&d->world, &d->dp, &d->cp, &d->cp_inner, &d->cp_outer};
    return i < (int)(sizeof(comms) / sizeof(comms[0])) ? comms[i] : NULL;
}

// The NCCL communicator over c's ranks in c's order: rank 0 of c makes the
// unique id, c's MPI communicator carries it to the others.
static void make_nccl(Comm *c) {
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, c->comm));
    NCCL_CHECK(ncclCommInitRank(&c->nccl, c->size, id, c->rank));
}

static void leave_devices(Dist *d) {
    for (int i = 0; dist_comms(d, i); i++) {
        Comm *c = dist_comms(d, i);
        if (c->nccl) NCCL_CHECK(ncclCommDestroy(c->nccl));
        c->nccl = NULL;
    }
    d->leave_devices = NULL;
}

void comm_device_join(Dist *d, bool nccl) {
    int gpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&gpus));
    // The most ranks on any node against the fewest GPUs on any node.
    int64_t worst[2] = {d->local_size, -(int64_t)gpus};
    comm_allreduce(&d->world, worst, 2, DT_INT64, REDUCE_MAX);
    if (nccl && worst[0] > -worst[1])
        comm_fail_all(&d->world, "parallel.comm: nccl: %lld ranks on a node with %lld GPU%s (NCCL needs a GPU per "
                      "rank: expected at most %lld rank%s per node, or parallel.comm: mpi to share the GPUs)",
                      (long long)worst[0], (long long)-worst[1], worst[1] == -1 ? "" : "s", (long long)-worst[1],
                      worst[1] == -1 ? "" : "s");
    CUDA_CHECK(cudaSetDevice(d->local_rank % gpus));
    if (!nccl) return;
    for (int i = 0; dist_comms(d, i); i++)
        if (dist_comms(d, i)->size > 1) make_nccl(dist_comms(d, i));
    d->leave_devices = leave_devices;
}

// The watchdog of an NCCL operation just enqueued on stream: poll its
// completion (an event after it) and the communicator's asynchronous error
// until c's deadline (parallel.timeout_s); a failure or the deadline aborts
// the communicator (which unblocks the stream) and ends the job with one line
// naming this rank, the operation and the communicator. Spins for the first
// 2 ms, then sleeps 100 µs between polls, as comm_wait does.
static void watch_device(const Comm *c, cudaStream_t stream, const char *op) {
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream));
    double start = now_seconds();
    for (;;) {
        cudaError_t state = cudaEventQuery(done);
        if (state == cudaSuccess) break;
        if (state != cudaErrorNotReady) CUDA_CHECK(state);
        ncclResult_t error = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(c->nccl, &error));
        if (error != ncclSuccess && error != ncclInProgress) {
            int rank = -1;
            MPI_Comm_rank(MPI_COMM_WORLD, &rank);
            fprintf(stderr, "mtrain: rank %d: %s on %s failed: NCCL: %s\n", rank, op, c->name,
                    ncclGetErrorString(error));
            fflush(stderr);
            ncclCommAbort(c->nccl);
            MPI_Abort(MPI_COMM_WORLD, 1);
            exit(1);
        }
        if (now_seconds() - start > c->timeout_s) {
            ncclCommAbort(c->nccl);
            comm_timed_out(c, op);
        }
        if (now_seconds() - start > 2e-3) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    CUDA_CHECK(cudaEventDestroy(done));
}

// parallel.comm: mpi: device range src [bytes] copied into host memory at
// dst, and back, each waiting for stream.
static void stage_out(void *dst, const float *src, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}
static void stage_in(float *dst, const void *src, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

void comm_device_allreduce(const Comm *c, float *buf, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    if (c->nccl) {
        NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, c->nccl, stream));
        watch_device(c, stream, "all-reduce (sum)");
        return;
    }
    size_t bytes = sizeof(float) * (size_t)count;
    float *host = xmalloc(bytes);
    stage_out(host, buf, bytes, stream);
    comm_allreduce(c, host, count, DT_FLOAT, REDUCE_SUM);
    stage_in(buf, host, bytes, stream);
    free(host);
}

void comm_device_allreduce_start(const Comm *c, float *buf, int64_t count, cudaStream_t stream,
                                 cudaStream_t comm_stream) {
    static cudaEvent_t computed;  // re-recorded per bucket: each wait takes the record of its call
    if (!c->nccl) {
        comm_device_allreduce(c, buf, count, stream);
        return;
    }
    if (!computed) CUDA_CHECK(cudaEventCreateWithFlags(&computed, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(computed, stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream, computed, 0));
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, c->nccl, comm_stream));
}

void comm_device_allreduce_finish(const Comm *c, cudaStream_t comm_stream) {
    if (c->nccl) watch_device(c, comm_stream, "all-reduce (sum)");
}

void comm_device_reduce_scatter(const Comm *c, float *arena, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    float *block = arena + (int64_t)c->rank * count;
    if (c->nccl) {
        NCCL_CHECK(ncclReduceScatter(arena, block, (size_t)count, ncclFloat32, ncclSum, c->nccl, stream));
        watch_device(c, stream, "reduce-scatter");
        return;
    }
    size_t bytes = sizeof(float) * (size_t)count;
    float *host = xmalloc(bytes * (size_t)(c->size + 1)), *sum = host + (int64_t)c->size * count;
    stage_out(host, arena, bytes * (size_t)c->size, stream);
    comm_reduce_scatter(c, host, sum, count, DT_FLOAT);
    stage_in(block, sum, bytes, stream);
    free(host);
}

void comm_device_allgather(const Comm *c, float *arena, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    float *block = arena + (int64_t)c->rank * count;
    if (c->nccl) {
        NCCL_CHECK(ncclAllGather(block, arena, (size_t)count, ncclFloat32, c->nccl, stream));
        watch_device(c, stream, "all-gather");
        return;
    }
    size_t bytes = sizeof(float) * (size_t)count;
    float *host = xmalloc(bytes * (size_t)c->size);
    stage_out(host + (int64_t)c->rank * count, block, bytes, stream);
    comm_allgather(c, NULL, host, count, DT_FLOAT);
    stage_in(arena, host, bytes * (size_t)c->size, stream);
    free(host);
}

#endif
