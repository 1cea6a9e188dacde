// mpi.h: a single-rank MPI for the GPU bundle (scripts/gpu_bundle.sh,
// docs/DECISIONS.md): exactly the subset of MPI that the library calls, with
// MPI's semantics for a job of one process. Every communicator has one rank;
// collectives copy (or leave in place) their one contribution; a send to
// self is buffered until a receive with the same communicator and tag takes
// it. MPI_Init_thread refuses, with one line, a start that asks for more than one
// rank (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_SIZE or SLURM_NTASKS > 1).
// Only the bundle's build puts this folder on the include path; every other
// build uses Open MPI.
#ifndef MTRAIN_MPI_SINGLE_H
#define MTRAIN_MPI_SINGLE_H

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;
typedef int MPI_Info;
typedef int MPI_Errhandler;
typedef struct MpiSingleRequest *MPI_Request;
typedef struct { int MPI_SOURCE, MPI_TAG, MPI_ERROR; } MPI_Status;

#define MPI_SUCCESS 0
#define MPI_ERR_ARG 12
#define MPI_MAX_ERROR_STRING 256
#define MPI_UNDEFINED (-32766)

#define MPI_COMM_NULL 0
#define MPI_COMM_WORLD 1
#define MPI_COMM_TYPE_SHARED 1
#define MPI_INFO_NULL 0
#define MPI_ERRORS_RETURN 1
#define MPI_REQUEST_NULL ((MPI_Request)0)
#define MPI_STATUS_IGNORE ((MPI_Status *)0)
#define MPI_STATUSES_IGNORE ((MPI_Status *)0)
#define MPI_IN_PLACE ((void *)1)

#define MPI_THREAD_FUNNELED 1

// Each datatype is its size in bytes times 16 plus a kind, so that two types
// of one size stay distinct.
#define MPI_BYTE (1 * 16 + 0)
#define MPI_CHAR (1 * 16 + 2)
#define MPI_UINT16_T (2 * 16 + 1)
#define MPI_INT (4 * 16 + 3)
#define MPI_FLOAT (4 * 16 + 4)
#define MPI_INT64_T (8 * 16 + 5)
#define MPI_DOUBLE (8 * 16 + 6)

#define MPI_SUM 1
#define MPI_MAX 2
#define MPI_MIN 3
#define MPI_BOR 4

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided);
int MPI_Finalize(void);
int MPI_Abort(MPI_Comm comm, int errorcode);
int MPI_Error_string(int errorcode, char *string, int *resultlen);

int MPI_Comm_rank(MPI_Comm comm, int *rank);
int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm);
int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm);
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm);
int MPI_Comm_free(MPI_Comm *comm);
int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler errhandler);

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *req);
int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request *req);
int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status);
int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status statuses[]);
int MPI_Request_free(MPI_Request *req);

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);
int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm);
int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request *req);
int MPI_Ireduce_scatter_block(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm, MPI_Request *req);
int MPI_Allgather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm);
int MPI_Iallgather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                   MPI_Datatype recv_type, MPI_Comm comm, MPI_Request *req);
int MPI_Igather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                MPI_Datatype recv_type, int root, MPI_Comm comm, MPI_Request *req);
int MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request *req);

#endif
