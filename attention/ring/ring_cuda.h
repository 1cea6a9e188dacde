// ring_cuda.h: ring attention on device buffers (ring_cuda.c), for the CUDA
// attention op (attention_cuda_op.cu): the schedules of ring.c over a
// RingMemory on the GPU, where K/V travel as bf16 and the dK/dV accumulators
// as fp32 through dist/comm_device.h's exchange (NCCL on a communication
// stream, or host-staged MPI under parallel.comm: mpi), with the dense
// kernels of attention_cuda.h or the sparse ones of sparse_cuda.h per ring
// step (sparse, as ring_sparse.c: the block pass per step; the index's
// columns gathered to every rank once per layer and computed in step 0,
// their dK/dV sent home after the backward); ring_send selected sends only
// the key blocks later holders read (ring_dense_need, or the sparse index's
// blocks). The op calls it through the AttnRingCuda that ring_cuda_new
// returns (attention_cuda_op.h):
//   sequence  a new sequence: this rank's positions (host); collective over cp
//   sparse_plan  a layer's pattern estimated over the ring (as ring_sparse.c,
//             combined on the device so that every rank holds the same bits
//             and selects the same pattern), this
//             rank's device index, every rank's need bits and the gathered
//             columns (the layer's state); collective
//   forward   q [T, Hq, D], k, v [T, Hkv, D] bf16 -> o_acc [T, Hq, D] fp32
//             and lse [Hq, T] over every rank's keys (written)
//   backward  from o, dout bf16 and lse: dq_acc [T, Hq, D] and this rank's
//             dk_acc, dv_acc [T, Hkv, D] fp32, accumulated (+=) over every
//             rank's queries
//   bytes     bytes this rank sent in the ring since the sequence began (the
//             gathered columns' K/V and dK/dV included)
// Every call is enqueued on the op's stream.
#ifndef MTRAIN_RING_CUDA_H
#define MTRAIN_RING_CUDA_H

#include "../../dist/comm.h"
#include "../op/attention_cuda_op.h"

// The ring over cp with inner ranks per inner ring; cp NULL or of one rank:
// a ring of one (ring.h: one step on this GPU's K/V, no exchange; sparse:
// the whole index of the op's one-GPU plan in one pass, AttnRingCuda's
// sparse_plan unused).
AttnRingCuda ring_cuda_new(const Comm *cp, int inner);

#endif
