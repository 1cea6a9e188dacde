// ring_cuda.c: ring attention on device buffers (ring_cuda.h): a RingMemory
// on the GPU for ring.c's schedules. Buffers are cudaMalloc'ed, copies, row
// moves and the forward init / backward delta are enqueued on the op's
// stream, messages go through a DeviceExchange (dist/comm_device.h): with
// NCCL the host never waits inside a layer's ring. Token lists for row
// moves are uploaded once and found again (TokenLists). The ring's buffers
// and positions outlive the sequence: a later sequence reuses them, so a
// training step allocates nothing and waits for nothing once the first
// step has run.
// Sparse, as ring_sparse.c: the ring steps compute blocks only, and the
// column pass (ring.h, run by ring.c at the same points on both backends)
// gathers the columns of every rank's index to every rank before the first
// step (one device all-gather of their K/V rows), computes them after the
// own chunk's step and sends their dK/dV home after the last (one device
// reduce-scatter). The plan stays on the device (ring_columns_cuda.h): the
// columns are held at bounds the host knows (ring_columns_bound), their
// counts live on the device, and nothing is read back, except with
// ring_send selected the need rows (the host schedules each hop's rows from
// them) and the statistics when asked for.
#ifdef MTRAIN_CUDA

#include "ring_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/comm_device.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../kernels/attention_cuda.h"
#include "../kernels/attn_variants.h"
#include "ring_columns_cuda.h"
#include "ring_plan.h"
#include "ring_rows_cuda.h"
#include "ring_sparse.h"
#include "../kernels/sparse_cuda.h"
#include "../sparse/sparse_select_cuda.h"

// Token lists on the device. ring.c computes each row list on the host for
// every call, the same lists for every layer (and step) of one layout; each
// distinct list is copied once into page-locked memory that is not rewritten
// while the list is kept, and from there (stream-ordered, no host wait) to
// the device; a list seen before is found by its contents. The lists are
// kept while the ring's positions stay the same, up to TOKEN_LISTS_KEPT
// lists of the largest chunk; then the next sequence starts them afresh
// (one wait for the stream, so no queued copy still reads the memory). A
// chunk of room is added when the lists outgrow the arena (cudaMalloc and
// cudaHostAlloc wait for no queued work).
#define TOKEN_LISTS_KEPT 64

typedef struct TokenChunk {
    int64_t *host, *dev;       // [cap] page-locked, and its device copy
    int64_t cap, used;
    struct TokenChunk *next;
} TokenChunk;

typedef struct {
    const int64_t *host, *dev; // [n] in a chunk
    int64_t n;
    uint64_t hash;
} TokenList;

typedef struct {
    TokenChunk *chunks;        // the newest first
    TokenList *lists;
    int64_t count, allocated;  // lists kept, room in `lists`
    int64_t elements;          // int64 in all kept lists
} TokenLists;

typedef struct {
    void *ptr;
    size_t bytes;
    bool spare;                // released by ring.c, free for its next alloc
} RingBufferCuda;

// The ring's device buffers, live or spare (ring.c holds RING_BUFFERS at once).
#define RING_BUFFERS_CUDA 32

struct RingCuda {
    const Comm *cp;            // NULL: a ring of one (no exchange, ring.h)
    int inner;
    Ring ring;
    bool built;
    int64_t *positions;        // [N] the ring's positions on the device, then its offsets [W + 1]
    size_t positions_bytes;
    int64_t *positions_host;   // [positions_count] what `positions` holds
    int64_t positions_count;
    cudaStream_t stream;       // the op's stream of the current call
    DeviceExchange *exchange;  // made on the first call, with that stream
    TokenLists lists;
    RingBufferCuda buffers[RING_BUFFERS_CUDA];
    void *staging;             // [staging_bytes] in-place row moves go through it
    size_t staging_bytes;
    RingMemory memory;
    RingKernels kernels;
    RingNeed need;             // ring_send selected: key blocks each rank's queries read
    RingDenseNeed dense_need;  // dense: its bits, kept for the sequence
    RingTraffic traffic;
    RingKernels sparse_kernels;
    RingKernels local_sparse_kernels;  // a ring of one: the whole index
    const SparseIndexCuda *index;  // the sparse kernels' index of the current call
    struct RingLayerCuda *layer;   // and its layer (gathered columns)
    void *column_arena;        // [W, 2 * owned_bound, Hkv * D] the columns' collective (bf16 K/V or fp32 dK/dV)
    size_t column_arena_bytes;
    float *column_dkv;         // [2, count, Hkv, D] the columns' dK/dV of the backward
    size_t column_dkv_bytes;
    int64_t column_bytes;      // sent for the gathered columns since the sequence began
    // The sparse plan's device scratch (grown) and its estimation's combined lse (host).
    void *est_q, *est_pos, *est_lse, *est_scores, *q_blocks, *plan_bits;
    size_t est_q_bytes, est_pos_bytes, est_lse_bytes, est_scores_bytes, q_blocks_bytes, plan_bits_bytes;
    float *lse_est;            // [Hq, est_rows] host, for the forward's recall (with statistics)
    int64_t est_rows;
    // The recall sample (with statistics): its positions (host), its dense lse
    // [Hq, sample_count] (host) for the forward's recall, the plan's device scratch.
    int64_t sample_rows[SPARSE_RECALL_ROWS], sample_count;
    float *sample_lse;
    void *sample;
    size_t sample_bytes;
};

// A layer's sparse ring state (RingCallCuda's `layer`), made by the plan
// and remade in place by the next step's (its buffers grow only with the
// bounds): with ring_send selected which key blocks every rank's index
// reads, and the gathered columns, held at count_bound columns of which
// owned_bound at most on one rank (ring_columns_bound). The columns'
// collective message is [W, 2 * owned_bound] rows: owner r's block holds its
// columns' K rows from the block's start, their V rows from owned_bound, in
// slot order (ring_columns_plan_cuda).
typedef struct RingLayerCuda {
    uint64_t *need;            // [W, words] page-locked host (ring_send selected)
    size_t need_bytes;
    int64_t count_bound, owned_bound;
    int64_t *column_pos;       // [count_bound] device: the columns' positions (the column pass's keys), then N
    int64_t *column_rows;      // [2, count_bound] device: each column's K row, then V row, in the message
    int64_t *own_local;        // [owned_bound] device: this rank's columns' local tokens, in slot order
    int64_t *live;             // [2] device: the columns, this rank's columns
    size_t pos_bytes, rows_bytes, own_bytes, live_bytes;
    uint16_t *column_kv;       // [2, count_bound, Hkv, D] device bf16: the gathered K then V (set by the forward)
    size_t column_kv_bytes;
} RingLayerCuda;

// ---- the device memory ----

// The host waits for `stream`: after the watchdog has seen the collectives
// and transfers queued so far (comm_device_settle).
static void host_wait(cudaStream_t stream) {
    comm_device_settle();
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

// The sparse plan's collectives over the ring's ranks (ring_cuda_sparse_plan,
// count_recall): a ring of one has nothing to combine.
static void plan_allgather(const RingCuda *rc, uint16_t *arena, int64_t count, cudaStream_t stream) {
    if (rc->cp) comm_device_allgather_bf16(rc->cp, arena, count, stream);
}

static void plan_reduce_scatter(const RingCuda *rc, float *arena, int64_t count, cudaStream_t stream) {
    if (rc->cp) comm_device_reduce_scatter(rc->cp, arena, count, stream);
}

static void plan_sum(const RingCuda *rc, double *x, int64_t n) {
    if (rc->cp) comm_allreduce(rc->cp, x, n, DT_DOUBLE, REDUCE_SUM);
}

// Zeroed: with ring_send selected a chunk's unsent rows stay as they were,
// and the dense kernels read them under the causal mask (weight 0, so they
// must be finite).
// The smallest spare buffer that holds `bytes` (no allocation), else a new
// one. ring.c asks again for the same sizes when the next sequence has the
// same shape, so a training step allocates only in the first.
static void *dev_alloc(void *ctx, size_t bytes) {
    RingCuda *rc = ctx;
    RingBufferCuda *b = NULL, *empty = NULL;
    for (int i = 0; i < RING_BUFFERS_CUDA; i++) {
        RingBufferCuda *x = &rc->buffers[i];
        if (!x->ptr && !empty) empty = x;
        if (x->ptr && x->spare && x->bytes >= bytes && (!b || x->bytes < b->bytes)) b = x;
    }
    if (!b) {
        CHECK(empty, "ring attention (CUDA): more than %d ring buffers", RING_BUFFERS_CUDA);
        b = empty;
        b->bytes = bytes > 0 ? bytes : 1;
        CUDA_CHECK(cudaMalloc(&b->ptr, b->bytes));
    }
    b->spare = false;
    CUDA_CHECK(cudaMemsetAsync(b->ptr, 0, bytes, rc->stream));
    return b->ptr;
}

// Kept as a spare: work queued on the stream that still uses it runs before
// the next user's (the same stream).
static void dev_release(void *ctx, void *buf) {
    RingCuda *rc = ctx;
    for (int i = 0; i < RING_BUFFERS_CUDA; i++)
        if (rc->buffers[i].ptr == buf) rc->buffers[i].spare = true;
}

static void dev_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    RingCuda *rc = ctx;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, rc->stream));
}

static void dev_zero(void *ctx, void *dst, size_t bytes) {
    RingCuda *rc = ctx;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, rc->stream));
}

static uint64_t list_hash(const int64_t *x, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint64_t)x[i]) * 1099511628211ull;
    return h;
}

// Room for n more int64 in the newest chunk: a new chunk (at least `least`) when it is full.
static TokenChunk *token_room(TokenLists *l, int64_t n, int64_t least) {
    TokenChunk *c = l->chunks;
    if (c && c->used + n <= c->cap) return c;
    c = xcalloc(1, sizeof(TokenChunk));
    c->cap = n > least ? n : least;
    CUDA_CHECK(cudaHostAlloc((void **)&c->host, sizeof(int64_t) * (size_t)c->cap, cudaHostAllocDefault));
    CUDA_CHECK(cudaMalloc((void **)&c->dev, sizeof(int64_t) * (size_t)c->cap));
    c->next = l->chunks;
    l->chunks = c;
    return c;
}

// sel [n] (host) on the device: the kept copy of the same list, else a new one.
static const int64_t *device_sel(RingCuda *rc, const int64_t *sel, int64_t n) {
    TokenLists *l = &rc->lists;
    const uint64_t hash = list_hash(sel, n);
    for (int64_t i = 0; i < l->count; i++)
        if (l->lists[i].hash == hash && l->lists[i].n == n &&
            !memcmp(l->lists[i].host, sel, sizeof(int64_t) * (size_t)n))
            return l->lists[i].dev;
    TokenChunk *c = token_room(l, n, 4 * (rc->ring.max_count + 1));
    int64_t *host = c->host + c->used, *dev = c->dev + c->used;
    c->used += n;
    memcpy(host, sel, sizeof(int64_t) * (size_t)n);
    CUDA_CHECK(cudaMemcpyAsync(dev, host, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice, rc->stream));
    if (l->count == l->allocated) {
        l->allocated = 2 * l->allocated + 16;
        l->lists = xrealloc(l->lists, sizeof(TokenList) * (size_t)l->allocated);
    }
    l->lists[l->count++] = (TokenList){.host = host, .dev = dev, .n = n, .hash = hash};
    l->elements += n;
    return dev;
}

static void token_chunks_free(TokenLists *l) {
    while (l->chunks) {
        TokenChunk *c = l->chunks;
        l->chunks = c->next;
        CUDA_CHECK(cudaFreeHost(c->host));
        CUDA_CHECK(cudaFree(c->dev));
        free(c);
    }
}

// Forgets every kept list: after `stream` is done with them (one wait); the
// chunks are merged into one of their total room.
static void token_lists_clear(TokenLists *l, cudaStream_t stream) {
    if (!l->chunks) return;
    host_wait(stream);
    if (l->chunks->next) {
        int64_t cap = 0;
        for (TokenChunk *c = l->chunks; c; c = c->next) cap += c->cap;
        token_chunks_free(l);
        token_room(l, cap, cap);
    }
    l->chunks->used = 0;
    l->count = l->elements = 0;
}

// In place (dst == src) the source is copied aside first: threads move rows in any order.
static const void *apart(RingCuda *rc, const void *dst, const void *src, size_t bytes) {
    if (dst != src) return src;
    CHECK(bytes <= rc->staging_bytes, "ring attention (CUDA): a message of %zu bytes (room for %zu)", bytes,
          rc->staging_bytes);
    CUDA_CHECK(cudaMemcpyAsync(rc->staging, src, bytes, cudaMemcpyDeviceToDevice, rc->stream));
    return rc->staging;
}

// At least `bytes` of *buf (device). Only between ring calls: cudaFree waits
// for the whole device, which inside a call would wait for transfers whose
// peers wait for this host (and after the watchdog, as host_wait).
static void room(void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return;
    comm_device_settle();
    if (*buf) CUDA_CHECK(cudaFree(*buf));
    CUDA_CHECK(cudaMalloc(buf, bytes));
    *have = bytes;
}

static void dev_gather_rows(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                            size_t row_bytes) {
    RingCuda *rc = ctx;
    if (n == 0) return;
    src = apart(rc, dst, src, (size_t)(2 * full) * row_bytes);
    ring_gather_rows_cuda(dst, src, full, device_sel(rc, sel, n), n, row_bytes, rc->stream);
}

static void dev_scatter_rows(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                             size_t row_bytes) {
    RingCuda *rc = ctx;
    if (n == 0) return;
    src = apart(rc, dst, src, (size_t)(2 * n) * row_bytes);
    ring_scatter_rows_cuda(dst, src, full, device_sel(rc, sel, n), n, row_bytes, rc->stream);
}

static void dev_add_rows(void *ctx, float *dk, float *dv, const float *in, const int64_t *sel, int64_t n,
                         int64_t kv) {
    RingCuda *rc = ctx;
    if (n == 0) return;
    ring_add_rows_cuda(dk, dv, in, device_sel(rc, sel, n), n, NULL, kv, rc->stream);
}

static void dev_send(void *ctx, const Comm *c, const void *buf, size_t bytes, int to, int tag, RingRequest *req) {
    RingCuda *rc = ctx;
    (void)c;
    req->id = comm_device_send(rc->exchange, buf, bytes, to, tag);
}

static void dev_recv(void *ctx, const Comm *c, void *buf, size_t bytes, int from, int tag, RingRequest *req) {
    RingCuda *rc = ctx;
    (void)c;
    req->id = comm_device_recv(rc->exchange, buf, bytes, from, tag);
}

static void dev_wait(void *ctx, const Comm *c, RingRequest *reqs, int n, const char *op) {
    RingCuda *rc = ctx;
    if (!rc->exchange || c->size == 1) return;   // a ring of one posts nothing
    for (int i = 0; i < n; i++) {
        comm_device_wait(rc->exchange, reqs[i].id, op);
        reqs[i] = RING_REQUEST_NULL;
    }
}

static void dev_forward_init(void *ctx, const AttnShape *shape, float *o, float *lse) {
    RingCuda *rc = ctx;
    attn_forward_init_cuda(shape, o, lse, rc->stream);
}

static void dev_backward_delta(void *ctx, const AttnShape *shape, const void *o, const void *dout, float *delta) {
    RingCuda *rc = ctx;
    attn_backward_delta_cuda(shape, o, dout, delta, rc->stream);
}

// ---- the dense kernels per ring step ----

// The registry's call (attn_variants.h) of a ring step over this ring's index, for `part` of it.
static AttnVariantCall step_call(const RingCuda *rc, const RingStep *step, SparsePart part) {
    const AttnGrads *g = &step->grads;
    const AttnVariantCall call = {.shape = step->shape, .index = rc->index, .q = step->q, .k = step->k, .v = step->v,
                                  .dout = step->dout, .q_pos = step->q_pos, .k_pos = step->k_pos,
                                  .o_acc = step->out.o, .lse = step->out.lse, .lse_final = g->lse,
                                  .delta = g->delta, .dq = g->dq, .dk = g->dk, .dv = g->dv, .part = part};
    return call;
}

// Runs `kind` on a ring step over `part` of this ring's index.
static void launch_step(void *ctx, const RingStep *step, AttnVariantKind kind, SparsePart part) {
    const RingCuda *rc = ctx;
    const AttnVariantCall call = step_call(rc, step, part);
    attn_variant_launch(kind, &call, rc->stream);
}

static void dense_forward(void *ctx, const RingStep *s) { launch_step(ctx, s, ATTN_DENSE_FORWARD, SPARSE_ALL); }
static void dense_backward(void *ctx, const RingStep *s) { launch_step(ctx, s, ATTN_DENSE_BACKWARD, SPARSE_ALL); }

// ---- the sparse kernels of a ring of one: the whole index (blocks and columns) in one pass ----

static void local_sparse_forward(void *ctx, const RingStep *s) { launch_step(ctx, s, ATTN_SPARSE_FORWARD, SPARSE_ALL); }
static void local_sparse_backward(void *ctx, const RingStep *s) {
    launch_step(ctx, s, ATTN_SPARSE_BACKWARD, SPARSE_ALL);
}

// ---- the sparse kernels per ring step (rc->index: the chunk's blocks) and the column pass ----

static void sparse_forward(void *ctx, const RingStep *s) { launch_step(ctx, s, ATTN_SPARSE_FORWARD, SPARSE_BLOCKS); }
static void sparse_backward(void *ctx, const RingStep *s) { launch_step(ctx, s, ATTN_SPARSE_BACKWARD, SPARSE_BLOCKS); }

// The gathered columns' shape for the own step's queries, and *half the
// elements of their K rows (the V rows follow).
static AttnShape columns_shape(const RingCuda *rc, const AttnShape *own, int64_t *half) {
    AttnShape s = *own;
    s.k_tokens = rc->layer->count_bound;
    *half = s.k_tokens * s.num_kv_heads * s.head_dim;
    return s;
}

// The call of the column pass for the own step: its queries against the
// gathered columns (*s their shape, *half the elements of their K rows).
static AttnVariantCall columns_call(const RingCuda *rc, const RingStep *own, AttnShape *s, int64_t *half) {
    const RingLayerCuda *layer = rc->layer;
    *s = columns_shape(rc, own->shape, half);
    AttnVariantCall call = step_call(rc, own, SPARSE_COLUMNS);
    call.shape = s;
    call.k = layer->column_kv;
    call.v = layer->column_kv + *half;
    call.k_pos = layer->column_pos;
    return call;
}

static void columns_forward(void *ctx, const RingStep *own) {
    const RingCuda *rc = ctx;
    AttnShape s;
    int64_t half;
    const AttnVariantCall call = columns_call(rc, own, &s, &half);
    attn_variant_launch(ATTN_SPARSE_FORWARD, &call, rc->stream);
}

static void columns_backward(void *ctx, const RingStep *own) {
    const RingCuda *rc = ctx;
    AttnShape s;
    int64_t half;
    AttnVariantCall call = columns_call(rc, own, &s, &half);
    call.dk = rc->column_dkv;
    call.dv = rc->column_dkv + half;
    attn_variant_launch(ATTN_SPARSE_BACKWARD, &call, rc->stream);
}

// ---- the sparse plan over the ring ----

// The first of the T tokens at positions pos (ascending) at or after base.
static int64_t first_at_or_after(const int64_t *pos, int64_t T, int64_t base) {
    int64_t first = T;
    while (first > 0 && pos[first - 1] >= base) first--;
    return first;
}

// The rows of the tokens at positions pos [T] (ascending) that are among the
// ascending positions rows [n], into dst [n, row] at their index in rows,
// from src at the token's row (src_local) or at that same index; one device
// copy per run of consecutive tokens at consecutive rows (a layout's block).
static void copy_rows_at(const int64_t *pos, int64_t T, const int64_t *rows, int64_t n, size_t row_bytes, char *dst,
                         const char *src, bool src_local, cudaStream_t stream) {
    int64_t i = 0;
    for (int64_t t = n ? first_at_or_after(pos, T, rows[0]) : T; t < T && i < n;) {
        while (i < n && rows[i] < pos[t]) i++;
        if (i == n) break;
        if (rows[i] != pos[t]) {
            t++;
            continue;
        }
        int64_t run = 1;
        while (t + run < T && i + run < n && pos[t + run] == pos[t] + run && rows[i + run] == rows[i] + run) run++;
        CUDA_CHECK(cudaMemcpyAsync(dst + (size_t)i * row_bytes, src + (size_t)(src_local ? t : i) * row_bytes,
                                   (size_t)run * row_bytes, cudaMemcpyDeviceToDevice, stream));
        t += run;
        i += run;
    }
}

// qe [n, Hq, D] (device): the queries at the ascending positions rows [n]
// (host) on every rank. Each rank copies its rows there into its block of
// arena [W, n, Hq, D] (device), the blocks are all-gathered on the device,
// and every rank copies each rank's rows out of that rank's block (every
// rank knows the ring's positions). Hq * D is even (D 64 or 128).
static void gather_queries(RingCuda *rc, const AttnShape *shape, const uint16_t *q, const int64_t *rows, int64_t n,
                           uint16_t *arena, uint16_t *qe, cudaStream_t stream) {
    const Ring *ring = &rc->ring;
    const int W = ring->cp->size, me = ring->cp->rank;
    const int64_t wq = (int64_t)shape->num_heads * shape->head_dim;
    const size_t row = sizeof(uint16_t) * (size_t)wq;
    copy_rows_at(ring->positions + ring->offsets[me], ring->counts[me], rows, n, row, (char *)(arena + me * n * wq),
                 (const char *)q, true, stream);
    plan_allgather(rc, arena, n * wq, stream);
    for (int r = 0; r < W; r++)
        copy_rows_at(ring->positions + ring->offsets[r], ring->counts[r], rows, n, row, (char *)qe,
                     (const char *)(arena + r * n * wq), false, stream);
}

// lse [Hq, n] (device): dense attention's lse of the queries qe [n, Hq, D] at
// positions qe_pos [n] (device) over every rank's keys k, from this rank's
// partial in its block of parts [W, Hq, n] (set to -inf before), all-gathered
// and folded in rank order (ring_combine_lse_cuda): the same bits on every rank.
static void rows_lse(RingCuda *rc, const AttnShape *shape, int64_t n, const uint16_t *qe, const int64_t *qe_pos,
                     const uint16_t *k, float *parts, float *lse, cudaStream_t stream) {
    const Ring *rg = &rc->ring;
    const int W = rg->cp->size, me = rg->cp->rank;
    const int64_t nl = shape->num_heads * n;
    AttnShape rows = *shape;
    rows.q_tokens = n;
    rows.k_tokens = rg->counts[me];
    sparse_estimate_lse_cuda(&rows, qe, qe_pos, k, rc->positions + rg->offsets[me], parts + me * nl, stream);
    plan_allgather(rc, (uint16_t *)parts, 2 * nl, stream);
    ring_combine_lse_cuda(parts, W, nl, lse, stream);
}

// stats: the recall sample's rows (sparse_recall_rows) gathered to every
// rank, their dense lse over the ring into rc->sample_lse [Hq, n] (host),
// for the forward's count_recall.
static void plan_sample(RingCuda *rc, const AttnShape *shape, const uint16_t *q, const uint16_t *k, int64_t Lq,
                        cudaStream_t stream) {
    const int W = rc->ring.cp->size, Hq = shape->num_heads;
    const int64_t N = rc->ring.offsets[W], wq = (int64_t)Hq * shape->head_dim;
    const int64_t n = sparse_recall_rows(N, Lq, rc->sample_rows), nl = Hq * n;
    room(&rc->sample, &rc->sample_bytes, sizeof(int64_t) * (size_t)n + sizeof(float) * (size_t)((W + 1) * nl) +
                                         sizeof(uint16_t) * (size_t)((W + 1) * n * wq));
    int64_t *rows_dev = rc->sample;                                     // [n]
    float *parts = (float *)(rows_dev + n), *lse = parts + W * nl;     // [W, Hq, n], [Hq, n]
    uint16_t *arena = (uint16_t *)(lse + nl), *qs = arena + W * n * wq; // [W, n, Hq, D], [n, Hq, D]
    ring_estimation_init_cuda(rows_dev, n, 0, parts + rc->ring.cp->rank * nl, nl, stream);   // the lse's -inf
    CUDA_CHECK(cudaMemcpyAsync(rows_dev, rc->sample_rows, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice,
                               stream));
    gather_queries(rc, shape, q, rc->sample_rows, n, arena, qs, stream);
    rows_lse(rc, shape, n, qs, rows_dev, k, parts, lse, stream);
    rc->sample_lse = xrealloc(rc->sample_lse, sizeof(float) * (size_t)(nl + 1));
    rc->sample_count = n;
    host_wait(stream);
    CUDA_CHECK(cudaMemcpy(rc->sample_lse, lse, sizeof(float) * (size_t)nl, cudaMemcpyDeviceToHost));
}

void ring_cuda_layer_free(void *layer) {
    RingLayerCuda *l = layer;
    if (!l) return;
    if (l->need) CUDA_CHECK(cudaFreeHost(l->need));
    void *dev[] = {l->column_pos, l->column_rows, l->own_local, l->live, l->column_kv};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i]) CUDA_CHECK(cudaFree(dev[i]));
    free(l);
}

// With ring_send selected, layer->need [W, words]: this rank's row from its
// index, all-gathered on the device and read back (ring.c schedules each
// hop's rows from them on the host): one stream-ordered copy into
// page-locked memory (grown with the ring's size) and one wait.
static void plan_need(RingCuda *rc, const SparseIndexCuda *index, int64_t words, RingLayerCuda *layer,
                      cudaStream_t stream) {
    const int W = rc->cp->size;
    room(&rc->plan_bits, &rc->plan_bits_bytes, sizeof(uint64_t) * (size_t)(W * words + 1));
    uint64_t *all = rc->plan_bits;
    ring_index_bits_cuda(index, false, all + rc->cp->rank * words, words, stream);
    comm_device_allgather_bf16(rc->cp, (uint16_t *)all, 4 * words, stream);
    const size_t bytes = sizeof(uint64_t) * (size_t)(W * words);
    if (bytes > layer->need_bytes) {
        if (layer->need) CUDA_CHECK(cudaFreeHost(layer->need));
        CUDA_CHECK(cudaHostAlloc((void **)&layer->need, bytes, cudaHostAllocDefault));
        layer->need_bytes = bytes;
    }
    CUDA_CHECK(cudaMemcpyAsync(layer->need, all, bytes, cudaMemcpyDeviceToHost, stream));
    host_wait(stream);
}

// The layer's gathered columns on the device (collective over cp): this
// rank's column bits from its index, all-gathered, planned at the bounds
// (ring_columns_plan_cuda).
static void plan_columns(RingCuda *rc, const SparseIndexCuda *index, const SparsePatternCuda *pattern,
                         const AttnShape *shape, int sink, RingLayerCuda *layer, cudaStream_t stream) {
    const Ring *rg = &rc->ring;
    const int W = rc->cp->size;
    const int64_t N = rg->offsets[W], words = ring_need_words(N, 1);
    ring_columns_bound(N, pattern->num_heads, pattern->vertical_capacity, shape->doc_starts ? shape->doc_count : 0,
                       sink, rg->max_count, &layer->count_bound, &layer->owned_bound);
    const int64_t n = layer->count_bound;
    room((void **)&layer->column_pos, &layer->pos_bytes, sizeof(int64_t) * (size_t)(n + 1));
    room((void **)&layer->column_rows, &layer->rows_bytes, sizeof(int64_t) * (size_t)(2 * n + 1));
    room((void **)&layer->own_local, &layer->own_bytes, sizeof(int64_t) * (size_t)(layer->owned_bound + 1));
    room((void **)&layer->live, &layer->live_bytes, sizeof(int64_t) * 2);
    room(&rc->plan_bits, &rc->plan_bits_bytes, sizeof(uint64_t) * (size_t)(W * words + 1));
    uint64_t *all = rc->plan_bits;
    ring_index_bits_cuda(index, true, all + rc->cp->rank * words, words, stream);
    comm_device_allgather_bf16(rc->cp, (uint16_t *)all, 4 * words, stream);
    ring_columns_plan_cuda(all, W, rc->cp->rank, N, rc->positions, rc->positions + N, n, layer->owned_bound,
                           layer->column_pos, layer->column_rows, layer->own_local, layer->live, stream);
}

// As ring_sparse_plan (ring_sparse.c) on the GPU: estimation of the last Lq
// queries against this rank's keys, the partial lse and sums combined on the
// device (below), selection and this rank's index on the GPU, the need rows
// (the index's blocks) all-gathered and the gathered columns planned:
// *layer remade. The combines keep every rank's result bit for bit equal,
// so that every rank selects the same pattern: the lse's partials [W, Hq,
// Lq] are all-gathered and every rank folds them in rank order
// (ring_combine_lse_cuda); the sums [2, Hq, N] are reduce-scattered (each
// block summed on its owner only) and the blocks all-gathered. A ring of one
// runs the same steps on its own keys with nothing to combine (the fold of
// one partial is that partial) and has no layer state: one GPU's plan.
void ring_cuda_sparse_plan(RingCuda *rc, const SparsePlanCall *call, SparsePatternCuda *pattern,
                           SparseIndexCuda *index, void **layer_out, cudaStream_t stream) {
    const AttentionConfig *cfg = call->cfg;
    const AttnShape *shape = call->shape;
    const uint16_t *q = call->q, *k = call->k;
    SparseStats *stats = call->stats;
    CHECK(rc->built, "sparse ring attention (CUDA): a plan before the sequence's positions");
    const Ring *rg = &rc->ring;
    const int W = rg->cp->size, me = rg->cp->rank, Hq = shape->num_heads, B = shape->block_size;
    const int64_t N = rg->offsets[W], T = rg->counts[me], *pos = rg->positions + rg->offsets[me];
    CHECK(T == shape->q_tokens, "sparse ring attention (CUDA): %lld local tokens but the ring was built for %lld",
          (long long)shape->q_tokens, (long long)T);
    const int64_t Lq = cfg->last_q < N ? cfg->last_q : N, wq = (int64_t)Hq * shape->head_dim, nqb = (T + B - 1) / B;
    const int64_t nl = Hq * Lq, part = (2 * Hq * N + W - 1) / W;   // part: a rank's block of the sums
    room(&rc->est_q, &rc->est_q_bytes, sizeof(uint16_t) * (size_t)((W + 1) * Lq * wq + 1));
    room(&rc->est_pos, &rc->est_pos_bytes, sizeof(int64_t) * (size_t)(Lq + 1));
    room(&rc->est_lse, &rc->est_lse_bytes, sizeof(float) * (size_t)((W + 1) * nl + 1));
    room(&rc->est_scores, &rc->est_scores_bytes, sizeof(float) * (size_t)(W * part + 1));
    room(&rc->q_blocks, &rc->q_blocks_bytes, sizeof(int64_t) * (size_t)(nqb + 1));
    uint16_t *qe = (uint16_t *)rc->est_q + W * Lq * wq;
    float *parts = rc->est_lse, *lse = parts + W * nl, *vertical = rc->est_scores, *slash = vertical + Hq * N;
    int64_t *qe_pos = xmalloc(sizeof(int64_t) * (size_t)Lq);   // host
    for (int64_t i = 0; i < Lq; i++) qe_pos[i] = N - Lq + i;
    gather_queries(rc, shape, q, qe_pos, Lq, rc->est_q, qe, stream);
    free(qe_pos);
    const int64_t *k_pos = rc->positions + rg->offsets[me];
    sparse_query_blocks_cuda(k_pos, T, B, rc->q_blocks, stream);

    // Pass 1: the partial lse over this rank's keys (from -inf) into its block, combined.
    ring_estimation_init_cuda(rc->est_pos, Lq, N - Lq, parts + me * nl, nl, stream);
    rows_lse(rc, shape, Lq, qe, rc->est_pos, k, parts, lse, stream);
    AttnShape est = *shape;
    est.q_tokens = Lq;
    est.k_tokens = T;
    if (stats) {   // the forward's recall (count_recall)
        rc->lse_est = xrealloc(rc->lse_est, sizeof(float) * (size_t)(nl + 1));
        rc->est_rows = Lq;
        host_wait(stream);
        CUDA_CHECK(cudaMemcpy(rc->lse_est, lse, sizeof(float) * (size_t)nl, cudaMemcpyDeviceToHost));
    }
    // Pass 2: the partial vertical and slash sums, combined.
    CUDA_CHECK(cudaMemsetAsync(vertical, 0, sizeof(float) * (size_t)(W * part), stream));
    sparse_estimate_scores_cuda(&est, qe, rc->est_pos, k, k_pos, lse, N, vertical, slash, stream);
    plan_reduce_scatter(rc, vertical, part, stream);
    plan_allgather(rc, (uint16_t *)vertical, 2 * part, stream);

    // Selection (identical inputs, identical pattern), this rank's index, the need rows and the columns.
    sparse_select_cuda(cfg, vertical, slash, Hq, N, call->fixed_vertical, call->fixed_slash, pattern, stream);
    sparse_index_build_cuda(pattern, B, rc->q_blocks, nqb, shape->doc_starts_device, shape->doc_count, cfg->sink,
                            index, stream);
    if (rc->cp) {   // over several ranks: the layer's state
        RingLayerCuda *layer = *layer_out ? *layer_out : (*layer_out = xcalloc(1, sizeof(RingLayerCuda)));
        if (cfg->ring_send == RING_SEND_SELECTED) plan_need(rc, index, ring_need_words(N, B), layer, stream);
        plan_columns(rc, index, pattern, shape, cfg->sink, layer, stream);
    }
    if (stats) {
        SparseIndex mine;
        comm_device_settle();
        sparse_index_to_host(index, stream, &mine);
        SparseStats part = {0};
        sparse_index_count(&mine, pos, T, shape->doc_starts, shape->doc_count, &part);
        double sums[2] = {part.computed, part.causal};
        plan_sum(rc, sums, 2);
        stats->computed += sums[0];
        stats->causal += sums[1];
        sparse_index_free(&mine);
        plan_sample(rc, shape, q, k, Lq, stream);
    }
}

// stats->covered_mass, estimation_rows and sampled_mass, sampled_rows after
// a sparse forward: the estimation rows' and the recall sample's rows'
// exp(lse - their dense lse) (the pattern's share of each row's softmax
// mass, as the one-GPU op counts it), summed over the rows' owners.
static void count_recall(RingCuda *rc, const AttnShape *shape, const float *lse, SparseStats *stats) {
    const Ring *rg = &rc->ring;
    const int W = rg->cp->size, me = rg->cp->rank, Hq = shape->num_heads;
    const int64_t N = rg->offsets[W], T = rg->counts[me], Lq = rc->est_rows, n = rc->sample_count;
    const int64_t *pos = rg->positions + rg->offsets[me];
    float *host = xmalloc(sizeof(float) * (size_t)(Hq * T + 1));
    host_wait(rc->stream);
    CUDA_CHECK(cudaMemcpy(host, lse, sizeof(float) * (size_t)(Hq * T), cudaMemcpyDeviceToHost));
    double covered[2] = {0, 0};   // estimation rows, recall sample
    for (int64_t t = 0, i = 0; t < T; t++) {   // pos and sample_rows ascending
        while (i < n && rc->sample_rows[i] < pos[t]) i++;
        for (int h = 0; h < Hq; h++) {
            if (pos[t] >= N - Lq)
                covered[0] += exp((double)host[h * T + t] - (double)rc->lse_est[h * Lq + pos[t] - (N - Lq)]);
            if (i < n && rc->sample_rows[i] == pos[t])
                covered[1] += exp((double)host[h * T + t] - (double)rc->sample_lse[h * n + i]);
        }
    }
    plan_sum(rc, covered, 2);
    stats->covered_mass += covered[0];
    stats->estimation_rows += (double)(Hq * Lq);
    stats->sampled_mass += covered[1];
    stats->sampled_rows += (double)(Hq * n);
    free(host);
}

// ---- the ring ----

static void forget_sequence(RingCuda *rc) {
    if (!rc->built) return;
    ring_free(&rc->ring);
    ring_dense_need_forget(&rc->dense_need);
    rc->built = false;
}

void ring_cuda_free(RingCuda *rc) {
    if (!rc) return;
    forget_sequence(rc);
    comm_device_exchange_free(rc->exchange);
    token_chunks_free(&rc->lists);
    free(rc->lists.lists);
    for (int i = 0; i < RING_BUFFERS_CUDA; i++)
        if (rc->buffers[i].ptr) CUDA_CHECK(cudaFree(rc->buffers[i].ptr));
    void *scratch[] = {rc->positions, rc->staging, rc->est_q, rc->est_pos, rc->est_lse, rc->est_scores,
                       rc->q_blocks, rc->plan_bits, rc->column_arena, rc->column_dkv, rc->sample};
    for (size_t i = 0; i < sizeof(scratch) / sizeof(scratch[0]); i++)
        if (scratch[i]) CUDA_CHECK(cudaFree(scratch[i]));
    free(rc->positions_host);
    ring_dense_need_free(&rc->dense_need);
    free(rc->lse_est);
    free(rc->sample_lse);
    free(rc);
}

// The ring's positions on the device are uploaded (one wait) only when they
// differ from the last sequence's; the token lists are kept with them, up to
// TOKEN_LISTS_KEPT lists of the largest chunk.
void ring_cuda_sequence(RingCuda *rc, const int64_t *pos, int64_t tokens) {
    forget_sequence(rc);
    ring_init(&rc->ring, rc->cp, rc->inner, pos, tokens);
    const int W = rc->ring.cp->size;
    const int64_t N = rc->ring.offsets[W];
    const size_t bytes = sizeof(int64_t) * (size_t)N, offsets_bytes = sizeof(int64_t) * (size_t)(W + 1);
    const bool same = N == rc->positions_count && !memcmp(rc->positions_host, rc->ring.positions, bytes);
    if (!same || rc->lists.elements > TOKEN_LISTS_KEPT * (rc->ring.max_count + 1))
        token_lists_clear(&rc->lists, rc->stream);
    if (!same) {   // after the last call's work that reads them
        if (rc->stream) host_wait(rc->stream);
        room((void **)&rc->positions, &rc->positions_bytes, bytes + offsets_bytes);
        CUDA_CHECK(cudaMemcpy(rc->positions, rc->ring.positions, bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(rc->positions + N, rc->ring.offsets, offsets_bytes, cudaMemcpyHostToDevice));
        rc->positions_host = xrealloc(rc->positions_host, bytes + sizeof(int64_t));
        memcpy(rc->positions_host, rc->ring.positions, bytes);
        rc->positions_count = N;
    }
    ring_set_memory(&rc->ring, &rc->memory, rc->positions);
    rc->built = true;
    rc->traffic = (RingTraffic){0};
    rc->column_bytes = 0;
}

// The call's stream, the exchange, the kernels (dense, or sparse over the
// call's index and layer; on a ring of one the whole index) and with
// ring_send selected the key blocks each rank's queries read: the dense ones
// for this shape, or the layer's (the plan's). A ring of one has no
// exchange, no staging and no need.
static const RingKernels *begin(RingCuda *rc, const RingCallCuda *call) {
    CHECK(rc->built, "ring attention (CUDA): a call before the sequence's positions (ring_cuda_sequence)");
    const AttnShape *shape = call->shape;
    RingLayerCuda *layer = call->layer;
    rc->stream = call->stream;
    rc->index = call->index;
    if (!rc->cp) return call->index ? &rc->local_sparse_kernels : &rc->kernels;
    CHECK(!call->index || layer, "sparse ring attention (CUDA): a call before the layer's plan");
    if (!rc->exchange) rc->exchange = comm_device_exchange_new(rc->cp, rc->inner, call->stream);
    const int64_t rows = rc->ring.max_count + 1, kv = (int64_t)shape->num_kv_heads * shape->head_dim;
    room(&rc->staging, &rc->staging_bytes, sizeof(float) * (size_t)(2 * rows * kv));
    rc->layer = layer;
    RingKernels *kernels = call->index ? &rc->sparse_kernels : &rc->kernels;
    kernels->need = NULL;
    if (call->send != RING_SEND_SELECTED) return kernels;
    CHECK(!call->index || layer->need, "sparse ring attention (CUDA): ring_send selected but the plan was made for full");
    rc->need = call->index ? (RingNeed){.block_size = shape->block_size,
                                        .words = ring_need_words(rc->ring.offsets[rc->cp->size], shape->block_size),
                                        .need = layer->need}
                           : ring_dense_need_kept(&rc->dense_need, &rc->ring, shape);
    kernels->need = &rc->need;
    return kernels;
}

// The columns' collective message of `element_bytes` elements: [W, 2 *
// owned_bound, kv] (grown between ring calls).
static void *column_arena(RingCuda *rc, const RingLayerCuda *layer, int64_t kv, size_t element_bytes) {
    room(&rc->column_arena, &rc->column_arena_bytes,
         element_bytes * (size_t)(rc->cp->size * 2 * layer->owned_bound * kv + 1));
    return rc->column_arena;
}

// The column pass before a pass (ring.h). Forward: the layer's columns' K/V
// rows gathered to every rank, in column order, into layer->column_kv [2,
// count, kv] (bf16): this rank packs its own into its block of the message,
// one all-gather, then every column's rows out. Backward: their dK/dV
// (rc->column_dkv) from zero, and the message sized for columns_home (room
// frees, and so waits for the device, only here, before the pass posts
// anything).
static void columns_gather(void *ctx, const Ring *ring, const AttnShape *shape, bool backward, const void *k,
                           const void *v) {
    RingCuda *rc = ctx;
    RingLayerCuda *layer = rc->layer;
    const int me = ring->cp->rank;
    const int64_t kv = (int64_t)shape->num_kv_heads * shape->head_dim;
    const int64_t n = layer->count_bound, M = layer->owned_bound, block = 2 * M * kv;   // per rank's block
    if (backward) {
        room((void **)&rc->column_dkv, &rc->column_dkv_bytes, sizeof(float) * (size_t)(2 * n * kv + 1));
        CUDA_CHECK(cudaMemsetAsync(rc->column_dkv, 0, sizeof(float) * (size_t)(2 * n * kv), rc->stream));
        column_arena(rc, layer, kv, sizeof(float));
        return;
    }
    const size_t row = sizeof(uint16_t) * (size_t)kv;
    room((void **)&layer->column_kv, &layer->column_kv_bytes, row * (size_t)(2 * n + 1));
    if (M == 0) return;
    uint16_t *arena = column_arena(rc, layer, kv, sizeof(uint16_t));
    ring_gather_pair_rows_cuda(arena + me * block, k, layer->own_local, v, layer->own_local, M, layer->live + 1, row,
                               rc->stream);
    comm_device_allgather_bf16(rc->cp, arena, block, rc->stream);
    ring_gather_pair_rows_cuda(layer->column_kv, arena, layer->column_rows, arena, layer->column_rows + n, n,
                               layer->live, row, rc->stream);
    rc->column_bytes += ring_columns_bytes(M, rc->cp->size, kv, sizeof(uint16_t));
}

// The column pass after the backward (ring.h): the columns' dK/dV
// (rc->column_dkv, every rank's contribution) summed into their owners' dk,
// dv [T, kv]: scattered into the message, one reduce-scatter, this rank's
// block added at its columns' tokens.
static void columns_home(void *ctx, const Ring *ring, const AttnShape *shape, float *dk, float *dv) {
    RingCuda *rc = ctx;
    const RingLayerCuda *layer = rc->layer;
    const int me = ring->cp->rank;
    const int64_t kv = (int64_t)shape->num_kv_heads * shape->head_dim;
    const int64_t n = layer->count_bound, M = layer->owned_bound, block = 2 * M * kv;
    if (M == 0) return;
    float *arena = column_arena(rc, layer, kv, sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(arena, 0, sizeof(float) * (size_t)(rc->cp->size * block), rc->stream));
    ring_scatter_pair_rows_cuda(arena, layer->column_rows, arena, layer->column_rows + n, rc->column_dkv, n,
                                layer->live, sizeof(float) * (size_t)kv, rc->stream);
    comm_device_reduce_scatter(rc->cp, arena, block, rc->stream);
    ring_add_rows_cuda(dk, dv, arena + me * block, layer->own_local, M, layer->live + 1, kv, rc->stream);
    rc->column_bytes += ring_columns_bytes(M, rc->cp->size, kv, sizeof(float));
}

// The pass's tensors as ring.c takes them.
static RingTensors ring_tensors(const RingCallCuda *call) {
    return (RingTensors){.q = call->q, .k = call->k, .v = call->v, .o = call->o, .dout = call->dout,
                         .q_pos = call->q_pos, .out = call->out, .grads = call->grads};
}

void ring_cuda_forward(RingCuda *rc, const RingCallCuda *call) {
    const RingKernels *kernels = begin(rc, call);
    const RingTensors t = ring_tensors(call);
    ring_attn_forward(&rc->ring, kernels, call->shape, &t);
    if (call->index && call->stats) count_recall(rc, call->shape, call->out.lse, call->stats);
}

void ring_cuda_backward(RingCuda *rc, const RingCallCuda *call) {
    const RingKernels *kernels = begin(rc, call);
    const RingTensors t = ring_tensors(call);
    ring_attn_backward(&rc->ring, kernels, call->shape, &t);
}

void ring_cuda_cached(RingCuda *rc, const RingCallCuda *call, const int64_t *k_pos) {
    CHECK(!call->index, "ring attention (CUDA): a cached call is dense");
    rc->stream = call->stream;
    rc->index = NULL;
    Ring one;
    ring_init_keys(&one, &rc->memory, k_pos, call->shape->k_tokens);
    const RingTensors t = ring_tensors(call);
    ring_attn_forward(&one, &rc->kernels, call->shape, &t);
    ring_free(&one);
}

double ring_cuda_bytes(const RingCuda *rc) {
    return (double)(rc->traffic.kv_bytes + rc->traffic.dkv_bytes + rc->column_bytes);
}

int ring_cuda_size(const RingCuda *rc) { return rc->cp ? rc->cp->size : 1; }

RingCuda *ring_cuda_new(const Comm *cp, int inner) {
    RingCuda *rc = xcalloc(1, sizeof(RingCuda));
    rc->cp = cp && cp->size > 1 ? cp : NULL;
    rc->inner = rc->cp ? inner : 1;
    rc->memory = (RingMemory){
        .act_bytes = sizeof(uint16_t), .alloc = dev_alloc, .release = dev_release, .copy = dev_copy,
        .zero = dev_zero, .gather_rows = dev_gather_rows, .scatter_rows = dev_scatter_rows,
        .add_rows = dev_add_rows, .send = dev_send, .recv = dev_recv, .wait = dev_wait,
        .forward_init = dev_forward_init, .backward_delta = dev_backward_delta, .ctx = rc,
    };
    rc->kernels = (RingKernels){.forward = dense_forward, .backward = dense_backward, .ctx = rc,
                                .traffic = &rc->traffic};
    rc->sparse_kernels = (RingKernels){.forward = sparse_forward, .backward = sparse_backward,
                                       .columns_gather = columns_gather, .columns_forward = columns_forward,
                                       .columns_backward = columns_backward, .columns_home = columns_home,
                                       .ctx = rc, .traffic = &rc->traffic};
    rc->local_sparse_kernels = (RingKernels){.forward = local_sparse_forward, .backward = local_sparse_backward,
                                             .ctx = rc};
    return rc;
}

#endif
