// comm.h: processes and communicators over MPI (docs/ARCHITECTURE.md, Dist). Bootstrap from
// mpirun or srun (or a plain start: an MPI singleton), the rank grid
// world = dp × cp with cp = outer × inner, and the operations on CPU buffers
// that the trainer and the ring need: non-blocking send/recv, all-reduce,
// reduce-scatter, all-gather, gather and broadcast. Every wait polls against a
// deadline (`parallel.timeout_s`): an operation that does not complete in
// time ends the whole job with "mtrain: rank R: OP on COMM did not complete
// within S s" instead of hanging.
//
// Rank order (cp innermost, inner innermost within cp):
//   world rank = dp_rank * cp + cp_rank,  cp_rank = outer_rank * cp_inner + inner_rank
// so that a cp group (or at least each inner ring) is a run of consecutive
// world ranks, which mpirun and srun place on one node.
#ifndef MTRAIN_COMM_H
#define MTRAIN_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

// Every MPI call goes through this: on error print file:line, the call and
// MPI's error string, then abort the whole job.
#define MPI_CHECK(call) do { int mpi_rc_ = (call); \
    if (mpi_rc_ != MPI_SUCCESS) comm_mpi_fail(__FILE__, __LINE__, #call, mpi_rc_); } while (0)
void comm_mpi_fail(const char *file, int line, const char *call, int rc) __attribute__((noreturn));

// DT_UINT16: 2-byte elements moved as they are (bf16 weights), never reduced.
typedef enum { DT_FLOAT, DT_DOUBLE, DT_INT64, DT_UINT16 } DType;
typedef enum { REDUCE_SUM, REDUCE_MAX, REDUCE_MIN } ReduceOp;

// One communicator: its MPI handle, its name for messages, this rank in it.
typedef struct Comm {
    MPI_Comm comm;
    const char *name;          // "world", "dp", "cp"
    int rank, size;
    double timeout_s;          // every wait on it gives up after this long
    struct ncclComm *nccl;     // its NCCL communicator for device buffers (dist/comm_device.h), or NULL
} Comm;

// The shape of the rank grid, decided before any communicator exists.
typedef struct {
    int world, dp, cp, cp_inner, cp_outer;
} Grid;

// This process in the job.
typedef struct Dist {
    int world_rank, world_size;
    int local_rank, local_size;   // within the node (shared-memory domain)
    int node_cpus;                // CPUs this node's ranks may run on (the union of their affinity masks)
    int rank_cpus;                // CPUs this rank may run on (its affinity mask)
    const char *launcher;         // "mpirun", "srun" (its environment cross-checked) or "none"
    Grid grid;
    Comm world, dp, cp;        // the hierarchical ring's inner and outer peers are ranks of cp (Grid)
    void (*leave_devices)(struct Dist *d);  // set by comm_device_join: frees the NCCL communicators
} Dist;

// MPI_Init_thread (FUNNELED: only the main thread calls MPI), world rank and
// size, local rank and the node's CPUs from MPI_Comm_split_type(SHARED), cross-checked with
// OMPI_COMM_WORLD_LOCAL_RANK (mpirun) or SLURM_LOCALID (srun, which must also
// give SLURM_PROCID = rank and SLURM_STEP_NUM_TASKS = world size); a mismatch
// ends the run with one line. srun without a PMIx plugin ends with one line
// before MPI_Init.
// d->world is usable afterwards (the other communicators are not).
void dist_init(Dist *d, int *argc, char ***argv, double timeout_s);

// The grid for `world` ranks with `ranks_per_node` on the smallest node, from
// the requested dp, cp, cp_inner (0 = default: cp = world / dp or world,
// dp = world / cp, cp_inner = gcd(cp, ranks_per_node)). Returns 0, or -1 with
// a one-line reason in why (naming the parallel.* key and what was expected).
int dist_grid(int world, int ranks_per_node, int dp, int cp, int cp_inner, Grid *grid,
              char *why, size_t why_size);

// Build dp and cp for the requested grid. A bad request
// ends every rank (rank 0 prints "mtrain: SOURCE: <reason>"; source names
// where the settings came from, e.g. the run file).
void dist_setup(Dist *d, int dp, int cp, int cp_inner, const char *source);

// Free the communicators (the NCCL ones first) and MPI_Finalize.
void dist_finalize(Dist *d);

// Every rank of c prints "mtrain: <message>" on rank 0 of c only and exits
// with status 1. All ranks of c must call it (a collective decision).
void comm_fail_all(const Comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

// Non-blocking point-to-point; finish with comm_wait.
void comm_isend(const Comm *c, const void *buf, int64_t count, DType type, int peer, int tag,
                MPI_Request *req);
void comm_irecv(const Comm *c, void *buf, int64_t count, DType type, int peer, int tag,
                MPI_Request *req);

// Wait for n requests (MPI_REQUEST_NULL entries are done already), polling
// until the deadline; `op` names the operation in the time-out message.
void comm_wait(const Comm *c, MPI_Request *reqs, int n, const char *op);

// The end of a wait past c's deadline: "mtrain: rank R: OP on COMM did not
// complete within S s" on stderr, then MPI_Abort ends every rank.
void comm_timed_out(const Comm *c, const char *op) __attribute__((noreturn));

// Collectives, each waiting with the deadline. In place: buf [count].
void comm_allreduce(const Comm *c, void *buf, int64_t count, DType type, ReduceOp op);
// Non-blocking, in place: the sum over c of buf [count]; finish with
// comm_wait (op "all-reduce (sum)"). MPI progresses it inside MPI calls.
void comm_iallreduce_sum(const Comm *c, void *buf, int64_t count, DType type, MPI_Request *req);
// Sum of every rank's send [size * count], this rank's block into recv [count].
void comm_reduce_scatter(const Comm *c, const void *send, void *recv, int64_t count, DType type);
// Every rank's send [count] into recv [size * count], in rank order; send
// NULL: in place, this rank's block already at recv + rank * count.
void comm_allgather(const Comm *c, const void *send, void *recv, int64_t count, DType type);
// Every rank's send [count] into root's recv [size * count], in rank order
// (recv is not used on the other ranks).
void comm_gather(const Comm *c, const void *send, void *recv, int64_t count, DType type, int root);
// root's buf [count] to every rank.
void comm_broadcast(const Comm *c, void *buf, int64_t count, DType type, int root);

#endif
