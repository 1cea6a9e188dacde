// loader.h: the training data loader (docs/ARCHITECTURE.md, Data). It opens shards named by a
// glob or a comma-separated list of globs, holds out validation documents,
// packs documents into sequences of seq_len + 1 tokens, and hands each rank
// its slice of a sequence in the attention layout (attention/layout.h).
//
// Packing: the training documents of epoch e, in an order shuffled from
// (seed, e), are concatenated into one stream; sequence i of the epoch is
// stream tokens [i*N, i*N + N + 1) (N = seq_len): inputs are the first N,
// targets the next-token shift. Consecutive sequences share one token, a
// document cut at a sequence end continues in the next sequence, and no
// separator is inserted (shards from `mtrain tokenize` end every document
// with <|endoftext|>). The epoch's last (S - 1) mod N tokens are not used.
// Sequence g of the run is sequence g mod P of epoch g / P (P sequences per
// epoch), computed directly from prefix sums, so the cursor saved in a
// checkpoint is just the number of sequences consumed (c), and data-parallel
// rank d of D can read sequence c + d, the cursor then advancing by D.
//
// Padded packing (data.packing: padded) keeps documents whole at sequence
// starts instead: document k of the epoch's order, of length L, is the
// (L - 1 + N - 1) / N sequences j = 0, 1, ... holding its tokens
// [j*N, j*N + N + 1) (the last piece shorter), each from position 0; the
// positions after a document's last token are padding (token 0, target -1:
// no loss), so no sequence holds two documents and a document of at most
// N + 1 tokens is never cut. The epoch's sequences are the sum of those
// counts; a 1-token document has no (input, target) pair and no sequence.
//
// `data.train: synthetic` goes through the same interface: sequence g is
// synthetic_sequence(seed, g) and validation sequence i is index -1 - i.
#ifndef MTRAIN_LOADER_H
#define MTRAIN_LOADER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../attention/layout.h"
#include "shard.h"

#define LOADER_OPEN_SHARDS 8   // shards kept open at once (each holds frame buffers)

typedef struct {
    bool synthetic;            // the built-in generator (data/synthetic.h) instead of shards; train and val unused
    const char *train;         // glob[,glob...] of shard files
    bool val_held_out;         // validation documents held out of train's (always, for synthetic data)
    const char *val;           // else glob[,glob...] of validation shard files
    int64_t vocab_size;        // the model's: every shard's vocab_size must be <= it
    int64_t seq_len;           // N: input tokens per sequence
    int64_t val_sequences;     // sequences in the validation stream; 0 = no validation (nothing held out)
    bool padded;               // training sequences padded: one document piece each (above); validation stays packed
    uint64_t seed;             // document order and the held-out choice
    ShardTokenizer tokenizer;  // the model's tokenizer: a shard made by another one fails; unknown = not checked
    const char *tokenizer_source; // where the model's tokenizer comes from, for that message
} LoaderConfig;

// Documents in stream order: document k holds stream tokens
// [prefix[k], prefix[k+1]).
typedef struct {
    int64_t count;
    int64_t *docs;             // [count] global document ids
    int64_t *prefix;           // [count + 1]
    int64_t *seq_prefix;       // [count + 1] padded packing: document k is sequences [seq_prefix[k], seq_prefix[k+1])
} DocStream;

// A shard's metadata, kept while the file itself may be closed.
typedef struct {
    char *path;
    int64_t first_doc;         // global id of its document 0
    int64_t doc_count;
    int64_t *doc_starts;       // [doc_count + 1] as in the shard's document table
} ShardInfo;

typedef struct {
    LoaderConfig cfg;
    int shard_count;
    int train_shard_count;
    ShardInfo *shards;         // train_shard_count training shards, then data.val shards
    int64_t doc_count;         // global document ids are 0 .. doc_count-1
    uint64_t content_hash;     // of every shard's contents, in order (shard_content_hash); 0 for synthetic data
    int64_t *train_docs;       // non-empty training documents, in id order
    int64_t train_count;
    int64_t train_tokens;      // tokens in them (one epoch's stream)
    int64_t seqs_per_epoch;    // P
    DocStream epoch;           // the order of epoch `epoch_index` (-1: none yet)
    int64_t epoch_index;
    DocStream val;             // the validation stream, fixed
    // open shards, least recently used replaced first
    Shard open[LOADER_OPEN_SHARDS];
    int open_shard[LOADER_OPEN_SHARDS];  // index into shards, -1 = slot free
    uint64_t open_used[LOADER_OPEN_SHARDS];
    uint64_t use_clock;
} Loader;

// One packed sequence.
typedef struct {
    int64_t seq_len;           // N
    int32_t *tokens;           // [N + 1]: inputs tokens[0..N) (sequential packing: targets tokens[1..N])
    int32_t *targets;          // [N] next-token targets (data/packing.h: not always the next input; -1: padding)
    int64_t *doc_starts;       // positions in [0, N) where a document begins
    int64_t doc_start_count;   // (position 0 may continue a document: then it is not listed)
} PackedSequence;

// Rank `rank`'s part of a sequence, in its local (layout) order.
typedef struct {
    int64_t count;             // tokens on this rank
    int32_t *tokens;           // [count] inputs
    int32_t *targets;          // [count] next-token targets
    int64_t *positions;        // [count] global positions (RoPE, masks)
} RankSlice;

// Opens and validates every shard, picks the validation documents and checks
// that there is data for one training sequence and for the validation
// stream. Bad input ends the program with one line naming file and problem.
void loader_open(Loader *l, const LoaderConfig *cfg);
void loader_close(Loader *l);
// One line: shards, documents, tokens, sequences per epoch, validation.
void loader_print_summary(const Loader *l, FILE *out);

// Training sequence g (the cursor): sequence g mod P of epoch g / P.
void loader_train_sequence(Loader *l, int64_t g, PackedSequence *out);
// Training sequence g's targets that are not padding (-1): seq_len, or
// under padded packing of shards its document piece's (input, target) pairs.
int64_t loader_train_targets(Loader *l, int64_t g);
// Validation sequence i, 0 <= i < val_sequences.
void loader_val_sequence(Loader *l, int64_t i, PackedSequence *out);
// The document order of epoch e (valid until another epoch is asked for).
const DocStream *loader_epoch_order(Loader *l, int64_t e);
// Global document id -> its shard (index into l->shards) and its number there.
void loader_document(const Loader *l, int64_t id, int *shard, int64_t *doc);

void packed_sequence_alloc(PackedSequence *s, int64_t seq_len);
void packed_sequence_free(PackedSequence *s);

// Rank `rank` of `world`'s tokens, targets and global positions of seq in
// layout `kind` with blocks of block_size tokens.
void loader_rank_slice(const PackedSequence *seq, LayoutKind kind, int block_size, int world, int rank,
                       RankSlice *out);
void rank_slice_alloc(RankSlice *s, int64_t seq_len);
void rank_slice_free(RankSlice *s);

#endif
