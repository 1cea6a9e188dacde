// ring.c: ring attention schedules (flat and hierarchical) over the cp
// communicator, forward and backward, with a kernel callback per step (see
// ring.h).
//
// At outer step so and inner step si,
// rank (o, i) holds the chunk of rank ((o - so) mod outer, (i - si) mod inner).
//
// Backward accumulators: the owner adds its own chunk's dK/dV at home; at
// every later step a rank computes the chunk's dK/dV contribution into a
// fresh buffer, then adds the accumulator arriving from the previous inner
// rank (if it had one to send) and sends the sum on; so the dK/dV transfer of one
// step overlaps the compute of the next. After a whole inner loop the sum is
// what this node contributed: it adds the sum arriving from the previous node
// (sent a whole inner loop earlier) and sends the total to the next node, or
// after the last outer step, home to the chunk's owner.
//
// A chunk message is one buffer [2, Tk, Hkv, D]: K then V of the chunk in
// the memory's activation type, or dK then dV (fp32) for an accumulator. The
// ring's memory (RingMemory: host and MPI, or a GPU) holds every buffer and
// moves every message; the schedule is the same for all. Order of posting:
// every rank calls the memory's wait at the same points of the schedule
// (whether or not it has a transfer to wait for), and posts the receive of
// every message between the same two of those points as its sender posts the
// send (a dK/dV accumulator's receive right after this rank's own send of the
// step); between two ranks in one direction messages are posted in the same
// order on both sides. So a transport without tags that hands each batch of
// transfers posted between two waits over as one group, run to completion
// before the next (NCCL groups on one stream, dist/comm_device.h), neither
// mismatches messages nor waits for a later group.
#include "ring_cpu.h"
#include "ring_plan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/util.h"

enum { TAG_KV_INNER = 1, TAG_KV_OUTER, TAG_DKV_INNER, TAG_DKV_OUTER, TAG_DKV_HOME };

// The transfers' buffers, one set per ring: allocated at their first use,
// grown when a later call needs more, freed by ring_free. Messages, the mask
// and delta live in the ring's memory; token lists (SEL_*, BUF_MASK) on the host.
typedef enum {
    BUF_OUTER_CUR, BUF_OUTER_NEXT, BUF_INNER_0, BUF_INNER_1,  // K/V chunks travelling
    BUF_HOP_INNER, BUF_HOP_OUTER,                              // packed K/V going out (selected)
    BUF_STEP_0, BUF_STEP_1, BUF_NODE,                          // dK/dV accumulators going out
    BUF_INNER_IN, BUF_OUTER_IN, BUF_HOME,                      // dK/dV accumulators coming in
    SEL_HOP_INNER, SEL_HOP_OUTER, SEL_TRAVEL,                  // token lists [max_count + 1]
    SEL_INNER, SEL_OUTER, SEL_HOME, SEL_SEND,
    BUF_MASK,                                                  // [need->words]
    BUF_DELTA,                                                 // [Hq, T]
    RING_BUFFERS
} RingBuffer;

struct RingScratch {
    void *buf[RING_BUFFERS];
    size_t bytes[RING_BUFFERS];
};

// The communicator of a ring of one rank: never used for a transfer.
static const Comm one_rank = {.name = "one rank", .rank = 0, .size = 1};

void ring_init(Ring *ring, const Comm *cp, int inner, const int64_t *pos, int64_t tokens) {
    if (!cp) {
        cp = &one_rank;
        inner = 1;
    }
    CHECK(inner > 0 && cp->size % inner == 0, "ring: inner ring of %d ranks does not divide cp = %d", inner,
          cp->size);
    for (int64_t t = 1; t < tokens; t++)
        CHECK(pos[t] > pos[t - 1], "ring: this rank's token %lld at position %lld does not follow position %lld "
              "(expected ascending positions)", (long long)t, (long long)pos[t], (long long)pos[t - 1]);
    const int W = cp->size;
    ring->cp = cp;
    ring->inner = inner;
    ring->outer = W / inner;
    ring->scratch = xcalloc(1, sizeof(RingScratch));
    ring->memory = &ring_host_memory;
    ring->counts = xmalloc((size_t)W * sizeof(int64_t));
    ring->offsets = xmalloc((size_t)(W + 1) * sizeof(int64_t));
    ring->counts[0] = tokens;
    if (W > 1) comm_allgather(cp, &tokens, ring->counts, 1, DT_INT64);
    ring->offsets[0] = 0;
    ring->max_count = 0;
    for (int r = 0; r < W; r++) {
        ring->offsets[r + 1] = ring->offsets[r] + ring->counts[r];
        if (ring->counts[r] > ring->max_count) ring->max_count = ring->counts[r];
    }
    // Positions travel padded to max_count (one all-gather), then are packed.
    int64_t *mine = xcalloc((size_t)ring->max_count, sizeof(int64_t));
    int64_t *all = xmalloc((size_t)(W * ring->max_count) * sizeof(int64_t));
    memcpy(mine, pos, (size_t)tokens * sizeof(int64_t));
    if (W > 1) comm_allgather(cp, mine, all, ring->max_count, DT_INT64);
    else memcpy(all, mine, (size_t)tokens * sizeof(int64_t));
    ring->positions = xmalloc((size_t)ring->offsets[W] * sizeof(int64_t));
    for (int r = 0; r < W; r++)
        memcpy(ring->positions + ring->offsets[r], all + r * ring->max_count, (size_t)ring->counts[r] * sizeof(int64_t));
    ring->kernel_positions = ring->positions;
    free(mine);
    free(all);
}

void ring_init_layout(Ring *ring, Comm *comm, LayoutKind layout, int64_t N, int B, int W, int inner) {
    CHECK(inner > 0 && W % inner == 0, "ring: inner ring of %d ranks does not divide cp = %d", inner, W);
    *comm = (Comm){.comm = MPI_COMM_NULL, .name = "cp", .rank = 0, .size = W};
    *ring = (Ring){.cp = comm, .inner = inner, .outer = W / inner, .scratch = xcalloc(1, sizeof(RingScratch)),
                   .memory = &ring_host_memory, .counts = xmalloc((size_t)W * sizeof(int64_t)),
                   .offsets = xmalloc((size_t)(W + 1) * sizeof(int64_t)),
                   .positions = xmalloc((size_t)(N + 1) * sizeof(int64_t))};
    ring->offsets[0] = 0;
    for (int r = 0; r < W; r++) {
        ring->counts[r] = layout_rank_positions(layout, N, B, W, r, ring->positions + ring->offsets[r]);
        ring->offsets[r + 1] = ring->offsets[r] + ring->counts[r];
        if (ring->counts[r] > ring->max_count) ring->max_count = ring->counts[r];
    }
    ring->kernel_positions = ring->positions;
}

void ring_init_keys(Ring *ring, const RingMemory *memory, const int64_t *k_pos, int64_t tokens) {
    *ring = (Ring){.cp = &one_rank, .inner = 1, .outer = 1, .scratch = xcalloc(1, sizeof(RingScratch)),
                   .memory = memory, .counts = xmalloc(sizeof(int64_t)), .offsets = xmalloc(2 * sizeof(int64_t)),
                   .max_count = tokens, .kernel_positions = k_pos};
    ring->counts[0] = tokens;
    ring->offsets[0] = 0;
    ring->offsets[1] = tokens;
}

// Token lists and the block mask live on the host, the rest in the ring's memory.
static bool on_host(RingBuffer which) { return which >= SEL_HOP_INNER && which <= BUF_MASK; }

static void release_buffer(const Ring *ring, RingBuffer which) {
    void *buf = ring->scratch->buf[which];
    if (!buf) return;
    if (on_host(which)) free(buf);
    else ring->memory->release(ring->memory->ctx, buf);
}

// Frees every buffer (their next use allocates them again).
static void release_buffers(Ring *ring) {
    RingScratch *s = ring->scratch;
    for (int b = 0; b < RING_BUFFERS; b++) {
        release_buffer(ring, (RingBuffer)b);
        s->buf[b] = NULL;
        s->bytes[b] = 0;
    }
}

void ring_set_memory(Ring *ring, const RingMemory *memory, const int64_t *kernel_positions) {
    release_buffers(ring);
    ring->memory = memory;
    ring->kernel_positions = kernel_positions;
}

void ring_free(Ring *ring) {
    release_buffers(ring);
    free(ring->scratch);
    free(ring->counts);
    free(ring->offsets);
    free(ring->positions);
    memset(ring, 0, sizeof(*ring));
}

// This rank's place; its queries are its tokens, or (q_pos) sit at their own
// positions against the keys of a ring of one.
static Place place(const Ring *ring, const AttnShape *shape, const int64_t *q_pos) {
    const int r = ring->cp->rank;
    if (q_pos)
        CHECK(ring->cp->size == 1 && shape->k_tokens == ring->counts[r], "ring: queries at their own positions "
              "against %lld keys need a ring of one over them (%d ranks, %lld keys)", (long long)shape->k_tokens,
              ring->cp->size, (long long)ring->counts[r]);
    else
        CHECK(shape->q_tokens == ring->counts[r], "ring: %lld local tokens but the ring was built for %lld",
              (long long)shape->q_tokens, (long long)ring->counts[r]);
    return ring_place(ring, r, (int64_t)shape->num_kv_heads * shape->head_dim);
}

// Bytes of one K/V message (activations) and of one dK/dV message (fp32) of `tokens` tokens.
static size_t kv_message(const Ring *ring, const Place *p, int64_t tokens) {
    return (size_t)(2 * tokens * p->kv) * ring->memory->act_bytes;
}
static size_t dkv_message(const Place *p, int64_t tokens) { return (size_t)(2 * tokens * p->kv) * sizeof(float); }

// Buffer `which`, at least `bytes` (on_host: where it lives).
static void *buffer(const Ring *ring, RingBuffer which, size_t bytes) {
    RingScratch *s = ring->scratch;
    const RingMemory *m = ring->memory;
    if (bytes > s->bytes[which]) {
        release_buffer(ring, which);
        s->buf[which] = on_host(which) ? xmalloc(bytes) : m->alloc(m->ctx, bytes);
        s->bytes[which] = bytes;
    }
    return s->buf[which];
}

// A message of the largest chunk: K/V (activations) or dK/dV (fp32).
static void *kv_buffer(const Ring *ring, const Place *p, RingBuffer which) {
    return buffer(ring, which, kv_message(ring, p, ring->max_count));
}
static float *dkv_buffer(const Ring *ring, const Place *p, RingBuffer which) {
    return buffer(ring, which, dkv_message(p, ring->max_count));
}

// A host list of up to max_count tokens (one more, so that it is never empty).
static int64_t *token_list(const Ring *ring, RingBuffer which) {
    return buffer(ring, which, (size_t)(ring->max_count + 1) * sizeof(int64_t));
}

// Own K and V into one chunk message.
static void pack_kv(const Ring *ring, const Place *p, int64_t tokens, const void *k, const void *v, char *buf) {
    const RingMemory *m = ring->memory;
    const size_t half = kv_message(ring, p, tokens) / 2;
    m->copy(m->ctx, buf, k, half);
    m->copy(m->ctx, buf + half, v, half);
}

// One direction of K/V travel (inner or outer ring) with ring_send selected:
// the packed message going out, and the token list of the one coming in.
typedef struct {
    char *out;                 // [2, n, kv] packed message being sent
    int64_t *in_sel;           // [max_count] local tokens of the incoming message
    int64_t in_count;
    char *in_buf;              // where it arrives (unpacked there after the wait)
} Hop;

// The K/V travel of both passes: the chunks held at every step, in order,
// with each transfer posted before the step's compute.
typedef struct {
    const Ring *ring;
    const Place *p;
    const RingKernels *kernels;
    const char *pass;          // "forward" | "backward", for time-out messages
    char *outer_cur, *outer_next, *inner_buf[2];
    RingRequest outer_req[2], inner_req[2];
    Hop inner_hop, outer_hop;  // used with kernels->need only
    uint64_t *mask;            // [need->words] scratch
    int64_t *sel;              // [max_count] scratch
} KvTravel;

// Only with ring_send selected: the packed message and the incoming token list.
static Hop hop_new(const Ring *ring, const Place *p, bool selected, RingBuffer out, RingBuffer in_sel) {
    if (!selected) return (Hop){0};
    return (Hop){.out = kv_buffer(ring, p, out), .in_sel = token_list(ring, in_sel)};
}

// The own chunk is computed from k and v in place; it is packed into a
// message only when it travels (more than one rank), and a ring of one has
// no buffer.
static KvTravel kv_travel_start(const Ring *ring, const Place *p, const RingKernels *kernels,
                                const char *pass, const void *k, const void *v) {
    const RingNeed *need = kernels->need;
    KvTravel t = {.ring = ring, .p = p, .kernels = kernels, .pass = pass,
                  .outer_req = {RING_REQUEST_NULL, RING_REQUEST_NULL},
                  .inner_req = {RING_REQUEST_NULL, RING_REQUEST_NULL}};
    if (ring->cp->size == 1) return t;
    t.outer_cur = kv_buffer(ring, p, BUF_OUTER_CUR);
    t.outer_next = kv_buffer(ring, p, BUF_OUTER_NEXT);
    t.inner_buf[0] = kv_buffer(ring, p, BUF_INNER_0);
    t.inner_buf[1] = kv_buffer(ring, p, BUF_INNER_1);
    t.inner_hop = hop_new(ring, p, need, BUF_HOP_INNER, SEL_HOP_INNER);
    t.outer_hop = hop_new(ring, p, need, BUF_HOP_OUTER, SEL_HOP_OUTER);
    t.mask = buffer(ring, BUF_MASK, (size_t)(need ? need->words : 1) * sizeof(uint64_t));
    t.sel = token_list(ring, SEL_TRAVEL);
    pack_kv(ring, p, ring->counts[ring->cp->rank], k, v, t.outer_cur);
    return t;
}

// One K/V transfer of a step: this rank sends chunk out_chunk (from `out`) to
// rank `to` and receives chunk in_chunk from rank `from` into `in`; both
// messages arrive at holding (so, si) of their chunk's journey.
typedef struct {
    int tag;
    int so, si;
    const char *out;
    int out_chunk, to;
    char *in;
    int in_chunk, from;
    Hop *hop;                  // this direction's packing (ring_send selected)
    RingRequest *req;          // [2] receive, send
} KvTransfer;

// Post one K/V transfer; packs with ring_send selected.
static void kv_post(KvTravel *t, const KvTransfer *x) {
    const Place *p = t->p;
    const Ring *ring = t->ring;
    const RingMemory *m = ring->memory;
    const RingNeed *need = t->kernels->need;
    const size_t row = (size_t)p->kv * m->act_bytes;
    int64_t in_n = ring->counts[x->in_chunk], out_n = ring->counts[x->out_chunk];
    const char *send = x->out;
    if (need) {
        const Holdings serves = ring_kv_serves(p, x->so, x->si);
        Hop *h = x->hop;
        in_n = h->in_count = ring_selected_tokens(ring, p, need, x->in_chunk, serves, t->mask, h->in_sel);
        h->in_buf = x->in;
        out_n = ring_selected_tokens(ring, p, need, x->out_chunk, serves, t->mask, t->sel);
        m->gather_rows(m->ctx, h->out, x->out, ring->counts[x->out_chunk], t->sel, out_n, row);
        send = h->out;
    }
    if (in_n > 0) m->recv(m->ctx, ring->cp, x->in, kv_message(ring, p, in_n), x->from, x->tag, &x->req[0]);
    if (out_n == 0) return;                    // nothing of it is used on the way: no message
    m->send(m->ctx, ring->cp, send, kv_message(ring, p, out_n), x->to, x->tag, &x->req[1]);
    if (t->kernels->traffic) {
        t->kernels->traffic->kv_bytes += (int64_t)kv_message(ring, p, out_n);
        t->kernels->traffic->kv_messages++;
    }
}

// After the wait: a packed message of chunk c back into the chunk's layout.
static void kv_unpack(const KvTravel *t, const Hop *h, int c) {
    if (!t->kernels->need) return;
    const RingMemory *m = t->ring->memory;
    m->scatter_rows(m->ctx, h->in_buf, h->in_buf, t->ring->counts[c], h->in_sel, h->in_count,
                    (size_t)t->p->kv * m->act_bytes);
}

// Start of outer step so: post the node's chunk set onward (outer ring).
static void kv_outer_post(KvTravel *t, int so) {
    const Place *p = t->p;
    if (so == p->outer - 1) return;
    kv_post(t, &(KvTransfer){.tag = TAG_KV_OUTER, .so = so + 1, .si = 0,
                             .out = t->outer_cur, .out_chunk = ring_chunk_at(p, so, 0), .to = p->outer_next,
                             .in = t->outer_next, .in_chunk = ring_chunk_at(p, so + 1, 0), .from = p->outer_prev,
                             .hop = &t->outer_hop, .req = t->outer_req});
}

// Inner step si of outer step so holds chunk `cur`: post the next inner
// transfer and return the buffer it arrives in (NULL at the last inner step).
static char *kv_inner_post(KvTravel *t, int so, int si, const char *cur) {
    const Place *p = t->p;
    if (si == p->inner - 1) return NULL;
    char *next = t->inner_buf[si % 2];
    kv_post(t, &(KvTransfer){.tag = TAG_KV_INNER, .so = so, .si = si + 1,
                             .out = cur, .out_chunk = ring_chunk_at(p, so, si), .to = p->inner_next,
                             .in = next, .in_chunk = ring_chunk_at(p, so, si + 1), .from = p->inner_prev,
                             .hop = &t->inner_hop, .req = t->inner_req});
    return next;
}

// End of inner step si of outer step so: the next chunk is in.
static void kv_inner_wait(KvTravel *t, int so, int si) {
    const RingMemory *m = t->ring->memory;
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (inner ring)", t->pass);
    m->wait(m->ctx, t->ring->cp, t->inner_req, 2, op);
    if (si < t->p->inner - 1) kv_unpack(t, &t->inner_hop, ring_chunk_at(t->p, so, si + 1));
}

// End of outer step so: the next node's chunk set is in.
static void kv_outer_wait(KvTravel *t, int so) {
    const RingMemory *m = t->ring->memory;
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (outer ring)", t->pass);
    m->wait(m->ctx, t->ring->cp, t->outer_req, 2, op);
    if (so < t->p->outer - 1) kv_unpack(t, &t->outer_hop, ring_chunk_at(t->p, so + 1, 0));
    char *swap = t->outer_cur;
    t->outer_cur = t->outer_next;
    t->outer_next = swap;
}

// Whether this rank's queries see any key of chunk c (else the step has no
// attention work: its kernels are not called).
static bool chunk_visible(const Ring *ring, const AttnShape *shape, int c) {
    const int me = ring->cp->rank;
    return ring_chunk_visible(ring->positions + ring->offsets[me], ring->counts[me], ring->positions + ring->offsets[c],
                              ring->counts[c], shape->doc_starts, shape->doc_count);
}

void ring_attn_forward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape, const RingTensors *t) {
    const Place p = place(ring, shape, t->q_pos);
    const RingMemory *m = ring->memory;
    const int64_t *q_pos = t->q_pos ? t->q_pos : ring->kernel_positions + ring->offsets[ring->cp->rank];
    m->forward_init(m->ctx, shape, t->out.o, t->out.lse);
    if (kernels->columns_gather) kernels->columns_gather(kernels->ctx, ring, shape, false, t->k, t->v);
    KvTravel travel = kv_travel_start(ring, &p, kernels, "forward", t->k, t->v);
    for (int so = 0; so < p.outer; so++) {
        kv_outer_post(&travel, so);
        const char *cur = travel.outer_cur;
        for (int si = 0; si < p.inner; si++) {
            const int c = ring_chunk_at(&p, so, si);
            const char *next = kv_inner_post(&travel, so, si, cur);
            const bool own = so == 0 && si == 0;
            if (t->q_pos || chunk_visible(ring, shape, c)) {   // own positions: the kernels mask
                AttnShape s = *shape;
                s.k_tokens = ring->counts[c];
                const RingStep step = {.shape = &s, .q = t->q, .k = own ? t->k : cur,
                                       .v = own ? t->v : cur + kv_message(ring, &p, s.k_tokens) / 2,
                                       .q_pos = q_pos, .k_pos = ring->kernel_positions + ring->offsets[c], .out = t->out};
                kernels->forward(kernels->ctx, &step);
                if (own && kernels->columns_forward) kernels->columns_forward(kernels->ctx, &step);
            }
            kv_inner_wait(&travel, so, si);
            cur = next;
        }
        kv_outer_wait(&travel, so);
    }
}

// The dK/dV accumulators of the backward pass. The owner adds its own
// contribution at home, so an accumulator starts empty. With ring_send
// selected a message carries only the rows of key blocks its holders used
// (dkv_carries; the others are zero): the sender packs them in place, the
// receiver adds them at their rows.
typedef struct {
    float *step[2];            // fresh contributions of inner steps (then sent on)
    float *node;               // last inner step: the node's sum (sent to the next node or home)
    float *inner_in, *outer_in, *home;
    int64_t *inner_sel, *outer_sel, *home_sel, *send_sel;  // [max_count] rows of the messages
    int64_t inner_n, outer_n, home_n;
    RingRequest step_send[2], node_send, inner_recv, outer_recv, home_recv;
} Accumulators;

// A ring of one has no accumulator: its one step is the own chunk's.
static Accumulators accumulators_start(const Ring *ring, const Place *p) {
    Accumulators a = {.step_send = {RING_REQUEST_NULL, RING_REQUEST_NULL}, .node_send = RING_REQUEST_NULL,
                      .inner_recv = RING_REQUEST_NULL, .outer_recv = RING_REQUEST_NULL,
                      .home_recv = RING_REQUEST_NULL};
    if (ring->cp->size == 1) return a;
    a.step[0] = dkv_buffer(ring, p, BUF_STEP_0);
    a.step[1] = dkv_buffer(ring, p, BUF_STEP_1);
    a.node = dkv_buffer(ring, p, BUF_NODE);
    a.inner_in = dkv_buffer(ring, p, BUF_INNER_IN);
    a.outer_in = dkv_buffer(ring, p, BUF_OUTER_IN);
    a.home = dkv_buffer(ring, p, BUF_HOME);
    a.inner_sel = token_list(ring, SEL_INNER);
    a.outer_sel = token_list(ring, SEL_OUTER);
    a.home_sel = token_list(ring, SEL_HOME);
    a.send_sel = token_list(ring, SEL_SEND);
    return a;
}

static void wait_one(const Ring *ring, RingRequest *req, const char *what) {
    const RingMemory *m = ring->memory;
    char op[96];
    snprintf(op, sizeof(op), "ring attention backward: %s", what);
    m->wait(m->ctx, ring->cp, req, 1, op);
}

void ring_attn_backward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape, const RingTensors *t) {
    CHECK(!t->q_pos, "ring attention backward: queries at their own positions (the decode's) have no backward");
    const Place p = place(ring, shape, NULL);
    const Comm *cp = ring->cp;
    const RingMemory *m = ring->memory;
    const RingNeed *need = kernels->need;
    const int64_t T = shape->q_tokens;
    float *delta = buffer(ring, BUF_DELTA, (size_t)(shape->num_heads * T + 1) * sizeof(float));
    m->backward_delta(m->ctx, shape, t->o, t->dout, delta);
    if (kernels->columns_gather) kernels->columns_gather(kernels->ctx, ring, shape, true, t->k, t->v);
    Accumulators a = accumulators_start(ring, &p);
    KvTravel travel = kv_travel_start(ring, &p, kernels, "backward", t->k, t->v);
    for (int so = 0; so < p.outer; so++) {
        kv_outer_post(&travel, so);
        const char *cur = travel.outer_cur;
        a.inner_n = -1;                               // the first inner step receives no inner accumulator
        for (int si = 0; si < p.inner; si++) {
            const int c = ring_chunk_at(&p, so, si);
            const int64_t full = ring->counts[c];
            const bool last = si == p.inner - 1;
            const char *next = kv_inner_post(&travel, so, si, cur);
            float *fresh = last ? a.node : a.step[si % 2];
            wait_one(ring, last ? &a.node_send : &a.step_send[si % 2], "dK/dV send buffer reuse");
            const bool own = so == 0 && si == 0;      // own chunk: its dK/dV stay home (fresh is not used)
            if (!own) m->zero(m->ctx, fresh, dkv_message(&p, full));
            if (chunk_visible(ring, shape, c)) {
                AttnShape s = *shape;
                s.k_tokens = full;
                const RingStep step = {
                    .shape = &s, .q = t->q, .k = own ? t->k : cur, .v = own ? t->v : cur + kv_message(ring, &p, full) / 2,
                    .dout = t->dout, .q_pos = ring->kernel_positions + ring->offsets[cp->rank],
                    .k_pos = ring->kernel_positions + ring->offsets[c],
                    .grads = {.lse = t->grads.lse, .delta = delta, .dq = t->grads.dq, .dk = own ? t->grads.dk : fresh,
                              .dv = own ? t->grads.dv : fresh + full * p.kv}};
                kernels->backward(kernels->ctx, &step);
                if (own && kernels->columns_backward) kernels->columns_backward(kernels->ctx, &step);
            }
            wait_one(ring, &a.inner_recv, "dK/dV transfer (inner ring)");
            if (a.inner_n > 0)
                m->add_rows(m->ctx, fresh, fresh + full * p.kv, a.inner_in, a.inner_sel, a.inner_n, p.kv);
            if (last && so > 0) {
                wait_one(ring, &a.outer_recv, "dK/dV transfer (outer ring)");
                if (a.outer_n > 0)
                    m->add_rows(m->ctx, fresh, fresh + full * p.kv, a.outer_in, a.outer_sel, a.outer_n, p.kv);
            }
            const int64_t n = ring_dkv_rows(ring, &p, need, c, so, si, travel.mask, a.send_sel);
            if (n >= 0 && n < full) m->gather_rows(m->ctx, fresh, fresh, full, a.send_sel, n, (size_t)p.kv * sizeof(float));
            int to = p.inner_next, tag = TAG_DKV_INNER;        // on, or to the next node, or home
            if (last) {
                to = so < p.outer - 1 ? p.outer_next : c;
                tag = so < p.outer - 1 ? TAG_DKV_OUTER : TAG_DKV_HOME;
            }
            if (n > 0) {
                m->send(m->ctx, cp, fresh, dkv_message(&p, n), to, tag, last ? &a.node_send : &a.step_send[si % 2]);
                if (kernels->traffic) kernels->traffic->dkv_bytes += (int64_t)dkv_message(&p, n);
            }
            // The receive of what the previous holder sends now (order of posting): for the next inner
            // step, or the next node's sum, or this rank's own accumulator home.
            if (!last) {
                a.inner_n = ring_dkv_rows(ring, &p, need, ring_chunk_at(&p, so, si + 1), so, si, travel.mask, a.inner_sel);
                if (a.inner_n > 0)
                    m->recv(m->ctx, cp, a.inner_in, dkv_message(&p, a.inner_n), p.inner_prev, TAG_DKV_INNER,
                            &a.inner_recv);
            } else if (so < p.outer - 1) {
                a.outer_n = ring_dkv_rows(ring, &p, need, ring_chunk_at(&p, so + 1, p.inner - 1), so, p.inner - 1,
                                          travel.mask, a.outer_sel);
                if (a.outer_n > 0)
                    m->recv(m->ctx, cp, a.outer_in, dkv_message(&p, a.outer_n), p.outer_prev, TAG_DKV_OUTER,
                            &a.outer_recv);
            } else {
                a.home_n = ring_dkv_rows(ring, &p, need, cp->rank, p.outer - 1, p.inner - 1, travel.mask, a.home_sel);
                if (a.home_n > 0)
                    m->recv(m->ctx, cp, a.home, dkv_message(&p, a.home_n), ring_rank_at(&p, p.o - 1, p.i - 1),
                            TAG_DKV_HOME, &a.home_recv);
            }
            kv_inner_wait(&travel, so, si);
            cur = next;
        }
        kv_outer_wait(&travel, so);
    }
    wait_one(ring, &a.home_recv, "dK/dV transfer (home)");
    if (a.home_n > 0) m->add_rows(m->ctx, t->grads.dk, t->grads.dv, a.home, a.home_sel, a.home_n, p.kv);
    RingRequest sends[3] = {a.step_send[0], a.step_send[1], a.node_send};
    m->wait(m->ctx, cp, sends, 3, "ring attention backward: dK/dV sends");
    if (kernels->columns_home) kernels->columns_home(kernels->ctx, ring, shape, t->grads.dk, t->grads.dv);
}
