// sparse_types.h: the vertical-slash pattern, its index and their
// statistics as data (sparse/sparse.h makes them; the kernels, the ring and
// the ops read them), at the bottom of attention/ beside attention.h, so
// that kernels/ needs nothing of sparse/; and a layer's plan call, the
// arguments every sparse plan takes from the op down. Plain C.
#ifndef MTRAIN_SPARSE_TYPES_H
#define MTRAIN_SPARSE_TYPES_H

#include <stdint.h>

#include "attention.h"

// The selected lines, per q head, in CSR form. Entries ascending, no repeats.
typedef struct {
    int num_heads;             // Hq
    int64_t seq_len;           // N
    int64_t *vertical_start;   // [Hq + 1]
    int64_t *vertical;         // key positions in [0, N)
    int64_t *slash_start;      // [Hq + 1]
    int64_t *slash;            // offsets q - k in [0, N)
} SparsePattern;

// The pattern turned into work, for a set of query blocks (a rank's). Row
// r = h * num_q_blocks + i is q head h and local query block i.
typedef struct {
    int num_heads;             // Hq
    int block_size;            // B
    int64_t seq_len;           // N
    int64_t num_q_blocks;      // local query blocks
    int64_t *q_blocks;         // [num_q_blocks] global block id of each local query block
    int64_t *block_start;      // [Hq * num_q_blocks + 1]
    int64_t *blocks;           // global key block ids, ascending, each <= the row's q block;
                               // the diagonal block (== q block) is always present
    int64_t *column_start;     // [Hq * num_q_blocks + 1]
    int64_t *columns;          // global key positions, ascending, none inside a selected
                               // block of the row, each <= the row's last query position
} SparseIndex;

// Work and quality of a pattern, summed over rows (and ranks) before dividing.
typedef struct {
    double computed;           // causal score elements inside the pattern (token-exact)
    double causal;             // causal score elements of dense attention
    double covered_mass;       // estimation rows: softmax mass inside the pattern
    double estimation_rows;    // estimation rows counted (Hq * last_q)
    double sampled_mass;       // the recall sample's rows (sparse_recall_rows): softmax mass
                               // inside the pattern, against dense attention
    double sampled_rows;       // sampled rows counted (Hq * the sample's rows)
} SparseStats;

// One layer's sparse plan call, as the op hands it down to the ring's plan
// (ring_cpu_sparse_plan, ring_cuda_sparse_plan) and that to the estimation
// (sparse_plan_local on one rank, ring_sparse_plan over several): this
// rank's T tokens (shape: q_tokens = k_tokens = T) with q [T, Hq, D] and k
// [T, Hkv, D] after RoPE in the ring's memory (fp32 on the host, bf16 bits
// on a GPU); the layer's fixed budgets [Hq] (NULL unless attention.budget is
// fixed); stats NULL, or the layer's density and recall added (cp totals).
typedef struct {
    const AttentionConfig *cfg;
    const AttnShape *shape;
    const void *q, *k;
    const int *fixed_vertical, *fixed_slash;
    SparseStats *stats;
} SparsePlanCall;

// Which part of the index a call computes.
typedef enum {
    SPARSE_ALL,                // blocks and columns that lie in the chunk (attn_sparse_forward_cpu)
    SPARSE_BLOCKS,             // only the selected blocks (ring steps when columns are gathered)
    SPARSE_COLUMNS,            // only the columns, against K/V rows at an arbitrary ascending
                               // list of key positions k_pos [Tk] (need not be block-aligned)
} SparsePart;

#endif
