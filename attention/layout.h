// layout.h: the rules every part of attention/ shares, below all of them:
// how a sequence of N tokens is spread over the W ranks of a
// context-parallel group (docs/ARCHITECTURE.md, Attention), and which keys a
// query's document lets it see (attn_doc_first). Layouts work at block
// granularity: the sequence is cut into ceil(N / B) blocks of B tokens (the
// last may be shorter) and each rank holds whole blocks, in ascending global
// order:
//   contiguous  rank r holds one run of consecutive blocks (sizes differ by <= 1)
//   zigzag      the blocks are cut into 2W runs as equal as possible; rank r
//               holds runs r and 2W-1-r (balanced for dense causal attention)
//   striped     block b goes to rank b mod W (balanced for sparse patterns)
// The loader hands each rank its tokens in this order and attention uses the
// same global positions (RoPE, masks), so no tokens are reshuffled per layer.
// Every rank's tokens are block-aligned as attention/sparse/sparse.h requires.
#ifndef MTRAIN_LAYOUT_H
#define MTRAIN_LAYOUT_H

#include <stdint.h>

typedef enum { LAYOUT_CONTIGUOUS, LAYOUT_ZIGZAG, LAYOUT_STRIPED } LayoutKind;

// "contiguous" | "zigzag" | "striped" -> kind; -1 for anything else.
int layout_parse(const char *name);
const char *layout_name(LayoutKind kind);

// The global blocks rank `rank` of `world` holds, ascending, into blocks
// (room for ceil(N / B) entries; NULL only counts). Returns how many.
int64_t layout_rank_blocks(LayoutKind kind, int64_t seq_len, int block_size, int world, int rank,
                           int64_t *blocks);

// The global token positions rank `rank` holds, in its local order, into pos
// (room for seq_len entries; NULL only counts). Returns how many tokens.
int64_t layout_rank_positions(LayoutKind kind, int64_t seq_len, int block_size, int world,
                              int rank, int64_t *pos);

// The first key position a query at position p may see: the last of the
// sorted doc_starts [doc_count] <= p; INT64_MIN when there is none (no
// documents, or p before the first start).
int64_t attn_doc_first(const int64_t *doc_starts, int64_t doc_count, int64_t p);

#endif
