// ring_cpu.c: ring attention on host buffers (ring_cpu.h): ring.c's
// schedules over ring_host_memory, built per sequence (ring_init: one
// all-gather of the positions), with the dense CPU kernels, the sparse ones
// over a ring of one's whole index, or ring_sparse.c's over a layer's plan.
// Every kernel set counts its messages into the ring's traffic, and a sparse
// layer's gathered columns are added to the ring's column bytes after each
// call, so the ring's bytes are the sequence's, as ring_cuda.c's.
#include "ring_cpu.h"

#include <stdlib.h>

#include "../../dist/util.h"
#include "ring_plan.h"
#include "ring_sparse.h"

typedef struct {
    const Comm *cp;            // NULL: a ring of one (no MPI, ring.h)
    int inner;
    Ring ring;                 // this sequence's (ring_sequence)
    bool built;
    RingKernels kernels;       // the current call's (begin)
    RingNeed need;             // dense, ring_send selected: key blocks each rank's queries read
    RingDenseNeed dense_need;  // its bits, kept for the sequence
    RingTraffic traffic;       // K/V and dK/dV messages since the sequence began
    int64_t column_bytes;      // sparse: the gathered columns' K/V and dK/dV since the sequence began
} RingCpu;

// ---- the sparse kernels of a ring of one: the whole index (blocks and columns) in one pass ----

static void local_sparse_forward(void *ctx, const AttnShape *shape, const void *q, const int64_t *q_pos,
                                 const void *k, const void *v, const int64_t *k_pos, float *o, float *lse) {
    attn_sparse_forward_cpu(shape, ctx, q, q_pos, k, v, k_pos, o, lse);
}

static void local_sparse_backward(void *ctx, const AttnShape *shape, const void *q, const int64_t *q_pos,
                                  const void *k, const void *v, const int64_t *k_pos, const float *lse,
                                  const float *delta, const void *dout, float *dq, float *dk, float *dv) {
    attn_sparse_backward_cpu(shape, ctx, q, q_pos, k, v, k_pos, lse, delta, dout, dq, dk, dv);
}

// ---- the ring ----

static void check_built(const RingCpu *rc, const char *what) {
    CHECK(rc->built, "ring attention (CPU): %s before the sequence's positions (attention_sequence)", what);
}

static void forget_sequence(RingCpu *rc) {
    if (!rc->built) return;
    ring_free(&rc->ring);
    ring_dense_need_forget(&rc->dense_need);
    rc->built = false;
}

static void ring_free_cpu(void *ring) {
    RingCpu *rc = ring;
    forget_sequence(rc);
    ring_dense_need_free(&rc->dense_need);
    free(rc);
}

static void ring_sequence(void *ring, const int64_t *pos, int64_t tokens) {
    RingCpu *rc = ring;
    forget_sequence(rc);
    ring_init(&rc->ring, rc->cp, rc->inner, pos, tokens);
    rc->built = true;
    rc->traffic = (RingTraffic){0};
    rc->column_bytes = 0;
}

static void ring_sparse_plan_cpu(void *ring, const AttentionConfig *cfg, const AttnShape *shape, const float *q,
                                 const float *k, const int *fixed_vertical, const int *fixed_slash, void **layer,
                                 SparseStats *stats) {
    RingCpu *rc = ring;
    check_built(rc, "a sparse plan");
    if (!*layer) *layer = xcalloc(1, sizeof(RingSparse));
    ring_sparse_plan(&rc->ring, cfg, shape, q, k, fixed_vertical, fixed_slash, cfg->ring_send, *layer, stats);
}

static void ring_layer_free(void *layer) {
    ring_sparse_free(layer);
    free(layer);
}

// The call's kernels: the sparse ones of the plan's layer (several ranks),
// or over index (a ring of one: the whole index), or the dense ones, with
// ring_send selected over several ranks each hop carrying only the key
// blocks that the receiving and later ranks' queries read (with documents:
// blocks of their documents).
static const RingKernels *begin(RingCpu *rc, const AttnShape *shape, RingSend send, const SparseIndex *index,
                                RingSparse *layer) {
    check_built(rc, "a call");
    if (layer) {
        rc->kernels = ring_sparse_kernels(layer);
        rc->kernels.traffic = &rc->traffic;
        return &rc->kernels;
    }
    if (index) {
        rc->kernels = (RingKernels){.forward = local_sparse_forward, .backward = local_sparse_backward,
                                    .ctx = (void *)index};
        return &rc->kernels;
    }
    rc->kernels = ring_dense_cpu;
    rc->kernels.traffic = &rc->traffic;
    if (send != RING_SEND_SELECTED || !rc->cp) return &rc->kernels;
    rc->need = ring_dense_need_kept(&rc->dense_need, &rc->ring, shape);
    rc->kernels.need = &rc->need;
    return &rc->kernels;
}

// A sparse layer's column bytes of the call (ring_sparse.c counts them in
// the layer) move to the ring's count.
static void count_column_bytes(RingCpu *rc, RingSparse *layer) {
    if (!layer) return;
    rc->column_bytes += layer->column_bytes;
    layer->column_bytes = 0;
}

static void ring_forward(void *ring, const AttnShape *shape, RingSend send, const SparseIndex *index, void *layer,
                         const float *q, const float *k, const float *v, float *o, float *lse) {
    RingCpu *rc = ring;
    ring_attn_forward(&rc->ring, begin(rc, shape, send, index, layer), shape, q, k, v, o, lse);
    count_column_bytes(rc, layer);
}

static void ring_backward(void *ring, const AttnShape *shape, RingSend send, const SparseIndex *index, void *layer,
                          const float *q, const float *k, const float *v, const float *o, const float *lse,
                          const float *dout, float *dq, float *dk, float *dv) {
    RingCpu *rc = ring;
    ring_attn_backward(&rc->ring, begin(rc, shape, send, index, layer), shape, q, k, v, o, lse, dout, dq, dk, dv);
    count_column_bytes(rc, layer);
}

static double ring_bytes(const void *ring) {
    const RingCpu *rc = ring;
    return (double)(rc->traffic.kv_bytes + rc->traffic.dkv_bytes + rc->column_bytes);
}

AttnRingCpu ring_cpu_new(const Comm *cp, int inner) {
    RingCpu *rc = xcalloc(1, sizeof(RingCpu));
    rc->cp = cp && cp->size > 1 ? cp : NULL;
    rc->inner = rc->cp ? inner : 1;
    return (AttnRingCpu){.ring = rc, .cp_size = rc->cp ? rc->cp->size : 1, .sequence = ring_sequence,
                         .sparse_plan = ring_sparse_plan_cpu, .forward = ring_forward, .backward = ring_backward,
                         .layer_free = ring_layer_free, .bytes = ring_bytes, .free = ring_free_cpu};
}
