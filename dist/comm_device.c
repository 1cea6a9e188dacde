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
#include "test_hooks.h"
#include "util.h"

// The communicators that get a device side, in the order every rank makes
// them: those the device code communicates on (the hierarchical ring's hops
// are peers of cp).
static Comm *dist_comms(Dist *d, int i) {
    Comm *comms[] = {&d->world, &d->dp, &d->cp};
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
    comm_device_settle();      // the collectives still watched later, before their communicators go
    for (int i = 0; dist_comms(d, i); i++) {
        Comm *c = dist_comms(d, i);
        if (c->nccl) NCCL_CHECK(ncclCommDestroy(c->nccl));
        c->nccl = NULL;
    }
    d->leave_devices = NULL;
}

// How many distinct GPUs the ranks of this rank's node bind to (by PCI bus
// id: under Slurm's per-task binding every rank sees its own GPU as device 0).
static int64_t node_gpus(const Dist *d) {
    char mine[16] = {0};
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetPCIBusId(mine, (int)sizeof(mine), device));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->world_rank, MPI_INFO_NULL, &node));
    char *all = xcalloc((size_t)d->local_size, sizeof(mine));
    MPI_CHECK(MPI_Allgather(mine, (int)sizeof(mine), MPI_CHAR, all, (int)sizeof(mine), MPI_CHAR, node));
    MPI_CHECK(MPI_Comm_free(&node));
    int64_t distinct = 0;
    for (int r = 0; r < d->local_size; r++) {
        bool seen = false;
        for (int q = 0; q < r && !seen; q++)
            seen = !memcmp(all + (size_t)r * sizeof(mine), all + (size_t)q * sizeof(mine), sizeof(mine));
        distinct += !seen;
    }
    free(all);
    return distinct;
}

void comm_device_join(Dist *d, bool nccl) {
    int gpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&gpus));
    CUDA_CHECK(cudaSetDevice(d->local_rank % gpus));
    if (!nccl) return;
    // The most ranks on any node against the fewest GPUs they bind to on any node.
    int64_t worst[2] = {d->local_size, -node_gpus(d)};
    comm_allreduce(&d->world, worst, 2, DT_INT64, REDUCE_MAX);
    if (worst[0] > -worst[1])
        comm_fail_all(&d->world, "parallel.comm: nccl: %lld ranks on a node with %lld GPU%s (NCCL needs a GPU per "
                      "rank: expected at most %lld rank%s per node, or parallel.comm: mpi to share the GPUs)",
                      (long long)worst[0], (long long)-worst[1], worst[1] == -1 ? "" : "s", (long long)-worst[1],
                      worst[1] == -1 ? "" : "s");
    for (int i = 0; dist_comms(d, i); i++)
        if (dist_comms(d, i)->size > 1) make_nccl(dist_comms(d, i));
    d->leave_devices = leave_devices;
}

cudaStream_t comm_device_stream_new(void) {
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    return s;
}

// Whether event e has completed, without waiting. cudaErrorNotReady is also
// the host thread's last error (CUDA Runtime API): cleared here, as PyTorch
// does, so that the next CUDA_CHECK(cudaGetLastError()) after a launch sees
// only the launch's own error.
static bool event_done(cudaEvent_t e) {
    cudaError_t state = cudaEventQuery(e);
    if (state != cudaErrorNotReady) {
        CUDA_CHECK(state);
        return true;
    }
    CHECK(cudaGetLastError() == cudaErrorNotReady, "CUDA: cudaGetLastError() after a not-ready cudaEventQuery: "
          "expected cudaErrorNotReady");
    return false;
}

// The watchdog: poll the event done (recorded after NCCL operations of c)
// and c's asynchronous error until c's deadline (parallel.timeout_s); a
// failure ends the job with one line naming this rank, the operation and the
// communicator; false when the deadline passed (the caller names what did
// not complete). Spins for the first 2 ms, then sleeps 100 µs between polls,
// as comm_wait does.
static bool watch_event(const Comm *c, cudaEvent_t done, const char *op) {
    double start = now_seconds();
    for (;;) {
        if (event_done(done)) return true;
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
        if (now_seconds() - start > c->timeout_s) return false;
        if (now_seconds() - start > 2e-3) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
}

// The deadline passed: abort the communicator (which unblocks the stream)
// and end the job naming op.
static void timed_out(const Comm *c, const char *op) {
    ncclCommAbort(c->nccl);
    comm_timed_out(c, op);
}

// The watchdog of an NCCL operation just enqueued on stream (an event after it).
static void watch_device(const Comm *c, cudaStream_t stream, const char *op) {
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream));
    if (!watch_event(c, done, op)) timed_out(c, op);
    CUDA_CHECK(cudaEventDestroy(done));
}

// NCCL collectives enqueued and not yet watched, per communicator and
// stream: an event after the last one (the stream runs them in order, so it
// covers the earlier ones) and its name, for comm_device_settle.
#define WATCH_LATER 8
static struct {
    const Comm *c;             // NULL: a free slot
    cudaStream_t stream;
    cudaEvent_t done;
    const char *op;
} watch_later_slot[WATCH_LATER];

// The watchdog of an NCCL operation of c just enqueued on stream, at the next
// comm_device_settle: no host wait now.
static void watch_later(const Comm *c, cudaStream_t stream, const char *op) {
    int i = 0;
    while (i < WATCH_LATER && !(watch_later_slot[i].c == c && watch_later_slot[i].stream == stream)) i++;
    if (i == WATCH_LATER) {
        i = 0;
        while (i < WATCH_LATER && watch_later_slot[i].c) i++;
        if (i == WATCH_LATER) {   // every slot taken: watched now
            watch_device(c, stream, op);
            return;
        }
        if (!watch_later_slot[i].done)
            CUDA_CHECK(cudaEventCreateWithFlags(&watch_later_slot[i].done, cudaEventDisableTiming));
        watch_later_slot[i].c = c;
        watch_later_slot[i].stream = stream;
    }
    watch_later_slot[i].op = op;
    CUDA_CHECK(cudaEventRecord(watch_later_slot[i].done, stream));
}

// Operations of two NCCL communicators must never be in flight at once (NCCL
// documentation, "Using multiple NCCL communicators concurrently": NCCL's
// kernels block until their peers arrive, and two communicators' kernels
// ordered differently on two ranks deadlock). Every NCCL operation is
// ordered after the last one of every other communicator (an event per
// stream that NCCL operations were enqueued on): the bucketed gradient
// all-reduce (world) and the ring's groups (cp) take turns.
#define ORDER_STREAMS 8
static struct {
    bool used;                 // false: a free slot
    cudaStream_t stream;       // (0, the legacy default stream, is a stream too)
    ncclComm_t nccl;           // the communicator of the stream's last NCCL operation
    cudaEvent_t done;          // recorded after it
} nccl_order[ORDER_STREAMS];

// Before an NCCL operation of c on stream: stream waits for the last
// operation of every other communicator on another stream.
static void order_before(const Comm *c, cudaStream_t stream) {
    for (int i = 0; i < ORDER_STREAMS; i++)
        if (nccl_order[i].used && nccl_order[i].stream != stream && nccl_order[i].nccl != c->nccl)
            CUDA_CHECK(cudaStreamWaitEvent(stream, nccl_order[i].done, 0));
}

// After an NCCL operation of c on stream: its event, for order_before.
static void order_after(const Comm *c, cudaStream_t stream) {
    int i = 0;
    while (i < ORDER_STREAMS && !(nccl_order[i].used && nccl_order[i].stream == stream)) i++;
    if (i == ORDER_STREAMS) {
        i = 0;
        while (i < ORDER_STREAMS && nccl_order[i].used) i++;
        CHECK(i < ORDER_STREAMS, "NCCL on %s: more than %d streams", c->name, ORDER_STREAMS);
        if (!nccl_order[i].done) CUDA_CHECK(cudaEventCreateWithFlags(&nccl_order[i].done, cudaEventDisableTiming));
        nccl_order[i].used = true;
        nccl_order[i].stream = stream;
    }
    nccl_order[i].nccl = c->nccl;
    CUDA_CHECK(cudaEventRecord(nccl_order[i].done, stream));
}

// A stream about to be destroyed leaves the order (its last event stays
// recorded in the streams that waited for it).
static void order_forget(cudaStream_t stream) {
    for (int i = 0; i < ORDER_STREAMS; i++)
        if (nccl_order[i].used && nccl_order[i].stream == stream) nccl_order[i].used = false;
}

// parallel.comm: mpi: device range src [bytes] copied into host memory at
// dst, and back, each waiting for stream.
static void stage_out(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}
static void stage_in(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

void comm_device_allreduce(const Comm *c, float *buf, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    if (c->nccl) {
        order_before(c, stream);
        NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, c->nccl, stream));
        order_after(c, stream);
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
    order_before(c, comm_stream);
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, c->nccl, comm_stream));
    order_after(c, comm_stream);
}

void comm_device_allreduce_finish(const Comm *c, cudaStream_t comm_stream) {
    if (!c->nccl) return;
    comm_device_settle();      // the sums wait for the ring's transfers: those are named if they hang
    watch_device(c, comm_stream, "all-reduce (sum)");
}

void comm_device_reduce_scatter(const Comm *c, float *arena, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    float *block = arena + (int64_t)c->rank * count;
    if (c->nccl) {
        order_before(c, stream);
        NCCL_CHECK(ncclReduceScatter(arena, block, (size_t)count, ncclFloat32, ncclSum, c->nccl, stream));
        order_after(c, stream);
        watch_later(c, stream, "reduce-scatter");
        return;
    }
    size_t bytes = sizeof(float) * (size_t)count;
    float *host = xmalloc(bytes * (size_t)(c->size + 1)), *sum = host + (int64_t)c->size * count;
    stage_out(host, arena, bytes * (size_t)c->size, stream);
    comm_reduce_scatter(c, host, sum, count, DT_FLOAT);
    stage_in(block, sum, bytes, stream);
    free(host);
}

void comm_device_allgather_bf16(const Comm *c, uint16_t *arena, int64_t count, cudaStream_t stream) {
    if (c->size == 1) return;
    uint16_t *block = arena + (int64_t)c->rank * count;
    if (c->nccl) {
        order_before(c, stream);
        NCCL_CHECK(ncclAllGather(block, arena, (size_t)count, ncclBfloat16, c->nccl, stream));
        order_after(c, stream);
        watch_later(c, stream, "all-gather");
        return;
    }
    size_t bytes = sizeof(uint16_t) * (size_t)count;
    uint16_t *host = xmalloc(bytes * (size_t)c->size);
    stage_out(host + (int64_t)c->rank * count, block, bytes, stream);
    comm_allgather(c, NULL, host, count, DT_UINT16);
    stage_in(arena, host, bytes * (size_t)c->size, stream);
    free(host);
}

// ---- point-to-point exchanges ----

// Transfers posted and not yet waited for (MPI) or not yet handed to NCCL.
#define EXCHANGE_SLOTS 16
// NCCL: the last groups of a lane handed over whose completion events are kept.
#define EXCHANGE_GROUPS 8
// NCCL: the lanes of an exchange, each its own stream and groups: peers in
// this rank's inner ring (its node), and the others (the hierarchical
// ring's outer hops, over the network).
enum { LANE_INNER, LANE_OUTER, LANES };
// The transfers whose lane is remembered: more than can be outstanding or in kept groups.
#define LANE_HISTORY (EXCHANGE_SLOTS * EXCHANGE_GROUPS)

typedef struct {
    int64_t id;                // -1: free slot
    bool send;
    void *dev;                 // the device buffer
    size_t bytes;
    int peer;
    void *host;                // MPI: the staging copy
    MPI_Request req;           // MPI
    cudaEvent_t posted;        // NCCL: the compute stream when it was posted
} Transfer;

typedef struct {
    cudaStream_t comm;                        // NCCL's stream for this lane
    cudaEvent_t group_done[EXCHANGE_GROUPS];  // group g's completion at g % EXCHANGE_GROUPS
    int64_t group_end[EXCHANGE_GROUPS];       // the id after group g's last transfer
    char group_op[EXCHANGE_GROUPS][96];       // the wait that handed group g over, for the watchdog
    int64_t groups;                           // groups handed over
    int64_t watched;                          // groups [0, watched) seen complete by the watchdog
} Lane;

struct DeviceExchange {
    const Comm *c;
    int inner;                   // ranks per inner ring: peers r with r / inner == rank / inner are LANE_INNER
    int lanes;                   // NCCL: 1 (flat) or 2 (hierarchical)
    cudaStream_t compute;
    Lane lane[LANES];
    int64_t posted, issued;      // NCCL: ids [issued, posted) wait in slots
    Transfer slot[EXCHANGE_SLOTS];
    int8_t lane_of[LANE_HISTORY];  // NCCL: transfer id's lane (LANE_INNER, LANE_OUTER) at id % LANE_HISTORY
};

// The live exchanges over NCCL, for comm_device_settle.
#define MAX_EXCHANGES 8
static DeviceExchange *live_exchanges[MAX_EXCHANGES];

DeviceExchange *comm_device_exchange_new(const Comm *c, int inner, cudaStream_t compute) {
    CHECK(inner > 0 && c->size % inner == 0, "device exchange on %s: inner ring of %d ranks does not divide %d",
          c->name, inner, c->size);
    DeviceExchange *x = xcalloc(1, sizeof(DeviceExchange));
    x->c = c;
    x->inner = inner;
    x->lanes = inner < c->size ? LANES : 1;
    x->compute = compute;
    for (int s = 0; s < EXCHANGE_SLOTS; s++) x->slot[s].id = -1;
    if (!c->nccl) return x;
    int e = 0;
    while (e < MAX_EXCHANGES && live_exchanges[e]) e++;
    CHECK(e < MAX_EXCHANGES, "device exchange on %s: more than %d exchanges at once", c->name, MAX_EXCHANGES);
    live_exchanges[e] = x;
    for (int l = 0; l < x->lanes; l++) {
        x->lane[l].comm = comm_device_stream_new();
        for (int g = 0; g < EXCHANGE_GROUPS; g++) CUDA_CHECK(cudaEventCreate(&x->lane[l].group_done[g]));
    }
    for (int s = 0; s < EXCHANGE_SLOTS; s++)
        CUDA_CHECK(cudaEventCreate(&x->slot[s].posted));
    return x;
}

// NCCL: lane l's groups handed over before group `end` through the
// watchdog: the lane's stream runs them in order, so the last one's event
// covers the others (one poll). Past the deadline the message names the
// oldest group whose event is kept and has not completed.
static void watch_groups(DeviceExchange *x, int l, int64_t end) {
    Lane *n = &x->lane[l];
    if (n->watched >= end) return;
    const int64_t last = end - 1;
    if (!watch_event(x->c, n->group_done[last % EXCHANGE_GROUPS], n->group_op[last % EXCHANGE_GROUPS])) {
        int64_t g = n->watched > end - EXCHANGE_GROUPS ? n->watched : end - EXCHANGE_GROUPS;
        while (g < last && event_done(n->group_done[g % EXCHANGE_GROUPS])) g++;
        timed_out(x->c, n->group_op[g % EXCHANGE_GROUPS]);
    }
    n->watched = end;
}

void comm_device_settle(void) {
    for (int i = 0; i < WATCH_LATER; i++) {
        if (!watch_later_slot[i].c) continue;
        if (!watch_event(watch_later_slot[i].c, watch_later_slot[i].done, watch_later_slot[i].op))
            timed_out(watch_later_slot[i].c, watch_later_slot[i].op);
        watch_later_slot[i].c = NULL;
    }
    for (int e = 0; e < MAX_EXCHANGES; e++)
        if (live_exchanges[e])
            for (int l = 0; l < live_exchanges[e]->lanes; l++)
                watch_groups(live_exchanges[e], l, live_exchanges[e]->lane[l].groups);
}

void comm_device_exchange_free(DeviceExchange *x) {
    if (!x) return;
    if (x->c->nccl) {
        for (int l = 0; l < x->lanes; l++) watch_groups(x, l, x->lane[l].groups);
        for (int e = 0; e < MAX_EXCHANGES; e++)
            if (live_exchanges[e] == x) live_exchanges[e] = NULL;
        for (int s = 0; s < EXCHANGE_SLOTS; s++) CUDA_CHECK(cudaEventDestroy(x->slot[s].posted));
        for (int l = 0; l < x->lanes; l++) {
            for (int g = 0; g < EXCHANGE_GROUPS; g++) CUDA_CHECK(cudaEventDestroy(x->lane[l].group_done[g]));
            order_forget(x->lane[l].comm);
            CUDA_CHECK(cudaStreamDestroy(x->lane[l].comm));
        }
    }
    for (int s = 0; s < EXCHANGE_SLOTS; s++) free(x->slot[s].host);
    free(x);
}

static Transfer *free_slot(DeviceExchange *x) {
    for (int s = 0; s < EXCHANGE_SLOTS; s++)
        if (x->slot[s].id < 0) return &x->slot[s];
    FAIL("device exchange on %s: more than %d transfers outstanding", x->c->name, EXCHANGE_SLOTS);
    return NULL;
}

static Transfer *find(DeviceExchange *x, int64_t id) {
    for (int s = 0; s < EXCHANGE_SLOTS; s++)
        if (x->slot[s].id == id) return &x->slot[s];
    return NULL;
}

static int64_t post(DeviceExchange *x, bool send, void *buf, size_t bytes, int peer, int tag) {
    CHECK(bytes % sizeof(float) == 0, "device exchange on %s: %zu bytes (expected a multiple of 4)", x->c->name,
          bytes);
    Transfer *t = free_slot(x);
    const int64_t id = x->posted++;
    *t = (Transfer){.id = id, .send = send, .dev = buf, .bytes = bytes, .peer = peer, .req = MPI_REQUEST_NULL,
                    .posted = t->posted};
    x->lane_of[id % LANE_HISTORY] = peer / x->inner == x->c->rank / x->inner ? LANE_INNER : LANE_OUTER;
    if (x->c->nccl) {
        CUDA_CHECK(cudaEventRecord(t->posted, x->compute));
        return id;
    }
    const int64_t count = (int64_t)(bytes / sizeof(float));
    t->host = xmalloc(bytes > 0 ? bytes : 1);
    if (send) {
        CUDA_CHECK(cudaMemcpyAsync(t->host, buf, bytes, cudaMemcpyDeviceToHost, x->compute));
        CUDA_CHECK(cudaStreamSynchronize(x->compute));
        comm_isend(x->c, t->host, count, DT_FLOAT, peer, tag, &t->req);
    } else {
        comm_irecv(x->c, t->host, count, DT_FLOAT, peer, tag, &t->req);
    }
    return id;
}

int64_t comm_device_send(DeviceExchange *x, const void *buf, size_t bytes, int to, int tag) {
    return post(x, true, (void *)buf, bytes, to, tag);
}

int64_t comm_device_recv(DeviceExchange *x, void *buf, size_t bytes, int from, int tag) {
    return post(x, false, buf, bytes, from, tag);
}

// NCCL: the transfers of lane l posted and not yet handed over, as one group
// on the lane's stream, after the compute stream's work up to the last one's
// posting; the inner lane first, on every rank.
static void issue_lane(DeviceExchange *x, int l, const char *op) {
    int64_t last = -1;
    for (int64_t i = x->issued; i < x->posted; i++)
        if (x->lane_of[i % LANE_HISTORY] == l) last = i;
    if (last < 0) return;
    Lane *n = &x->lane[l];
    CUDA_CHECK(cudaStreamWaitEvent(n->comm, find(x, last)->posted, 0));
    order_before(x->c, n->comm);
    NCCL_CHECK(ncclGroupStart());
    for (int64_t i = x->issued; i <= last; i++) {
        if (x->lane_of[i % LANE_HISTORY] != l) continue;
        Transfer *t = find(x, i);
        if (t->send) NCCL_CHECK(ncclSend(t->dev, t->bytes, ncclUint8, t->peer, x->c->nccl, n->comm));
        else NCCL_CHECK(ncclRecv(t->dev, t->bytes, ncclUint8, t->peer, x->c->nccl, n->comm));
    }
    NCCL_CHECK(ncclGroupEnd());
    order_after(x->c, n->comm);
    const int64_t g = n->groups++;
    CUDA_CHECK(cudaEventRecord(n->group_done[g % EXCHANGE_GROUPS], n->comm));
    n->group_end[g % EXCHANGE_GROUPS] = last + 1;
    snprintf(n->group_op[g % EXCHANGE_GROUPS], sizeof(n->group_op[0]), "%s", op);
}

// NCCL: every transfer posted and not yet handed over, one group per lane: a
// hop to another node never shares a group (which completes as a unit) with
// one inside the node, so compute waits only for the transfer it reads.
static void issue(DeviceExchange *x, const char *op) {
    for (int l = 0; l < x->lanes; l++) issue_lane(x, l, op);
    for (int64_t i = x->issued; i < x->posted; i++) find(x, i)->id = -1;
    x->issued = x->posted;
}

// NCCL: the event of lane l's group that holds transfer id (handed over), or
// of a later one when that group's event was reused (the lane's stream runs
// its groups in order, so a later one's completion implies it).
static cudaEvent_t group_event(const DeviceExchange *x, int l, int64_t id) {
    const Lane *n = &x->lane[l];
    int64_t g = n->groups > EXCHANGE_GROUPS ? n->groups - EXCHANGE_GROUPS : 0;
    while (g < n->groups - 1 && n->group_end[g % EXCHANGE_GROUPS] <= id) g++;
    return n->group_done[g % EXCHANGE_GROUPS];
}

void comm_device_wait(DeviceExchange *x, int64_t id, const char *op) {
    int world_rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    test_fault("ring", world_rank, x->c->timeout_s);
    if (x->c->nccl) {
        if (x->posted > x->issued) issue(x, op);
        // No host wait: comm_device_settle watches each lane's groups before
        // the host next blocks on the device.
        if (id >= 0) {
            CUDA_CHECK(cudaStreamWaitEvent(x->compute, group_event(x, x->lane_of[id % LANE_HISTORY], id), 0));
        }
        return;
    }
    Transfer *t = id >= 0 ? find(x, id) : NULL;
    if (!t) return;            // nothing, or waited for already
    comm_wait(x->c, &t->req, 1, op);
    if (!t->send) CUDA_CHECK(cudaMemcpyAsync(t->dev, t->host, t->bytes, cudaMemcpyHostToDevice, x->compute));
    free(t->host);             // pageable source: staged when cudaMemcpyAsync returns
    t->host = NULL;
    t->id = -1;
}

#endif
