// packing.h: work-balanced packing of one optimizer step (data.packing:
// balanced; docs/ARCHITECTURE.md, Data). A step reads the `count` = dp ranks
// × micro-batches sequences its sequential packing would (cursor .. cursor +
// count - 1, see loader.h), joins their inputs and targets into one stream
// of count × N (input, target) pairs and cuts it at every document start
// (and at the stream's start): these pieces are the step's documents. They
// are dealt into `count` bins of exactly N tokens, bin i being the step's
// sequence i (micro-batch i / dp on dp rank i mod dp), longest first, each
// to the bin, among those with room for it whole, of the dp rank with the
// least attention work (Σ L(L+1)/2 over its pieces: the score elements of
// causal attention masked by document), and of that rank's bins the one with
// the least; a piece no bin has room for fills the bin with the most room
// and its rest is dealt on. Every (input, target) pair of the step is used
// once, so the step's loss is that of the sequential packing up to the
// contexts of the documents cut differently; the plan depends only on the
// cursor (seed and step), so a resumed run packs the same sequences.
#ifndef MTRAIN_PACKING_H
#define MTRAIN_PACKING_H

#include <stdint.h>

#include "loader.h"

// A run of the step stream placed in a bin: tokens [start, start + length).
typedef struct {
    int64_t start, length;
    int bin;
} PackPiece;

// The plan: documents beginning at doc_starts [count] (ascending, in
// [0, total); 0 is a start whether listed or not) of a stream of total =
// bins × capacity tokens, dealt into bins of capacity tokens, bin b on rank
// b mod ranks. pieces has room for count + 1 + bins entries (each split
// fills a bin); returns how many, ordered by bin, then by start.
int64_t pack_balanced(const int64_t *doc_starts, int64_t count, int bins, int ranks, int64_t capacity,
                      PackPiece *pieces);
// The document-masked causal attention work of each bin: work [bins] =
// Σ over its pieces of L(L+1)/2.
void pack_work(const PackPiece *pieces, int64_t count, int bins, double *work);

// One step under balanced packing.
typedef struct {
    int64_t seq_len;           // N
    int64_t count;             // sequences (bins) in the step: micro-batches × ranks
    int ranks;                 // dp ranks
    int32_t *inputs, *targets; // [count * N] the sequential sequences joined
    int64_t *doc_starts;       // [doc_capacity] where the joined stream's documents begin
    int64_t doc_count, doc_capacity;
    PackPiece *pieces;         // [doc_capacity + 1 + count] the plan
    int64_t piece_count;
} PackedStep;

void packed_step_alloc(PackedStep *s, int64_t seq_len, int micro_batches, int ranks);
void packed_step_free(PackedStep *s);
// Reads the training sequences cursor .. cursor + count - 1 and plans them.
void packed_step_read(Loader *l, int64_t cursor, PackedStep *s);
// Sequence `bin` of the step: its pieces in stream order, each a document.
void packed_step_sequence(const PackedStep *s, int bin, PackedSequence *out);

#endif
