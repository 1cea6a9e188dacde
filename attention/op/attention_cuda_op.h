// attention_cuda_op.h: what the CUDA attention op (attention_cuda_op.cu;
// its public entries are attention_api.h's attention_cuda_*) takes from
// inside attention/: the binding of a ring made by ring_cuda_new
// (op/attention_cuda_ring.c), and by the GPU tests a ring of their own.
// The op keeps, per layer, the device pattern of the sequence's plan
// forward (over the ring on several ranks: AttnRingCuda.sparse_plan) and
// rebuilds one index at the bound the pattern states (sparse_index_bound)
// on the device; the kernels' fp32 sums live in its scratch and are added
// into the bf16 outputs with one rounding. Documents (shape->doc_starts,
// host) reach the kernels through the op's device copy
// (AttnShape.doc_starts_device, copied through page-locked memory when the
// list changes: once per sequence).
#ifndef MTRAIN_ATTENTION_CUDA_OP_H
#define MTRAIN_ATTENTION_CUDA_OP_H

#include <stdbool.h>

#include "../attention_api.h"
#include "../ring/ring_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

// ring: the cp ring or a ring of one (the state owns and frees ring->ring;
// every sequence needs one). Returns whether it has more than one rank.
bool attention_cuda_bind_ring(AttnState *st, const AttnRingCuda *ring);

#ifdef __cplusplus
}
#endif

#endif
