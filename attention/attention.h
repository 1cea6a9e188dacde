// attention.h: the attention module's interface. Flash-style causal attention
// over one chunk of keys at a time, so that the same kernels serve a single
// rank (one chunk: all keys) and a ring (one chunk per ring step). Positions
// are global token positions, so any token layout over ranks works.
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
// attention.ring_send (sparse ring: ring_sparse.h)
typedef enum { RING_SEND_FULL, RING_SEND_SELECTED } RingSend;
// attention.kernels: the dense forward on a GPU (kernels/flash_sm90.h): auto
// (the mma.sync kernels until measurements choose), sm80 (mma.sync), sm90
// (the Hopper kernels)
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
    AttnKernels kernels;       // auto | sm80 | sm90: the GPU's dense forward
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

// Start a running result: o = 0, lse = -inf.
void attn_forward_init(const AttnShape *shape, float *o, float *lse);

// The first key position a query at position p may see: the last of the
// sorted doc_starts [doc_count] <= p; INT64_MIN when there is none (no
// documents, or p before the first start).
int64_t attn_doc_first(const int64_t *doc_starts, int64_t doc_count, int64_t p);

// Causal attention of q against one key chunk (mask: k_pos <= q_pos, and
// k_pos >= attn_doc_first(q_pos) with documents), merged
// into the running (o, lse) by log-sum-exp in fp32. o stays normalised after
// every call; rows that see no key in this chunk are left unchanged.
void attn_dense_forward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                            const float *k, const float *v, const int64_t *k_pos,
                            float *o, float *lse);

// delta[h, t] = sum_d do[t, h, d] * o[t, h, d] (FlashAttention-2's D).
void attn_backward_delta(const AttnShape *shape, const float *o, const float *dout, float *delta);

// Gradients of the final attention output with respect to q and this key
// chunk, recomputing P = exp(S - lse) from the final lse. Accumulates (+=)
// into dq [Tq, Hq, D], dk and dv [Tk, Hkv, D].
void attn_dense_backward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                             const float *k, const float *v, const int64_t *k_pos,
                             const float *lse, const float *delta, const float *dout,
                             float *dq, float *dk, float *dv);

#endif
