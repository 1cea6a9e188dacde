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
// returns (below):
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

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"
#include "../sparse/sparse_select_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Comm;

// A cp ring's attention on device buffers (a ring of one on one GPU), as
// ring_cuda_new makes it, so that the op and the programs that link only the kernels need no MPI. ring is the ring's
// own state; cp_size 1: a ring of one, whose forward and backward with an
// index run the whole index in one pass (layer NULL, stats unused) and
// whose sparse_plan is not called (the op plans on its GPU).
//   sparse_plan  (collective over cp) the sparse pattern of this rank's q, k
//                [T, H, D] with the estimation's inputs gathered
//                bit-identically on every rank: *pattern the same on every
//                rank, *index this rank's query blocks, *layer (made or
//                remade; free with layer_free) the ring's state of the
//                layer: the key blocks every rank's index reads and the
//                columns gathered once per layer; stats: NULL or the
//                density added (cp totals), and the recall sample's dense
//                lse kept for the forward
//   forward      index NULL: dense; else the sparse kernels over the index
//                and the plan's layer: the columns gathered to every rank
//                and computed in ring step 0, the blocks per ring step;
//                stats: NULL or the recall (estimation rows and recall
//                sample) added (cp totals, after a sparse_plan of the same
//                layer)
//   backward     likewise; the columns' dK/dV go home after the ring
typedef struct {
    void *ring;
    int cp_size;
    void (*sequence)(void *ring, const int64_t *pos, int64_t tokens);
    void (*sparse_plan)(void *ring, const AttentionConfig *cfg, const AttnShape *shape, const uint16_t *q,
                        const uint16_t *k, const int *fixed_vertical, const int *fixed_slash,
                        SparsePatternCuda *pattern, SparseIndexCuda *index, void **layer, SparseStats *stats,
                        cudaStream_t stream);
    void (*forward)(void *ring, const AttnShape *shape, RingSend send, const SparseIndexCuda *index, void *layer,
                    const uint16_t *q, const uint16_t *k, const uint16_t *v, float *o_acc, float *lse,
                    SparseStats *stats, cudaStream_t stream);
    void (*backward)(void *ring, const AttnShape *shape, RingSend send, const SparseIndexCuda *index, void *layer,
                     const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *o, const float *lse,
                     const uint16_t *dout, float *dq_acc, float *dk_acc, float *dv_acc, cudaStream_t stream);
    void (*layer_free)(void *layer);   // NULL: nothing
    double (*bytes)(const void *ring);
    void (*free)(void *ring);
} AttnRingCuda;


// The ring over cp with inner ranks per inner ring; cp NULL or of one rank:
// a ring of one (ring.h: one step on this GPU's K/V, no exchange; sparse:
// the whole index of the op's one-GPU plan in one pass, AttnRingCuda's
// sparse_plan unused).
AttnRingCuda ring_cuda_new(const struct Comm *cp, int inner);

#ifdef __cplusplus
}
#endif

#endif
