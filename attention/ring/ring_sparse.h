// ring_sparse.h: dynamic sparse (vertical-slash) attention over the ring of
// cp ranks (docs/ARCHITECTURE.md, Attention). Per layer and forward pass:
//   ring_sparse_plan      distributed estimation: the last last_q queries are
//                         gathered to every rank; each rank scores them
//                         against its own keys; the partial lse and the
//                         partial vertical/slash sums are combined so that
//                         every rank holds bit-identical inputs and selects
//                         the identical pattern (no rank-0 funnel), the same
//                         lines as sparse_plan_local on the whole sequence;
//                         then the index of this rank's query blocks (with
//                         documents cut to its queries' documents, as on one
//                         rank) and which key blocks every rank uses.
//   ring_sparse_forward   the K/V rows at the index columns of every rank
//                         (vertical lines; with documents also each
//                         document's sink) are all-gathered to every rank
//                         and computed once, by the column pass right after
//                         the own chunk's step (SPARSE_COLUMNS); the ring
//                         steps compute only blocks (SPARSE_BLOCKS). ring_send selected
//                         sends each hop only the blocks still needed.
//   ring_sparse_backward  the same steps; the columns' dK/dV go home to their
//                         owners (one reduce-scatter) after the ring.
// The trainer calls plan, forward, backward per layer with the same Ring.
#ifndef MTRAIN_RING_SPARSE_H
#define MTRAIN_RING_SPARSE_H

#include <stdbool.h>
#include <stdint.h>

#include "ring.h"
#include "../sparse/sparse.h"

// The gathered columns of a layer: the union of every cp rank's index
// columns (vertical positions outside a row's blocks, and with documents
// each document's sink), where each lives, and its place in the messages
// that gather their K/V (all-gather) and send their dK/dV home
// (reduce-scatter): [W, max_owned] rows, owner r's columns at its block in
// slot order.
typedef struct {
    int64_t count;
    int64_t *positions;        // [count] ascending global positions
    int *owner;                // [count] cp rank holding each
    int64_t *local;            // [count] its local token there
    int64_t *slot;             // [count] its place among its owner's columns
    int64_t *owned;            // [W] columns each rank holds
    int64_t max_owned;         // most columns one rank holds
} RingColumns;

// One layer's sparse ring state (plan, then forward, then backward).
typedef struct {
    SparsePattern pattern;     // the layer's lines, identical on every cp rank
    const SparseIndex *index;  // this rank's query blocks (the plan's caller's; local block i = q_blocks[i])
    RingSend send;
    RingNeed need;             // key blocks each cp rank's index uses (need.need = need_bits)
    uint64_t *need_bits;       // [W, need.words]
    RingColumns columns;
    float *column_kv;          // [2, columns.count, Hkv, D] K then V rows (set by the forward)
    float *column_dkv;         // [2, columns.count, Hkv, D] backward scratch
    // Bytes this rank sent for the layer (ring_sparse_plan zeroes them).
    RingTraffic traffic;       // K/V and dK/dV ring messages
    int64_t column_bytes;      // gathered column K/V (forward) and their dK/dV home (backward)
} RingSparse;

// The plan of call (SparsePlanCall: q, k fp32; shape->q_tokens this rank's
// tokens T, block-aligned, at the ring's positions; fixed budgets as in
// sparse_plan_local), its hops' blocks for call->cfg->ring_send. *index
// (replaced) gets this rank's index, which rs reads from then on (the caller
// keeps it while rs is used). rs (zero-initialised before its first plan)
// is rebuilt; free it with ring_sparse_free. call->stats, when not NULL,
// gets the cp totals added (density, the estimation rows' recall and the
// recall sample's, sparse_recall_rows; the same numbers on every rank;
// equal to sparse_plan_local's up to rounding). Collective over ring->cp.
void ring_sparse_plan(const Ring *ring, const SparsePlanCall *call, SparseIndex *index, RingSparse *rs);

// The layer's kernels for ring_attn_forward / ring_attn_backward (ring.h):
// rs's index per ring step and the column pass on its columns (gathered
// before the forward, computed after the own step, their dK/dV sent home
// after the backward: columns_gather, _forward, _backward, _home), need with
// ring_send selected, rs's traffic. rs outlives them.
RingKernels ring_sparse_kernels(RingSparse *rs);

// ring_attn_forward / ring_attn_backward over ring_sparse_kernels(rs). The
// backward uses the column K/V gathered by the forward.
void ring_sparse_forward(const Ring *ring, RingSparse *rs, const AttnShape *shape, const RingTensors *t);
void ring_sparse_backward(const Ring *ring, RingSparse *rs, const AttnShape *shape, const RingTensors *t);

void ring_sparse_free(RingSparse *rs);

// Bit rows of the key blocks each index uses, for the W indexes of a ring
// (index[r] over rank r's query blocks): need [W, words] with words =
// ring_need_words (ring_plan.h). No MPI (used by ring_sparse_plan per rank,
// and by byte models over any W).
void ring_need_row(const SparseIndex *index, int64_t words, uint64_t *row);

// The gathered columns (RingColumns) of the ring's ranks' indexes (index:
// this rank's); c is freed first. Collective over ring->cp.
void ring_columns_plan(const Ring *ring, const SparseIndex *index, RingColumns *c);
// The same from mark [N] (1 at every column of any rank's index), without
// MPI (ring->cp only gives the size): for byte models of any ring.
void ring_columns_build(const Ring *ring, const char *mark, RingColumns *c);
// Bytes one rank sends to gather the columns' rows of kv elements of
// element_bytes each (K/V forward) or to send them home (dK/dV backward):
// W - 1 blocks of [2, max_owned, kv], as a ring all-gather or
// reduce-scatter moves them (max_owned: RingColumns' on the CPU, the
// owned bound on the GPU).
int64_t ring_columns_bytes(int64_t max_owned, int W, int64_t kv, size_t element_bytes);
// Bounds of the gathered columns that hold before any index is built (the
// GPU ring sizes its messages by them and reads nothing back): every
// column is a vertical line of some q head (num_heads lines of at most the
// pattern's vertical_capacity, sink lines included) or, with doc_count
// documents, in a document's sink, so *count = min(seq_len, num_heads *
// vertical_capacity + doc_count * sink) columns, *owned = min(*count,
// max_count) on one rank of at most max_count tokens.
void ring_columns_bound(int64_t seq_len, int num_heads, int64_t vertical_capacity, int64_t doc_count, int sink,
                        int64_t max_count, int64_t *count, int64_t *owned);
void ring_columns_free(RingColumns *c);

// The estimation's combines, collective over cp, the same bits on every rank:
// lse [n] (each rank's partial lse over its keys) merged by log-sum-exp in
// rank order; x [n] (partial sums) summed over the ranks, each element once
// on one rank (reduce-scatter, then all-gather).
void ring_sparse_combine_lse(const Comm *cp, float *lse, int64_t n);
void ring_sparse_combine_sums(const Comm *cp, float *x, int64_t n);

#endif
