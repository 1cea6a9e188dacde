// ring.h: ring attention over the context-parallel group (docs/ARCHITECTURE.md, Attention). Each
// cp rank holds its queries and its own chunk of keys/values (kv heads only,
// never repeated for GQA) at global positions from the token layout; the K/V
// chunks travel around the ring so that every rank sees every chunk once.
//   forward   per step, the next transfer is posted before the current chunk
//             is computed (double buffering); the kernel merges each chunk
//             into (o, lse) by log-sum-exp in fp32.
//   backward  K/V travel again; fp32 dK/dV accumulators travel with them and
//             arrive home at the end; dQ stays local in fp32.
// Schedules: cp = outer × inner ranks, cp rank = outer_rank * inner + inner_rank.
//   flat          inner = cp, outer = 1: one ring.
//   hierarchical  inner = parallel.cp_inner (one node): the chunk set of a
//                 node moves to the next node (outer transfer, posted before
//                 a whole inner loop) while the inner ring rotates chunks
//                 inside the node, one step per chunk.
// Ranks may hold different numbers of tokens (any N, any layout); each
// rank's positions ascend.
// Documents (AttnShape.doc_starts: global positions, the same list on every
// rank) travel nowhere: a rank derives a received chunk's documents from the
// chunk's positions. A step whose chunk holds no key that a local query may
// see (ring_chunk_visible: causal and document mask) calls no kernel; a
// message that carries no token (ring_send selected) is not posted.
//
// The per-step work is a pair of kernel callbacks, so the dense kernels of
// attention.h and the sparse ones of sparse.h (with a SparseIndex as ctx)
// run under the same schedule.
#ifndef MTRAIN_RING_H
#define MTRAIN_RING_H

#include <stdint.h>

#include "../dist/comm.h"
#include "attention.h"

// ring_send selected: which key blocks each cp rank's kernels use. A K/V
// transfer then carries only the blocks of the chunk that the receiver or a
// later holder of the same message uses (the set shrinks as the chunk
// travels); every rank computes the same sets, so no sizes are exchanged. The
// receiver's buffer keeps the chunk's full layout (unsent blocks are stale
// and never read by kernels that honour `need`). Backward dK/dV accumulators
// carry only the rows of blocks a holder on their way so far used (the rest
// are zero), packed by the sender and added at their rows by the receiver.
typedef struct {
    int block_size;            // B of the block ids below
    int64_t words;             // uint64 words per rank: ceil(num_blocks / 64)
    const uint64_t *need;      // [cp size, words]: bit b of row r = rank r uses key block b
} RingNeed;

// Bytes this rank sent in the ring (added to; zero it first).
typedef struct {
    int64_t kv_bytes;          // K/V messages (forward and backward)
    int64_t dkv_bytes;         // dK/dV accumulator messages (backward)
    int64_t kv_messages;       // K/V messages sent: mean bytes per step = kv_bytes / kv_messages
} RingTraffic;

// One ring step: queries against one key chunk. shape->k_tokens is the
// chunk's token count. Same contracts as attn_dense_forward_cpu and
// attn_dense_backward_cpu (merge into o/lse; accumulate dq, dk, dv).
// need: NULL sends whole chunks (ring_send full). traffic: NULL or counted.
typedef struct {
    void (*forward)(void *ctx, const AttnShape *shape, const float *q, const int64_t *q_pos, const float *k,
                    const float *v, const int64_t *k_pos, float *o, float *lse);
    void (*backward)(void *ctx, const AttnShape *shape, const float *q, const int64_t *q_pos, const float *k,
                     const float *v, const int64_t *k_pos, const float *lse, const float *delta,
                     const float *dout, float *dq, float *dk, float *dv);
    void *ctx;
    const RingNeed *need;
    RingTraffic *traffic;
} RingKernels;

// The dense CPU kernels of attention.h (ctx unused).
extern const RingKernels ring_dense_cpu;

typedef struct RingScratch RingScratch;

// The ring of one sequence: who holds which tokens. Built once per sequence
// (one all-gather of positions), used by every layer forward and backward.
typedef struct {
    const Comm *cp;
    int inner, outer;          // schedule: cp->size = outer * inner
    int64_t *counts;           // [W] tokens of each cp rank
    int64_t *offsets;          // [W + 1] start of each rank's positions
    int64_t *positions;        // [N] every rank's global positions, in cp rank order
    int64_t max_count;         // largest count (buffer size)
    RingScratch *scratch;      // the transfers' buffers (ring.c), kept until ring_free
} Ring;

// The inner ring size of a schedule for a cp group of cp_size ranks with
// cp_inner ranks per inner ring (hierarchical).
int ring_inner_size(RingSchedule schedule, int cp_size, int cp_inner);

// pos [tokens]: this rank's global positions (the same for queries and keys).
// inner must divide cp->size. Collective over cp.
void ring_init(Ring *ring, const Comm *cp, int inner, const int64_t *pos, int64_t tokens);
void ring_free(Ring *ring);

// shape: q_tokens = this rank's tokens; k_tokens is ignored (set per chunk).
// q, o [T, Hq, D]; k, v [T, Hkv, D]; lse [Hq, T] fp32. Writes o and lse.
void ring_attn_forward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape,
                       const float *q, const float *k, const float *v, float *o, float *lse);

// From the forward's o, lse and the upstream dout [T, Hq, D]: accumulates (+=)
// dq [T, Hq, D] and this rank's dk, dv [T, Hkv, D] (from every rank's queries).
void ring_attn_backward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape,
                        const float *q, const float *k, const float *v, const float *o,
                        const float *lse, const float *dout, float *dq, float *dk, float *dv);

#endif
