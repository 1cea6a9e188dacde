// comm.c: MPI bootstrap, the rank grid and its communicators, and the
// operations with deadlines (see comm.h).
#define _GNU_SOURCE
#include "comm.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

void comm_mpi_fail(const char *file, int line, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof(text), "error %d", rc);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "mtrain: rank %d: %s:%d: %s failed: %s\n", rank, file, line, call, text);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static MPI_Datatype mpi_type(DType type) {
    switch (type) {
    case DT_FLOAT: return MPI_FLOAT;
    case DT_DOUBLE: return MPI_DOUBLE;
    case DT_INT64: return MPI_INT64_T;
    case DT_UINT16: return MPI_UINT16_T;
    }
    FAIL("unknown DType %d", (int)type);
}

static int mpi_count(int64_t count) {
    CHECK(count >= 0 && count <= INT_MAX, "MPI message of %lld elements (at most %d per call)",
          (long long)count, INT_MAX);
    return (int)count;
}

static int world_rank(void) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// ----------------------------------------------------------------------------
// Bootstrap

// An integer from the environment, or -1 when unset or not a number.
static int env_int(const char *name) {
    const char *text = getenv(name);
    if (!text || !*text) return -1;
    char *end;
    long v = strtol(text, &end, 10);
    return *end || v < 0 || v > INT_MAX ? -1 : (int)v;
}

// Errors under several ranks (util.h's fail_rank_to_name): rank 0, failing,
// tells every other rank on error_comm (a copy of the world, so that no
// collective in flight sees the message) and prints; another rank that fails
// prints, naming itself, only when rank 0's word has not come within
// ERROR_GRACE_S: an error every rank hits prints once, one that rank 0 does
// not hit is still said.
#define ERROR_GRACE_S 20.0
static MPI_Comm error_comm = MPI_COMM_NULL;
static pthread_t mpi_thread;  // the thread that called MPI_Init (MPI_THREAD_FUNNELED: the only one that may call MPI)

static int error_rank_to_name(void) {
    static const int rank0_failed = 1;
    int rank = 0, size = 1, flag = 0, got;
    if (!pthread_equal(pthread_self(), mpi_thread) || MPI_Comm_rank(error_comm, &rank) != MPI_SUCCESS ||
        MPI_Comm_size(error_comm, &size) != MPI_SUCCESS)
        return 0;
    if (rank == 0) {
        for (int r = 1; r < size; r++) {
            MPI_Request req;
            if (MPI_Isend(&rank0_failed, 1, MPI_INT, r, 0, error_comm, &req) == MPI_SUCCESS) MPI_Request_free(&req);
        }
        return 0;
    }
    MPI_Request req;
    if (MPI_Irecv(&got, 1, MPI_INT, 0, 0, error_comm, &req) != MPI_SUCCESS) return rank;
    for (double deadline = now_seconds() + ERROR_GRACE_S; now_seconds() < deadline;) {
        if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return rank;
        if (flag) return -1;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return rank;
}

static Comm make_comm(MPI_Comm comm, const char *name, double timeout_s) {
    Comm c = {comm, name, 0, 1, timeout_s, NULL};
    MPI_CHECK(MPI_Comm_rank(comm, &c.rank));
    MPI_CHECK(MPI_Comm_size(comm, &c.size));
    return c;
}

// srun starts each task itself and Open MPI finds its rank through Slurm's
// PMIx server (PMIX_RANK, ... in the environment). Under srun without
// --mpi=pmix (and MpiDefault=none) there is none and MPI_Init would abort
// every task with a page of text: say it in one line, from task 0 only.
// (mpirun's ranks have OMPI_COMM_WORLD_RANK; PMI_RANK is srun --mpi=pmi2, left
// to an MPI built with PMI-2.)
static void check_srun_plugin(void) {
    if (!getenv("SLURM_STEP_ID") || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("OMPI_COMM_WORLD_RANK")) return;
    if (env_int("SLURM_PROCID") > 0) exit(1);
    fail("started by srun without an MPI plugin (SLURM_STEP_ID is set but not PMIX_RANK): expected "
         "srun --mpi=pmix (or MpiDefault=pmix in slurm.conf)");
}

void dist_init(Dist *d, int *argc, char ***argv, double timeout_s) {
    memset(d, 0, sizeof(*d));
    check_srun_plugin();
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    if (provided < MPI_THREAD_FUNNELED) fail("MPI provides no MPI_THREAD_FUNNELED support (needed with OpenMP)");
    d->world = make_comm(MPI_COMM_WORLD, "world", timeout_s);
    d->world_rank = d->world.rank;
    d->world_size = d->world.size;
    if (d->world_size > 1) {
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &error_comm));
        MPI_CHECK(MPI_Comm_set_errhandler(error_comm, MPI_ERRORS_RETURN));
        mpi_thread = pthread_self();
        fail_rank_to_name = error_rank_to_name;
    }

    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->world_rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &d->local_rank));
    MPI_CHECK(MPI_Comm_size(node, &d->local_size));
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) fail("sched_getaffinity: %s", strerror(errno));
    d->rank_cpus = CPU_COUNT(&cpus);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &cpus, (int)sizeof(cpus), MPI_BYTE, MPI_BOR, node));
    d->node_cpus = CPU_COUNT(&cpus);
    MPI_CHECK(MPI_Comm_free(&node));

    // mpirun sets OMPI_COMM_WORLD_LOCAL_RANK; srun sets SLURM_PROCID,
    // SLURM_STEP_NUM_TASKS and SLURM_LOCALID in each task of a step (SLURM_STEP_ID
    // set). A batch script has no step: its processes, and those of an mpirun
    // inside it, inherit the script's SLURM_PROCID and SLURM_LOCALID, so these
    // are read only in a step, when mpirun's variable is absent.
    int launcher = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
    const char *source = "OMPI_COMM_WORLD_LOCAL_RANK";
    d->launcher = launcher >= 0 ? "mpirun" : "none";
    if (launcher < 0 && getenv("SLURM_STEP_ID")) {
        int procid = env_int("SLURM_PROCID"), tasks = env_int("SLURM_STEP_NUM_TASKS");
        if (procid != d->world_rank || tasks != d->world_size)
            fail("rank %d of %d: srun's SLURM_PROCID is %d of SLURM_STEP_NUM_TASKS %d (expected them equal to MPI's "
                 "rank and size: each task of the step must join one MPI job, through srun --mpi=pmix)",
                 d->world_rank, d->world_size, procid, tasks);
        launcher = env_int("SLURM_LOCALID");
        source = "SLURM_LOCALID";
        d->launcher = "srun";
    }
    if (launcher >= 0 && launcher != d->local_rank)
        fail("the launcher's %s is %d but MPI places this rank %d of %d on its node (expected them equal)", source,
             launcher, d->local_rank, d->local_size);
}

static int gcd(int a, int b) {
    while (b) { int t = a % b; a = b; b = t; }
    return a;
}

int dist_grid(int world, int ranks_per_node, int dp, int cp, int cp_inner, Grid *grid,
              char *why, size_t why_size) {
    if (dp < 0 || cp < 0 || cp_inner < 0) {
        snprintf(why, why_size, "parallel.dp, parallel.cp, parallel.cp_inner: %d, %d, %d (expected 0 = default, or "
                 "positive)", dp, cp, cp_inner);
        return -1;
    }
    if (dp && cp && (int64_t)dp * cp != world) {
        snprintf(why, why_size, "parallel.dp × parallel.cp = %d × %d = %lld does not match the job's %d ranks "
                 "(expected dp × cp = %d)", dp, cp, (long long)dp * cp, world, world);
        return -1;
    }
    if (cp && world % cp) {
        snprintf(why, why_size, "parallel.cp: %d does not divide the job's %d ranks (expected a divisor of %d)",
                 cp, world, world);
        return -1;
    }
    if (dp && world % dp) {
        snprintf(why, why_size, "parallel.dp: %d does not divide the job's %d ranks (expected a divisor of %d)",
                 dp, world, world);
        return -1;
    }
    if (!cp) cp = dp ? world / dp : world;
    if (!dp) dp = world / cp;
    if (cp_inner && cp % cp_inner) {
        snprintf(why, why_size, "parallel.cp_inner: %d does not divide parallel.cp = %d (expected a divisor of %d)",
                 cp_inner, cp, cp);
        return -1;
    }
    if (!cp_inner) cp_inner = gcd(cp, ranks_per_node > 0 ? ranks_per_node : 1);
    *grid = (Grid){world, dp, cp, cp_inner, cp / cp_inner};
    return 0;
}

static Comm split(const Comm *parent, int color, int key, const char *name) {
    MPI_Comm comm;
    MPI_CHECK(MPI_Comm_split(parent->comm, color, key, &comm));
    MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    return make_comm(comm, name, parent->timeout_s);
}

void dist_setup(Dist *d, int dp, int cp, int cp_inner, const char *source) {
    // Nodes may hold different numbers of ranks: default to the smallest.
    int64_t ranks_per_node = d->local_size;
    comm_allreduce(&d->world, &ranks_per_node, 1, DT_INT64, REDUCE_MIN);
    char why[512];
    if (dist_grid(d->world_size, (int)ranks_per_node, dp, cp, cp_inner, &d->grid, why, sizeof(why)))
        comm_fail_all(&d->world, "%s: %s", source, why);
    const Grid *g = &d->grid;
    int dp_rank = d->world_rank / g->cp, cp_rank = d->world_rank % g->cp;
    d->dp = split(&d->world, cp_rank, dp_rank, "dp");
    d->cp = split(&d->world, dp_rank, cp_rank, "cp");
}

void dist_finalize(Dist *d) {
    if (d->leave_devices) d->leave_devices(d);
    Comm *comms[] = {&d->dp, &d->cp};
    for (size_t i = 0; i < sizeof(comms) / sizeof(comms[0]); i++)
        if (comms[i]->name) MPI_CHECK(MPI_Comm_free(&comms[i]->comm));
    if (error_comm != MPI_COMM_NULL) {
        fail_rank_to_name = NULL;
        MPI_CHECK(MPI_Comm_free(&error_comm));
    }
    MPI_CHECK(MPI_Finalize());
}

void comm_fail_all(const Comm *c, const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    if (c->rank == 0) fprintf(stderr, "mtrain: %s\n", message);
    fflush(stderr);
    MPI_Finalize();
    exit(1);
}

// ----------------------------------------------------------------------------
// Waiting with a deadline

void comm_wait(const Comm *c, MPI_Request *reqs, int n, const char *op) {
    double start = now_seconds(), deadline = start + c->timeout_s;
    for (;;) {
        int done = 0;
        MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
        if (done) return;
        if (now_seconds() > deadline) comm_timed_out(c, op);
        // Poll without pausing for the first 2 ms (a collective's rounds between
        // ranks that are all waiting: a sleep per round would add up), then
        // sleep so that ranks sharing cores leave them to the ranks that compute.
        if (now_seconds() - start > 2e-3) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
}

void comm_timed_out(const Comm *c, const char *op) {
    fprintf(stderr, "mtrain: rank %d: %s on %s did not complete within %g s\n", world_rank(), op, c->name,
            c->timeout_s);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// ----------------------------------------------------------------------------
// Operations

void comm_isend(const Comm *c, const void *buf, int64_t count, DType type, int peer, int tag,
                MPI_Request *req) {
    MPI_CHECK(MPI_Isend(buf, mpi_count(count), mpi_type(type), peer, tag, c->comm, req));
}

void comm_irecv(const Comm *c, void *buf, int64_t count, DType type, int peer, int tag,
                MPI_Request *req) {
    MPI_CHECK(MPI_Irecv(buf, mpi_count(count), mpi_type(type), peer, tag, c->comm, req));
}

void comm_allreduce(const Comm *c, void *buf, int64_t count, DType type, ReduceOp op) {
    MPI_Request req;
    static const char *names[] = {[REDUCE_SUM] = "all-reduce (sum)", [REDUCE_MAX] = "all-reduce (max)",
                                  [REDUCE_MIN] = "all-reduce (min)"};
    MPI_Op mpi_op = op == REDUCE_MAX ? MPI_MAX : op == REDUCE_MIN ? MPI_MIN : MPI_SUM;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count), mpi_type(type), mpi_op, c->comm, &req));
    comm_wait(c, &req, 1, names[op]);
}

void comm_iallreduce_sum(const Comm *c, void *buf, int64_t count, DType type, MPI_Request *req) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count), mpi_type(type), MPI_SUM, c->comm, req));
}

void comm_reduce_scatter(const Comm *c, const void *send, void *recv, int64_t count, DType type) {
    MPI_Request req;
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, mpi_count(count), mpi_type(type), MPI_SUM, c->comm, &req));
    comm_wait(c, &req, 1, "reduce-scatter");
}

void comm_allgather(const Comm *c, const void *send, void *recv, int64_t count, DType type) {
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(send ? send : MPI_IN_PLACE, mpi_count(count), mpi_type(type), recv, mpi_count(count), mpi_type(type), c->comm,
                             &req));
    comm_wait(c, &req, 1, "all-gather");
}

void comm_gather(const Comm *c, const void *send, void *recv, int64_t count, DType type, int root) {
    MPI_Request req;
    MPI_CHECK(MPI_Igather(send, mpi_count(count), mpi_type(type), recv, mpi_count(count), mpi_type(type), root, c->comm,
                          &req));
    comm_wait(c, &req, 1, "gather");
}

void comm_broadcast(const Comm *c, void *buf, int64_t count, DType type, int root) {
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(buf, mpi_count(count), mpi_type(type), root, c->comm, &req));
    comm_wait(c, &req, 1, "broadcast");
}
