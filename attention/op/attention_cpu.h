// attention_cpu.h: the CPU backend's attention op (the attention_* entries of
// the Backend table, model/backend.h, which states their contracts, bound by
// model/ops_cpu.c): the kernels of attention.h and sparse.h under the ring
// schedule of ring.h (a ring of one on one rank; over the cp ring, MPI, with
// ring_sparse.h's kernels for sparse). The same parameters in the same order
// as the CUDA op (attention_cuda_op.h), in fp32 host memory:
//   q, o, dq, dout : [T, Hq, D]   k, v, dk, dv : [T, Hkv, D]   lse, delta : [Hq, T]
// dq, dk, dv are ACCUMULATED (+=). pos and delta are not read: the ring
// keeps the sequence's positions (attention_cpu_sequence, which every
// sequence needs first) and its own delta. attention_cpu_set_ring: cp NULL
// or of one rank is a ring of one (the state starts with one).
#ifndef MTRAIN_ATTENTION_CPU_H
#define MTRAIN_ATTENTION_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "../attention.h"
#include "../sparse/sparse.h"

AttnState *attention_cpu_new(const AttentionConfig *cfg, int num_layers, int num_heads);
void attention_cpu_free(AttnState *st);
bool attention_cpu_set_ring(AttnState *st, const struct Comm *cp, int inner);
void attention_cpu_sequence(AttnState *st, const int64_t *pos, int64_t tokens);
void attention_cpu_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const float *q,
                           const float *k, const float *v, const int64_t *pos, float *o, float *lse, SparseStats *stats);
void attention_cpu_cached(AttnState *st, const AttnShape *shape, const float *q, const int64_t *q_pos, const float *k,
                          const float *v, const int64_t *k_pos, float *o, float *lse);
void attention_cpu_backward(AttnState *st, int layer, const AttnShape *shape, const float *q, const float *k,
                            const float *v, const int64_t *pos, const float *o, const float *lse, const float *dout,
                            float *delta, float *dq, float *dk, float *dv);
double attention_cpu_ring_bytes(const AttnState *st);

#endif
