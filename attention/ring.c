// ring.c: ring attention schedules (flat and hierarchical) over the cp
// communicator, forward and backward, with a kernel callback per step (see
// ring.h).
//
// A chunk message is one float buffer [2, Tk, Hkv, D]: K then V of the chunk
// (or dK then dV for an accumulator). At outer step so and inner step si,
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
#include "ring_plan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"

enum { TAG_KV_INNER = 1, TAG_KV_OUTER, TAG_DKV_INNER, TAG_DKV_OUTER, TAG_DKV_HOME };

// The transfers' buffers, one set per ring: allocated at their first use,
// grown when a later call needs more, freed by ring_free.
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

static void dense_forward(void *ctx, const AttnShape *shape, const float *q, const int64_t *q_pos,
                          const float *k, const float *v, const int64_t *k_pos, float *o, float *lse) {
    (void)ctx;
    attn_dense_forward_cpu(shape, q, q_pos, k, v, k_pos, o, lse);
}

static void dense_backward(void *ctx, const AttnShape *shape, const float *q, const int64_t *q_pos,
                           const float *k, const float *v, const int64_t *k_pos, const float *lse,
                           const float *delta, const float *dout, float *dq, float *dk, float *dv) {
    (void)ctx;
    attn_dense_backward_cpu(shape, q, q_pos, k, v, k_pos, lse, delta, dout, dq, dk, dv);
}

const RingKernels ring_dense_cpu = {.forward = dense_forward, .backward = dense_backward};

int ring_inner_size(RingSchedule schedule, int cp_size, int cp_inner) {
    return schedule == RING_HIERARCHICAL ? cp_inner : cp_size;
}

void ring_init(Ring *ring, const Comm *cp, int inner, const int64_t *pos, int64_t tokens) {
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
    ring->counts = xmalloc((size_t)W * sizeof(int64_t));
    ring->offsets = xmalloc((size_t)(W + 1) * sizeof(int64_t));
    comm_allgather(cp, &tokens, ring->counts, 1, DT_INT64);
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
    comm_allgather(cp, mine, all, ring->max_count, DT_INT64);
    ring->positions = xmalloc((size_t)ring->offsets[W] * sizeof(int64_t));
    for (int r = 0; r < W; r++)
        memcpy(ring->positions + ring->offsets[r], all + r * ring->max_count, (size_t)ring->counts[r] * sizeof(int64_t));
    free(mine);
    free(all);
}

void ring_free(Ring *ring) {
    for (int b = 0; b < RING_BUFFERS; b++) free(ring->scratch->buf[b]);
    free(ring->scratch);
    free(ring->counts);
    free(ring->offsets);
    free(ring->positions);
    memset(ring, 0, sizeof(*ring));
}

static Place place(const Ring *ring, const AttnShape *shape) {
    const int r = ring->cp->rank;
    CHECK(shape->q_tokens == ring->counts[r], "ring: %lld local tokens but the ring was built for %lld",
          (long long)shape->q_tokens, (long long)ring->counts[r]);
    return ring_place(ring, r, (int64_t)shape->num_kv_heads * shape->head_dim);
}

// Floats of one chunk message (K and V, or dK and dV) of `tokens` tokens.
static int64_t message(const Place *p, int64_t tokens) { return 2 * tokens * p->kv; }

static void *scratch(const Ring *ring, RingBuffer which, size_t bytes) {
    RingScratch *s = ring->scratch;
    if (bytes > s->bytes[which]) {
        free(s->buf[which]);
        s->buf[which] = xmalloc(bytes);
        s->bytes[which] = bytes;
    }
    return s->buf[which];
}

// A chunk message of the largest chunk.
static float *chunk_buffer(const Ring *ring, const Place *p, RingBuffer which) {
    return scratch(ring, which, (size_t)message(p, ring->max_count) * sizeof(float));
}

// A list of up to max_count tokens (one more, so that it is never empty).
static int64_t *token_list(const Ring *ring, RingBuffer which) {
    return scratch(ring, which, (size_t)(ring->max_count + 1) * sizeof(int64_t));
}

// Own K and V into one chunk message.
static void pack_kv(const Place *p, int64_t tokens, const float *k, const float *v, float *buf) {
    memcpy(buf, k, (size_t)(tokens * p->kv) * sizeof(float));
    memcpy(buf + tokens * p->kv, v, (size_t)(tokens * p->kv) * sizeof(float));
}

// Rows sel[0..n) of a chunk message of `full` tokens ([2, full, kv]) into a
// packed message [2, n, kv]; dst may be src (rows only move up).
static void pack_rows(float *dst, const float *src, int64_t full, const int64_t *sel, int64_t n, int64_t kv) {
    for (int part = 0; part < 2; part++)
        for (int64_t j = 0; j < n; j++)
            memmove(dst + (part * n + j) * kv, src + (part * full + sel[j]) * kv, (size_t)kv * sizeof(float));
}

// One direction of K/V travel (inner or outer ring) with ring_send selected:
// the packed message going out, and the token list of the one coming in.
typedef struct {
    float *out;                // [2, n, kv] packed message being sent
    int64_t *in_sel;           // [max_count] local tokens of the incoming message
    int64_t in_count;
    float *in_buf;             // where it arrives (unpacked there after the wait)
} Hop;

// The K/V travel of both passes: the chunks held at every step, in order,
// with each transfer posted before the step's compute.
typedef struct {
    const Ring *ring;
    const Place *p;
    const RingKernels *kernels;
    const char *pass;          // "forward" | "backward", for time-out messages
    float *outer_cur, *outer_next, *inner_buf[2];
    MPI_Request outer_req[2], inner_req[2];
    Hop inner_hop, outer_hop;  // used with kernels->need only
    uint64_t *mask;            // [need->words] scratch
    int64_t *sel;              // [max_count] scratch
} KvTravel;

// Only with ring_send selected: the packed message and the incoming token list.
static Hop hop_new(const Ring *ring, const Place *p, bool selected, RingBuffer out, RingBuffer in_sel) {
    if (!selected) return (Hop){0};
    return (Hop){.out = chunk_buffer(ring, p, out), .in_sel = token_list(ring, in_sel)};
}

static KvTravel kv_travel_start(const Ring *ring, const Place *p, const RingKernels *kernels,
                                const char *pass, const float *k, const float *v) {
    const RingNeed *need = kernels->need;
    KvTravel t = {
        .ring = ring, .p = p, .kernels = kernels, .pass = pass,
        .outer_cur = chunk_buffer(ring, p, BUF_OUTER_CUR),
        .outer_next = chunk_buffer(ring, p, BUF_OUTER_NEXT),
        .inner_buf = {chunk_buffer(ring, p, BUF_INNER_0), chunk_buffer(ring, p, BUF_INNER_1)},
        .outer_req = {MPI_REQUEST_NULL, MPI_REQUEST_NULL},
        .inner_req = {MPI_REQUEST_NULL, MPI_REQUEST_NULL},
        .inner_hop = hop_new(ring, p, need, BUF_HOP_INNER, SEL_HOP_INNER),
        .outer_hop = hop_new(ring, p, need, BUF_HOP_OUTER, SEL_HOP_OUTER),
        .mask = scratch(ring, BUF_MASK, (size_t)(need ? need->words : 1) * sizeof(uint64_t)),
        .sel = token_list(ring, SEL_TRAVEL),
    };
    pack_kv(p, ring->counts[ring->cp->rank], k, v, t.outer_cur);
    return t;
}

// One K/V transfer of a step: this rank sends chunk out_chunk (from `out`) to
// rank `to` and receives chunk in_chunk from rank `from` into `in`; both
// messages arrive at holding (so, si) of their chunk's journey.
typedef struct {
    int tag;
    int so, si;
    const float *out;
    int out_chunk, to;
    float *in;
    int in_chunk, from;
    Hop *hop;                  // this direction's packing (ring_send selected)
    MPI_Request *req;          // [2] receive, send
} KvTransfer;

// Post one K/V transfer; packs with ring_send selected.
static void kv_post(KvTravel *t, const KvTransfer *x) {
    const Place *p = t->p;
    const Ring *ring = t->ring;
    const RingNeed *need = t->kernels->need;
    int64_t in_n = ring->counts[x->in_chunk], out_n = ring->counts[x->out_chunk];
    const float *send = x->out;
    if (need) {
        const Holdings serves = ring_kv_serves(p, x->so, x->si);
        Hop *h = x->hop;
        in_n = h->in_count = ring_selected_tokens(ring, p, need, x->in_chunk, serves, t->mask, h->in_sel);
        h->in_buf = x->in;
        out_n = ring_selected_tokens(ring, p, need, x->out_chunk, serves, t->mask, t->sel);
        pack_rows(h->out, x->out, ring->counts[x->out_chunk], t->sel, out_n, p->kv);
        send = h->out;
    }
    if (in_n > 0) comm_irecv(ring->cp, x->in, message(p, in_n), DT_FLOAT, x->from, x->tag, &x->req[0]);
    if (out_n == 0) return;                    // nothing of it is used on the way: no message
    comm_isend(ring->cp, send, message(p, out_n), DT_FLOAT, x->to, x->tag, &x->req[1]);
    if (t->kernels->traffic) {
        t->kernels->traffic->kv_bytes += message(p, out_n) * (int64_t)sizeof(float);
        t->kernels->traffic->kv_messages++;
    }
}

// After the wait: a packed message of chunk c back into the chunk's layout
// (in place; rows only move up, so going down from the last is safe).
static void kv_unpack(const KvTravel *t, const Hop *h, int c) {
    if (!t->kernels->need) return;
    const int64_t kv = t->p->kv, n = h->in_count, full = t->ring->counts[c];
    for (int part = 1; part >= 0; part--)
        for (int64_t j = n - 1; j >= 0; j--)
            memmove(h->in_buf + (part * full + h->in_sel[j]) * kv, h->in_buf + (part * n + j) * kv,
                    (size_t)kv * sizeof(float));
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
static float *kv_inner_post(KvTravel *t, int so, int si, const float *cur) {
    const Place *p = t->p;
    if (si == p->inner - 1) return NULL;
    float *next = t->inner_buf[si % 2];
    kv_post(t, &(KvTransfer){.tag = TAG_KV_INNER, .so = so, .si = si + 1,
                             .out = cur, .out_chunk = ring_chunk_at(p, so, si), .to = p->inner_next,
                             .in = next, .in_chunk = ring_chunk_at(p, so, si + 1), .from = p->inner_prev,
                             .hop = &t->inner_hop, .req = t->inner_req});
    return next;
}

// End of inner step si of outer step so: the next chunk is in.
static void kv_inner_wait(KvTravel *t, int so, int si) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (inner ring)", t->pass);
    comm_wait(t->ring->cp, t->inner_req, 2, op);
    if (si < t->p->inner - 1) kv_unpack(t, &t->inner_hop, ring_chunk_at(t->p, so, si + 1));
}

// End of outer step so: the next node's chunk set is in.
static void kv_outer_wait(KvTravel *t, int so) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (outer ring)", t->pass);
    comm_wait(t->ring->cp, t->outer_req, 2, op);
    if (so < t->p->outer - 1) kv_unpack(t, &t->outer_hop, ring_chunk_at(t->p, so + 1, 0));
    float *swap = t->outer_cur;
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

void ring_attn_forward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape,
                       const float *q, const float *k, const float *v, float *o, float *lse) {
    const Place p = place(ring, shape);
    const int64_t *q_pos = ring->positions + ring->offsets[ring->cp->rank];
    attn_forward_init(shape, o, lse);
    KvTravel t = kv_travel_start(ring, &p, kernels, "forward", k, v);
    for (int so = 0; so < p.outer; so++) {
        kv_outer_post(&t, so);
        const float *cur = t.outer_cur;
        for (int si = 0; si < p.inner; si++) {
            int c = ring_chunk_at(&p, so, si);
            const float *next = kv_inner_post(&t, so, si, cur);
            AttnShape s = *shape;
            s.k_tokens = ring->counts[c];
            if (chunk_visible(ring, shape, c))
                kernels->forward(kernels->ctx, &s, q, q_pos, cur, cur + s.k_tokens * p.kv,
                                 ring->positions + ring->offsets[c], o, lse);
            kv_inner_wait(&t, so, si);
            cur = next;
        }
        kv_outer_wait(&t, so);
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
    MPI_Request step_send[2], node_send, inner_recv, outer_recv, home_recv;
} Accumulators;

// dk, dv [tokens, kv] += the packed message in [2, n, kv] at rows sel.
static void add_rows(float *dk, float *dv, const float *in, const int64_t *sel, int64_t n, int64_t kv) {
    for (int part = 0; part < 2; part++)
        for (int64_t j = 0; j < n; j++) {
            float *row = (part ? dv : dk) + sel[j] * kv;
            const float *from = in + (part * n + j) * kv;
            for (int64_t x = 0; x < kv; x++) row[x] += from[x];
        }
}

static void wait_one(const Comm *cp, MPI_Request *req, const char *what) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention backward: %s", what);
    comm_wait(cp, req, 1, op);
}

void ring_attn_backward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape,
                        const float *q, const float *k, const float *v, const float *o,
                        const float *lse, const float *dout, float *dq, float *dk, float *dv) {
    const Place p = place(ring, shape);
    const Comm *cp = ring->cp;
    const RingNeed *need = kernels->need;
    const int64_t T = shape->q_tokens, *q_pos = ring->positions + ring->offsets[cp->rank];
    float *delta = scratch(ring, BUF_DELTA, (size_t)(shape->num_heads * T + 1) * sizeof(float));
    attn_backward_delta(shape, o, dout, delta);
    Accumulators a = {
        .step = {chunk_buffer(ring, &p, BUF_STEP_0), chunk_buffer(ring, &p, BUF_STEP_1)},
        .node = chunk_buffer(ring, &p, BUF_NODE),
        .inner_in = chunk_buffer(ring, &p, BUF_INNER_IN),
        .outer_in = chunk_buffer(ring, &p, BUF_OUTER_IN),
        .home = chunk_buffer(ring, &p, BUF_HOME),
        .inner_sel = token_list(ring, SEL_INNER),
        .outer_sel = token_list(ring, SEL_OUTER),
        .home_sel = token_list(ring, SEL_HOME),
        .send_sel = token_list(ring, SEL_SEND),
        .step_send = {MPI_REQUEST_NULL, MPI_REQUEST_NULL},
        .node_send = MPI_REQUEST_NULL, .inner_recv = MPI_REQUEST_NULL, .outer_recv = MPI_REQUEST_NULL,
        .home_recv = MPI_REQUEST_NULL,
    };
    KvTravel t = kv_travel_start(ring, &p, kernels, "backward", k, v);
    // Home: this rank's own accumulator, from the rank that computes last on it.
    a.home_n = ring_dkv_rows(ring, &p, need, cp->rank, p.outer - 1, p.inner - 1, t.mask, a.home_sel);
    if (a.home_n > 0)
        comm_irecv(cp, a.home, message(&p, a.home_n), DT_FLOAT, ring_rank_at(&p, p.o - 1, p.i - 1), TAG_DKV_HOME,
                   &a.home_recv);
    for (int so = 0; so < p.outer; so++) {
        kv_outer_post(&t, so);
        if (so > 0) {
            a.outer_n = ring_dkv_rows(ring, &p, need, ring_chunk_at(&p, so, p.inner - 1), so - 1, p.inner - 1, t.mask, a.outer_sel);
            if (a.outer_n > 0)
                comm_irecv(cp, a.outer_in, message(&p, a.outer_n), DT_FLOAT, p.outer_prev, TAG_DKV_OUTER,
                           &a.outer_recv);
        }
        const float *cur = t.outer_cur;
        for (int si = 0; si < p.inner; si++) {
            const int c = ring_chunk_at(&p, so, si);
            const int64_t full = ring->counts[c];
            const bool last = si == p.inner - 1;
            a.inner_n = si > 0 ? ring_dkv_rows(ring, &p, need, c, so, si - 1, t.mask, a.inner_sel) : -1;
            if (a.inner_n > 0)
                comm_irecv(cp, a.inner_in, message(&p, a.inner_n), DT_FLOAT, p.inner_prev, TAG_DKV_INNER,
                           &a.inner_recv);
            const float *next = kv_inner_post(&t, so, si, cur);
            float *fresh = last ? a.node : a.step[si % 2];
            wait_one(cp, last ? &a.node_send : &a.step_send[si % 2], "dK/dV send buffer reuse");
            memset(fresh, 0, (size_t)message(&p, full) * sizeof(float));
            AttnShape s = *shape;
            s.k_tokens = full;
            const bool own = so == 0 && si == 0;      // own chunk: its dK/dV stay home
            if (chunk_visible(ring, shape, c))
                kernels->backward(kernels->ctx, &s, q, q_pos, cur, cur + full * p.kv,
                                  ring->positions + ring->offsets[c], lse, delta, dout, dq, own ? dk : fresh,
                                  own ? dv : fresh + full * p.kv);
            if (a.inner_n > 0) {
                wait_one(cp, &a.inner_recv, "dK/dV transfer (inner ring)");
                add_rows(fresh, fresh + full * p.kv, a.inner_in, a.inner_sel, a.inner_n, p.kv);
            }
            if (last && so > 0 && a.outer_n > 0) {
                wait_one(cp, &a.outer_recv, "dK/dV transfer (outer ring)");
                add_rows(fresh, fresh + full * p.kv, a.outer_in, a.outer_sel, a.outer_n, p.kv);
            }
            const int64_t n = ring_dkv_rows(ring, &p, need, c, so, si, t.mask, a.send_sel);
            if (n >= 0 && n < full) pack_rows(fresh, fresh, full, a.send_sel, n, p.kv);
            int to = p.inner_next, tag = TAG_DKV_INNER;        // on, or to the next node, or home
            if (last) {
                to = so < p.outer - 1 ? p.outer_next : c;
                tag = so < p.outer - 1 ? TAG_DKV_OUTER : TAG_DKV_HOME;
            }
            if (n > 0) {
                comm_isend(cp, fresh, message(&p, n), DT_FLOAT, to, tag, last ? &a.node_send : &a.step_send[si % 2]);
                if (kernels->traffic) kernels->traffic->dkv_bytes += message(&p, n) * (int64_t)sizeof(float);
            }
            kv_inner_wait(&t, so, si);
            cur = next;
        }
        kv_outer_wait(&t, so);
    }
    if (a.home_n > 0) {
        wait_one(cp, &a.home_recv, "dK/dV transfer (home)");
        add_rows(dk, dv, a.home, a.home_sel, a.home_n, p.kv);
    }
    MPI_Request sends[3] = {a.step_send[0], a.step_send[1], a.node_send};
    comm_wait(cp, sends, 3, "ring attention backward: dK/dV sends");
}
