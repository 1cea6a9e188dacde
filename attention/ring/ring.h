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
// One rank is a ring of one (ring_init with no communicator): the schedule
// runs its one step on the rank's own K/V in place, with no transfer, no
// buffer and no MPI call.
//
// The per-step work is a table of kernels (RingKernels), so the dense
// kernels and the sparse ones (with the column pass of the sparse ring)
// run under the same schedule.
#ifndef MTRAIN_RING_H
#define MTRAIN_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "../../dist/comm.h"
#include "../attention.h"
#include "../attn_args.h"
#include "../layout.h"

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

// One ring step's kernel call, in the ring's memory (RingMemory): this
// rank's queries against one key chunk (shape->k_tokens its tokens), or
// against the gathered columns. q, k, v, dout are the memory's activations
// (fp32 on the host, bf16 on a GPU); out: the running output o and lse, fp32,
// merged into (forward); grads: the forward's final lse and delta, dq, dk,
// dv fp32, accumulated (backward). Same contracts as attn_dense_forward_cpu
// and attn_dense_backward_cpu.
typedef struct {
    const AttnShape *shape;
    const void *q, *k, *v, *dout;
    const int64_t *q_pos;      // [Tq]
    const int64_t *k_pos;      // [Tk]
    AttnOut out;
    AttnGrads grads;
} RingStep;

// A pass's kernels. forward, backward: one ring step. need: NULL sends whole
// chunks (ring_send full). traffic: NULL or counted. The column pass: all
// four NULL, or the sparse ring's (ring_sparse.h on the host, ring_cuda.c on
// a GPU), which computes the columns of every rank's index once per layer
// instead of at every step, and which ring_attn_forward / _backward run at
// the same points on both backends:
//   columns_gather    before a pass's first step, with this rank's k and v:
//                     the forward gathers the columns' K/V rows from their
//                     owners to every rank; the backward starts their dK/dV
//                     at zero
//   columns_forward,  right after the own chunk's step (the first; it
//   columns_backward  computes whenever the rank holds a token), on that
//                     step: its queries against the gathered columns
//   columns_home      after the backward's last step: the columns' dK/dV of
//                     every rank summed into their owners' dk and dv
struct Ring;
typedef struct {
    void (*forward)(void *ctx, const RingStep *step);
    void (*backward)(void *ctx, const RingStep *step);
    void (*columns_gather)(void *ctx, const struct Ring *ring, const AttnShape *shape, bool backward, const void *k,
                           const void *v);
    void (*columns_forward)(void *ctx, const RingStep *own);
    void (*columns_backward)(void *ctx, const RingStep *own);
    void (*columns_home)(void *ctx, const struct Ring *ring, const AttnShape *shape, float *dk, float *dv);
    void *ctx;
    const RingNeed *need;
    RingTraffic *traffic;
} RingKernels;

// One pass's tensors on this rank, in the ring's memory: q [T, Hq, D], k, v
// [T, Hkv, D] activations; forward: out written (o [T, Hq, D] and lse
// [Hq, T], fp32); backward: o (the forward's output) and dout [T, Hq, D]
// activations, grads.lse the forward's, grads.dq [T, Hq, D] and grads.dk,
// grads.dv [T, Hkv, D] fp32 accumulated (+=) over every rank's queries
// (grads.delta unused: the ring computes it). q_pos: NULL, the queries are
// this rank's tokens at the ring's positions; else their own positions
// [shape->q_tokens] in the ring's memory, for a forward on a ring of one
// over other keys (ring_init_keys: the decode's cached call).
typedef struct {
    const void *q, *k, *v, *o, *dout;
    const int64_t *q_pos;
    AttnOut out;
    AttnGrads grads;
} RingTensors;

// A message transfer in flight: an MPI request (host memory) or a device
// exchange's operation id (dist/comm_device.h); RING_REQUEST_NULL is done.
typedef struct {
    MPI_Request mpi;
    int64_t id;
} RingRequest;
#define RING_REQUEST_NULL ((RingRequest){MPI_REQUEST_NULL, -1})

// Where the ring's buffers live and how its messages move: the schedules of
// ring.c are the same for every memory. ring_host_memory (ring_cpu.h) is
// host memory and MPI; attention/ring/ring_cuda.c has the GPU's (NCCL or host-staged MPI). A K/V
// element has act_bytes bytes; dK/dV accumulators and o, lse are fp32.
// Rows: a message [2, n, row_bytes] holds rows of K then V (dK then dV).
typedef struct {
    size_t act_bytes;
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *buf);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);   // buffers do not overlap
    void (*zero)(void *ctx, void *dst, size_t bytes);
    // dst [2, n] = rows sel[0..n) of src [2, full]; dst may be src.
    void (*gather_rows)(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                        size_t row_bytes);
    // Rows sel[j] of dst [2, full] = row j of src [2, n]; dst may be src.
    void (*scatter_rows)(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                         size_t row_bytes);
    // dk, dv [*, kv] rows sel[j] += row j of in [2, n, kv] (fp32).
    void (*add_rows)(void *ctx, float *dk, float *dv, const float *in, const int64_t *sel, int64_t n, int64_t kv);
    void (*send)(void *ctx, const Comm *c, const void *buf, size_t bytes, int to, int tag, RingRequest *req);
    void (*recv)(void *ctx, const Comm *c, void *buf, size_t bytes, int from, int tag, RingRequest *req);
    // Until reqs [n] are done (for the kernels that follow: on a GPU the
    // compute stream waits, not the host).
    void (*wait)(void *ctx, const Comm *c, RingRequest *reqs, int n, const char *op);
    // o = 0, lse = -inf (attn_forward_init); delta from o and dout (attn_backward_delta).
    void (*forward_init)(void *ctx, const AttnShape *shape, float *o, float *lse);
    void (*backward_delta)(void *ctx, const AttnShape *shape, const void *o, const void *dout, float *delta);
    void *ctx;
} RingMemory;

typedef struct RingScratch RingScratch;

// The ring of one sequence: who holds which tokens. Built once per sequence
// (one all-gather of positions), used by every layer forward and backward.
typedef struct Ring {
    const Comm *cp;
    int inner, outer;          // schedule: cp->size = outer * inner
    int64_t *counts;           // [W] tokens of each cp rank
    int64_t *offsets;          // [W + 1] start of each rank's positions
    int64_t *positions;        // [N] every rank's global positions, in cp rank order
    int64_t max_count;         // largest count (buffer size)
    RingScratch *scratch;      // the transfers' buffers (ring.c), kept until ring_free
    const RingMemory *memory;  // where buffers live: ring_host_memory unless ring_set_memory
    const int64_t *kernel_positions;  // positions as the kernels read them (in memory)
} Ring;

// pos [tokens]: this rank's global positions (the same for queries and keys).
// inner must divide cp->size. Collective over cp. cp NULL: a ring of one
// rank (inner 1; no MPI).
void ring_init(Ring *ring, const Comm *cp, int inner, const int64_t *pos, int64_t tokens);
// The ring of a layout on paper, for planning and tests: every rank's
// positions of N tokens in layout's blocks of B over W ranks (layout.h),
// inner per inner ring, no communication; *comm (the caller's, kept while the
// ring is) gets W ranks and no communicator, this process as rank 0.
void ring_init_layout(Ring *ring, Comm *comm, LayoutKind layout, int64_t N, int B, int W, int inner);
// A ring of one over `tokens` keys at k_pos [tokens] in `memory` (read by
// the kernels only; the host need not know them), for a forward whose
// queries sit at their own positions (RingTensors.q_pos): the decode's
// cached call, new queries against the whole cache. No communication.
void ring_init_keys(Ring *ring, const RingMemory *memory, const int64_t *k_pos, int64_t tokens);
void ring_free(Ring *ring);
// The ring's buffers from now on in `memory`, and kernel_positions [N] there:
// `positions` in that memory (the caller keeps it until ring_free).
void ring_set_memory(Ring *ring, const RingMemory *memory, const int64_t *kernel_positions);

// shape: q_tokens = this rank's tokens (or t->q_pos's queries); k_tokens is
// ignored (set per chunk). The forward writes t->out from t->q, k, v; the backward adds into
// t->grads from t->q, k, v, o, dout and grads.lse (RingTensors).
void ring_attn_forward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape, const RingTensors *t);
void ring_attn_backward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape, const RingTensors *t);

#endif
