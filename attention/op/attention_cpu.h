// attention_cpu.h: the CPU backend's attention op (the attention_* entries of
// the Backend table, model/backend.h, which states their contracts, bound by
// model/ops_cpu.c): the kernels of attention.h and sparse.h, every call
// through the ring that the backend binds (attention_cpu_set_ring: an
// AttnRingCpu from attention/ring/ring_cpu.h, a ring of one on one rank; over
// the cp ring, MPI, with ring_sparse.h's kernels for sparse). The same
// parameters in the same order as the CUDA op (attention_cuda_op.h), in fp32
// host memory:
//   q, o, dq, dout : [T, Hq, D]   k, v, dk, dv : [T, Hkv, D]   lse : [Hq, T]
//   pos : [T] int64, the sequence's positions (attention_cpu_sequence's)
// dq, dk, dv are ACCUMULATED (+=).
#ifndef MTRAIN_ATTENTION_CPU_H
#define MTRAIN_ATTENTION_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "../attention.h"
#include "../sparse/sparse.h"

// A cp ring's attention on host buffers (a ring of one on one rank), bound
// by the caller (attention/ring/ring_cpu.h: ring_cpu_new), so that the op
// never sees a communicator; the shape of the CUDA op's AttnRingCuda with
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

AttnState *attention_cpu_new(const AttentionConfig *cfg, int num_layers, int num_heads);
void attention_cpu_free(AttnState *st);
// ring: the cp ring or a ring of one (the state owns and frees ring->ring;
// every sequence needs one). Returns whether it has more than one rank.
bool attention_cpu_set_ring(AttnState *st, const AttnRingCpu *ring);
void attention_cpu_sequence(AttnState *st, const int64_t *pos, int64_t tokens);
void attention_cpu_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const float *q,
                           const float *k, const float *v, const int64_t *pos, float *o, float *lse, SparseStats *stats);
void attention_cpu_cached(AttnState *st, const AttnShape *shape, const float *q, const int64_t *q_pos, const float *k,
                          const float *v, const int64_t *k_pos, float *o, float *lse);
void attention_cpu_backward(AttnState *st, int layer, const AttnShape *shape, const float *q, const float *k,
                            const float *v, const int64_t *pos, const float *o, const float *lse, const float *dout,
                            float *dq, float *dk, float *dv);
// Bytes this rank sent in the ring for the sequence (0 without a ring).
double attention_cpu_ring_bytes(const AttnState *st);

#endif
