// sparse.h: dynamic sparse attention, vertical-slash (docs/ARCHITECTURE.md, Attention), CPU.
// Per layer and forward pass:
//   1. estimation — the last `last_q` queries of the sequence against every
//      key, one key chunk at a time (a ring feeds the chunk it holds):
//        sparse_estimate_lse     pass 1: row log-sum-exp merged over chunks
//        sparse_estimate_scores  pass 2: with the final lse, vertical (column)
//                                and slash (diagonal) sums of the softmax
//   2. sparse_select       — per q head, vertical key positions and slash offsets
//   3. sparse_index_build  — per q head and query block, the key blocks and
//                            the extra vertical columns
//   4. attn_sparse_forward_cpu / attn_sparse_backward_cpu — the kernels of
//      attention.h restricted to the index, over one key chunk at a time
//      (kernels/sparse_flash_cpu.h; the types: attention/sparse_types.h).
// GQA: the pattern is selected per q head (heads of one kv group may differ).
//
// Block-aligned token arrangement (what every layout of attention/layout.h
// produces): a rank's tokens are whole blocks of `block_size` consecutive
// global positions; local block i holds tokens [i*B, min((i+1)*B, T)) and
// only the sequence's last global block may be shorter than B. So the global
// block of local block i is pos[i*B] / B, for queries and for key chunks.
// Global positions index everything in the pattern and the index.
#ifndef MTRAIN_SPARSE_H
#define MTRAIN_SPARSE_H

#include <stdint.h>

#include "../attention.h"
#include "../kernels/sparse_flash_cpu.h"
#include "../sparse_types.h"

// Pass 1 of the estimation. shape: q_tokens = Lq estimation queries, k_tokens
// = this chunk's keys. qe [Lq, Hq, D] at qe_pos [Lq]; k [Tk, Hkv, D] at
// k_pos [Tk]. Merges the causal row log-sum-exp (scaled by shape->scale) of
// this chunk into lse_est [Hq, Lq], which starts at -inf.
void sparse_estimate_lse(const AttnShape *shape, const float *qe, const int64_t *qe_pos,
                         const float *k, const int64_t *k_pos, float *lse_est);

// Pass 2, with the final lse_est: P = exp(S - lse_est) over this chunk;
// vertical [Hq, N] += column sums of P at each key position, slash [Hq, N] +=
// sums of P along each offset q - k. Both start at zero and add over chunks.
void sparse_estimate_scores(const AttnShape *shape, const float *qe, const int64_t *qe_pos,
                            const float *k, const int64_t *k_pos, const float *lse_est,
                            int64_t seq_len, float *vertical, float *slash);

// Selection per q head from the summed scores (identical inputs give identical
// output on every rank). budget "topp": the fewest lines (separately vertical
// and slash) whose mass reaches cfg->top_p of the total, capped by
// max_vertical / max_slash; budget "fixed": the top fixed_vertical[h] /
// fixed_slash[h] lines. Ties go to the smaller position / offset. Always adds
// positions 0..sink-1 and offsets 0..local-1 (clipped to N). fixed_vertical
// and fixed_slash [Hq] may be NULL: then cfg->vertical / cfg->slash for all.
void sparse_select(const AttentionConfig *cfg, const float *vertical, const float *slash,
                   int num_heads, int64_t seq_len, const int *fixed_vertical,
                   const int *fixed_slash, SparsePattern *pattern);

// Index of the pattern for the given global query blocks (block size B): a
// slash at offset d selects, for query block qb, every key block that the
// keys q - d of the block's queries fall in (at most two); the diagonal block
// is always selected; vertical positions become columns where their block is
// not selected. Causality is left to the kernels (token-exact).
void sparse_index_build(const SparsePattern *pattern, int block_size, const int64_t *q_blocks,
                        int64_t num_q_blocks, SparseIndex *index);

// The index rows of the query blocks that hold the ascending positions
// rows_pos [n] (each block once), as sparse_index_build then
// sparse_index_documents with shape's documents: the rows the forward uses
// for those queries.
void sparse_index_for_rows(const SparsePattern *pattern, const AttnShape *shape, int sink, const int64_t *rows_pos,
                           int64_t n, SparseIndex *index);

// The recall sample of a sequence of seq_len tokens whose last last_q
// queries estimate the pattern: rows [SPARSE_RECALL_ROWS] gets the
// ascending positions of min(SPARSE_RECALL_ROWS, M) queries, M = seq_len -
// last_q, one drawn (fixed seed) from each of as many equal strata of
// [0, M), so that no estimation row is measured; when M < 1 (every query
// estimates) from all seq_len positions. Returns the count.
#define SPARSE_RECALL_ROWS 64
int64_t sparse_recall_rows(int64_t seq_len, int64_t last_q, int64_t *rows);

// Softmax mass inside the pattern of the rows qe [n, Hq, D] at ascending
// positions qe_pos [n] (rows_shape: q_tokens = n, k_tokens = this chunk's
// keys k [Tk, Hkv, D] at k_pos), from this chunk: the rows' final lse_est
// [Hq, n] and their index rows (sparse_index_for_rows), summed over heads
// and rows.
double sparse_pattern_mass(const SparsePattern *pattern, int sink, const AttnShape *rows_shape, const float *qe,
                           const int64_t *qe_pos, const float *k, const int64_t *k_pos, const float *lse_est);

// Estimation rows' softmax mass inside the pattern, from this chunk: adds to
// covered [Hq] (start at zero). est_index indexes the blocks of qe_pos.
void sparse_estimate_recall(const AttnShape *shape, const SparseIndex *est_index,
                            const float *qe, const int64_t *qe_pos, const float *k,
                            const int64_t *k_pos, const float *lse_est, double *covered);

// Documents (shape->doc_starts, attention.h): each row keeps only the blocks
// and columns that hold a key of one of its queries' documents, and gets the
// sink of every such document as columns: its first `sink` tokens (clipped to
// the document and to the row's last query; the sequence's first document,
// which may continue one cut at position 0, has positions 0 .. sink - 1),
// except where a kept block holds them. The slash lines (local among them)
// need nothing: the kernels mask their cross-document keys per element.
// Without documents the index is left as it is.
void sparse_index_documents(const AttnShape *shape, int sink, SparseIndex *index);

// stats->computed and stats->causal for the index's query blocks (q_pos as in
// the kernels, q_tokens of them), counting only keys of each query's document
// when doc_starts is not NULL (attention.h); adds to stats.
void sparse_index_count(const SparseIndex *index, const int64_t *q_pos, int64_t q_tokens,
                        const int64_t *doc_starts, int64_t doc_count, SparseStats *stats);

// Fixed budgets per layer and q head from `path` (attention.budget_file): text
// lines "layer head vertical slash", '#' starts a comment; a head not listed
// keeps the defaults. vertical, slash [num_layers * num_heads]. Bad lines fail
// with "path:line: what is wrong, what was expected".
void sparse_budget_load(const char *path, int num_layers, int num_heads, int default_vertical,
                        int default_slash, int *vertical, int *slash);
// The fixed budgets of every layer and q head under cfg, as the attention
// ops keep them: *vertical = *slash = NULL unless cfg is sparse with budget
// fixed; else two malloc'd [num_layers * num_heads] tables, from
// cfg->budget_file_path when set (sparse_budget_load), else cfg's vertical
// and slash everywhere.
void sparse_budget_tables(const AttentionConfig *cfg, int num_layers, int num_heads, int **vertical, int **slash);

void sparse_pattern_free(SparsePattern *pattern);
void sparse_index_free(SparseIndex *index);

#endif
