// single_rank_mpi.c: the single-rank MPI of the GPU bundle (dist/mpi_single/)
// against MPI's semantics for one rank: sizes and ranks, a send to self
// matched by its receive in either order, by communicator and tag, the
// oldest message first, a receive without its send left pending (Testall:
// flag 0, requests kept), collectives that copy or leave in place, and an
// error for a peer other than rank 0. Built and run by
// tests/repo/test_gpu_bundle.sh (make build/bundle/tests/single_rank_mpi).
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../lib/check.h"

int main(int argc, char **argv) {
    int provided = -1, rank = -1, size = -1;
    EXPECT(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS &&
           provided == MPI_THREAD_FUNNELED, "single_rank_mpi: init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    EXPECT(rank == 0 && size == 1, "single_rank_mpi: one rank");

    MPI_Comm a, b;
    MPI_Comm_split(MPI_COMM_WORLD, 0, 0, &a);
    MPI_Comm_split(MPI_COMM_WORLD, 1, 0, &b);
    EXPECT(a != b && a != MPI_COMM_WORLD && a != MPI_COMM_NULL, "single_rank_mpi: split: distinct communicators");

    // Receive posted first, then the send; a second message on another communicator must not match it.
    float got[3] = {0}, want[3] = {1.5f, -2.0f, 3.25f}, other[3] = {9, 9, 9};
    MPI_Request reqs[3];
    int flag = -1;
    MPI_Irecv(got, 3, MPI_FLOAT, 0, 7, a, &reqs[0]);
    MPI_Isend(other, 3, MPI_FLOAT, 0, 7, b, &reqs[1]);
    reqs[2] = MPI_REQUEST_NULL;
    MPI_Testall(3, reqs, &flag, MPI_STATUSES_IGNORE);
    EXPECT(flag == 0 && reqs[0] != MPI_REQUEST_NULL, "single_rank_mpi: receive without its send: pending, requests kept");
    MPI_Isend(want, 3, MPI_FLOAT, 0, 7, a, &reqs[2]);
    MPI_Testall(3, reqs, &flag, MPI_STATUSES_IGNORE);
    EXPECT(flag == 1 && !memcmp(got, want, sizeof(want)) && reqs[0] == MPI_REQUEST_NULL,
           "single_rank_mpi: receive matched by the send on its communicator");

    // The message left on b, then two on b with tags 1 and 2 received in reverse order.
    double x = 1, y = 2, rx = 0, ry = 0;
    MPI_Isend(&x, 1, MPI_DOUBLE, 0, 1, b, &reqs[0]);
    MPI_Isend(&y, 1, MPI_DOUBLE, 0, 2, b, &reqs[1]);
    MPI_Irecv(&ry, 1, MPI_DOUBLE, 0, 2, b, &reqs[2]);
    MPI_Testall(3, reqs, &flag, MPI_STATUSES_IGNORE);
    MPI_Request rq;
    MPI_Irecv(&rx, 1, MPI_DOUBLE, 0, 1, b, &rq);
    int flag2 = -1;
    MPI_Testall(1, &rq, &flag2, MPI_STATUSES_IGNORE);
    EXPECT(flag == 1 && flag2 == 1 && rx == 1 && ry == 2, "single_rank_mpi: messages matched by tag");
    float left[3] = {0};
    MPI_Irecv(left, 3, MPI_FLOAT, 0, 7, b, &rq);
    MPI_Testall(1, &rq, &flag, MPI_STATUSES_IGNORE);
    EXPECT(flag == 1 && left[0] == 9, "single_rank_mpi: the earlier message on b still queued");

    // Collectives: one contribution, copied or left in place.
    int64_t in[2] = {5, 6}, outv[2] = {0, 0};
    MPI_Allreduce(in, outv, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Iallgather(MPI_IN_PLACE, 2, MPI_INT64_T, in, 2, MPI_INT64_T, a, &rq);
    MPI_Testall(1, &rq, &flag, MPI_STATUSES_IGNORE);
    EXPECT(outv[0] == 5 && outv[1] == 6 && in[0] == 5 && flag, "single_rank_mpi: all-reduce copies, in-place all-gather keeps");
    char name[4] = "bus", names[4] = "";
    EXPECT(MPI_Allgather(name, 4, MPI_CHAR, names, 4, MPI_CHAR, a) == MPI_SUCCESS && !strcmp(names, "bus") &&
               MPI_Allgather(name, 4, MPI_CHAR, names, 3, MPI_CHAR, a) != MPI_SUCCESS,
           "single_rank_mpi: all-gather copies its block, counts that differ are an error");
    int64_t gathered[2] = {0, 0};
    MPI_Igather(in, 2, MPI_INT64_T, gathered, 2, MPI_INT64_T, 0, a, &rq);
    MPI_Testall(1, &rq, &flag, MPI_STATUSES_IGNORE);
    EXPECT(gathered[0] == 5 && gathered[1] == 6 && flag &&
               MPI_Igather(in, 2, MPI_INT64_T, gathered, 2, MPI_INT64_T, 1, a, &rq) != MPI_SUCCESS,
           "single_rank_mpi: gather copies to root 0, another root is an error");
    EXPECT(MPI_Isend(&x, 1, MPI_DOUBLE, 1, 0, a, &rq) != MPI_SUCCESS, "single_rank_mpi: a peer other than rank 0 is an error");
    MPI_Comm_free(&a);
    MPI_Comm_free(&b);
    EXPECT(a == MPI_COMM_NULL && b == MPI_COMM_NULL && MPI_Finalize() == MPI_SUCCESS, "single_rank_mpi: free");
    return check_exit();
}
