// ring_cuda.h: ring attention on device buffers (ring_cuda.c), for the CUDA
// attention op (attention_cuda_op.cu): the schedules of ring.c over a
// RingMemory on the GPU, where K/V travel as bf16 and the dK/dV accumulators
// as fp32 through dist/comm_device.h's exchange (NCCL on a communication
// stream, or host-staged MPI under parallel.comm: mpi), with the dense
// kernels of attention_cuda.h or the sparse ones of sparse_cuda.h per ring
// step (sparse, as ring_sparse.c: the block pass per step; the index's
// columns gathered to every rank once per layer and computed by the column
// pass, their dK/dV sent home after the backward); ring_send selected sends
// only the key blocks later holders read (ring_dense_need, or the sparse
// index's blocks). The op calls its functions directly (below); the GPU
// programs that link only the kernels link neither (no MPI).
#ifndef MTRAIN_RING_CUDA_H
#define MTRAIN_RING_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../attention.h"
#include "../attn_args.h"
#include "../sparse_types.h"
#include "../sparse/sparse_select_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Comm;

// The device ring of a cp group (a ring of one on one GPU), as
// ring_cuda_new makes it, so that the op never sees a communicator.
typedef struct RingCuda RingCuda;

// A layer's call through the device ring; the same contract as the host
// ring's RingCallCpu (ring_cpu.h) in device memory. index: sparse, this
// rank's index of the layer (its query blocks: built by the op from the
// layer's pattern); NULL: dense. layer: sparse over several ranks, the
// ring's state of the layer (ring_cuda_sparse_plan's); NULL on a ring of
// one, whose one step runs the whole index (blocks and columns) in one
// pass. The pass's tensors: q, k, v (and the backward's o, dout) bf16 [T,
// H, D]; forward: out (o [T, Hq, D] fp32 and lse [Hq, T], written), stats
// NULL or the recall added (sparse: the estimation rows' and the recall
// sample's, cp totals, after a ring_cuda_sparse_plan of the same layer);
// backward: grads.lse the forward's, grads.dq [T, Hq, D], grads.dk,
// grads.dv [T, Hkv, D] fp32 accumulated (+=), grads.delta unused. Every call
// is enqueued on stream.
typedef struct {
    const AttnShape *shape;
    RingSend send;
    const SparseIndexCuda *index;
    void *layer;
    const uint16_t *q, *k, *v, *o, *dout;
    const int64_t *q_pos;      // NULL, or a cached call's query positions (RingTensors.q_pos)
    AttnOut out;
    AttnGrads grads;
    SparseStats *stats;
    cudaStream_t stream;
} RingCallCuda;

// The ring over cp with inner ranks per inner ring; cp NULL or of one rank:
// a ring of one (ring.h: one step on this GPU's K/V, no exchange).
RingCuda *ring_cuda_new(const struct Comm *cp, int inner);
void ring_cuda_free(RingCuda *rc);
// Ranks in the ring (1: a ring of one).
int ring_cuda_size(const RingCuda *rc);
// (Collective over cp.) A new sequence: this rank's positions (host).
void ring_cuda_sequence(RingCuda *rc, const int64_t *pos, int64_t tokens);
// (Collective over cp.) The layer's sparse pattern of call (SparsePlanCall:
// this rank's q, k bf16 on the device) with the estimation's inputs
// combined bit-identically on every rank (on a ring of one: this GPU's own
// plan, nothing combined): *pattern the same on every rank, *index this
// rank's query blocks; over several ranks *layer (made or remade; free with
// ring_cuda_layer_free) the ring's state of the layer: the key blocks every
// rank's index reads and the columns gathered once per layer (a ring of one
// leaves it NULL); call->stats: NULL or the density added (cp totals), and
// the estimation rows' and the recall sample's dense lse kept for the
// forward's recall.
void ring_cuda_sparse_plan(RingCuda *rc, const SparsePlanCall *call, SparsePatternCuda *pattern,
                           SparseIndexCuda *index, void **layer, cudaStream_t stream);
void ring_cuda_layer_free(void *layer);
void ring_cuda_forward(RingCuda *rc, const RingCallCuda *call);
// The columns' dK/dV go home after the ring.
void ring_cuda_backward(RingCuda *rc, const RingCallCuda *call);
// The decode's cached call, dense: call's queries at their own positions
// call->q_pos [shape->q_tokens] against the shape->k_tokens keys call->k,
// v at k_pos (device), writing call->out, through ring.c's forward on a ring
// of one over those keys (ring_init_keys) in rc's device memory: this GPU
// alone, whatever rc's ring (no exchange, no sequence needed).
void ring_cuda_cached(RingCuda *rc, const RingCallCuda *call, const int64_t *k_pos);
// Bytes this rank sent in the ring since the sequence began (the gathered
// columns' K/V and dK/dV included).
double ring_cuda_bytes(const RingCuda *rc);

#ifdef __cplusplus
}
#endif

#endif
