// attention_api.h: the attention component's one public header, all that
// the rest of mtrain uses of attention/ (data/ alone also reads layout.h):
// the config and a call's shape (attention.h), the token layouts and the
// document rule (layout.h), the sparse statistics (sparse_types.h), the
// kernels' counted work and cost model for the planner (kernels/
// kernel_cost.h, kernel_counts.h) and each backend's attention op: create,
// bind the cp ring, start a sequence, forward, backward, the decode's cached
// call, the ring's bytes. The Backend table (model/backend.h) states the
// ops' contracts; the two ops take the same parameters in the same order,
// in their backend's memory:
//   CPU (op/attention_cpu.c)       fp32 host memory
//   CUDA (op/attention_cuda_op.cu) device memory, activations bf16 (uint16_t
//        bits), lse fp32, pos int64; every call enqueued on `stream` (a
//        cudaStream_t, spelled struct CUstream_st * so that this header
//        needs no CUDA header); built only with MTRAIN_CUDA
//   q, o, dq, dout : [T, Hq, D]   k, v, dk, dv : [T, Hkv, D]   lse : [Hq, T]
//   pos : [T], the sequence's positions (the _sequence call's)
// dq, dk, dv are ACCUMULATED (+=). Each op runs every call through its cp
// ring (a ring of one on one rank or GPU; the decode's cached call through
// a ring of one over its keys): dense, or sparse with each
// layer's pattern estimated on the sequence's plan forward and reused by
// its recomputation and backward. CUDA supports head_dim 64 and 128, GQA;
// sparse: block_size 64 or 128, last_q <= 128, positions 0 .. T-1 on one
// GPU, whole blocks of B on each ring rank (only the last may be short).
#ifndef MTRAIN_ATTENTION_API_H
#define MTRAIN_ATTENTION_API_H

#include <stdbool.h>
#include <stdint.h>

#include "attention.h"
#include "kernels/kernel_cost.h"
#include "layout.h"
#include "sparse_types.h"

struct Comm;
struct CUstream_st;

#ifdef __cplusplus
extern "C" {
#endif

// ---- the CPU op ----
AttnState *attention_cpu_new(const AttentionConfig *cfg, int num_layers, int num_heads);
void attention_cpu_free(AttnState *st);
// The op's ring over cp with inner ranks per inner ring (cp NULL or of one
// rank: a ring of one); every sequence needs one. Returns whether it has
// more than one rank.
bool attention_cpu_set_ring(AttnState *st, const struct Comm *cp, int inner);
void attention_cpu_sequence(AttnState *st, const int64_t *pos, int64_t tokens);
// stats: NULL, or the layer's density and recall added on a plan forward.
void attention_cpu_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const float *q,
                           const float *k, const float *v, const int64_t *pos, float *o, float *lse, SparseStats *stats);
// Dense, on this rank alone: q_pos [Tq], k_pos [Tk] (the ring's positions
// of the call's keys).
void attention_cpu_cached(AttnState *st, const AttnShape *shape, const float *q, const int64_t *q_pos, const float *k,
                          const float *v, const int64_t *k_pos, float *o, float *lse);
void attention_cpu_backward(AttnState *st, int layer, const AttnShape *shape, const float *q, const float *k,
                            const float *v, const int64_t *pos, const float *o, const float *lse, const float *dout,
                            float *dq, float *dk, float *dv);
// Bytes this rank sent in the ring for the sequence (0 without a ring).
double attention_cpu_ring_bytes(const AttnState *st);

// ---- the CUDA op ----
AttnState *attention_cuda_new(const AttentionConfig *cfg, int num_layers, int num_heads);
void attention_cuda_free(AttnState *st);
// As attention_cpu_set_ring.
bool attention_cuda_set_ring(AttnState *st, const struct Comm *cp, int inner);
// A new sequence: pos [tokens] its positions (host).
void attention_cuda_sequence(AttnState *st, const int64_t *pos, int64_t tokens);
// stats: NULL, or the layer's density (computed, causal) and recall
// (covered_mass, estimation_rows; sampled_mass, sampled_rows) added, as the
// CPU op counts them; waits for the stream (the counts are read back).
void attention_cuda_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const uint16_t *q,
                            const uint16_t *k, const uint16_t *v, const int64_t *pos, uint16_t *o, float *lse,
                            SparseStats *stats, struct CUstream_st *stream);
// Dense, on this GPU alone: q_pos [Tq] and k_pos [Tk] device memory.
void attention_cuda_cached(AttnState *st, const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                           const uint16_t *k, const uint16_t *v, const int64_t *k_pos, uint16_t *o, float *lse,
                           struct CUstream_st *stream);
void attention_cuda_backward(AttnState *st, int layer, const AttnShape *shape, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, const int64_t *pos, const uint16_t *o,
                             const float *lse, const uint16_t *dout, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                             struct CUstream_st *stream);
double attention_cuda_ring_bytes(const AttnState *st);

#ifdef __cplusplus
}
#endif

#endif
