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
#include "ring.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"

enum { TAG_KV_INNER = 1, TAG_KV_OUTER, TAG_DKV_INNER, TAG_DKV_OUTER, TAG_DKV_HOME };

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

const RingKernels ring_dense_cpu = {dense_forward, dense_backward, NULL, NULL, NULL};

int ring_inner_size(RingSchedule schedule, int cp_size, int cp_inner) {
    return schedule == RING_HIERARCHICAL ? cp_inner : cp_size;
}

void ring_init(Ring *ring, const Comm *cp, int inner, const int64_t *pos, int64_t tokens) {
    CHECK(inner > 0 && cp->size % inner == 0, "ring: inner ring of %d ranks does not divide cp = %d", inner,
          cp->size);
    const int W = cp->size;
    ring->cp = cp;
    ring->inner = inner;
    ring->outer = W / inner;
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
    free(ring->counts);
    free(ring->offsets);
    free(ring->positions);
    memset(ring, 0, sizeof(*ring));
}

// Where a rank sits and who its neighbours are; cp rank = o * inner + i.
typedef struct {
    int inner, outer, o, i;
    int inner_next, inner_prev, outer_next, outer_prev;
    int64_t kv;                // floats of K (or V) per token: Hkv * D
} Place;

static int cp_rank_at(const Place *p, int o, int i) {
    return ((o % p->outer + p->outer) % p->outer) * p->inner + (i % p->inner + p->inner) % p->inner;
}

static Place place_of(const Ring *ring, int r, int64_t kv) {
    Place p = {ring->inner, ring->outer, r / ring->inner, r % ring->inner, 0, 0, 0, 0, kv};
    p.inner_next = cp_rank_at(&p, p.o, p.i + 1);
    p.inner_prev = cp_rank_at(&p, p.o, p.i - 1);
    p.outer_next = cp_rank_at(&p, p.o + 1, p.i);
    p.outer_prev = cp_rank_at(&p, p.o - 1, p.i);
    return p;
}

static Place place(const Ring *ring, const AttnShape *shape) {
    const int r = ring->cp->rank;
    CHECK(shape->q_tokens == ring->counts[r], "ring: %lld local tokens but the ring was built for %lld",
          (long long)shape->q_tokens, (long long)ring->counts[r]);
    return place_of(ring, r, (int64_t)shape->num_kv_heads * shape->head_dim);
}

// The chunk (its owner's cp rank) held at outer step so, inner step si.
static int chunk_at(const Place *p, int so, int si) { return cp_rank_at(p, p->o - so, p->i - si); }

// Floats of one chunk message (K and V, or dK and dV) of `tokens` tokens.
static int64_t message(const Place *p, int64_t tokens) { return 2 * tokens * p->kv; }

static float *chunk_buffer(const Ring *ring, const Place *p) {
    return xmalloc((size_t)message(p, ring->max_count) * sizeof(float));
}

// Own K and V into one chunk message.
static void pack_kv(const Place *p, int64_t tokens, const float *k, const float *v, float *buf) {
    memcpy(buf, k, (size_t)(tokens * p->kv) * sizeof(float));
    memcpy(buf + tokens * p->kv, v, (size_t)(tokens * p->kv) * sizeof(float));
}

// The holdings of a chunk (outer steps [o_from, o_to) x inner steps
// [i_from, i_to) of its journey) whose key-block needs one message serves.
// Holding (0, 0) is the chunk's owner, which no message serves: K/V start
// there, and the owner's own dK/dV contribution stays home.
typedef struct {
    int o_from, o_to, i_from, i_to;
} Holdings;

// K/V delivered to holding (so, si) serve the holders it reaches: via the
// inner ring (si > 0) inner steps si .. inner-1 of outer step so; via the
// outer ring (si == 0) every holding of outer steps so .. outer-1.
static Holdings kv_serves(const Place *p, int so, int si) {
    return (Holdings){so, si > 0 ? so + 1 : p->outer, si, p->inner};
}

// A dK/dV accumulator leaving holding (so, si) carries what its holders
// added: on the inner ring (si < inner-1) inner steps 0 .. si of outer step
// so; after the last inner step (to the next node or home) every holding of
// outer steps 0 .. so. Other rows are zero (no holder used their block).
static Holdings dkv_carries(const Place *p, int so, int si) {
    return si < p->inner - 1 ? (Holdings){so, so + 1, 0, si + 1} : (Holdings){0, so + 1, 0, p->inner};
}

// The tokens of chunk c (local indices, ascending, into sel [counts[c]]) that
// a message serving holdings h carries; returns how many. Without need: all.
// With need: those in a key block that a holder in h uses. mask: scratch
// [need->words].
static int64_t selected_tokens(const Ring *ring, const Place *p, const RingNeed *need, int c, Holdings h,
                               uint64_t *mask, int64_t *sel) {
    const int64_t count = ring->counts[c], *pos = ring->positions + ring->offsets[c];
    if (!need) {
        for (int64_t t = 0; t < count; t++) sel[t] = t;
        return count;
    }
    const int c_o = c / p->inner, c_i = c % p->inner;
    memset(mask, 0, (size_t)need->words * sizeof(uint64_t));
    for (int o = h.o_from; o < h.o_to; o++)
        for (int i = h.i_from; i < h.i_to; i++) {
            if (o == 0 && i == 0) continue;
            const uint64_t *row = need->need + (int64_t)cp_rank_at(p, c_o + o, c_i + i) * need->words;
            for (int64_t w = 0; w < need->words; w++) mask[w] |= row[w];
        }
    int64_t n = 0;
    for (int64_t t = 0; t < count; t++) {
        const int64_t b = pos[t] / need->block_size;
        if (mask[b / 64] >> (b % 64) & 1) sel[n++] = t;
    }
    return n;
}

// The rows (into sel) of the dK/dV message leaving holding (so, si) of chunk
// c; returns how many, or -1 at the owner's holding (0, 0), which sends none:
// its contribution stays home and the accumulator starts at the next holder.
static int64_t dkv_rows(const Ring *ring, const Place *p, const RingNeed *need, int c, int so, int si,
                        uint64_t *mask, int64_t *sel) {
    if (so == 0 && si == 0) return -1;
    return selected_tokens(ring, p, need, c, dkv_carries(p, so, si), mask, sel);
}

// Rows sel[0..n) of a chunk message of `full` tokens ([2, full, kv]) into a
// packed message [2, n, kv]; dst may be src (rows only move up).
static void pack_rows(float *dst, const float *src, int64_t full, const int64_t *sel, int64_t n, int64_t kv) {
    for (int part = 0; part < 2; part++)
        for (int64_t j = 0; j < n; j++)
            memmove(dst + (part * n + j) * kv, src + (part * full + sel[j]) * kv, (size_t)kv * sizeof(float));
}

void ring_send_tokens(const Ring *ring, const RingNeed *need, int64_t *kv_tokens, int64_t *dkv_tokens) {
    const int W = ring->cp->size;
    uint64_t *mask = xmalloc((size_t)(need ? need->words : 1) * sizeof(uint64_t));
    int64_t *sel = xmalloc((size_t)(ring->max_count + 1) * sizeof(int64_t));
    memset(kv_tokens, 0, (size_t)W * W * sizeof(int64_t));
    memset(dkv_tokens, 0, (size_t)W * W * sizeof(int64_t));
    for (int r = 0; r < W; r++) {
        const Place p = place_of(ring, r, 1);
        for (int so = 0; so < p.outer; so++)
            for (int si = 0; si < p.inner; si++) {
                const int64_t at = (int64_t)r * W + so * p.inner + si;
                const int c = chunk_at(&p, so, si);
                if (si == 0 && so < p.outer - 1)      // outer: to holding (so + 1, 0)
                    kv_tokens[at] += selected_tokens(ring, &p, need, c, kv_serves(&p, so + 1, 0), mask, sel);
                if (si < p.inner - 1)                  // inner: to holding (so, si + 1)
                    kv_tokens[at] += selected_tokens(ring, &p, need, c, kv_serves(&p, so, si + 1), mask, sel);
                const int64_t dkv = dkv_rows(ring, &p, need, c, so, si, mask, sel);
                dkv_tokens[at] = dkv > 0 ? dkv : 0;   // the owner's holding sends none
            }
    }
    free(mask);
    free(sel);
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

static Hop hop_new(const Ring *ring, const Place *p, bool selected) {
    Hop h = {NULL, NULL, 0, NULL};
    if (selected) {
        h.out = chunk_buffer(ring, p);
        h.in_sel = xmalloc((size_t)(ring->max_count + 1) * sizeof(int64_t));
    }
    return h;
}

static KvTravel kv_travel_start(const Ring *ring, const Place *p, const RingKernels *kernels,
                                const char *pass, const float *k, const float *v) {
    const RingNeed *need = kernels->need;
    KvTravel t = {ring, p, kernels, pass, chunk_buffer(ring, p), chunk_buffer(ring, p),
                  {chunk_buffer(ring, p), chunk_buffer(ring, p)},
                  {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, {MPI_REQUEST_NULL, MPI_REQUEST_NULL},
                  hop_new(ring, p, need), hop_new(ring, p, need),
                  xmalloc((size_t)(need ? need->words : 1) * sizeof(uint64_t)),
                  xmalloc((size_t)(ring->max_count + 1) * sizeof(int64_t))};
    pack_kv(p, ring->counts[ring->cp->rank], k, v, t.outer_cur);
    return t;
}

// Post one K/V transfer: chunk `out_chunk` from `cur` to `to` (arriving at its
// holding (so_out, si_out)), and chunk `in_chunk` from `from` into `in`
// (arriving here at (so_in, si_in)). Packs with ring_send selected.
static void kv_post(KvTravel *t, Hop *h, int tag, const float *cur, int out_chunk, int so_out, int si_out,
                    int to, float *in, int in_chunk, int so_in, int si_in, int from, MPI_Request *req) {
    const Place *p = t->p;
    const Ring *ring = t->ring;
    const RingNeed *need = t->kernels->need;
    int64_t in_n = ring->counts[in_chunk], out_n = ring->counts[out_chunk];
    const float *send = cur;
    if (need) {
        in_n = h->in_count = selected_tokens(ring, p, need, in_chunk, kv_serves(p, so_in, si_in), t->mask, h->in_sel);
        h->in_buf = in;
        out_n = selected_tokens(ring, p, need, out_chunk, kv_serves(p, so_out, si_out), t->mask, t->sel);
        pack_rows(h->out, cur, ring->counts[out_chunk], t->sel, out_n, p->kv);
        send = h->out;
    }
    comm_irecv(ring->cp, in, message(p, in_n), DT_FLOAT, from, tag, &req[0]);
    comm_isend(ring->cp, send, message(p, out_n), DT_FLOAT, to, tag, &req[1]);
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
    kv_post(t, &t->outer_hop, TAG_KV_OUTER, t->outer_cur, chunk_at(p, so, 0), so + 1, 0, p->outer_next,
            t->outer_next, chunk_at(p, so + 1, 0), so + 1, 0, p->outer_prev, t->outer_req);
}

// Inner step si of outer step so holds chunk `cur`: post the next inner
// transfer and return the buffer it arrives in (NULL at the last inner step).
static float *kv_inner_post(KvTravel *t, int so, int si, const float *cur) {
    const Place *p = t->p;
    if (si == p->inner - 1) return NULL;
    float *next = t->inner_buf[si % 2];
    kv_post(t, &t->inner_hop, TAG_KV_INNER, cur, chunk_at(p, so, si), so, si + 1, p->inner_next, next,
            chunk_at(p, so, si + 1), so, si + 1, p->inner_prev, t->inner_req);
    return next;
}

// End of inner step si of outer step so: the next chunk is in.
static void kv_inner_wait(KvTravel *t, int so, int si) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (inner ring)", t->pass);
    comm_wait(t->ring->cp, t->inner_req, 2, op);
    if (si < t->p->inner - 1) kv_unpack(t, &t->inner_hop, chunk_at(t->p, so, si + 1));
}

// End of outer step so: the next node's chunk set is in.
static void kv_outer_wait(KvTravel *t, int so) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (outer ring)", t->pass);
    comm_wait(t->ring->cp, t->outer_req, 2, op);
    if (so < t->p->outer - 1) kv_unpack(t, &t->outer_hop, chunk_at(t->p, so + 1, 0));
    float *swap = t->outer_cur;
    t->outer_cur = t->outer_next;
    t->outer_next = swap;
}

static void kv_travel_free(KvTravel *t) {
    free(t->outer_cur);
    free(t->outer_next);
    free(t->inner_buf[0]);
    free(t->inner_buf[1]);
    free(t->inner_hop.out); free(t->inner_hop.in_sel);
    free(t->outer_hop.out); free(t->outer_hop.in_sel);
    free(t->mask);
    free(t->sel);
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
            int c = chunk_at(&p, so, si);
            const float *next = kv_inner_post(&t, so, si, cur);
            AttnShape s = *shape;
            s.k_tokens = ring->counts[c];
            kernels->forward(kernels->ctx, &s, q, q_pos, cur, cur + s.k_tokens * p.kv,
                             ring->positions + ring->offsets[c], o, lse);
            kv_inner_wait(&t, so, si);
            cur = next;
        }
        kv_outer_wait(&t, so);
    }
    kv_travel_free(&t);
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
    float *delta = xmalloc((size_t)(shape->num_heads * T) * sizeof(float));
    attn_backward_delta(shape, o, dout, delta);
    const size_t rows = (size_t)(ring->max_count + 1) * sizeof(int64_t);
    Accumulators a = {{chunk_buffer(ring, &p), chunk_buffer(ring, &p)}, chunk_buffer(ring, &p),
                      chunk_buffer(ring, &p), chunk_buffer(ring, &p), chunk_buffer(ring, &p),
                      xmalloc(rows), xmalloc(rows), xmalloc(rows), xmalloc(rows), 0, 0, 0,
                      {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                      MPI_REQUEST_NULL};
    KvTravel t = kv_travel_start(ring, &p, kernels, "backward", k, v);
    // Home: this rank's own accumulator, from the rank that computes last on it.
    a.home_n = dkv_rows(ring, &p, need, cp->rank, p.outer - 1, p.inner - 1, t.mask, a.home_sel);
    if (a.home_n >= 0)
        comm_irecv(cp, a.home, message(&p, a.home_n), DT_FLOAT, cp_rank_at(&p, p.o - 1, p.i - 1), TAG_DKV_HOME,
                   &a.home_recv);
    for (int so = 0; so < p.outer; so++) {
        kv_outer_post(&t, so);
        if (so > 0) {
            a.outer_n = dkv_rows(ring, &p, need, chunk_at(&p, so, p.inner - 1), so - 1, p.inner - 1, t.mask, a.outer_sel);
            if (a.outer_n >= 0)
                comm_irecv(cp, a.outer_in, message(&p, a.outer_n), DT_FLOAT, p.outer_prev, TAG_DKV_OUTER,
                           &a.outer_recv);
        }
        const float *cur = t.outer_cur;
        for (int si = 0; si < p.inner; si++) {
            const int c = chunk_at(&p, so, si);
            const int64_t full = ring->counts[c];
            const bool last = si == p.inner - 1;
            a.inner_n = si > 0 ? dkv_rows(ring, &p, need, c, so, si - 1, t.mask, a.inner_sel) : -1;
            if (a.inner_n >= 0)
                comm_irecv(cp, a.inner_in, message(&p, a.inner_n), DT_FLOAT, p.inner_prev, TAG_DKV_INNER,
                           &a.inner_recv);
            const float *next = kv_inner_post(&t, so, si, cur);
            float *fresh = last ? a.node : a.step[si % 2];
            wait_one(cp, last ? &a.node_send : &a.step_send[si % 2], "dK/dV send buffer reuse");
            memset(fresh, 0, (size_t)message(&p, full) * sizeof(float));
            AttnShape s = *shape;
            s.k_tokens = full;
            const bool own = so == 0 && si == 0;      // own chunk: its dK/dV stay home
            kernels->backward(kernels->ctx, &s, q, q_pos, cur, cur + full * p.kv, ring->positions + ring->offsets[c],
                              lse, delta, dout, dq, own ? dk : fresh, own ? dv : fresh + full * p.kv);
            if (a.inner_n >= 0) {
                wait_one(cp, &a.inner_recv, "dK/dV transfer (inner ring)");
                add_rows(fresh, fresh + full * p.kv, a.inner_in, a.inner_sel, a.inner_n, p.kv);
            }
            if (last && so > 0 && a.outer_n >= 0) {
                wait_one(cp, &a.outer_recv, "dK/dV transfer (outer ring)");
                add_rows(fresh, fresh + full * p.kv, a.outer_in, a.outer_sel, a.outer_n, p.kv);
            }
            const int64_t n = dkv_rows(ring, &p, need, c, so, si, t.mask, a.send_sel);
            if (n >= 0 && n < full) pack_rows(fresh, fresh, full, a.send_sel, n, p.kv);
            int to = p.inner_next, tag = TAG_DKV_INNER;        // on, or to the next node, or home
            if (last) {
                to = so < p.outer - 1 ? p.outer_next : c;
                tag = so < p.outer - 1 ? TAG_DKV_OUTER : TAG_DKV_HOME;
            }
            if (n >= 0) {
                comm_isend(cp, fresh, message(&p, n), DT_FLOAT, to, tag, last ? &a.node_send : &a.step_send[si % 2]);
                if (kernels->traffic) kernels->traffic->dkv_bytes += message(&p, n) * (int64_t)sizeof(float);
            }
            kv_inner_wait(&t, so, si);
            cur = next;
        }
        kv_outer_wait(&t, so);
    }
    if (a.home_n >= 0) {
        wait_one(cp, &a.home_recv, "dK/dV transfer (home)");
        add_rows(dk, dv, a.home, a.home_sel, a.home_n, p.kv);
    }
    MPI_Request sends[3] = {a.step_send[0], a.step_send[1], a.node_send};
    comm_wait(cp, sends, 3, "ring attention backward: dK/dV sends");
    kv_travel_free(&t);
    free(a.step[0]); free(a.step[1]); free(a.node); free(a.inner_in); free(a.outer_in); free(a.home);
    free(a.inner_sel); free(a.outer_sel); free(a.home_sel); free(a.send_sel);
    free(delta);
}
