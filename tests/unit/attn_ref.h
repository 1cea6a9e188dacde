// attn_ref.h: what the attention tests share: a random problem (q, k, v, the
// upstream gradient, positions), the double-precision masked reference
// (full softmax per row and its analytic gradients) and the error measure.
#ifndef MTRAIN_ATTN_REF_H
#define MTRAIN_ATTN_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/attention.h"
#include "../../dist/util.h"

// One attention problem: q, w (the upstream gradient dO) [Tq, Hq, D],
// k, v [Tk, Hkv, D], q_pos [Tq], k_pos [Tk] (positions 0.. unless overridden).
typedef struct {
    AttnShape s;
    int64_t nq, nk, nl;        // element counts of q, k and lse
    float *q, *k, *v, *w;
    int64_t *qp, *kp;
} Problem;

static float *randn(Rng *rng, int64_t n, double sd) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * rng_normal(rng));
    return x;
}

static Problem make_problem(int64_t Tq, int64_t Tk, int Hq, int Hkv, int D, int B, uint64_t seed) {
    Problem p = {.s = {Tq, Tk, Hq, Hkv, D, B, 1.0f / sqrtf((float)D)}};
    p.nq = Tq * Hq * D; p.nk = Tk * Hkv * D; p.nl = Hq * Tq;
    Rng rng; rng_seed(&rng, seed);
    p.q = randn(&rng, p.nq, 2.0);          // peaky softmax: scores ~ N(0, 4)
    p.k = randn(&rng, p.nk, 1.0);
    p.v = randn(&rng, p.nk, 1.0);
    p.w = randn(&rng, p.nq, 1.0);
    p.qp = xmalloc((size_t)(Tq + Tk + 1) * sizeof(int64_t));
    p.kp = p.qp + Tq;
    for (int64_t t = 0; t < Tq; t++) p.qp[t] = t;
    for (int64_t t = 0; t < Tk; t++) p.kp[t] = t;
    return p;
}

static void free_problem(Problem *p) {
    free(p->q); free(p->k); free(p->v); free(p->w); free(p->qp);
}

static double *to_double(const float *x, int64_t n) {
    double *y = xmalloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

// Reference forward and (when dq != NULL) backward in double, with the full
// masked softmax per row. Key j is visible to query i of head h iff
// kp[j] <= qp[i] and (mask == NULL or mask[(h * Tq + i) * Tk + j]). Rows with
// no visible key: o = 0, lse = -inf, no gradient. o, dq, dout [Tq, Hq, D];
// dk, dv [Tk, Hkv, D]; lse [Hq, Tq].
static void reference(const AttnShape *s, const unsigned char *mask, const double *q, const int64_t *qp, const double *k,
                      const double *v, const int64_t *kp, const double *dout,
                      double *o, double *lse, double *dq, double *dk, double *dv) {
    const int64_t Tq = s->q_tokens, Tk = s->k_tokens;
    const int Hq = s->num_heads, Hkv = s->num_kv_heads, D = s->head_dim, group = Hq / Hkv;
    double *p = xmalloc((size_t)(2 * Tk + 1) * sizeof(double)), *dp = p + Tk;
    if (dq) {
        memset(dq, 0, (size_t)(Tq * Hq * D) * sizeof(double));
        memset(dk, 0, (size_t)(Tk * Hkv * D) * sizeof(double));
        memset(dv, 0, (size_t)(Tk * Hkv * D) * sizeof(double));
    }
    for (int h = 0; h < Hq; h++) {
        const int g = h / group;
        for (int64_t i = 0; i < Tq; i++) {
            const double *qi = q + (i * Hq + h) * D;
            double *oi = o + (i * Hq + h) * D, mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < Tk; j++) {
                p[j] = -INFINITY;
                if (kp[j] > qp[i] || (mask && !mask[(h * Tq + i) * Tk + j])) continue;
                double dot = 0;
                for (int d = 0; d < D; d++) dot += qi[d] * k[(j * Hkv + g) * D + d];
                p[j] = s->scale * dot;
                if (p[j] > mx) mx = p[j];
            }
            for (int d = 0; d < D; d++) oi[d] = 0;
            lse[h * Tq + i] = mx;
            if (mx == -INFINITY) continue;
            for (int64_t j = 0; j < Tk; j++) sum += exp(p[j] - mx);
            lse[h * Tq + i] = mx + log(sum);
            for (int64_t j = 0; j < Tk; j++) {
                p[j] = exp(p[j] - lse[h * Tq + i]);
                for (int d = 0; d < D; d++) oi[d] += p[j] * v[(j * Hkv + g) * D + d];
            }
            if (!dq) continue;
            const double *gi = dout + (i * Hq + h) * D;
            double delta = 0;
            for (int64_t j = 0; j < Tk; j++) {
                dp[j] = 0;
                for (int d = 0; d < D; d++) dp[j] += gi[d] * v[(j * Hkv + g) * D + d];
                delta += p[j] * dp[j];
            }
            for (int64_t j = 0; j < Tk; j++) {
                const double ds = p[j] * (dp[j] - delta);
                for (int d = 0; d < D; d++) {
                    dq[(i * Hq + h) * D + d] += s->scale * ds * k[(j * Hkv + g) * D + d];
                    dk[(j * Hkv + g) * D + d] += s->scale * ds * qi[d];
                    dv[(j * Hkv + g) * D + d] += p[j] * gi[d];
                }
            }
        }
    }
    free(p);
}

// The document mask of a problem with documents (p->s.doc_starts): [Hq, Tq,
// Tk], 1 where key j and query i lie in one document (as many starts at or
// before each position); NULL without documents. Causality is the reference's.
static unsigned char *doc_mask(const Problem *p) {
    const AttnShape *s = &p->s;
    if (!s->doc_starts) return NULL;
    const int64_t Tq = s->q_tokens, Tk = s->k_tokens;
    unsigned char *mask = xmalloc((size_t)(s->num_heads * Tq * Tk + 1));
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            int64_t di = 0, dj = 0;
            for (int64_t d = 0; d < s->doc_count; d++) {
                di += s->doc_starts[d] <= p->qp[i];
                dj += s->doc_starts[d] <= p->kp[j];
            }
            for (int h = 0; h < s->num_heads; h++) mask[(h * Tq + i) * Tk + j] = di == dj;
        }
    return mask;
}

// max |a - b| / max |b|; infinite when a and b disagree on which entries are -inf.
static double rel_err(const float *a, const double *b, int64_t n) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(b[i]) || isinf(a[i])) {
            if ((double)a[i] != b[i]) return INFINITY;
            continue;
        }
        double d = fabs(a[i] - b[i]);
        if (d > diff || d != d) diff = d;
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    }
    return diff / (scale + 1e-30);
}

#endif
