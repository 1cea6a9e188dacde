// attention_cuda_op.h: the CUDA backend's attention op (attention_cuda_op.cu),
// the attention_* entries of the Backend table (model/backend.h states their
// contracts): dense, or sparse with the pattern estimated and selected on
// the GPU (over the ring on several ranks) on a sequence's first forward of
// a layer and reused by its recomputation and its backward (the index
// rebuilt from it on the GPU: one index at its bound, not one per layer),
// every call through the ring bound by attention_cuda_set_ring (a ring of
// one on one GPU: ring.c's schedule in one step with the one-GPU kernels).
//
// Same parameters in the same order as the CPU op (attention_cpu.h), on
// device memory, with the backend's stream last (every call is enqueued on
// it; the state's scratch is stream-ordered on it too):
//   q, o, dq, dout : [T, Hq, D] bf16 (uint16_t bits)   k, v, dk, dv : [T, Hkv, D] bf16
//   lse            : [Hq, T] fp32                       pos : [T] int64 (device)
// dq, dk, dv are ACCUMULATED (+=): the kernels' fp32 sums live in the state's
// scratch and are added into the bf16 outputs with one rounding. Dense and sparse attention run ring.c's
// schedules on device buffers (ring_cuda.h); over several ranks the sparse
// plan is estimated over the ring (AttnRingCuda.sparse_plan). Documents
// (shape->doc_starts, host) are masked by the dense and the sparse kernels,
// which read the op's device copy (AttnShape.doc_starts_device, copied
// through page-locked memory when the list changes: once per sequence); the
// sparse plan sees only same-document scores and its index holds each row's
// documents and their sinks, as the CPU op's. Supported as the kernels:
// head_dim 64 and 128, GQA; sparse: block_size 64 or 128, last_q <= 128,
// positions 0 .. T-1 on one GPU, whole blocks of B on each ring rank (only
// the sequence's last block may be short).
#ifndef MTRAIN_ATTENTION_CUDA_OP_H
#define MTRAIN_ATTENTION_CUDA_OP_H

#include <stdbool.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../sparse/sparse.h"
#include "../kernels/sparse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

// A cp ring's attention on device buffers (a ring of one on one GPU), bound
// by the caller (attention/ring/ring_cuda.h: ring_cuda_new), so that the op and
// the programs that link only the kernels need no MPI. ring is the ring's
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

AttnState *attention_cuda_new(const AttentionConfig *cfg, int num_layers, int num_heads);
void attention_cuda_free(AttnState *st);
// ring: the cp ring or a ring of one (the state owns and frees ring->ring;
// every sequence needs one). Returns whether it has more than one rank.
bool attention_cuda_set_ring(AttnState *st, const AttnRingCuda *ring);
// A new sequence: pos [tokens] its positions (host).
void attention_cuda_sequence(AttnState *st, const int64_t *pos, int64_t tokens);
// stats: NULL, or the layer's density (computed, causal) and recall
// (covered_mass, estimation_rows; sampled_mass, sampled_rows) added, as the
// CPU op counts them; waits
// for the stream (the counts are read back to the host).
void attention_cuda_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const uint16_t *q,
                            const uint16_t *k, const uint16_t *v, const int64_t *pos, uint16_t *o, float *lse,
                            SparseStats *stats, cudaStream_t stream);
// The Backend's attention_cached: dense, q_pos [Tq] and k_pos [Tk] device memory.
void attention_cuda_cached(AttnState *st, const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                           const uint16_t *k, const uint16_t *v, const int64_t *k_pos, uint16_t *o, float *lse,
                           cudaStream_t stream);
void attention_cuda_backward(AttnState *st, int layer, const AttnShape *shape, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, const int64_t *pos, const uint16_t *o,
                             const float *lse, const uint16_t *dout, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                             cudaStream_t stream);
// Bytes this rank sent in the ring for the sequence (0 without a ring).
double attention_cuda_ring_bytes(const AttnState *st);

#ifdef __cplusplus
}
#endif

#endif
