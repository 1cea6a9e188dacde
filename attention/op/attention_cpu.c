// attention_cpu.c: the CPU backend's attention op (attention_cpu.h). One
// path for every case: the op picks the layer's kernels and runs the ring
// schedule (ring.h) over them. One rank is a ring of one (one step on the
// rank's own K/V, no transfer); dense and sparse differ only in the kernels
// the ring calls: the dense ones, or the sparse ones over the layer's
// pattern (on a ring of one the whole local index, over several ranks the
// ring's gathered columns, ring_sparse.h). The state keeps what lives
// between calls: the attention config and its fixed budgets, each layer's
// sparse pattern from the sequence's first forward (reused by backward and
// by a recomputation), and the sequence's ring (and for dense attention on
// several ranks, what ring_send selected sends and the bytes). Its tensors
// are fp32 (model/ops_cpu.c casts the table's Act arguments).
#include "attention_cpu.h"

#include <stdlib.h>

#include "../../dist/util.h"
#include "../ring/ring_plan.h"
#include "../ring/ring_sparse.h"
#include "../sparse/sparse_plan.h"

struct AttnState {
    AttentionConfig cfg;
    int num_layers, num_heads;
    int *budget_vertical;      // [num_layers * Hq] budget fixed, else NULL
    int *budget_slash;         // [num_layers * Hq]
    const Comm *cp;            // the ring's group; NULL = a ring of one rank
    int inner;                 // inner ring size of the schedule
    Ring ring;                 // this sequence's ring (attention_cpu_sequence)
    bool ring_built;
    SparseIndex *sparse_index; // [num_layers] sparse on one rank: the layer's pattern
    RingSparse *ring_sparse;   // [num_layers] sparse on several ranks: the layer's pattern on the ring
    RingKernels kernels;       // the current call's (layer_kernels)
    RingNeed dense_need;       // dense, ring_send selected: key blocks each rank's queries read
    uint64_t *dense_need_bits; // [cp size, dense_need.words]
    RingTraffic dense_traffic; // bytes the dense ring sent for this sequence
};

AttnState *attention_cpu_new(const AttentionConfig *cfg, int num_layers, int num_heads) {
    AttnState *st = xcalloc(1, sizeof(AttnState));
    st->cfg = *cfg;
    st->num_layers = num_layers;
    st->num_heads = num_heads;
    st->sparse_index = xcalloc((size_t)num_layers, sizeof(SparseIndex));
    st->ring_sparse = xcalloc((size_t)num_layers, sizeof(RingSparse));
    sparse_budget_tables(cfg, num_layers, num_heads, &st->budget_vertical, &st->budget_slash);
    return st;
}

void attention_cpu_free(AttnState *st) {
    if (!st) return;
    for (int l = 0; l < st->num_layers; l++) {
        sparse_index_free(&st->sparse_index[l]);
        ring_sparse_free(&st->ring_sparse[l]);
    }
    free(st->sparse_index);
    free(st->ring_sparse);
    if (st->ring_built) ring_free(&st->ring);
    free(st->budget_vertical);
    free(st->budget_slash);
    free(st->dense_need_bits);
    free(st);
}

bool attention_cpu_set_ring(AttnState *st, const Comm *cp, int inner) {
    if (st->ring_built) ring_free(&st->ring);
    st->ring_built = false;
    st->cp = cp && cp->size > 1 ? cp : NULL;
    st->inner = st->cp ? inner : 1;
    return st->cp != NULL;
}

void attention_cpu_sequence(AttnState *st, const int64_t *pos, int64_t tokens) {
    if (st->ring_built) ring_free(&st->ring);
    ring_init(&st->ring, st->cp, st->inner, pos, tokens);
    st->ring_built = true;
    st->dense_traffic = (RingTraffic){0};
}

// The dense kernels for shape: with ring_send selected on several ranks,
// each hop carries only the key blocks that the receiving and later ranks'
// queries read (with documents: blocks of their documents).
static void dense_kernels(AttnState *st, const AttnShape *shape) {
    st->kernels = ring_dense_cpu;
    st->kernels.traffic = &st->dense_traffic;
    if (st->cfg.ring_send != RING_SEND_SELECTED || !st->cp) return;
    const int64_t words = ring_need_words(st->ring.offsets[st->cp->size], shape->block_size);
    st->dense_need_bits = xrealloc(st->dense_need_bits, (size_t)(st->cp->size * words) * sizeof(uint64_t));
    ring_dense_need(&st->ring, shape, words, st->dense_need_bits);
    st->dense_need = (RingNeed){.block_size = shape->block_size, .words = words, .need = st->dense_need_bits};
    st->kernels.need = &st->dense_need;
}

// The sparse kernels over one rank's whole index (ctx): blocks and columns in one pass.
static void local_sparse_forward(void *ctx, const AttnShape *shape, const void *q, const int64_t *q_pos,
                                 const void *k, const void *v, const int64_t *k_pos, float *o, float *lse) {
    attn_sparse_forward_cpu(shape, ctx, q, q_pos, k, v, k_pos, o, lse);
}

static void local_sparse_backward(void *ctx, const AttnShape *shape, const void *q, const int64_t *q_pos,
                                  const void *k, const void *v, const int64_t *k_pos, const float *lse,
                                  const float *delta, const void *dout, float *dq, float *dk, float *dv) {
    attn_sparse_backward_cpu(shape, ctx, q, q_pos, k, v, k_pos, lse, delta, dout, dq, dk, dv);
}

// Layer l's fixed budgets [Hq], or NULL (budget topp).
static const int *layer_budget(const AttnState *st, const int *budget, int l) {
    return budget ? budget + (size_t)l * st->num_heads : NULL;
}

// The kernels of the layer's call, in st->kernels: dense, or sparse over
// the layer's pattern, estimated first when plan (q, k [T, H, D] at this
// rank's positions; stats: NULL or its density and recall added).
static const RingKernels *layer_kernels(AttnState *st, int layer, bool plan, const AttnShape *shape,
                                        const float *q, const float *k, SparseStats *stats) {
    CHECK(st->ring_built, "attention: layer %d before the sequence's positions (attention_sequence)", layer);
    if (st->cfg.type != ATTN_SPARSE) {
        dense_kernels(st, shape);
        return &st->kernels;
    }
    const int *fixed_vertical = layer_budget(st, st->budget_vertical, layer);
    const int *fixed_slash = layer_budget(st, st->budget_slash, layer);
    if (st->cp) {
        if (plan)
            ring_sparse_plan(&st->ring, &st->cfg, shape, q, k, fixed_vertical, fixed_slash, st->cfg.ring_send,
                             &st->ring_sparse[layer], stats);
        st->kernels = ring_sparse_kernels(&st->ring_sparse[layer]);
    } else {
        if (plan)
            sparse_plan_local(&st->cfg, shape, q, k, st->ring.positions, fixed_vertical, fixed_slash,
                              &st->sparse_index[layer], stats);
        st->kernels = (RingKernels){.forward = local_sparse_forward, .backward = local_sparse_backward,
                                    .ctx = &st->sparse_index[layer]};
    }
    return &st->kernels;
}

void attention_cpu_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const float *q,
                           const float *k, const float *v, const int64_t *pos, float *o, float *lse,
                           SparseStats *stats) {
    (void)pos;   // the ring's positions (attention_cpu_sequence)
    ring_attn_forward(&st->ring, layer_kernels(st, layer, plan, shape, q, k, stats), shape, q, k, v, o, lse);
}

void attention_cpu_cached(AttnState *st, const AttnShape *shape, const float *q, const int64_t *q_pos,
                          const float *k, const float *v, const int64_t *k_pos, float *o, float *lse) {
    (void)st;
    attn_forward_init(shape, o, lse);
    attn_dense_forward_cpu(shape, q, q_pos, k, v, k_pos, o, lse);
}

void attention_cpu_backward(AttnState *st, int layer, const AttnShape *shape, const float *q, const float *k,
                            const float *v, const int64_t *pos, const float *o, const float *lse,
                            const float *dout, float *delta, float *dq, float *dk, float *dv) {
    (void)pos, (void)delta;   // the ring's positions and its own delta
    ring_attn_backward(&st->ring, layer_kernels(st, layer, false, shape, q, k, NULL), shape, q, k, v, o, lse, dout,
                       dq, dk, dv);
}

double attention_cpu_ring_bytes(const AttnState *st) {
    if (!st->cp) return 0;
    double bytes = (double)(st->dense_traffic.kv_bytes + st->dense_traffic.dkv_bytes);
    for (int l = 0; l < st->num_layers; l++) {
        const RingSparse *rs = &st->ring_sparse[l];
        bytes += (double)(rs->traffic.kv_bytes + rs->traffic.dkv_bytes + rs->column_bytes);
    }
    return bytes;
}
