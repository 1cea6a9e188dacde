// attn_args.h: the arguments of one attention kernel call, grouped as the CPU
// tiles (flash_tiles.h, flash_cpu.c, sparse_flash_cpu.c) and the CUDA kernels
// (flash_cuda.cu, sparse_cuda.cu) both take them, by value or by pointer:
// the sizes, the token positions, the inputs, the forward's running result,
// the backward's statistics and gradients, and one call's view of a sparse
// index's rows. Plain C; internal to attention/. The inputs' element type
// differs (fp32 on the CPU, bf16 on the GPU), so they are declared per type
// with ATTN_INPUTS.
#ifndef MTRAIN_ATTN_ARGS_H
#define MTRAIN_ATTN_ARGS_H

#include <stdint.h>

#include "attention.h"

// The sizes of one call (AttnShape's, with the GQA group).
typedef struct {
    int64_t Tq, Tk;    // query tokens, key tokens
    int Hq, Hkv;       // q heads, kv heads
    int group;         // Hq / Hkv: q heads per kv head
    int D;             // head dim
    int B;             // tile (sparse: index block) size in tokens
    float scale;       // score scale, usually 1/sqrt(D)
} AttnDims;

// AttnShape's sizes; the caller has checked the shape (Hq a multiple of Hkv).
static inline AttnDims attn_dims(const AttnShape *s) {
    AttnDims d = {s->q_tokens, s->k_tokens, s->num_heads, s->num_kv_heads,
                  s->num_heads / s->num_kv_heads, s->head_dim, s->block_size, s->scale};
    return d;
}

// The global token positions of one call; the mask is by position (key j
// visible to query i iff k_pos[j] <= q_pos[i] and k_pos[j] >= q_first[i]).
typedef struct {
    const int64_t *q_pos;      // [Tq]
    const int64_t *k_pos;      // [Tk]
    const int64_t *q_first;    // [Tq] first key position each query may see (the start of its
                               // document); the CUDA kernels without documents: NULL
} AttnPos;

// The inputs of one call with elements of type T: q [Tq, Hq, D];
// k, v [Tk, Hkv, D]; dout [Tq, Hq, D] the gradient of the output (backward
// only; NULL in the forward).
#define ATTN_INPUTS(T) struct { const T *q, *k, *v, *dout; }

typedef ATTN_INPUTS(float) AttnInputs;

// The forward's running result, merged into chunk by chunk.
typedef struct {
    float *o;                  // [Tq, Hq, D] normalised output
    float *lse;                // [Hq, Tq] log-sum-exp of each row's scores (-inf: no key yet)
} AttnOut;

// The backward's statistics and the gradients it adds (+=) into.
typedef struct {
    const float *lse;          // [Hq, Tq] the forward's final log-sum-exp
    const float *delta;        // [Hq, Tq] sum_d o dout of each row
    float *dq;                 // [Tq, Hq, D]
    float *dk, *dv;            // [Tk, Hkv, D] each
} AttnGrads;

// One call's view of a SparseIndex (sparse.h): the index's rows, and the
// local key block of each global block and each row's columns in the call
// as local key tokens, col_key[col_start[r] .. col_start[r + 1]), ascending.
// Row r = h * num_q_blocks + i is q head h and local query block i.
typedef struct {
    int64_t rows;                  // Hq * num_q_blocks
    int64_t num_q_blocks;          // local query blocks
    const int64_t *block_start;    // [rows + 1] the index's
    const int64_t *blocks;         // [block_start[rows]] the index's global key blocks
    const int64_t *column_start;   // [rows + 1] the index's
    const int64_t *columns;        // [column_start[rows]] the index's global key positions
    int64_t *local_block;          // [ceil(N / B)] local key block of each global block (-1: not here)
    int64_t *col_start;            // [rows + 1]
    int64_t *col_key;              // [col_start[rows]]
} SparseView;

#endif
