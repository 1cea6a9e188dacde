// mpi_gpu_nccl.c: the NCCL calls a multi-rank GPU program makes (real NCCL
// on GPUs, the sim's NCCL over MPI under the CPU execution model), under
// mpirun with 2 or 4 ranks (tests/sim/test_sim_libs.sh): a world communicator
// from a unique id broadcast over MPI; a ring exchange of send/recv in one
// group; AllReduce (sum, prod, max, min over fp32, fp64, bf16, int32, int64,
// uint8; in place and not); ReduceScatter and AllGather (in place and not);
// Broadcast; split into the rows and columns of a grid (2 columns) and with
// NCCL_SPLIT_NOCOLOR; bad arguments; and an abort with a receive that is
// never matched. Misuses the sim must stop (argument): `two-comms`, an
// all-reduce on each of two communicators on two streams with no order
// between them; `coupled` (CUDASIM_NODE_RANKS=1), a stream that waits for
// a group holding a transfer to itself and one to another node, then
// computes. Every input is a function of (rank, index), so each rank
// computes every reference itself. Checks print once, on rank 0, passing when
// they passed on every rank (mpi_check.h).
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"
#include "../lib/mpi_check.h"

// expect_all, counted (gpu_common.h's counter).
#define EXPECT_ALL(...) do { checks++; expect_all(__VA_ARGS__); } while (0)

static int W, R;            // world size and rank
static cudaStream_t stream;

// The input of rank r at index i: small exact values (fp sums exact in any order), varied signs.
static double input(int r, int64_t i) { return (double)((r * 7 + i * 3) % 11 - 5) + 0.25 * (double)(r + 1); }

static size_t type_bytes(ncclDataType_t t) {
    return t == ncclUint8 ? 1 : t == ncclBfloat16 ? 2 : t == ncclInt32 || t == ncclFloat32 ? 4 : 8;
}

static void put(void *buf, ncclDataType_t t, int64_t i, double x) {
    switch (t) {
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)(int)x; break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = f32_to_bf16((float)x); break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)x; break;
    case ncclFloat32: ((float *)buf)[i] = (float)x; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)x; break;
    default: ((double *)buf)[i] = x; break;
    }
}

static double get(const void *buf, ncclDataType_t t, int64_t i) {
    switch (t) {
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclBfloat16: return bf16_to_f32(((const uint16_t *)buf)[i]);
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

// The value a type holds for input(r, i): integers keep the integer part (+ 1 << 40 for int64, to need
// 64 bits), uint8 the input mod 8, bf16 a scaled input whose sums need rounding to bf16.
static double typed_input(ncclDataType_t t, int r, int64_t i) {
    const double x = input(r, i);
    switch (t) {
    case ncclUint8: return (double)(((int)x + 8) % 8);
    case ncclInt32: return (double)(int)x;
    case ncclInt64: return (double)(int64_t)x + (double)(1ll << 40);
    case ncclBfloat16: return bf16_to_f32(f32_to_bf16((float)(x * (1 + (double)i / 300))));   // sums need rounding
    default: return x;
    }
}

// A device buffer of n elements holding typed_input(t, rank, offset + i).
static void *device_inputs(ncclDataType_t t, int rank, int64_t offset, int64_t n) {
    void *host = xmalloc((size_t)n * type_bytes(t) + 1);
    for (int64_t i = 0; i < n; i++) put(host, t, i, typed_input(t, rank, offset + i));
    void *dev = to_device(host, (size_t)n * type_bytes(t));
    free(host);
    return dev;
}

static void *host_copy(const void *dev, size_t bytes) {
    void *host = xmalloc(bytes + 1);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return host;
}

static const char *type_name(ncclDataType_t t) {
    return t == ncclUint8 ? "uint8" : t == ncclBfloat16 ? "bf16" : t == ncclInt32 ? "int32" : t == ncclFloat32 ? "fp32"
         : t == ncclInt64 ? "int64" : "fp64";
}

static const char *op_name(ncclRedOp_t op) {
    return op == ncclSum ? "sum" : op == ncclProd ? "prod" : op == ncclMax ? "max" : "min";
}

static double combine(ncclRedOp_t op, double a, double b) {
    return op == ncclSum ? a + b : op == ncclProd ? a * b : op == ncclMax ? (a > b ? a : b) : (a < b ? a : b);
}

// The reduction over ranks 0..W-1 of typed_input(t, r, i), in the type's arithmetic where it is exact.
static double reduced(ncclDataType_t t, ncclRedOp_t op, int64_t i) {
    double acc = typed_input(t, 0, i);
    for (int r = 1; r < W; r++) acc = combine(op, acc, typed_input(t, r, i));
    if (t == ncclUint8) acc = (double)(uint8_t)(int64_t)acc;
    return acc;
}

// Ring exchange in one group: send to rank + 1, receive from rank - 1 (both posted before either completes).
static void check_ring(ncclComm_t comm) {
    const int64_t n = 1 << 20;   // 4 MB: beyond MPI's eager sends, so that blocking sends in turn would deadlock
    float *send = device_inputs(ncclFloat32, R, 0, n);
    float *recv = poisoned((size_t)n * sizeof(float));
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(send, (size_t)n, ncclFloat32, (R + 1) % W, comm, stream));
    NCCL_CHECK(ncclRecv(recv, (size_t)n, ncclFloat32, (R + W - 1) % W, comm, stream));
    NCCL_CHECK(ncclGroupEnd());
    float *got = host_copy(recv, (size_t)n * sizeof(float));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= got[i] == (float)input((R + W - 1) % W, i);
    EXPECT_ALL(ok, "nccl ring send/recv in a group (%d ranks)", W);
    free(got);
    CUDA_CHECK(cudaFree(send));
    CUDA_CHECK(cudaFree(recv));
}

static void check_allreduce(ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op, int in_place) {
    const int64_t n = 300;
    const size_t bytes = (size_t)n * type_bytes(t);
    void *send = device_inputs(t, R, 0, n);
    void *recv = in_place ? send : poisoned(bytes);
    NCCL_CHECK(ncclAllReduce(send, recv, (size_t)n, t, op, comm, stream));
    void *got = host_copy(recv, bytes);
    // bf16 sums and products: 2 ranks give the correctly rounded result; more ranks round partial results in an
    // unspecified order (each rounding 2^-9 relative).
    const double tol = t == ncclBfloat16 && (op == ncclSum || op == ncclProd) && W > 2 ? 1.0 / 64 : 0;
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        double want = reduced(t, op, i);
        if (t == ncclBfloat16) want = bf16_to_f32(f32_to_bf16((float)want));
        ok &= fabs(get(got, t, i) - want) <= tol * (fabs(want) + 1);
    }
    EXPECT_ALL(ok, "nccl allreduce %s %s%s (%d ranks)", type_name(t), op_name(op), in_place ? " in place" : "", W);
    free(got);
    CUDA_CHECK(cudaFree(send));
    if (!in_place) CUDA_CHECK(cudaFree(recv));
}

// ReduceScatter (sum): rank R gets elements [R n, R n + n) of the sum; in place: recvbuff = sendbuff + R n.
static void check_reduce_scatter(ncclComm_t comm, int in_place) {
    const int64_t n = 257;
    float *send = device_inputs(ncclFloat32, R, 0, n * W);
    float *recv = in_place ? send + R * n : poisoned((size_t)n * sizeof(float));
    NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)n, ncclFloat32, ncclSum, comm, stream));
    float *got = host_copy(recv, (size_t)n * sizeof(float));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= got[i] == (float)reduced(ncclFloat32, ncclSum, R * n + i);
    EXPECT_ALL(ok, "nccl reducescatter fp32 sum%s (%d ranks)", in_place ? " in place" : "", W);
    free(got);
    CUDA_CHECK(cudaFree(send));
    if (!in_place) CUDA_CHECK(cudaFree(recv));
}

// AllGather: element r n + i of the result is rank r's element i; in place: sendbuff = recvbuff + R n.
static void check_all_gather(ncclComm_t comm, int in_place) {
    const int64_t n = 129;
    int32_t *recv = poisoned((size_t)(n * W) * sizeof(int32_t));
    int32_t *send = in_place ? recv + R * n : device_inputs(ncclInt32, R, 0, n);
    if (in_place) {
        int32_t *mine = device_inputs(ncclInt32, R, 0, n);
        CUDA_CHECK(cudaMemcpy(send, mine, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaFree(mine));
    }
    NCCL_CHECK(ncclAllGather(send, recv, (size_t)n, ncclInt32, comm, stream));
    int32_t *got = host_copy(recv, (size_t)(n * W) * sizeof(int32_t));
    int ok = 1;
    for (int r = 0; r < W; r++)
        for (int64_t i = 0; i < n; i++) ok &= got[r * n + i] == (int32_t)typed_input(ncclInt32, r, i);
    EXPECT_ALL(ok, "nccl allgather int32%s (%d ranks)", in_place ? " in place" : "", W);
    free(got);
    if (!in_place) CUDA_CHECK(cudaFree(send));
    CUDA_CHECK(cudaFree(recv));
}

static void check_broadcast(ncclComm_t comm, int root, int in_place) {
    const int64_t n = 100;
    uint16_t *send = device_inputs(ncclBfloat16, R, 0, n);
    uint16_t *recv = in_place ? send : poisoned((size_t)n * sizeof(uint16_t));
    NCCL_CHECK(ncclBroadcast(send, recv, (size_t)n, ncclBfloat16, root, comm, stream));
    uint16_t *got = host_copy(recv, (size_t)n * sizeof(uint16_t));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= bf16_to_f32(got[i]) == typed_input(ncclBfloat16, root, i);
    EXPECT_ALL(ok, "nccl broadcast bf16 from rank %d%s (%d ranks)", root, in_place ? " in place" : "", W);
    free(got);
    CUDA_CHECK(cudaFree(send));
    if (!in_place) CUDA_CHECK(cudaFree(recv));
}

// The sum over a communicator of the members' world ranks, by AllReduce on int64.
static int64_t sum_of_world_ranks(ncclComm_t comm) {
    int64_t *buf = to_device(&(int64_t){R}, sizeof(int64_t));
    NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclInt64, ncclSum, comm, stream));
    int64_t *got = host_copy(buf, sizeof(int64_t));
    const int64_t s = *got;
    free(got);
    CUDA_CHECK(cudaFree(buf));
    return s;
}

// Rows and columns of a (W / 2) x 2 grid (row = R / 2, column = R % 2), keys reversing the order in columns;
// then NCCL_SPLIT_NOCOLOR on rank 0.
static void check_split(ncclComm_t world) {
    ncclComm_t row, col, rest;
    NCCL_CHECK(ncclCommSplit(world, R / 2, R, &row, NULL));
    NCCL_CHECK(ncclCommSplit(world, R % 2, W - R, &col, NULL));
    int row_size, row_rank, col_size, col_rank;
    NCCL_CHECK(ncclCommCount(row, &row_size));
    NCCL_CHECK(ncclCommUserRank(row, &row_rank));
    NCCL_CHECK(ncclCommCount(col, &col_size));
    NCCL_CHECK(ncclCommUserRank(col, &col_rank));
    const int col_members = (W - R % 2 + 1) / 2;   // ranks c, c + 2, ... below W
    EXPECT_ALL(row_size == 2 && row_rank == R % 2, "nccl split rows: size %d rank %d", row_size, row_rank);
    EXPECT_ALL(col_size == col_members && col_rank == col_members - 1 - R / 2,
               "nccl split columns, key reversed: size %d rank %d", col_size, col_rank);
    const int64_t row_sum = sum_of_world_ranks(row), col_sum = sum_of_world_ranks(col);
    int64_t want_col = 0;
    for (int r = R % 2; r < W; r += 2) want_col += r;
    EXPECT_ALL(row_sum == (R / 2) * 4 + 1 && col_sum == want_col, "nccl allreduce in a row (%lld) and a column (%lld)",
               (long long)row_sum, (long long)col_sum);
    NCCL_CHECK(ncclCommSplit(world, R == 0 ? NCCL_SPLIT_NOCOLOR : 0, 0, &rest, NULL));
    int rest_size = -1;
    if (rest) NCCL_CHECK(ncclCommCount(rest, &rest_size));
    EXPECT_ALL(R == 0 ? rest == NULL : rest_size == W - 1 && sum_of_world_ranks(rest) == (int64_t)W * (W - 1) / 2,
               "nccl split with NCCL_SPLIT_NOCOLOR on rank 0: NULL there, %d ranks elsewhere", W - 1);
    if (rest) NCCL_CHECK(ncclCommDestroy(rest));
    NCCL_CHECK(ncclCommDestroy(row));
    NCCL_CHECK(ncclCommDestroy(col));
}

// Host memory, a peer and a root outside the communicator: ncclInvalidArgument; ncclGroupEnd without a
// ncclGroupStart: ncclInvalidUsage.
static void check_bad_arguments(ncclComm_t comm) {
    float host[4] = {0};
    float *dev = poisoned(sizeof host);
    const ncclResult_t host_buf = ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, comm, stream);
    const ncclResult_t bad_peer = ncclSend(dev, 4, ncclFloat32, W, comm, stream);
    const ncclResult_t bad_root = ncclBroadcast(dev, dev, 4, ncclFloat32, -1, comm, stream);
    const ncclResult_t lone_end = ncclGroupEnd();
    EXPECT_ALL(host_buf == ncclInvalidArgument && bad_peer == ncclInvalidArgument && bad_root == ncclInvalidArgument,
               "nccl bad arguments: host buffer '%s', peer %d '%s', root -1 '%s'", ncclGetErrorString(host_buf), W,
               ncclGetErrorString(bad_peer), ncclGetErrorString(bad_root));
    EXPECT_ALL(lone_end == ncclInvalidUsage, "nccl ncclGroupEnd without ncclGroupStart: '%s'",
               ncclGetErrorString(lone_end));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(dev));
}

// Rank 0 posts a receive from rank 1 that rank 1 never sends, then aborts; the
// others abort without posting anything. Abort returns at once and the stream
// then completes.
static void check_abort(ncclComm_t world) {
    ncclComm_t comm;
    NCCL_CHECK(ncclCommSplit(world, 0, R, &comm, NULL));
    float *buf = poisoned(16 * sizeof(float));
    if (R == 0) NCCL_CHECK(ncclRecv(buf, 16, ncclFloat32, 1, comm, stream));
    ncclResult_t async_err;
    NCCL_CHECK(ncclCommGetAsyncError(comm, &async_err));
    const ncclResult_t aborted = ncclCommAbort(comm);
    const cudaError_t synced = cudaStreamSynchronize(stream);
    EXPECT_ALL(async_err == ncclSuccess && aborted == ncclSuccess && synced == cudaSuccess,
               "nccl abort with an unmatched receive on rank 0: async '%s', abort '%s', stream '%s'",
               ncclGetErrorString(async_err), ncclGetErrorString(aborted), cudaGetErrorString(synced));
    CUDA_CHECK(cudaFree(buf));
}

// The misuses: each ends the program under the sim (docs/SIM.md, What the host sees of the device).
static void misuse(ncclComm_t world, const char *what) {
    float *buf = device_inputs(ncclFloat32, R, 0, 256);
    cudaStream_t other;
    CUDA_CHECK(cudaStreamCreate(&other));
    if (!strcmp(what, "two-comms")) {
        ncclComm_t copy;
        NCCL_CHECK(ncclCommSplit(world, 0, R, &copy, NULL));
        NCCL_CHECK(ncclAllReduce(buf, buf, 128, ncclFloat32, ncclSum, world, stream));
        NCCL_CHECK(ncclAllReduce(buf + 128, buf + 128, 128, ncclFloat32, ncclSum, copy, other));
    } else {
        CHECK(!strcmp(what, "coupled"), "mpi_gpu_nccl: unknown misuse '%s' (expected two-comms or coupled)", what);
        cudaEvent_t done;
        CUDA_CHECK(cudaEventCreate(&done));
        NCCL_CHECK(ncclGroupStart());
        NCCL_CHECK(ncclSend(buf, 64, ncclFloat32, R, world, other));
        NCCL_CHECK(ncclRecv(buf + 64, 64, ncclFloat32, R, world, other));
        NCCL_CHECK(ncclSend(buf + 128, 64, ncclFloat32, (R + 1) % W, world, other));
        NCCL_CHECK(ncclRecv(buf + 192, 64, ncclFloat32, (R + W - 1) % W, world, other));
        NCCL_CHECK(ncclGroupEnd());
        CUDA_CHECK(cudaEventRecord(done, other));
        CUDA_CHECK(cudaStreamWaitEvent(stream, done, 0));
        CUDA_CHECK(cudaMemsetAsync(buf + 64, 0, 64 * sizeof(float), stream));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

int main(int argc, char **argv) {
    dist_init(&dist, &argc, &argv, 60.0);
    W = dist.world_size;
    R = dist.world_rank;
    CHECK(W >= 2 && W % 2 == 0, "mpi_gpu_nccl: run on an even number of ranks >= 2 (got %d)", W);
    int devices;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    // One GPU per rank on a GPU node (NCCL refuses two ranks on one GPU); under the sim each process has its own.
    CUDA_CHECK(cudaSetDevice(dist.local_rank % devices));
    CUDA_CHECK(cudaStreamCreate(&stream));
    ncclUniqueId id;
    if (R == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    ncclComm_t world;
    NCCL_CHECK(ncclCommInitRank(&world, W, id, R));
    int count, rank;
    NCCL_CHECK(ncclCommCount(world, &count));
    NCCL_CHECK(ncclCommUserRank(world, &rank));
    EXPECT_ALL(count == W && rank == R, "nccl world communicator: %d ranks, this one %d", count, rank);
    if (argc > 1) misuse(world, argv[1]);

    check_ring(world);
    const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclBfloat16, ncclInt32, ncclInt64, ncclUint8};
    const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            if (!(ops[o] == ncclProd && types[t] == ncclInt64))   // 2^40 to the 4th overflows
                check_allreduce(world, types[t], ops[o], (int)(t + o) % 2);
    for (int in_place = 0; in_place < 2; in_place++) {
        check_reduce_scatter(world, in_place);
        check_all_gather(world, in_place);
        check_broadcast(world, in_place ? 0 : W - 1, in_place);
    }
    check_split(world);
    check_bad_arguments(world);
    check_abort(world);
    NCCL_CHECK(ncclCommDestroy(world));
    CUDA_CHECK(cudaStreamDestroy(stream));
    if (R == 0) printf("%d checks\n", checks);
    dist_finalize(&dist);
    return check_exit();
}
