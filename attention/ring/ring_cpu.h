// ring_cpu.h: ring attention on host buffers (ring_cpu.c), for the CPU
// attention op (attention_cpu.c), as ring_cuda.h is for the CUDA op: the
// schedules of ring.c over ring_host_memory (fp32 K/V and dK/dV, MPI), with
// the dense kernels of kernels/flash_cpu.h or the sparse ones of sparse.h per ring
// step (sparse over several ranks: ring_sparse.h's plan and kernels, the
// index's columns gathered to every rank once per layer and computed in
// step 0, their dK/dV sent home after the backward); ring_send selected
// sends only the key blocks later holders read (ring_dense_need, or the
// sparse index's blocks). The op calls it through the AttnRingCpu that
// ring_cpu_new returns (below):
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

#include <stdint.h>

#include "../attention.h"
#include "../sparse_types.h"

struct Comm;

// A cp ring's attention on host buffers (a ring of one on one rank), as
// ring_cpu_new makes it, so that the op never sees a communicator; the shape of the CUDA op's AttnRingCuda with
// the CPU's element types. ring is the ring's own state; cp_size 1: a ring
// of one, whose forward and backward with an index run the whole index in
// one pass (layer NULL) and whose sparse_plan is not called (the op plans
// on its rank, sparse_plan_local).
//   sequence     (collective over cp) a new sequence: this rank's positions
//   sparse_plan  (collective over cp) the sparse pattern of this rank's q, k
//                [T, H, D] estimated over the ring (ring_sparse_plan with
//                cfg->ring_send), every rank selecting the same pattern;
//                *layer (made or remade; free with layer_free) the ring's
//                state of the layer: the pattern, this rank's index, the key
//                blocks every rank's index reads and the columns gathered
//                once per layer; stats: NULL or the density and recall added
//                (cp totals; the CPU's recall comes from the plan, so the
//                forward takes no stats)
//   forward      dense when index and layer are NULL; else the sparse kernels
//                over index (a ring of one) or the plan's layer (several
//                ranks: the columns gathered to every rank and computed in
//                ring step 0, the blocks per ring step); o and lse written
//   backward     likewise, from o, lse and dout; the columns' dK/dV go home
//                after the ring
//   bytes        bytes this rank sent in the ring since the sequence began
typedef struct {
    void *ring;
    int cp_size;
    void (*sequence)(void *ring, const int64_t *pos, int64_t tokens);
    void (*sparse_plan)(void *ring, const AttentionConfig *cfg, const AttnShape *shape, const float *q,
                        const float *k, const int *fixed_vertical, const int *fixed_slash, void **layer,
                        SparseStats *stats);
    void (*forward)(void *ring, const AttnShape *shape, RingSend send, const SparseIndex *index, void *layer,
                    const float *q, const float *k, const float *v, float *o, float *lse);
    void (*backward)(void *ring, const AttnShape *shape, RingSend send, const SparseIndex *index, void *layer,
                     const float *q, const float *k, const float *v, const float *o, const float *lse,
                     const float *dout, float *dq, float *dk, float *dv);
    void (*layer_free)(void *layer);
    double (*bytes)(const void *ring);
    void (*free)(void *ring);
} AttnRingCpu;


// The ring over cp with inner ranks per inner ring; cp NULL or of one rank:
// a ring of one (ring.h: one step on this rank's K/V, no transfer, no MPI;
// sparse: the whole index of the op's one-rank plan in one pass,
// AttnRingCpu's sparse_plan unused).
AttnRingCpu ring_cpu_new(const struct Comm *cp, int inner);

#endif
