// attention.h: the vocabulary every part of attention/ shares, at its
// bottom with layout.h and sparse_types.h: the attention config, one call's
// shape, the op's opaque state. Attention is flash-style and causal over one
// chunk of keys at a time, so that the same kernels serve a single rank (one
// chunk: all keys) and a ring (one chunk per ring step). Positions are
// global token positions, so any token layout over ranks works.
//
// Memory layout is token-major, as the projections produce it:
//   q, o, dq, do : [Tq, Hq, D]      k, v, dk, dv : [Tk, Hkv, D]
//   lse, delta   : [Hq, Tq] (fp32)  q_pos : [Tq]  k_pos : [Tk]
// GQA: kv head j serves q heads j*g .. j*g+g-1 with g = Hq / Hkv; K and V are
// never repeated in memory.
#ifndef MTRAIN_ATTENTION_H
#define MTRAIN_ATTENTION_H

#include <stdint.h>

#include "layout.h"

// attention.type
typedef enum { ATTN_DENSE, ATTN_SPARSE } AttnType;
// attention.ring: the ring schedule (ring.h)
typedef enum { RING_FLAT, RING_HIERARCHICAL } RingSchedule;

// The inner ring size of a schedule for a cp group of cp_size ranks with
// cp_inner ranks per inner ring (hierarchical).
static inline int ring_inner_size(RingSchedule schedule, int cp_size, int cp_inner) {
    return schedule == RING_HIERARCHICAL ? cp_inner : cp_size;
}
// attention.ring_send (sparse ring: ring_sparse.h)
typedef enum { RING_SEND_FULL, RING_SEND_SELECTED } RingSend;
// attention.kernels: what bounds the registry's choice of GPU kernels
// (kernels/attn_variants.h): auto (a sweep's row, else the cost model among
// the mma.sync kernels), sm80 (mma.sync only), sm90 (the Hopper kernels
// where a kind has them)
typedef enum { ATTN_KERNELS_AUTO, ATTN_KERNELS_SM80, ATTN_KERNELS_SM90 } AttnKernels;
// attention.budget: how many vertical / slash lines a head keeps (sparse.h)
typedef enum { BUDGET_TOPP, BUDGET_FIXED } SparseBudget;

// attention.budget_file: the counts of `vertical` / `slash` for every head,
// or a file of "layer head vertical slash" lines (budget_file_path).
typedef enum { BUDGET_FILE_NONE, BUDGET_FILE_PATH } BudgetFile;

// Bytes of attention.budget_file_path (the run config's string size).
#define ATTN_PATH_MAX 512

typedef struct {
    AttnType type;             // dense | sparse
    int block_size;            // tile size in tokens (queries and keys)
    RingSchedule ring;         // flat | hierarchical (ring.h)
    RingSend ring_send;        // full | selected (sparse ring: ring_sparse.h)
    // sparse (vertical-slash) pattern estimation (sparse.h)
    int last_q;                // estimation queries: the last last_q of the sequence
    double top_p;              // budget topp: fewest lines reaching this softmax mass
    int max_vertical;          // caps on the selected lines per head (topp)
    int max_slash;
    int sink;                  // first tokens always kept (vertical)
    int local;                 // nearest diagonals always kept (slash offsets 0..local-1)
    SparseBudget budget;       // topp | fixed
    int vertical;              // budget fixed: vertical lines per head
    int slash;                 // budget fixed: slash lines per head
    BudgetFile budget_file;    // none | a file (budget_file_path)
    char budget_file_path[ATTN_PATH_MAX]; // BUDGET_FILE_PATH: the file of "layer head vertical slash" lines
    LayoutKind layout;         // contiguous | zigzag | striped (attention/layout.h)
    AttnKernels kernels;       // auto | sm80 | sm90: the GPU kernels the registry may choose
} AttentionConfig;

// The model's attention operation (model/backend.h): one state per model,
// opaque to the model, defined by each backend (attention_cpu.c for the CPU).
typedef struct AttnState AttnState;
// The context-parallel group of a ring (dist/comm.h).
struct Comm;

typedef struct {
    int64_t q_tokens;          // Tq
    int64_t k_tokens;          // Tk
    int num_heads;             // Hq
    int num_kv_heads;          // Hkv
    int head_dim;              // D
    int block_size;            // tile size
    float scale;               // usually 1/sqrt(D)
    // data.doc_mask: the sorted global positions where a document begins
    // (doc_starts [doc_count]; the same list for every chunk and rank). A
    // query then sees only keys of its own document: those at or after the
    // last start <= its position. NULL: one document (causal mask only).
    const int64_t *doc_starts;
    int64_t doc_count;
    // The same list in device memory, for the CUDA kernels (attention_cuda.h,
    // sparse_cuda.h), set by the CUDA op once per sequence; NULL on the CPU.
    const int64_t *doc_starts_device;
} AttnShape;

#endif
