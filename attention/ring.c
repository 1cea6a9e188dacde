// ring.c: ring attention schedules (flat and hierarchical) over the cp
// communicator, forward and backward, with a kernel callback per step (see
// ring.h).
//
// A chunk message is one float buffer [2, Tk, Hkv, D]: K then V of the chunk
// (or dK then dV for an accumulator). At outer step so and inner step si,
// rank (o, i) holds the chunk of rank ((o - so) mod outer, (i - si) mod inner).
//
// Backward accumulators: at every step a rank computes the chunk's dK/dV
// contribution into a fresh buffer, then adds the accumulator arriving from
// the previous inner rank and sends the sum on; so the dK/dV transfer of one
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

const RingKernels ring_dense_cpu = {dense_forward, dense_backward, NULL};

int ring_inner_size(const char *schedule, int cp_size, int cp_inner) {
    if (!strcmp(schedule, "flat")) return cp_size;
    if (!strcmp(schedule, "hierarchical")) return cp_inner;
    fail("attention.ring: '%s' is not a ring schedule (expected flat or hierarchical)", schedule);
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

// Where this rank sits and who its neighbours are; cp rank = o * inner + i.
typedef struct {
    int inner, outer, o, i;
    int inner_next, inner_prev, outer_next, outer_prev;
    int64_t kv;                // floats of K (or V) per token: Hkv * D
} Place;

static int cp_rank_at(const Place *p, int o, int i) {
    return ((o % p->outer + p->outer) % p->outer) * p->inner + (i % p->inner + p->inner) % p->inner;
}

static Place place(const Ring *ring, const AttnShape *shape) {
    const int r = ring->cp->rank;
    CHECK(shape->q_tokens == ring->counts[r], "ring: %lld local tokens but the ring was built for %lld",
          (long long)shape->q_tokens, (long long)ring->counts[r]);
    Place p = {ring->inner, ring->outer, r / ring->inner, r % ring->inner, 0, 0, 0, 0,
               (int64_t)shape->num_kv_heads * shape->head_dim};
    p.inner_next = cp_rank_at(&p, p.o, p.i + 1);
    p.inner_prev = cp_rank_at(&p, p.o, p.i - 1);
    p.outer_next = cp_rank_at(&p, p.o + 1, p.i);
    p.outer_prev = cp_rank_at(&p, p.o - 1, p.i);
    return p;
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

// The K/V travel of both passes: the chunks held at every step, in order,
// with each transfer posted before the step's compute.
typedef struct {
    const Ring *ring;
    const Place *p;
    const char *pass;          // "forward" | "backward", for time-out messages
    float *outer_cur, *outer_next, *inner_buf[2];
    MPI_Request outer_req[2], inner_req[2];
} KvTravel;

static KvTravel kv_travel_start(const Ring *ring, const Place *p, const char *pass, const float *k,
                                const float *v) {
    KvTravel t = {ring, p, pass, chunk_buffer(ring, p), chunk_buffer(ring, p),
                  {chunk_buffer(ring, p), chunk_buffer(ring, p)},
                  {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
    pack_kv(p, ring->counts[ring->cp->rank], k, v, t.outer_cur);
    return t;
}

// Start of outer step so: post the node's chunk set onward (outer ring).
static void kv_outer_post(KvTravel *t, int so) {
    const Place *p = t->p;
    const Comm *cp = t->ring->cp;
    if (so == p->outer - 1) return;
    int64_t in = t->ring->counts[chunk_at(p, so + 1, 0)], out = t->ring->counts[chunk_at(p, so, 0)];
    comm_irecv(cp, t->outer_next, message(p, in), DT_FLOAT, p->outer_prev, TAG_KV_OUTER, &t->outer_req[0]);
    comm_isend(cp, t->outer_cur, message(p, out), DT_FLOAT, p->outer_next, TAG_KV_OUTER, &t->outer_req[1]);
}

// Inner step si of outer step so holds chunk `cur`: post the next inner
// transfer and return the buffer it arrives in (NULL at the last inner step).
static float *kv_inner_post(KvTravel *t, int so, int si, const float *cur) {
    const Place *p = t->p;
    const Comm *cp = t->ring->cp;
    if (si == p->inner - 1) return NULL;
    float *next = t->inner_buf[si % 2];
    int64_t in = t->ring->counts[chunk_at(p, so, si + 1)], out = t->ring->counts[chunk_at(p, so, si)];
    comm_irecv(cp, next, message(p, in), DT_FLOAT, p->inner_prev, TAG_KV_INNER, &t->inner_req[0]);
    comm_isend(cp, cur, message(p, out), DT_FLOAT, p->inner_next, TAG_KV_INNER, &t->inner_req[1]);
    return next;
}

static void kv_inner_wait(KvTravel *t) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (inner ring)", t->pass);
    comm_wait(t->ring->cp, t->inner_req, 2, op);
}

// End of outer step: the next node's chunk set is in.
static void kv_outer_wait(KvTravel *t) {
    char op[96];
    snprintf(op, sizeof(op), "ring attention %s: K/V transfer (outer ring)", t->pass);
    comm_wait(t->ring->cp, t->outer_req, 2, op);
    float *swap = t->outer_cur;
    t->outer_cur = t->outer_next;
    t->outer_next = swap;
}

static void kv_travel_free(KvTravel *t) {
    free(t->outer_cur);
    free(t->outer_next);
    free(t->inner_buf[0]);
    free(t->inner_buf[1]);
}

void ring_attn_forward(const Ring *ring, const RingKernels *kernels, const AttnShape *shape,
                       const float *q, const float *k, const float *v, float *o, float *lse) {
    const Place p = place(ring, shape);
    const int64_t *q_pos = ring->positions + ring->offsets[ring->cp->rank];
    attn_forward_init(shape, o, lse);
    KvTravel t = kv_travel_start(ring, &p, "forward", k, v);
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
            kv_inner_wait(&t);
            cur = next;
        }
        kv_outer_wait(&t);
    }
    kv_travel_free(&t);
}

// The dK/dV accumulators of the backward pass.
typedef struct {
    float *step[2];            // fresh contributions of inner steps (then sent on)
    float *node;               // last inner step: the node's sum (sent to the next node or home)
    float *inner_in, *outer_in, *home;
    MPI_Request step_send[2], node_send, inner_recv, outer_recv, home_recv;
} Accumulators;

static void add(float *dst, const float *src, int64_t n) {
    for (int64_t j = 0; j < n; j++) dst[j] += src[j];
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
    const int64_t T = shape->q_tokens, *q_pos = ring->positions + ring->offsets[cp->rank];
    float *delta = xmalloc((size_t)(shape->num_heads * T) * sizeof(float));
    attn_backward_delta(shape, o, dout, delta);
    Accumulators a = {{chunk_buffer(ring, &p), chunk_buffer(ring, &p)}, chunk_buffer(ring, &p),
                      chunk_buffer(ring, &p), chunk_buffer(ring, &p), chunk_buffer(ring, &p),
                      {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                      MPI_REQUEST_NULL};
    // Home: this rank's own accumulator, from the rank that computes last on it.
    int64_t own = T * p.kv;
    comm_irecv(cp, a.home, 2 * own, DT_FLOAT, cp_rank_at(&p, p.o - 1, p.i - 1), TAG_DKV_HOME, &a.home_recv);
    KvTravel t = kv_travel_start(ring, &p, "backward", k, v);
    for (int so = 0; so < p.outer; so++) {
        kv_outer_post(&t, so);
        if (so > 0) {
            int64_t n = message(&p, ring->counts[chunk_at(&p, so, p.inner - 1)]);
            comm_irecv(cp, a.outer_in, n, DT_FLOAT, p.outer_prev, TAG_DKV_OUTER, &a.outer_recv);
        }
        const float *cur = t.outer_cur;
        for (int si = 0; si < p.inner; si++) {
            int c = chunk_at(&p, so, si);
            int64_t n = message(&p, ring->counts[c]);
            bool last = si == p.inner - 1;
            if (si > 0) comm_irecv(cp, a.inner_in, n, DT_FLOAT, p.inner_prev, TAG_DKV_INNER, &a.inner_recv);
            const float *next = kv_inner_post(&t, so, si, cur);
            float *fresh = last ? a.node : a.step[si % 2];
            wait_one(cp, last ? &a.node_send : &a.step_send[si % 2], "dK/dV send buffer reuse");
            memset(fresh, 0, (size_t)n * sizeof(float));
            AttnShape s = *shape;
            s.k_tokens = ring->counts[c];
            kernels->backward(kernels->ctx, &s, q, q_pos, cur, cur + s.k_tokens * p.kv,
                              ring->positions + ring->offsets[c], lse, delta, dout, dq, fresh,
                              fresh + s.k_tokens * p.kv);
            if (si > 0) {
                wait_one(cp, &a.inner_recv, "dK/dV transfer (inner ring)");
                add(fresh, a.inner_in, n);
            }
            if (!last) comm_isend(cp, fresh, n, DT_FLOAT, p.inner_next, TAG_DKV_INNER, &a.step_send[si % 2]);
            else {
                if (so > 0) {
                    wait_one(cp, &a.outer_recv, "dK/dV transfer (outer ring)");
                    add(fresh, a.outer_in, n);
                }
                if (so < p.outer - 1) comm_isend(cp, fresh, n, DT_FLOAT, p.outer_next, TAG_DKV_OUTER, &a.node_send);
                else comm_isend(cp, fresh, n, DT_FLOAT, c, TAG_DKV_HOME, &a.node_send);
            }
            kv_inner_wait(&t);
            cur = next;
        }
        kv_outer_wait(&t);
    }
    wait_one(cp, &a.home_recv, "dK/dV transfer (home)");
    add(dk, a.home, own);
    add(dv, a.home + own, own);
    MPI_Request sends[3] = {a.step_send[0], a.step_send[1], a.node_send};
    comm_wait(cp, sends, 3, "ring attention backward: dK/dV sends");
    kv_travel_free(&t);
    free(a.step[0]); free(a.step[1]); free(a.node); free(a.inner_in); free(a.outer_in); free(a.home);
    free(delta);
}
