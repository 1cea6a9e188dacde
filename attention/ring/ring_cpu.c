// ring_cpu.c: ring attention on host buffers (ring_cpu.h), as ring_cuda.c
// is on a GPU: the host memory (ring_host_memory: fp32 buffers, MPI) and the
// dense CPU kernels per step (ring_dense_cpu) for ring.c's schedules, and the
// host ring built per sequence (ring_init: one all-gather of the positions)
// with the dense kernels, the sparse ones over a ring of one's whole index,
// or ring_sparse.c's over a layer's plan.
// Every kernel set counts its messages into the ring's traffic, and a sparse
// layer's gathered columns are added to the ring's column bytes after each
// call, so the ring's bytes are the sequence's, as ring_cuda.c's.
#include "ring_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "../../dist/util.h"
#include "../kernels/flash_cpu.h"
#include "../sparse/sparse_plan.h"
#include "ring_plan.h"
#include "ring_sparse.h"

struct RingCpu {
    const Comm *cp;            // NULL: a ring of one (no MPI, ring.h)
    int inner;
    Ring ring;                 // this sequence's (ring_sequence)
    bool built;
    RingKernels kernels;       // the current call's (begin)
    RingNeed need;             // dense, ring_send selected: key blocks each rank's queries read
    RingDenseNeed dense_need;  // its bits, kept for the sequence
    RingTraffic traffic;       // K/V and dK/dV messages since the sequence began
    int64_t column_bytes;      // sparse: the gathered columns' K/V and dK/dV since the sequence began
};

// ---- the dense kernels per ring step ----

static void dense_forward(void *ctx, const RingStep *step) {
    (void)ctx;
    attn_dense_forward_cpu(step->shape, step->q, step->q_pos, step->k, step->v, step->k_pos, step->out.o,
                           step->out.lse);
}

static void dense_backward(void *ctx, const RingStep *step) {
    (void)ctx;
    const AttnGrads *g = &step->grads;
    attn_dense_backward_cpu(step->shape, step->q, step->q_pos, step->k, step->v, step->k_pos, g->lse, g->delta,
                            step->dout, g->dq, g->dk, g->dv);
}

const RingKernels ring_dense_cpu = {.forward = dense_forward, .backward = dense_backward};

// ---- host memory: MPI on host buffers ----


static void *host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return xmalloc(bytes);
}

static void host_release(void *ctx, void *buf) {
    (void)ctx;
    free(buf);
}

static void host_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
}

static void host_zero(void *ctx, void *dst, size_t bytes) {
    (void)ctx;
    memset(dst, 0, bytes);
}

// Rows only move up (sel[j] >= j), so going up from the first is safe in place.
static void host_gather_rows(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                             size_t row_bytes) {
    (void)ctx;
    for (int64_t part = 0; part < 2; part++)
        for (int64_t j = 0; j < n; j++)
            memmove((char *)dst + (size_t)(part * n + j) * row_bytes,
                    (const char *)src + (size_t)(part * full + sel[j]) * row_bytes, row_bytes);
}

// Rows only move down, so going down from the last is safe in place.
static void host_scatter_rows(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                              size_t row_bytes) {
    (void)ctx;
    for (int64_t part = 1; part >= 0; part--)
        for (int64_t j = n - 1; j >= 0; j--)
            memmove((char *)dst + (size_t)(part * full + sel[j]) * row_bytes,
                    (const char *)src + (size_t)(part * n + j) * row_bytes, row_bytes);
}

static void host_add_rows(void *ctx, float *dk, float *dv, const float *in, const int64_t *sel, int64_t n,
                          int64_t kv) {
    (void)ctx;
    for (int part = 0; part < 2; part++)
        for (int64_t j = 0; j < n; j++) {
            float *row = (part ? dv : dk) + sel[j] * kv;
            const float *from = in + (part * n + j) * kv;
            for (int64_t x = 0; x < kv; x++) row[x] += from[x];
        }
}

static void host_send(void *ctx, const Comm *c, const void *buf, size_t bytes, int to, int tag, RingRequest *req) {
    (void)ctx;
    comm_isend(c, buf, (int64_t)(bytes / sizeof(float)), DT_FLOAT, to, tag, &req->mpi);
}

static void host_recv(void *ctx, const Comm *c, void *buf, size_t bytes, int from, int tag, RingRequest *req) {
    (void)ctx;
    comm_irecv(c, buf, (int64_t)(bytes / sizeof(float)), DT_FLOAT, from, tag, &req->mpi);
}

#define RING_MAX_WAIT 4

static void host_wait(void *ctx, const Comm *c, RingRequest *reqs, int n, const char *op) {
    (void)ctx;
    MPI_Request mpi[RING_MAX_WAIT];
    CHECK(n <= RING_MAX_WAIT, "ring: %d requests in one wait (at most %d)", n, RING_MAX_WAIT);
    bool posted = false;
    for (int i = 0; i < n; i++) {
        mpi[i] = reqs[i].mpi;
        posted |= mpi[i] != MPI_REQUEST_NULL;
    }
    if (posted) comm_wait(c, mpi, n, op);   // a ring of one posts nothing and makes no MPI call
    for (int i = 0; i < n; i++) reqs[i] = RING_REQUEST_NULL;
}

static void host_forward_init(void *ctx, const AttnShape *shape, float *o, float *lse) {
    (void)ctx;
    attn_forward_init(shape, o, lse);
}

static void host_backward_delta(void *ctx, const AttnShape *shape, const void *o, const void *dout, float *delta) {
    (void)ctx;
    attn_backward_delta(shape, o, dout, delta);
}

const RingMemory ring_host_memory = {
    .act_bytes = sizeof(float), .alloc = host_alloc, .release = host_release, .copy = host_copy,
    .zero = host_zero, .gather_rows = host_gather_rows, .scatter_rows = host_scatter_rows,
    .add_rows = host_add_rows, .send = host_send, .recv = host_recv, .wait = host_wait,
    .forward_init = host_forward_init, .backward_delta = host_backward_delta,
};

// ---- the sparse kernels of a ring of one: the whole index (blocks and columns) in one pass ----

static void local_sparse_forward(void *ctx, const RingStep *step) {
    attn_sparse_forward_cpu(step->shape, ctx, step->q, step->q_pos, step->k, step->v, step->k_pos, step->out.o,
                            step->out.lse);
}

static void local_sparse_backward(void *ctx, const RingStep *step) {
    const AttnGrads *g = &step->grads;
    attn_sparse_backward_cpu(step->shape, ctx, step->q, step->q_pos, step->k, step->v, step->k_pos, g->lse, g->delta,
                             step->dout, g->dq, g->dk, g->dv);
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

void ring_cpu_free(RingCpu *rc) {
    if (!rc) return;
    forget_sequence(rc);
    ring_dense_need_free(&rc->dense_need);
    free(rc);
}

void ring_cpu_sequence(RingCpu *rc, const int64_t *pos, int64_t tokens) {
    forget_sequence(rc);
    ring_init(&rc->ring, rc->cp, rc->inner, pos, tokens);
    rc->built = true;
    rc->traffic = (RingTraffic){0};
    rc->column_bytes = 0;
}

void ring_cpu_sparse_plan(RingCpu *rc, const SparsePlanCall *call, SparseIndex *index, void **layer) {
    check_built(rc, "a sparse plan");
    if (!rc->cp) {   // one rank holds the sequence: its plan, no layer state
        sparse_plan_local(call, rc->ring.positions, index);
        return;
    }
    if (!*layer) *layer = xcalloc(1, sizeof(RingSparse));
    ring_sparse_plan(&rc->ring, call, index, *layer);
}

void ring_cpu_layer_free(void *layer) {
    if (!layer) return;
    ring_sparse_free(layer);
    free(layer);
}

// The call's kernels: the sparse ones of the plan's layer (several ranks),
// or over the index (a ring of one: the whole index), or the dense ones,
// with ring_send selected over several ranks each hop carrying only the key
// blocks that the receiving and later ranks' queries read (with documents:
// blocks of their documents).
static const RingKernels *begin(RingCpu *rc, const RingCallCpu *call) {
    check_built(rc, "a call");
    RingSparse *layer = call->layer;
    if (call->index && rc->cp) {
        CHECK(layer && layer->index == call->index, "sparse ring attention (CPU): a call without its layer's plan");
        rc->kernels = ring_sparse_kernels(layer);
        rc->kernels.traffic = &rc->traffic;
        return &rc->kernels;
    }
    if (call->index) {
        rc->kernels = (RingKernels){.forward = local_sparse_forward, .backward = local_sparse_backward,
                                    .ctx = (void *)call->index};
        return &rc->kernels;
    }
    rc->kernels = ring_dense_cpu;
    rc->kernels.traffic = &rc->traffic;
    if (call->send != RING_SEND_SELECTED || !rc->cp) return &rc->kernels;
    rc->need = ring_dense_need_kept(&rc->dense_need, &rc->ring, call->shape);
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

void ring_cpu_forward(RingCpu *rc, const RingCallCpu *call) {
    ring_attn_forward(&rc->ring, begin(rc, call), call->shape, &call->t);
    count_column_bytes(rc, call->layer);
}

void ring_cpu_backward(RingCpu *rc, const RingCallCpu *call) {
    ring_attn_backward(&rc->ring, begin(rc, call), call->shape, &call->t);
    count_column_bytes(rc, call->layer);
}

void ring_cpu_cached(const RingCallCpu *call, const int64_t *k_pos) {
    CHECK(!call->index, "ring attention (CPU): a cached call is dense");
    Ring one;
    ring_init_keys(&one, &ring_host_memory, k_pos, call->shape->k_tokens);
    ring_attn_forward(&one, &ring_dense_cpu, call->shape, &call->t);
    ring_free(&one);
}

double ring_cpu_bytes(const RingCpu *rc) {
    return (double)(rc->traffic.kv_bytes + rc->traffic.dkv_bytes + rc->column_bytes);
}

int ring_cpu_size(const RingCpu *rc) { return rc->cp ? rc->cp->size : 1; }

RingCpu *ring_cpu_new(const Comm *cp, int inner) {
    RingCpu *rc = xcalloc(1, sizeof(RingCpu));
    rc->cp = cp && cp->size > 1 ? cp : NULL;
    rc->inner = rc->cp ? inner : 1;
    return rc;
}
