// attention_cpu.c: the CPU backend's attention op (attention_api.h). One
// path for every case, as attention_cuda_op.cu's: the ring that
// attention_cpu_set_ring makes (ring_cpu_new: a ring of one on one rank)
// runs ring.c's schedule over the dense kernels or the layer's sparse index
// (the decode's cached call over a ring of one of its keys), and makes the
// sparse plan: this rank's own on a ring of one
// (sparse_plan_local), the ring's over several ranks (ring_sparse.h). The state keeps what lives
// between calls: the attention config and its fixed budgets, each layer's
// sparse plan from the sequence's first forward (reused by backward and by
// a recomputation): this rank's index, and over several ranks the ring's
// state of the layer.
#include "../attention_api.h"

#include <stdlib.h>

#include "../../dist/util.h"
#include "../ring/ring_cpu.h"
#include "../sparse/sparse.h"

struct AttnState {
    AttentionConfig cfg;
    int num_layers, num_heads;
    int *budget_vertical;      // [num_layers * Hq] budget fixed, else NULL
    int *budget_slash;         // [num_layers * Hq]
    SparseIndex *sparse_index; // [num_layers] sparse: this rank's index of the layer
    bool *planned;             // [num_layers] the layer's pattern is this sequence's
    void **ring_layer;         // [num_layers] sparse on a ring: the plan's state of the layer (the ring's)
    RingCpu *ring;             // the cp ring (NULL before attention_cpu_set_ring)
};

AttnState *attention_cpu_new(const AttentionConfig *cfg, int num_layers, int num_heads) {
    AttnState *st = xcalloc(1, sizeof(AttnState));
    st->cfg = *cfg;
    st->num_layers = num_layers;
    st->num_heads = num_heads;
    st->sparse_index = xcalloc((size_t)num_layers, sizeof(SparseIndex));
    st->planned = xcalloc((size_t)num_layers, sizeof(bool));
    st->ring_layer = xcalloc((size_t)num_layers, sizeof(void *));
    sparse_budget_tables(cfg, num_layers, num_heads, &st->budget_vertical, &st->budget_slash);
    return st;
}

// The ring's layer states (before the ring goes).
static void forget_ring_layers(AttnState *st) {
    for (int l = 0; l < st->num_layers; l++) {
        ring_cpu_layer_free(st->ring_layer[l]);
        st->ring_layer[l] = NULL;
    }
}

void attention_cpu_free(AttnState *st) {
    if (!st) return;
    for (int l = 0; l < st->num_layers; l++) sparse_index_free(&st->sparse_index[l]);
    forget_ring_layers(st);
    ring_cpu_free(st->ring);
    free(st->sparse_index);
    free(st->planned);
    free(st->ring_layer);
    free(st->budget_vertical);
    free(st->budget_slash);
    free(st);
}

bool attention_cpu_set_ring(AttnState *st, const struct Comm *cp, int inner) {
    forget_ring_layers(st);
    ring_cpu_free(st->ring);
    st->ring = ring_cpu_new(cp, inner);
    return ring_cpu_size(st->ring) > 1;
}

void attention_cpu_sequence(AttnState *st, const int64_t *pos, int64_t tokens) {
    CHECK(st->ring, "attention (CPU): a sequence before the ring (attention_cpu_set_ring)");
    for (int l = 0; l < st->num_layers; l++) st->planned[l] = false;
    ring_cpu_sequence(st->ring, pos, tokens);
}

// Layer l's fixed budgets [Hq], or NULL (budget topp).
static const int *layer_budget(const AttnState *st, const int *budget, int l) {
    return budget ? budget + (size_t)l * st->num_heads : NULL;
}

// Layer l's pattern from q, k [T, H, D], estimated by the ring (on this
// rank alone on a ring of one; collective); stats: NULL or its density and
// recall added.
static void plan_layer_pattern(AttnState *st, int l, const AttnShape *shape, const float *q, const float *k,
                               SparseStats *stats) {
    const SparsePlanCall call = {.cfg = &st->cfg, .shape = shape, .q = q, .k = k,
                                 .fixed_vertical = layer_budget(st, st->budget_vertical, l),
                                 .fixed_slash = layer_budget(st, st->budget_slash, l), .stats = stats};
    ring_cpu_sparse_plan(st->ring, &call, &st->sparse_index[l], &st->ring_layer[l]);
    st->planned[l] = true;
}

// Layer l's call through the ring: sparse, its index (planned by the
// sequence's first forward) and over several ranks the ring's layer state;
// dense: neither.
static RingCallCpu layer_call(const AttnState *st, int l, const AttnShape *shape) {
    RingCallCpu call = {.shape = shape, .send = st->cfg.ring_send};
    if (st->cfg.type != ATTN_SPARSE) return call;
    CHECK(st->planned[l], "attention (CPU): layer %d used before its sequence's plan forward", l);
    call.index = &st->sparse_index[l];
    call.layer = st->ring_layer[l];
    return call;
}

void attention_cpu_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const float *q,
                           const float *k, const float *v, const int64_t *pos, float *o, float *lse,
                           SparseStats *stats) {
    (void)pos;   // the ring's positions
    if (plan && st->cfg.type == ATTN_SPARSE) plan_layer_pattern(st, layer, shape, q, k, stats);
    RingCallCpu call = layer_call(st, layer, shape);
    call.t = (RingTensors){.q = q, .k = k, .v = v, .out = {.o = o, .lse = lse}};
    ring_cpu_forward(st->ring, &call);
}

// Through a ring of one over the call's keys (ring_cpu_cached), whatever
// the op's ring: the cache is this rank's alone.
void attention_cpu_cached(AttnState *st, const AttnShape *shape, const float *q, const int64_t *q_pos,
                          const float *k, const float *v, const int64_t *k_pos, float *o, float *lse) {
    (void)st;
    const RingCallCpu call = {.shape = shape,
                              .t = {.q = q, .k = k, .v = v, .q_pos = q_pos, .out = {.o = o, .lse = lse}}};
    ring_cpu_cached(&call, k_pos);
}

void attention_cpu_backward(AttnState *st, int layer, const AttnShape *shape, const float *q, const float *k,
                            const float *v, const int64_t *pos, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv) {
    (void)pos;   // the ring's positions
    RingCallCpu call = layer_call(st, layer, shape);
    call.t = (RingTensors){.q = q, .k = k, .v = v, .o = o, .dout = dout,
                           .grads = {.lse = lse, .dq = dq, .dk = dk, .dv = dv}};
    ring_cpu_backward(st->ring, &call);
}

double attention_cpu_ring_bytes(const AttnState *st) {
    return st->ring ? ring_cpu_bytes(st->ring) : 0;
}
