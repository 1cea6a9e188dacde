// ring_cpu.h: ring attention on host buffers (ring_cpu.c), for the CPU
// attention op (attention_cpu.c), as ring_cuda.h is for the CUDA op: the
// schedules of ring.c over ring_host_memory (fp32 K/V and dK/dV, MPI), with
// the dense kernels of kernels/flash_cpu.h or the sparse ones of sparse.h per
// ring step (sparse over several ranks: ring_sparse.h's plan and kernels, the
// index's columns gathered to every rank once per layer and computed by the
// column pass, their dK/dV sent home after the backward); ring_send selected
// sends only the key blocks later holders read (ring_dense_need, or the
// sparse index's blocks). The op calls its functions directly (below).
#ifndef MTRAIN_RING_CPU_H
#define MTRAIN_RING_CPU_H

#include <stdint.h>

#include "ring.h"
#include "../sparse_types.h"

struct Comm;

// Host memory and MPI (fp32 activations), every ring's memory unless
// ring_set_memory gives another.
extern const RingMemory ring_host_memory;

// The dense CPU kernels of kernels/flash_cpu.h per ring step (ctx unused).
extern const RingKernels ring_dense_cpu;

// The host ring of a cp group (a ring of one on one rank), as
// ring_cpu_new makes it, so that the op never sees a communicator.
typedef struct RingCpu RingCpu;

// A layer's call through the ring; the same contract as the device ring's
// RingCallCuda (ring_cuda.h) in host memory. index: sparse, this rank's
// index of the layer (its query blocks: the op's sparse_plan_local on a
// ring of one, ring_cpu_sparse_plan's over several ranks); NULL: dense.
// layer: sparse over several ranks, the ring's state of the layer
// (ring_cpu_sparse_plan's); NULL on a ring of one, whose one step runs the
// whole index (blocks and columns) in one pass. t: the pass's tensors (fp32).
typedef struct {
    const AttnShape *shape;
    RingSend send;
    const SparseIndex *index;
    void *layer;
    RingTensors t;
} RingCallCpu;

// The ring over cp with inner ranks per inner ring; cp NULL or of one rank:
// a ring of one (ring.h: one step on this rank's K/V, no transfer, no MPI).
RingCpu *ring_cpu_new(const struct Comm *cp, int inner);
void ring_cpu_free(RingCpu *rc);
// Ranks in the ring (1: a ring of one).
int ring_cpu_size(const RingCpu *rc);
// (Collective over cp.) A new sequence: this rank's positions.
void ring_cpu_sequence(RingCpu *rc, const int64_t *pos, int64_t tokens);
// (Collective over cp.) The layer's sparse pattern of call (SparsePlanCall:
// this rank's q, k fp32): *index (replaced) this rank's index of it. On a
// ring of one the rank's own plan (sparse_plan_local; *layer stays NULL);
// over several ranks estimated over the ring (ring_sparse_plan), every rank
// selecting the same pattern, and *layer (made or remade; free with
// ring_cpu_layer_free) the ring's state of the layer: the key blocks every
// rank's index reads and the columns gathered once per layer. call->stats:
// the density and recall (cp totals; the CPU's recall comes from the plan,
// so the forward takes no stats).
void ring_cpu_sparse_plan(RingCpu *rc, const SparsePlanCall *call, SparseIndex *index, void **layer);
void ring_cpu_layer_free(void *layer);
// Writes call->t.out over every rank's keys.
void ring_cpu_forward(RingCpu *rc, const RingCallCpu *call);
// Adds into call->t.grads; the columns' dK/dV go home after the ring.
void ring_cpu_backward(RingCpu *rc, const RingCallCpu *call);
// The decode's cached call, dense: call->t's queries at their own
// positions t.q_pos [shape->q_tokens] against the shape->k_tokens keys t.k,
// t.v at k_pos, writing call->t.out, through ring.c's forward on a ring of
// one over those keys (ring_init_keys; this rank alone, whatever the op's
// ring).
void ring_cpu_cached(const RingCallCpu *call, const int64_t *k_pos);
// Bytes this rank sent in the ring since the sequence began.
double ring_cpu_bytes(const RingCpu *rc);

#endif
