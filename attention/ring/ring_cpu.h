// ring_cpu.h: ring attention on host buffers (ring_cpu.c), for the CPU
// attention op (attention_cpu.c), as ring_cuda.h is for the CUDA op: the
// schedules of ring.c over ring_host_memory (fp32 K/V and dK/dV, MPI), with
// the dense kernels of attention.h or the sparse ones of sparse.h per ring
// step (sparse over several ranks: ring_sparse.h's plan and kernels, the
// index's columns gathered to every rank once per layer and computed in
// step 0, their dK/dV sent home after the backward); ring_send selected
// sends only the key blocks later holders read (ring_dense_need, or the
// sparse index's blocks). The op calls it through the AttnRingCpu that
// ring_cpu_new returns (attention_cpu.h):
//   sequence     a new sequence: this rank's positions; collective over cp
//   sparse_plan  a layer's pattern estimated over the ring (ring_sparse_plan:
//                every rank holds the same inputs and selects the same
//                pattern), this rank's index, every rank's need bits and
//                the gathered columns (the layer's state); collective
//   forward      q [T, Hq, D], k, v [T, Hkv, D] -> o [T, Hq, D] and lse
//                [Hq, T] over every rank's keys (written)
//   backward     from o, dout and lse: dq [T, Hq, D] and this rank's dk, dv
//                [T, Hkv, D], accumulated (+=) over every rank's queries
//   bytes        bytes this rank sent in the ring since the sequence began
//                (the gathered columns' K/V and dK/dV included)
#ifndef MTRAIN_RING_CPU_H
#define MTRAIN_RING_CPU_H

#include "../../dist/comm.h"
#include "../op/attention_cpu.h"

// The ring over cp with inner ranks per inner ring; cp NULL or of one rank:
// a ring of one (ring.h: one step on this rank's K/V, no transfer, no MPI;
// sparse: the whole index of the op's one-rank plan in one pass,
// AttnRingCpu's sparse_plan unused).
AttnRingCpu ring_cpu_new(const Comm *cp, int inner);

#endif
