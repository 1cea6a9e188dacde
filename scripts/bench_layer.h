// bench_layer.h: one layer's attention operands on the CPU and the timed
// forward and backward over them, shared by the attention benchmarks
// (scripts/bench_sparse_cpu.c, scripts/bench_documents.c).
#ifndef MTRAIN_BENCH_LAYER_H
#define MTRAIN_BENCH_LAYER_H

#include <stdlib.h>
#include <string.h>

#include "../attention/kernels/flash_cpu.h"
#include "../attention/sparse/sparse.h"
#include "../dist/util.h"

// Operands of one layer's attention: q, dout, o, dq [T, Hq, D]; k, v, dk, dv
// [T, Hkv, D]; lse, delta [Hq, T]; pos [T] = 0..T-1.
typedef struct {
    AttnShape s;
    float *q, *k, *v, *dout, *o, *dq, *dk, *dv, *lse, *delta;
    int64_t *pos;
} Layer;

static float *random_tensor(Rng *rng, int64_t n) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_normal(rng);
    return x;
}

// Random q, k, v, dout (seed 42); T tokens, block B, scale 1/sqrt(D), no documents.
static Layer make_layer(int64_t T, int Hq, int Hkv, int D, int B) {
    Layer L = {.s = {T, T, Hq, Hkv, D, B, 1.0f / sqrtf((float)D)}};
    const int64_t nq = T * Hq * D, nk = T * Hkv * D;
    Rng rng; rng_seed(&rng, 42);
    L.q = random_tensor(&rng, nq); L.k = random_tensor(&rng, nk);
    L.v = random_tensor(&rng, nk); L.dout = random_tensor(&rng, nq);
    L.o = xmalloc((size_t)nq * sizeof(float)); L.dq = xmalloc((size_t)nq * sizeof(float));
    L.dk = xmalloc((size_t)nk * sizeof(float)); L.dv = xmalloc((size_t)nk * sizeof(float));
    L.lse = xmalloc((size_t)(Hq * T) * sizeof(float));
    L.delta = xmalloc((size_t)(Hq * T) * sizeof(float));
    L.pos = xmalloc((size_t)T * sizeof(int64_t));
    for (int64_t t = 0; t < T; t++) L.pos[t] = t;
    return L;
}

static void free_layer(Layer *L) {
    free(L->q); free(L->k); free(L->v); free(L->dout); free(L->o); free(L->dq); free(L->dk);
    free(L->dv); free(L->lse); free(L->delta); free(L->pos);
}

// One forward (with its init) and one backward (with its delta), dense when
// x == NULL, gradients zeroed first (untimed): seconds of each into t [2];
// returns their sum.
static double layer_time(Layer *L, const SparseIndex *x, double t[2]) {
    const AttnShape *s = &L->s;
    const int64_t nq = s->q_tokens * s->num_heads * s->head_dim, nk = s->k_tokens * s->num_kv_heads * s->head_dim;
    memset(L->dq, 0, (size_t)nq * sizeof(float));
    memset(L->dk, 0, (size_t)nk * sizeof(float));
    memset(L->dv, 0, (size_t)nk * sizeof(float));
    const double t0 = now_seconds();
    attn_forward_init(s, L->o, L->lse);
    if (x) attn_sparse_forward_cpu(s, x, L->q, L->pos, L->k, L->v, L->pos, L->o, L->lse);
    else attn_dense_forward_cpu(s, L->q, L->pos, L->k, L->v, L->pos, L->o, L->lse);
    const double t1 = now_seconds();
    attn_backward_delta(s, L->o, L->dout, L->delta);
    if (x)
        attn_sparse_backward_cpu(s, x, L->q, L->pos, L->k, L->v, L->pos, L->lse, L->delta, L->dout, L->dq,
                                 L->dk, L->dv);
    else
        attn_dense_backward_cpu(s, L->q, L->pos, L->k, L->v, L->pos, L->lse, L->delta, L->dout, L->dq, L->dk,
                                L->dv);
    t[0] = t1 - t0;
    t[1] = now_seconds() - t1;
    return t[0] + t[1];
}

#endif
