// attention_cuda_op.h: the CUDA backend's attention op (attention_cuda_op.cu),
// the attention_* entries of the Backend table (model/backend.h states their
// contracts) on one GPU: dense, or sparse with the pattern estimated,
// selected and indexed on the GPU on a sequence's first forward of a layer
// and reused by its recomputation and its backward.
//
// Same parameters in the same order as the CPU op (attention_cpu.h), on
// device memory, with the backend's stream last (every call is enqueued on
// it; the state's scratch is stream-ordered on it too):
//   q, o, dq, dout : [T, Hq, D] bf16 (uint16_t bits)   k, v, dk, dv : [T, Hkv, D] bf16
//   lse, delta     : [Hq, T] fp32                       pos : [T] int64 (device)
// dq, dk, dv are ACCUMULATED (+=): the kernels' fp32 sums live in the state's
// scratch and are added into the bf16 outputs with one rounding.
// One rank only: a ring (cp_size > 1) fails with one line. Documents
// (shape->doc_starts) are masked by the dense and the sparse kernels; the
// sparse plan sees only same-document scores and its index holds each row's
// documents and their sinks, as the CPU op's. Supported as the kernels:
// head_dim 64 and 128, GQA; sparse: block_size 64 or 128, last_q <= 128,
// positions 0 .. T-1.
#ifndef MTRAIN_ATTENTION_CUDA_OP_H
#define MTRAIN_ATTENTION_CUDA_OP_H

#include <stdbool.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "sparse.h"

#ifdef __cplusplus
extern "C" {
#endif

AttnState *attention_cuda_new(const AttentionConfig *cfg, int num_layers, int num_heads);
void attention_cuda_free(AttnState *st);
// cp_size: ranks of the cp group (the Comm's size; 1 or less without one;
// a number, not the Comm, since the .cu files see no MPI header). Returns
// false for one rank; a ring fails with one line.
bool attention_cuda_set_ring(AttnState *st, int cp_size, int inner);
// A new sequence: pos [tokens] its positions (host).
void attention_cuda_sequence(AttnState *st, const int64_t *pos, int64_t tokens);
// stats: NULL, or the layer's density (computed, causal) and recall
// (covered_mass, estimation_rows) added, as the CPU op counts them; waits
// for the stream (the counts are read back to the host).
void attention_cuda_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const uint16_t *q,
                            const uint16_t *k, const uint16_t *v, const int64_t *pos, uint16_t *o, float *lse,
                            SparseStats *stats, cudaStream_t stream);
void attention_cuda_backward(AttnState *st, int layer, const AttnShape *shape, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, const int64_t *pos, const uint16_t *o,
                             const float *lse, const uint16_t *dout, float *delta, uint16_t *dq, uint16_t *dk,
                             uint16_t *dv, cudaStream_t stream);
// No ring, no ring traffic: 0.
double attention_cuda_ring_bytes(const AttnState *st);

#ifdef __cplusplus
}
#endif

#endif
