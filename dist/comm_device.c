// comm_device.c: GPU choice, the NCCL communicators beside the MPI ones, and
// the operations on device buffers (see comm_device.h).
#ifdef MTRAIN_CUDA

#include "comm_device.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// Wait for stream, then fail with the rank, operation and communicator when
// NCCL reports an error of c's communicator (after aborting it).
static void wait_device(const Comm *c, cudaStream_t stream, const char *op) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    ncclResult_t state = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(c->nccl, &state));
    if (state == ncclSuccess) return;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "mtrain: rank %d: %s on %s failed: NCCL: %s\n", rank, op, c->name, ncclGetErrorString(state));
    fflush(stderr);
    ncclCommAbort(c->nccl);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

void comm_device_allreduce(const Comm *c, float *buf, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    if (c->nccl) {
        NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, c->nccl, stream));
        wait_device(c, stream, "all-reduce (sum)");
        return;
    }
    size_t bytes = sizeof(float) * (size_t)count;
    float *host = xmalloc(bytes);
    CUDA_CHECK(cudaMemcpyAsync(host, buf, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    comm_allreduce(c, host, count, DT_FLOAT, REDUCE_SUM);
    CUDA_CHECK(cudaMemcpyAsync(buf, host, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    free(host);
}

#endif
