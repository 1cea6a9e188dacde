// mpi/nccl.cpp: the NCCL subset of the CPU execution model of CUDA (declared in
// include/nccl.h), over MPI. Semantics from the NCCL documentation (API:
// "Communicator Creation and Management Functions", "Collective Communication
// Functions", "Group Calls", "Point To Point Communication Functions").
//
// A communicator is two MPI communicators over the same ranks in NCCL rank
// order: `data` for the stream-ordered operations, `control` for host-side
// collectives (split, destroy), so that the two never interleave. Every
// operation is checked when called (ncclInvalidArgument, as NCCL's argument
// checks) and then enqueued on its stream (cudasim::enqueue): its MPI work
// runs when the stream is drained. A group's operations run as one stream
// operation: every send, receive and collective is posted non-blocking, then
// all are waited for, so a ring exchange in one group cannot deadlock.
//
// Reductions of bf16 (sum, prod, max, min): two values are combined in fp32
// and rounded to bf16 (nearest even) at each step of MPI's reduction order;
// with 2 ranks that is the exactly rounded result. Real NCCL also rounds each
// partial sum to bf16 on every hop of its ring or tree, but in its own order,
// so with more than 2 ranks the last bits of a bf16 sum can differ from the
// sim's (and between NCCL's algorithms). Sums of other types are exact
// (integers) or fp32/fp64 in MPI's order.
#include <nccl.h>

#include <limits.h>
#define OMPI_SKIP_MPICXX 1   // the C API only: no MPI C++ bindings to link
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "../cudasim.h"

extern "C" {
#include "../../../../dist/util.h"
}

#define NCCL_MPI(call) CHECK((call) == MPI_SUCCESS, "cudasim: NCCL over MPI: %s failed", #call)

struct ncclComm {
    MPI_Comm data, control;
    int rank, size;
    std::vector<int> world;     // [size] the world rank of each rank
    bool aborted;
    std::atomic<int> pending;   // stream operations enqueued and not yet run
};

// ---- the unique id: magic, the creator's world rank, a per-creator sequence number ----

static const char ID_MAGIC[16] = "cudasim-nccl-id";
static const int BOOT_TAG_BASE = 30000, BOOT_TAGS = 2000;   // tags of the bootstrap messages on MPI_COMM_WORLD

struct IdContents {
    char magic[16];
    int creator;     // world rank of the process that called ncclGetUniqueId
    int sequence;    // how many ids that process had made before
};

static int world_rank() {
    int initialized = 0;
    NCCL_MPI(MPI_Initialized(&initialized));
    if (!initialized) cudasim::fail("NCCL over MPI: MPI_Init must come before NCCL calls");
    int rank;
    NCCL_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    return rank;
}

extern "C" ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

extern "C" const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

// NCCL documentation, ncclGetUniqueId: an id to broadcast to the other ranks.
extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static int sequence = 0;
    if (!uniqueId) return ncclInvalidArgument;
    IdContents c;
    memcpy(c.magic, ID_MAGIC, sizeof c.magic);
    c.creator = world_rank();
    c.sequence = sequence++;
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &c, sizeof c);
    return ncclSuccess;
}

static ncclComm *new_comm(MPI_Comm data) {
    ncclComm *c = new ncclComm();
    c->data = data;
    NCCL_MPI(MPI_Comm_dup(data, &c->control));
    NCCL_MPI(MPI_Comm_rank(data, &c->rank));
    NCCL_MPI(MPI_Comm_size(data, &c->size));
    MPI_Group group, world;
    NCCL_MPI(MPI_Comm_group(data, &group));
    NCCL_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(c->size);
    for (int r = 0; r < c->size; r++) ranks[r] = r;
    c->world.resize(c->size);
    NCCL_MPI(MPI_Group_translate_ranks(group, c->size, ranks.data(), world, c->world.data()));
    NCCL_MPI(MPI_Group_free(&group));
    NCCL_MPI(MPI_Group_free(&world));
    c->aborted = false;
    c->pending = 0;
    return c;
}

// NCCL documentation, ncclCommInitRank: collective over the nranks processes
// holding the same id. The members report {rank, world rank} to the id's
// creator (which must be one of them), which answers with the table of world
// ranks in rank order; the MPI communicator is made from that group.
extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    IdContents id;
    memcpy(&id, commId.internal, sizeof id);
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0)
        return ncclInvalidArgument;
    const int me = world_rank();
    const int tag = BOOT_TAG_BASE + id.sequence % BOOT_TAGS;
    std::vector<int> table(nranks, -1);
    if (me == id.creator) {
        table[rank] = me;
        for (int i = 1; i < nranks; i++) {
            int report[2];
            NCCL_MPI(MPI_Recv(report, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            if (report[0] < 0 || report[0] >= nranks || table[report[0]] != -1)
                cudasim::fail("ncclCommInitRank: rank %d of %d claimed twice or out of range (world rank %d)",
                              report[0], nranks, report[1]);
            table[report[0]] = report[1];
        }
        for (int r = 0; r < nranks; r++)
            if (r != rank) NCCL_MPI(MPI_Send(table.data(), nranks, MPI_INT, table[r], tag, MPI_COMM_WORLD));
    } else {
        const int report[2] = {rank, me};
        NCCL_MPI(MPI_Send(report, 2, MPI_INT, id.creator, tag, MPI_COMM_WORLD));
        NCCL_MPI(MPI_Recv(table.data(), nranks, MPI_INT, id.creator, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    }
    MPI_Group world, members;
    NCCL_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    NCCL_MPI(MPI_Group_incl(world, nranks, table.data(), &members));
    MPI_Comm data;
    NCCL_MPI(MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &data));
    NCCL_MPI(MPI_Group_free(&members));
    NCCL_MPI(MPI_Group_free(&world));
    *comm = new_comm(data);
    return ncclSuccess;
}

static bool usable(const ncclComm *comm) { return comm && !comm->aborted; }

// NCCL documentation, ncclCommSplit: collective over comm; the ranks of one
// color form a communicator, ordered by key then by rank in comm;
// NCCL_SPLIT_NOCOLOR gives NULL. The config is accepted and ignored.
extern "C" ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                      ncclConfig_t *config) {
    (void)config;
    if (!usable(comm) || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
    MPI_Comm data;
    NCCL_MPI(MPI_Comm_split(comm->control, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &data));
    *newcomm = data == MPI_COMM_NULL ? nullptr : new_comm(data);
    return ncclSuccess;
}

// NCCL documentation, ncclCommDestroy: uncompleted operations are flushed
// first (as ncclCommFinalize), then the resources are freed.
extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    if (comm->aborted) return ncclInvalidUsage;
    if (comm->pending > 0) cudasim::drain(0);
    NCCL_MPI(MPI_Comm_free(&comm->data));
    NCCL_MPI(MPI_Comm_free(&comm->control));
    delete comm;
    return ncclSuccess;
}

// NCCL documentation, ncclCommAbort: local (the other ranks need not call it),
// returns without waiting; operations of comm not yet run are dropped. The
// handle stays allocated (enqueued operations still point to it) and refuses
// further use; its MPI communicators are left to MPI_Finalize.
extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) {
    static std::vector<std::unique_ptr<ncclComm>> aborted;
    if (!comm) return ncclInvalidArgument;
    if (comm->aborted) return ncclSuccess;
    comm->aborted = true;
    aborted.emplace_back(comm);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError) return ncclInvalidArgument;
    *asyncError = ncclSuccess;   // an MPI failure ends the program (NCCL_MPI), so none is ever pending
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!usable(comm) || !count) return ncclInvalidArgument;
    *count = comm->size;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!usable(comm) || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

// ---- types and reduction operators ----

static size_t type_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;   // not in the subset (fp8)
    }
}

static MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_UINT16_T;   // bf16, reduced by the user operators below
    }
}

template <int OP>
static void bf16_reduce(void *in, void *inout, int *len, MPI_Datatype *) {
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) {
        const float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
        const float r = OP == ncclSum ? x + y : OP == ncclProd ? x * y : OP == ncclMax ? (x > y ? x : y)
                      : (x < y ? x : y);
        b[i] = f32_to_bf16(r);
    }
}

static MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
    if (t == ncclBfloat16) {
        static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
        static MPI_User_function *const fns[4] = {bf16_reduce<ncclSum>, bf16_reduce<ncclProd>, bf16_reduce<ncclMax>,
                                                  bf16_reduce<ncclMin>};
        if (ops[op] == MPI_OP_NULL) NCCL_MPI(MPI_Op_create(fns[op], 1, &ops[op]));
        return ops[op];
    }
    return op == ncclSum ? MPI_SUM : op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX : MPI_MIN;
}

// ---- operations ----

enum OpKind { OP_SEND, OP_RECV, OP_ALLREDUCE, OP_REDUCESCATTER, OP_ALLGATHER, OP_BROADCAST };

struct Op {
    OpKind kind;
    const void *send;
    void *recv;
    size_t count;   // elements: sent/received, reduced, per rank (reduce-scatter, all-gather), broadcast
    ncclDataType_t type;
    ncclRedOp_t op;
    int peer;       // send/recv peer, broadcast root
    ncclComm *comm;
};

// Post one operation non-blocking; `copies` keeps the send copies alive until the wait.
static void post(const Op &o, std::vector<MPI_Request> &reqs, std::vector<std::vector<char>> &copies) {
    const size_t es = type_bytes(o.type);
    const int n = (int)o.count;
    const MPI_Comm c = o.comm->data;
    MPI_Request r;
    switch (o.kind) {
    case OP_SEND:
        NCCL_MPI(MPI_Isend(o.send, n * (int)es, MPI_BYTE, o.peer, 0, c, &r));
        break;
    case OP_RECV:
        NCCL_MPI(MPI_Irecv(o.recv, n * (int)es, MPI_BYTE, o.peer, 0, c, &r));
        break;
    case OP_ALLREDUCE:
        if (o.send != o.recv) memmove(o.recv, o.send, o.count * es);
        NCCL_MPI(MPI_Iallreduce(MPI_IN_PLACE, o.recv, n, mpi_type(o.type), mpi_op(o.op, o.type), c, &r));
        break;
    case OP_REDUCESCATTER:   // the input copied: recvbuff may lie inside sendbuff (in place)
        copies.emplace_back((const char *)o.send, (const char *)o.send + o.count * o.comm->size * es);
        NCCL_MPI(MPI_Ireduce_scatter_block(copies.back().data(), o.recv, n, mpi_type(o.type), mpi_op(o.op, o.type),
                                           c, &r));
        break;
    case OP_ALLGATHER:       // likewise: sendbuff may lie inside recvbuff
        copies.emplace_back((const char *)o.send, (const char *)o.send + o.count * es);
        NCCL_MPI(MPI_Iallgather(copies.back().data(), n * (int)es, MPI_BYTE, o.recv, n * (int)es, MPI_BYTE, c, &r));
        break;
    case OP_BROADCAST:
        if (o.comm->rank == o.peer && o.send != o.recv) memmove(o.recv, o.send, o.count * es);
        NCCL_MPI(MPI_Ibcast(o.recv, n * (int)es, MPI_BYTE, o.peer, c, &r));
        break;
    }
    reqs.push_back(r);
}

// One stream operation, polled (cudasim::enqueue_polled) as a GPU's
// communication kernel runs while its peers arrive: the first attempt posts
// every operation of a live communicator, each attempt tests them all. An
// attempt after ncclCommAbort of one of their communicators completes at
// once (the operations are dropped, as an abort ends NCCL's kernels).
struct InFlight {
    std::vector<Op> ops;
    std::vector<MPI_Request> reqs;
    std::vector<std::vector<char>> copies;
    bool posted = false;
};

static bool step_ops(InFlight &f) {
    if (!f.posted) {
        f.copies.reserve(f.ops.size());
        for (const Op &o : f.ops)
            if (!o.comm->aborted) post(o, f.reqs, f.copies);
        f.posted = true;
    }
    bool complete = true, aborted = false;
    for (const Op &o : f.ops) aborted |= o.comm->aborted;
    if (!aborted && !f.reqs.empty()) {
        int flag = 0;
        NCCL_MPI(PMPI_Testall((int)f.reqs.size(), f.reqs.data(), &flag, MPI_STATUSES_IGNORE));
        complete = flag != 0;
    }
    if (complete)
        for (const Op &o : f.ops) o.comm->pending--;
    return complete;
}

// A GPU runs its queued work, NCCL's kernels included, whatever its host
// does; the sim's device runs when its host waits in a CUDA call. A host
// waiting in MPI (dist/comm.c polls MPI_Testall) must move its device too, or
// a peer waiting for this rank's queued NCCL operation before it joins the
// MPI collective would wait for ever: each poll first runs what can run now
// (MPI's profiling interface; the sim's own polls call PMPI_Testall).
extern "C" int MPI_Testall(int count, MPI_Request requests[], int *flag, MPI_Status statuses[]) {
    cudasim::progress();
    return PMPI_Testall(count, requests, flag, statuses);
}

// The group being collected (NCCL documentation, "Group Calls"): depth of
// nested ncclGroupStart, its operations, their one stream (per host thread, as NCCL's).
static thread_local int group_depth = 0;
static thread_local std::vector<Op> group_ops;
static thread_local cudaStream_t group_stream;
static thread_local bool group_mixed_streams = false;

// The node of a world rank: CUDASIM_NODE_RANKS consecutive world ranks per
// node (unset: every rank on one node).
static int node_of(int world) {
    static const int per_node = getenv("CUDASIM_NODE_RANKS") ? atoi(getenv("CUDASIM_NODE_RANKS")) : 0;
    return per_node > 0 ? world / per_node : 0;
}

static void submit(std::vector<Op> ops, cudaStream_t stream, const char *what) {
    std::vector<const void *> comms;
    bool local = false, network = false;
    for (const Op &o : ops) {
        o.comm->pending++;
        if (std::find(comms.begin(), comms.end(), o.comm) == comms.end()) comms.push_back(o.comm);
        if (o.kind != OP_SEND && o.kind != OP_RECV) continue;
        const bool across = node_of(o.comm->world[o.peer]) != node_of(o.comm->world[o.comm->rank]);
        network |= across;
        local |= !across;
    }
    std::string label = std::string(what) + " on the communicator of world ranks";
    for (int r = 0; r < ops[0].comm->size; r++) label += (r ? "," : " ") + std::to_string(ops[0].comm->world[r]);
    auto flight = std::make_shared<InFlight>();
    flight->ops = std::move(ops);
    cudasim::enqueue_polled(stream, what, [flight] { return step_ops(*flight); });
    cudasim::nccl_enqueued(stream, comms, local, network, label);
}

static bool on_device(const void *p, size_t bytes) { return bytes == 0 || cudasim::is_device(p, bytes); }

// NCCL's argument checks: a live communicator, a type of the subset, a count
// MPI can take, buffers inside device allocations, peers and roots in range.
static ncclResult_t add(const Op &o, cudaStream_t stream, const char *what) {
    if (!usable(o.comm)) return ncclInvalidArgument;
    const size_t es = type_bytes(o.type);
    if (es == 0 || o.type == ncclFloat16 || o.count > (size_t)INT_MAX / es) return ncclInvalidArgument;
    if (o.op < ncclSum || o.op > ncclMin) return ncclInvalidArgument;
    const size_t bytes = o.count * es, all = bytes * (size_t)o.comm->size;
    bool ok = true;
    switch (o.kind) {
    case OP_SEND: ok = on_device(o.send, bytes) && o.peer >= 0 && o.peer < o.comm->size; break;
    case OP_RECV: ok = on_device(o.recv, bytes) && o.peer >= 0 && o.peer < o.comm->size; break;
    case OP_ALLREDUCE: ok = on_device(o.send, bytes) && on_device(o.recv, bytes); break;
    case OP_REDUCESCATTER: ok = on_device(o.send, all) && on_device(o.recv, bytes); break;
    case OP_ALLGATHER: ok = on_device(o.send, bytes) && on_device(o.recv, all); break;
    case OP_BROADCAST:
        ok = o.peer >= 0 && o.peer < o.comm->size && on_device(o.recv, bytes) &&
             (o.comm->rank != o.peer || on_device(o.send, bytes));
        break;
    }
    if (!ok) return ncclInvalidArgument;
    if (group_depth == 0) {
        submit({o}, stream, what);
        return ncclSuccess;
    }
    if (group_ops.empty()) group_stream = stream;
    else if (stream != group_stream) group_mixed_streams = true;
    group_ops.push_back(o);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

// The outermost ncclGroupEnd submits the group as one stream operation. The
// sim requires one stream per group (real NCCL also accepts several, which it
// then makes wait for each other): else ncclInvalidUsage, nothing submitted.
extern "C" ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth > 0) return ncclSuccess;
    std::vector<Op> ops;
    ops.swap(group_ops);
    const bool mixed = group_mixed_streams;
    group_mixed_streams = false;
    if (mixed) return ncclInvalidUsage;
    if (!ops.empty()) submit(std::move(ops), group_stream, "nccl group");
    return ncclSuccess;
}

extern "C" ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
    return add({OP_SEND, sendbuff, nullptr, count, datatype, ncclSum, peer, comm}, stream, "ncclSend");
}

extern "C" ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                 cudaStream_t stream) {
    return add({OP_RECV, nullptr, recvbuff, count, datatype, ncclSum, peer, comm}, stream, "ncclRecv");
}

extern "C" ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return add({OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm}, stream, "ncclAllReduce");
}

extern "C" ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
    return add({OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm}, stream,
               "ncclReduceScatter");
}

extern "C" ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return add({OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm}, stream, "ncclAllGather");
}

extern "C" ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
    return add({OP_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm}, stream, "ncclBroadcast");
}
