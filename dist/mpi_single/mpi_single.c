// mpi_single.c: the single-rank MPI of the GPU bundle (see mpi.h): one
// process, every communicator of size 1. Requests are heap objects: a
// collective's and a send's are complete when made (a send to self copies
// its data into a message queue), a receive's when MPI_Testall finds the
// oldest queued message of its communicator and tag.
#include "mpi.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util.h"

struct MpiSingleRequest {
    int done;
    void *buf;          // a receive's destination
    size_t bytes;       // its capacity
    MPI_Comm comm;
    int tag;
};

// A message sent to self, waiting for its receive.
typedef struct Message {
    MPI_Comm comm;
    int tag;
    size_t bytes;
    struct Message *next;
    unsigned char data[];
} Message;

static Message *queue_head, **queue_tail = &queue_head;
static MPI_Comm next_comm = MPI_COMM_WORLD + 1;

static size_t type_bytes(MPI_Datatype type) { return (size_t)type / 16; }

static MPI_Request completed(void) {
    MPI_Request r = xmalloc(sizeof(*r));
    *r = (struct MpiSingleRequest){.done = 1};
    return r;
}

// Ends the process with one line when the environment says the job has more ranks.
static void refuse_more_ranks(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1)
            fail("%s=%s asks for %s ranks, but this program is the GPU bundle's single-process build (single-rank "
                 "MPI, dist/mpi_single/): expected one process; for more ranks build build/cuda/mtrain with Open MPI",
                 vars[i], v, v);
    }
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    (void)argc; (void)argv;
    refuse_more_ranks();
    *provided = required;
    return MPI_SUCCESS;
}

int MPI_Finalize(void) { return MPI_SUCCESS; }

int MPI_Abort(MPI_Comm comm, int errorcode) {
    (void)comm;
    fflush(stdout);
    fflush(stderr);
    exit(errorcode ? errorcode : 1);
}

int MPI_Error_string(int errorcode, char *string, int *resultlen) {
    *resultlen = snprintf(string, MPI_MAX_ERROR_STRING, "single-rank MPI error %d (an argument outside one rank's "
                          "job)", errorcode);
    return MPI_SUCCESS;
}

int MPI_Comm_rank(MPI_Comm comm, int *rank) {
    *rank = 0;
    return comm == MPI_COMM_NULL ? MPI_ERR_ARG : MPI_SUCCESS;
}

int MPI_Comm_size(MPI_Comm comm, int *size) {
    *size = 1;
    return comm == MPI_COMM_NULL ? MPI_ERR_ARG : MPI_SUCCESS;
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm) {
    (void)key;
    if (comm == MPI_COMM_NULL) return MPI_ERR_ARG;
    *newcomm = color == MPI_UNDEFINED ? MPI_COMM_NULL : next_comm++;
    return MPI_SUCCESS;
}

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm) {
    (void)info;
    return MPI_Comm_split(comm, split_type, key, newcomm);
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm) { return MPI_Comm_split(comm, 0, 0, newcomm); }

int MPI_Comm_free(MPI_Comm *comm) {
    if (*comm == MPI_COMM_NULL || *comm == MPI_COMM_WORLD) return MPI_ERR_ARG;
    *comm = MPI_COMM_NULL;
    return MPI_SUCCESS;
}

int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler errhandler) {
    (void)errhandler;
    return comm == MPI_COMM_NULL ? MPI_ERR_ARG : MPI_SUCCESS;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *req) {
    if (dest != 0 || count < 0 || comm == MPI_COMM_NULL) return MPI_ERR_ARG;
    size_t bytes = (size_t)count * type_bytes(type);
    Message *m = xmalloc(sizeof(Message) + bytes);
    *m = (Message){.comm = comm, .tag = tag, .bytes = bytes};
    memcpy(m->data, buf, bytes);
    *queue_tail = m;
    queue_tail = &m->next;
    *req = completed();
    return MPI_SUCCESS;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request *req) {
    if (source != 0 || count < 0 || comm == MPI_COMM_NULL) return MPI_ERR_ARG;
    MPI_Request r = xmalloc(sizeof(*r));
    *r = (struct MpiSingleRequest){.buf = buf, .bytes = (size_t)count * type_bytes(type), .comm = comm, .tag = tag};
    *req = r;
    return MPI_SUCCESS;
}

// A receive takes the oldest queued message of its communicator and tag, if any.
static int match(MPI_Request r) {
    for (Message **at = &queue_head; *at; at = &(*at)->next) {
        Message *m = *at;
        if (m->comm != r->comm || m->tag != r->tag) continue;
        if (m->bytes > r->bytes) return MPI_ERR_ARG;
        memcpy(r->buf, m->data, m->bytes);
        *at = m->next;
        if (queue_tail == &m->next) queue_tail = at;
        free(m);
        r->done = 1;
        return MPI_SUCCESS;
    }
    return MPI_SUCCESS;
}

int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status statuses[]) {
    (void)statuses;
    int all = 1;
    for (int i = 0; i < count; i++) {
        if (reqs[i] == MPI_REQUEST_NULL || reqs[i]->done) continue;
        int rc = match(reqs[i]);
        if (rc != MPI_SUCCESS) return rc;
        all &= reqs[i]->done;
    }
    *flag = all;
    if (!all) return MPI_SUCCESS;
    for (int i = 0; i < count; i++) {
        free(reqs[i]);
        reqs[i] = MPI_REQUEST_NULL;
    }
    return MPI_SUCCESS;
}

int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status) { return MPI_Testall(1, req, flag, status); }

// Frees a request at once: a send's is complete, a receive's is dropped.
int MPI_Request_free(MPI_Request *req) {
    free(*req);
    *req = MPI_REQUEST_NULL;
    return MPI_SUCCESS;
}

// One rank's reduction, gather or scatter: its own block, copied unless in place.
static int own_block(const void *send, void *recv, int count, MPI_Datatype type) {
    if (count < 0) return MPI_ERR_ARG;
    if (send != MPI_IN_PLACE) memmove(recv, send, (size_t)count * type_bytes(type));
    return MPI_SUCCESS;
}

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    (void)op;
    return comm == MPI_COMM_NULL ? MPI_ERR_ARG : own_block(send, recv, count, type);
}

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
    (void)buf; (void)count; (void)type;
    return root != 0 || comm == MPI_COMM_NULL ? MPI_ERR_ARG : MPI_SUCCESS;
}

int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request *req) {
    int rc = MPI_Allreduce(send, recv, count, type, op, comm);
    if (rc == MPI_SUCCESS) *req = completed();
    return rc;
}

int MPI_Ireduce_scatter_block(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm, MPI_Request *req) {
    return MPI_Iallreduce(send, recv, count, type, op, comm, req);
}

int MPI_Allgather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) return MPI_ERR_ARG;
    if (send != MPI_IN_PLACE && (send_count != recv_count || send_type != recv_type)) return MPI_ERR_ARG;
    return own_block(send, recv, recv_count, recv_type);
}

int MPI_Iallgather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                   MPI_Datatype recv_type, MPI_Comm comm, MPI_Request *req) {
    int rc = MPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
    if (rc == MPI_SUCCESS) *req = completed();
    return rc;
}

int MPI_Igather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                MPI_Datatype recv_type, int root, MPI_Comm comm, MPI_Request *req) {
    if (comm == MPI_COMM_NULL || root != 0) return MPI_ERR_ARG;
    if (send != MPI_IN_PLACE && (send_count != recv_count || send_type != recv_type)) return MPI_ERR_ARG;
    int rc = own_block(send, recv, recv_count, recv_type);
    if (rc == MPI_SUCCESS) *req = completed();
    return rc;
}

int MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request *req) {
    int rc = MPI_Bcast(buf, count, type, root, comm);
    if (rc == MPI_SUCCESS) *req = completed();
    return rc;
}
