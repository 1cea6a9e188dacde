// test_attention.c: the CPU flash attention (attention/kernels/flash_cpu.c) against a
// naive double-precision reference (full masked softmax and its analytic
// gradients), over shapes, block sizes, GQA ratios, key chunks, arbitrary
// positions, finite differences, thread counts and rows that see no key;
// and the ring of one (attention/ring/ring.h: ring_init without a communicator,
// as every one-rank op runs it): bit for bit the kernels on the whole
// sequence, one step on the caller's own K/V, the column pass's gather
// once per pass and its home once per backward, and no MPI call (this program
// never initialises MPI); the CPU op (attention/attention_api.h) on the
// ring of one that attention_cpu_set_ring makes without a communicator
// (ring_cpu_new): bit for bit the kernels on the whole
// sequence, dense and sparse (its plan's statistics too), no bytes sent; and
// its cached call (new queries against more keys) bit for bit the kernel.
//
// Tolerances: max |kernel - reference| / max |reference| per tensor, with fp32
// kernels against a double reference: 1e-5 for O and LSE, 1e-4 for dQ, dK, dV.
// Finite differences (double, central, eps 1e-5) must match the double
// analytic gradients to 1e-6 and the kernel's to 1e-4.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/attention.h"
#include "../../attention/attention_api.h"
#include "../../attention/ring/ring_cpu.h"
#include "../../attention/sparse/sparse_plan.h"
#include "../../dist/util.h"
#include "attn_ref.h"
#include "../lib/check.h"

#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4

// Kernel forward over key chunks [cuts[c], cuts[c + 1]), visited in `order`.
static void kernel_forward(const Problem *p, int nchunks, const int64_t *cuts, const int *order,
                           float *o, float *lse) {
    attn_forward_init(&p->s, o, lse);
    for (int c = 0; c < nchunks; c++) {
        const int64_t a = cuts[order[c]], b = cuts[order[c] + 1];
        const int64_t off = a * p->s.num_kv_heads * p->s.head_dim;
        AttnShape cs = p->s;
        cs.k_tokens = b - a;
        attn_dense_forward_cpu(&cs, p->q, p->qp, p->k + off, p->v + off, p->kp + a, o, lse);
    }
}

// Kernel backward of loss = sum(o * w) over the same chunks; dq, dk, dv are zeroed first.
static void kernel_backward(const Problem *p, int nchunks, const int64_t *cuts, const int *order,
                            const float *o, const float *lse, float *dq, float *dk, float *dv) {
    float *delta = xmalloc((size_t)p->nl * sizeof(float));
    attn_backward_delta(&p->s, o, p->w, delta);
    memset(dq, 0, (size_t)p->nq * sizeof(float));
    memset(dk, 0, (size_t)p->nk * sizeof(float));
    memset(dv, 0, (size_t)p->nk * sizeof(float));
    for (int c = 0; c < nchunks; c++) {
        const int64_t a = cuts[order[c]], b = cuts[order[c] + 1];
        const int64_t off = a * p->s.num_kv_heads * p->s.head_dim;
        AttnShape cs = p->s;
        cs.k_tokens = b - a;
        attn_dense_backward_cpu(&cs, p->q, p->qp, p->k + off, p->v + off, p->kp + a, lse, delta,
                                p->w, dq, dk + off, dv + off);
    }
    free(delta);
}

// Kernel against reference: err = {o, lse, dq, dk, dv} relative errors
// (gradients only when grads is set).
static void compare(const Problem *p, int nchunks, const int64_t *cuts, const int *order,
                    int grads, double err[5]) {
    double *q = to_double(p->q, p->nq), *k = to_double(p->k, p->nk);
    double *v = to_double(p->v, p->nk), *w = to_double(p->w, p->nq);
    double *ro = xmalloc((size_t)(2 * p->nq + 2 * p->nk + p->nl) * sizeof(double));
    double *rdq = ro + p->nq, *rdk = rdq + p->nq, *rdv = rdk + p->nk, *rlse = rdv + p->nk;
    float *o = xmalloc((size_t)(2 * p->nq + 2 * p->nk + p->nl) * sizeof(float));
    float *dq = o + p->nq, *dk = dq + p->nq, *dv = dk + p->nk, *lse = dv + p->nk;
    unsigned char *mask = doc_mask(p);
    reference(&p->s, mask, q, p->qp, k, v, p->kp, w, ro, rlse, grads ? rdq : NULL, rdk, rdv);
    kernel_forward(p, nchunks, cuts, order, o, lse);
    err[0] = rel_err(o, ro, p->nq);
    err[1] = rel_err(lse, rlse, p->nl);
    err[2] = err[3] = err[4] = 0;
    if (grads) {
        kernel_backward(p, nchunks, cuts, order, o, lse, dq, dk, dv);
        err[2] = rel_err(dq, rdq, p->nq);
        err[3] = rel_err(dk, rdk, p->nk);
        err[4] = rel_err(dv, rdv, p->nk);
    }
    free(q); free(k); free(v); free(w); free(ro); free(o); free(mask);
}

static const int ORDER[] = {0, 1, 2, 3};

// Forward O and LSE over T x block x GQA x head_dim, all keys in one chunk.
static void test_forward_shapes(void) {
    const int64_t Ts[] = {1, 7, 64, 100, 257};
    const int blocks[] = {1, 16, 64}, ratios[] = {1, 2, 4}, dims[] = {8, 32, 64};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 3; b++)
            for (int r = 0; r < 3; r++) {
                double worst_o = 0, worst_lse = 0;
                for (int d = 0; d < 3; d++) {
                    Problem p = make_problem(Ts[a], Ts[a], 2 * ratios[r], 2, dims[d], blocks[b],
                                             1000 + 100 * a + 10 * b + r + 3 * d);
                    int64_t cuts[] = {0, Ts[a]};
                    double err[5];
                    compare(&p, 1, cuts, ORDER, 0, err);
                    worst_o = fmax(worst_o, err[0]);
                    worst_lse = fmax(worst_lse, err[1]);
                    free_problem(&p);
                }
                EXPECT(worst_o < TOL_FWD && worst_lse < TOL_FWD,
                       "forward T=%ld block=%d gqa=%d D=8,32,64 (o %.1e, lse %.1e)",
                       (long)Ts[a], blocks[b], ratios[r], worst_o, worst_lse);
            }
}

// Gradients against the analytic reference, all keys in one chunk.
static void test_backward_shapes(void) {
    const int64_t Ts[] = {7, 100};
    const int blocks[] = {1, 16, 64}, ratios[] = {1, 2, 4};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int r = 0; r < 3; r++) {
                Problem p = make_problem(Ts[a], Ts[a], 2 * ratios[r], 2, 32, blocks[b],
                                         2000 + 100 * a + 10 * b + r);
                int64_t cuts[] = {0, Ts[a]};
                double err[5];
                compare(&p, 1, cuts, ORDER, 1, err);
                EXPECT(err[0] < TOL_FWD && err[2] < TOL_GRAD && err[3] < TOL_GRAD &&
                       err[4] < TOL_GRAD,
                       "backward T=%ld block=%d gqa=%d D=32 (dq %.1e, dk %.1e, dv %.1e)",
                       (long)Ts[a], blocks[b], ratios[r], err[2], err[3], err[4]);
                free_problem(&p);
            }
    const int dims[] = {24, 128};
    for (int d = 0; d < 2; d++) {
        Problem p = make_problem(77, 77, 4, 1, dims[d], 32, 2500 + d);
        int64_t cuts[] = {0, 77};
        double err[5];
        compare(&p, 1, cuts, ORDER, 1, err);
        EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD &&
               err[3] < TOL_GRAD && err[4] < TOL_GRAD,
               "forward+backward T=77 block=32 gqa=4 D=%d (o %.1e, dq %.1e, dk %.1e, dv %.1e)",
               dims[d], err[0], err[2], err[3], err[4]);
        free_problem(&p);
    }
}

// Keys in 3 chunks (the last entirely after every query; in the middle one,
// early queries see nothing), in order and shuffled, against the reference
// and against a single call.
static void test_chunks(void) {
    Problem p = make_problem(100, 150, 4, 2, 32, 16, 3000);
    const int64_t cuts[] = {0, 40, 100, 150}, whole[] = {0, 150};
    const int shuffled[] = {2, 0, 1};
    double err[5];
    compare(&p, 3, cuts, ORDER, 1, err);
    EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD, "chunks in order: forward (o %.1e, lse %.1e)",
           err[0], err[1]);
    EXPECT(err[2] < TOL_GRAD && err[3] < TOL_GRAD && err[4] < TOL_GRAD,
           "chunks in order: backward (dq %.1e, dk %.1e, dv %.1e)", err[2], err[3], err[4]);
    compare(&p, 3, cuts, shuffled, 1, err);
    EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD && err[3] < TOL_GRAD &&
           err[4] < TOL_GRAD, "chunks in order 2,0,1: forward and backward (o %.1e, dq %.1e)",
           err[0], err[2]);

    float *o1 = xmalloc((size_t)(2 * p.nq + 2 * p.nl) * sizeof(float));
    float *o3 = o1 + p.nq, *l1 = o3 + p.nq, *l3 = l1 + p.nl;
    kernel_forward(&p, 1, whole, ORDER, o1, l1);
    kernel_forward(&p, 3, cuts, ORDER, o3, l3);
    EXPECT(max_rel_diff(o3, o1, p.nq) < TOL_FWD && max_rel_diff(l3, l1, p.nl) < TOL_FWD,
           "3 chunks equal one call (o %.1e, lse %.1e)", max_rel_diff(o3, o1, p.nq),
           max_rel_diff(l3, l1, p.nl));
    free(o1);
    free_problem(&p);
}

// Striped queries (blocks 0, 2, 4, ... of 16 tokens of a 256-token sequence)
// against all 256 keys stored in a random order, tiles not aligned with stripes.
static void test_striped(void) {
    const int blocks[] = {16, 24};
    for (int b = 0; b < 2; b++) {
        Problem p = make_problem(128, 256, 4, 2, 32, blocks[b], 4000 + b);
        Rng rng; rng_seed(&rng, 77 + b);
        for (int64_t t = 0; t < 128; t++) p.qp[t] = (t / 16) * 32 + t % 16;
        for (int64_t t = 255; t > 0; t--) {
            int64_t u = (int64_t)rng_below(&rng, (uint64_t)t + 1), tmp = p.kp[t];
            p.kp[t] = p.kp[u]; p.kp[u] = tmp;
        }
        const int64_t whole[] = {0, 256}, cuts[] = {0, 100, 256};
        double err[5], errc[5];
        compare(&p, 1, whole, ORDER, 1, err);
        compare(&p, 2, cuts, ORDER, 1, errc);
        for (int e = 0; e < 5; e++) err[e] = fmax(err[e], errc[e]);
        EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD,
               "striped queries, shuffled keys, block=%d, 1 and 2 chunks: forward "
               "(o %.1e, lse %.1e)", blocks[b], err[0], err[1]);
        EXPECT(err[2] < TOL_GRAD && err[3] < TOL_GRAD && err[4] < TOL_GRAD,
               "striped queries, shuffled keys, block=%d, 1 and 2 chunks: backward "
               "(dq %.1e, dk %.1e, dv %.1e)", blocks[b], err[2], err[3], err[4]);
        free_problem(&p);
    }
}

// loss = sum(o * w) through the double reference forward.
static double ref_loss(const Problem *p, const double *q, const double *k, const double *v,
                       const double *w) {
    double *o = xmalloc((size_t)(p->nq + p->nl) * sizeof(double)), *lse = o + p->nq, loss = 0;
    reference(&p->s, NULL, q, p->qp, k, v, p->kp, NULL, o, lse, NULL, NULL, NULL);
    for (int64_t i = 0; i < p->nq; i++) loss += o[i] * w[i];
    free(o);
    return loss;
}

// Central finite differences of a few elements of q, k and v.
static void test_finite_differences(void) {
    Problem p = make_problem(12, 12, 4, 2, 8, 4, 5000);
    for (int64_t t = 0; t < 12; t++) p.qp[t] = p.kp[t] = 3 * t;   // gaps between positions
    const int64_t cuts[] = {0, 5, 12};
    double *q = to_double(p.q, p.nq), *k = to_double(p.k, p.nk);
    double *v = to_double(p.v, p.nk), *w = to_double(p.w, p.nq);
    double *ro = xmalloc((size_t)(2 * p.nq + 2 * p.nk + p.nl) * sizeof(double));
    double *rdq = ro + p.nq, *rdk = rdq + p.nq, *rdv = rdk + p.nk, *rlse = rdv + p.nk;
    float *o = xmalloc((size_t)(2 * p.nq + 2 * p.nk + p.nl) * sizeof(float));
    float *dq = o + p.nq, *dk = dq + p.nq, *dv = dk + p.nk, *lse = dv + p.nk;
    reference(&p.s, NULL, q, p.qp, k, v, p.kp, w, ro, rlse, rdq, rdk, rdv);
    kernel_forward(&p, 2, cuts, ORDER, o, lse);
    kernel_backward(&p, 2, cuts, ORDER, o, lse, dq, dk, dv);

    const char *names[] = {"q", "k", "v"};
    double *xs[] = {q, k, v}, *refs[] = {rdq, rdk, rdv};
    const float *kern[] = {dq, dk, dv};
    const int64_t ns[] = {p.nq, p.nk, p.nk};
    Rng rng; rng_seed(&rng, 5001);
    for (int t = 0; t < 3; t++) {
        double gmax = 0, err_ref = 0, err_kern = 0;
        for (int64_t i = 0; i < ns[t]; i++) gmax = fmax(gmax, fabs(refs[t][i]));
        for (int n = 0; n < 6; n++) {
            const int64_t i = (int64_t)rng_below(&rng, (uint64_t)ns[t]);
            const double x0 = xs[t][i], eps = 1e-5;
            xs[t][i] = x0 + eps;
            const double up = ref_loss(&p, q, k, v, w);
            xs[t][i] = x0 - eps;
            const double down = ref_loss(&p, q, k, v, w);
            xs[t][i] = x0;
            const double fd = (up - down) / (2 * eps);
            err_ref = fmax(err_ref, fabs(fd - refs[t][i]) / gmax);
            err_kern = fmax(err_kern, fabs(fd - kern[t][i]) / gmax);
        }
        EXPECT(err_ref < 1e-6 && err_kern < TOL_GRAD,
               "finite differences d%s: reference %.1e, kernel %.1e", names[t], err_ref, err_kern);
    }
    free(q); free(k); free(v); free(w); free(ro); free(o);
    free_problem(&p);
}

// Forward and backward with 1, 2 and 3 threads are bitwise equal.
static void test_determinism(void) {
    Problem p = make_problem(257, 257, 4, 2, 32, 16, 6000);
    const int64_t cuts[] = {0, 100, 257};
    const int64_t n = 2 * p.nq + 2 * p.nk + p.nl;
    float *runs[3];
    const int saved = omp_get_max_threads();
    for (int r = 0; r < 3; r++) {
        float *o = runs[r] = xmalloc((size_t)n * sizeof(float));
        float *dq = o + p.nq, *dk = dq + p.nq, *dv = dk + p.nk, *lse = dv + p.nk;
        omp_set_num_threads(r + 1);
        kernel_forward(&p, 2, cuts, ORDER, o, lse);
        kernel_backward(&p, 2, cuts, ORDER, o, lse, dq, dk, dv);
    }
    omp_set_num_threads(saved);
    EXPECT(memcmp(runs[0], runs[1], (size_t)n * sizeof(float)) == 0 &&
           memcmp(runs[0], runs[2], (size_t)n * sizeof(float)) == 0,
           "o, lse, dq, dk, dv bitwise equal with 1, 2 and 3 threads");
    for (int r = 0; r < 3; r++) free(runs[r]);
    free_problem(&p);
}

// Rows that see no key of a chunk keep their (o, lse) bit for bit; rows that
// never see a key keep lse = -inf, o = 0 and get no gradient.
static void test_untouched_rows(void) {
    Problem p = make_problem(40, 40, 4, 2, 16, 16, 7000);
    for (int64_t t = 0; t < 40; t++) p.kp[t] = 20 + t;         // queries 0..19 see nothing
    Rng rng; rng_seed(&rng, 7001);
    float *o = xmalloc((size_t)(2 * p.nq + 2 * p.nl) * sizeof(float));
    float *o0 = o + p.nq, *lse = o0 + p.nq, *lse0 = lse + p.nl;
    for (int64_t i = 0; i < p.nq; i++) o0[i] = (float)rng_normal(&rng);
    for (int64_t i = 0; i < p.nl; i++) lse0[i] = (float)rng_normal(&rng);
    memcpy(o, o0, (size_t)p.nq * sizeof(float));
    memcpy(lse, lse0, (size_t)p.nl * sizeof(float));
    attn_dense_forward_cpu(&p.s, p.q, p.qp, p.k, p.v, p.kp, o, lse);
    const int64_t row = (int64_t)p.s.num_heads * p.s.head_dim;
    int same = 1, changed = 1;
    for (int64_t t = 0; t < 40; t++) {
        int eq = memcmp(o + t * row, o0 + t * row, (size_t)row * sizeof(float)) == 0;
        for (int h = 0; h < p.s.num_heads; h++) eq &= lse[h * 40 + t] == lse0[h * 40 + t];
        if (t < 20) same &= eq; else changed &= !eq;
    }
    EXPECT(same && changed, "rows without a visible key unchanged, the others updated");
    AttnShape empty = p.s;
    empty.k_tokens = 0;
    memcpy(o0, o, (size_t)p.nq * sizeof(float));
    memcpy(lse0, lse, (size_t)p.nl * sizeof(float));
    attn_dense_forward_cpu(&empty, p.q, p.qp, p.k, p.v, p.kp, o, lse);
    EXPECT(memcmp(o, o0, (size_t)p.nq * sizeof(float)) == 0 &&
           memcmp(lse, lse0, (size_t)p.nl * sizeof(float)) == 0,
           "an empty key chunk changes nothing");

    const int64_t cuts[] = {0, 40};
    double err[5];
    compare(&p, 1, cuts, ORDER, 1, err);
    EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD && err[3] < TOL_GRAD &&
           err[4] < TOL_GRAD, "half the rows never see a key: lse -inf and gradients match "
           "(o %.1e, lse %.1e, dq %.1e)", err[0], err[1], err[2]);

    // A chunk entirely in the future: nothing changes, no gradient, no NaN.
    for (int64_t t = 0; t < 40; t++) p.kp[t] = 100 + t;
    float *dq = xmalloc((size_t)(p.nq + 2 * p.nk) * sizeof(float));
    float *dk = dq + p.nq, *dv = dk + p.nk;
    attn_forward_init(&p.s, o, lse);
    attn_dense_forward_cpu(&p.s, p.q, p.qp, p.k, p.v, p.kp, o, lse);
    kernel_backward(&p, 1, cuts, ORDER, o, lse, dq, dk, dv);
    int clean = 1;
    for (int64_t i = 0; i < p.nq; i++) clean &= o[i] == 0.0f && dq[i] == 0.0f;
    for (int64_t i = 0; i < p.nk; i++) clean &= dk[i] == 0.0f && dv[i] == 0.0f;
    for (int64_t i = 0; i < p.nl; i++) clean &= lse[i] == -INFINITY;
    EXPECT(clean, "chunk in the future of every query: o 0, lse -inf, zero gradients");
    free(o); free(dq);
    free_problem(&p);
}

// Documents (AttnShape.doc_starts): position 0 continuing a document, starts
// on and off tile boundaries, one-token documents (17, 41, the last token),
// a document crossing several tiles; positions 0.. and the striped layout
// (ranks' queries against all keys), one and three key chunks, block 16.
static void test_documents(void) {
    static const int64_t starts[] = {5, 16, 17, 18, 40, 41, 42, 100, 149};
    const int64_t cuts[] = {0, 33, 97, 150};
    static const int order[] = {2, 0, 1};
    for (int striped = 0; striped < 2; striped++)
        for (int chunked = 0; chunked < 2; chunked++) {
            Problem p = make_problem(150, 150, 4, 2, 32, 16, 9000 + 2 * striped + chunked);
            p.s.doc_starts = starts;
            p.s.doc_count = (int64_t)(sizeof starts / sizeof starts[0]);
            if (striped) {
                p.s.q_tokens = layout_rank_positions(LAYOUT_STRIPED, 150, 16, 3, 1, p.qp);
                p.nq = p.s.q_tokens * 4 * 32; p.nl = 4 * p.s.q_tokens;
            }
            const int64_t one[] = {0, 150};
            double err[5];
            compare(&p, chunked ? 3 : 1, chunked ? cuts : one, chunked ? order : ORDER, 1, err);
            EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD &&
                   err[3] < TOL_GRAD && err[4] < TOL_GRAD,
                   "documents, %s queries, %d key chunk(s): o %.1e lse %.1e dq %.1e dk %.1e dv %.1e",
                   striped ? "striped" : "all", chunked ? 3 : 1, err[0], err[1], err[2], err[3],
                   err[4]);
            free_problem(&p);
        }
}

// The dense kernels of a ring, counting their calls and checking where they read.
typedef struct {
    const float *k, *v, *dk, *dv;  // the caller's own K/V and dK/dV
    int steps, gathers, backward_gathers, homes, foreign;
    int columns, columns_late;     // column passes; of them not right after the own step
} RingCounts;

static void counted_forward(void *ctx, const RingStep *step) {
    RingCounts *c = ctx;
    c->steps++;
    c->foreign += step->k != c->k || step->v != c->v;
    ring_dense_cpu.forward(NULL, step);
}

static void counted_backward(void *ctx, const RingStep *step) {
    RingCounts *c = ctx;
    c->steps++;
    c->foreign += step->k != c->k || step->v != c->v || step->grads.dk != c->dk || step->grads.dv != c->dv;
    ring_dense_cpu.backward(NULL, step);
}

// The column pass: right after the own chunk's step (the only step of a ring of one), on it.
static void counted_columns(void *ctx, const RingStep *own) {
    RingCounts *c = ctx;
    c->columns++;
    c->columns_late += c->steps != c->columns || own->k != c->k || own->v != c->v;
}

static void counted_gather(void *ctx, const struct Ring *ring, const AttnShape *shape, bool backward, const void *k,
                           const void *v) {
    RingCounts *c = ctx;
    (void)ring, (void)shape;
    c->gathers++;
    c->backward_gathers += backward;
    c->foreign += k != c->k || v != c->v;
}

static void counted_home(void *ctx, const struct Ring *ring, const AttnShape *shape, float *dk, float *dv) {
    RingCounts *c = ctx;
    (void)ring, (void)shape;
    c->homes++;
    c->foreign += dk != c->dk || dv != c->dv;
}

// The ring-of-one tests' problem: 130 tokens in 3 documents, block 16.
static Problem documents_problem(uint64_t seed) {
    static const int64_t starts[] = {0, 40, 77};
    Problem p = make_problem(130, 130, 4, 2, 32, 16, seed);
    p.s.doc_starts = starts;
    p.s.doc_count = 3;
    return p;
}

static void test_ring_of_one(void) {
    Problem p = documents_problem(9100);
    const int64_t one[] = {0, 130};
    const int64_t n = 2 * p.nq + 2 * p.nk + p.nl;
    float *want = xmalloc((size_t)n * sizeof(float)), *got = xcalloc((size_t)n, sizeof(float));
    float *o = want, *dq = o + p.nq, *dk = dq + p.nq, *dv = dk + p.nk, *lse = dv + p.nk;
    kernel_forward(&p, 1, one, ORDER, o, lse);
    kernel_backward(&p, 1, one, ORDER, o, lse, dq, dk, dv);
    o = got, dq = o + p.nq, dk = dq + p.nq, dv = dk + p.nk, lse = dv + p.nk;
    RingCounts c = {.k = p.k, .v = p.v, .dk = dk, .dv = dv};
    const RingKernels kernels = {.forward = counted_forward, .backward = counted_backward,
                                 .columns_gather = counted_gather, .columns_forward = counted_columns,
                                 .columns_backward = counted_columns, .columns_home = counted_home, .ctx = &c};
    Ring ring;
    ring_init(&ring, NULL, 1, p.qp, 130);
    const RingTensors forward = {.q = p.q, .k = p.k, .v = p.v, .out = {.o = o, .lse = lse}};
    const RingTensors backward = {.q = p.q, .k = p.k, .v = p.v, .o = o, .dout = p.w,
                                  .grads = {.lse = lse, .dq = dq, .dk = dk, .dv = dv}};
    ring_attn_forward(&ring, &kernels, &p.s, &forward);
    ring_attn_backward(&ring, &kernels, &p.s, &backward);
    ring_free(&ring);
    EXPECT(memcmp(want, got, (size_t)n * sizeof(float)) == 0,
           "ring of one: o, lse, dq, dk, dv bitwise equal to the kernels on the whole sequence (documents)");
    EXPECT(c.columns == 2 && c.columns_late == 0, "ring of one: the column pass once per pass, right after the own "
           "step, on it (%d passes, %d elsewhere)", c.columns, c.columns_late);
    EXPECT(c.steps == 2 && c.gathers == 2 && c.backward_gathers == 1 && c.homes == 1 && c.foreign == 0,
           "ring of one: one step per pass on the caller's K/V and dK/dV in place, the columns gathered per "
           "pass and sent home once (steps %d, gathers %d of which backward %d, homes %d, other buffers %d)",
           c.steps, c.gathers, c.backward_gathers, c.homes, c.foreign);
    free(want);
    free(got);
    free_problem(&p);
}

// The sparse kernels on the whole sequence over the index of sparse_plan_local
// (one layer of cfg), as kernel_forward and kernel_backward run the dense ones.
static void sparse_whole(const Problem *p, const AttentionConfig *cfg, float *o, float *lse, float *dq, float *dk,
                         float *dv, SparseStats *stats) {
    int *vertical, *slash;
    sparse_budget_tables(cfg, 1, p->s.num_heads, &vertical, &slash);
    SparseIndex index = {0};
    sparse_plan_local(&(SparsePlanCall){.cfg = cfg, .shape = &p->s, .q = p->q, .k = p->k, .fixed_vertical = vertical,
                                       .fixed_slash = slash, .stats = stats}, p->qp, &index);
    attn_forward_init(&p->s, o, lse);
    attn_sparse_forward_cpu(&p->s, &index, p->q, p->qp, p->k, p->v, p->kp, o, lse);
    float *delta = xmalloc((size_t)p->nl * sizeof(float));
    attn_backward_delta(&p->s, o, p->w, delta);
    attn_sparse_backward_cpu(&p->s, &index, p->q, p->qp, p->k, p->v, p->kp, lse, delta, p->w, dq, dk, dv);
    sparse_index_free(&index);
    free(delta); free(vertical); free(slash);
}

// The CPU op on ring_cpu_new's ring of one against the kernels on the whole
// sequence (documents): o, lse, dq, dk, dv and the sparse plan's statistics
// bit for bit, dense and sparse (budget fixed: a pattern that leaves blocks out).
static void test_op_ring_of_one(void) {
    Problem p = documents_problem(9200);
    const int64_t one[] = {0, 130};
    const int64_t n = 2 * p.nq + 2 * p.nk + p.nl;
    for (int sparse = 0; sparse < 2; sparse++) {
        const AttentionConfig cfg = {.type = sparse ? ATTN_SPARSE : ATTN_DENSE, .block_size = 16, .last_q = 16,
                                     .top_p = 0.9, .max_vertical = 8, .max_slash = 8, .sink = 4, .local = 8,
                                     .budget = BUDGET_FIXED, .vertical = 2, .slash = 2};
        float *want = xcalloc((size_t)n, sizeof(float)), *got = xcalloc((size_t)n, sizeof(float));
        float *o = want, *dq = o + p.nq, *dk = dq + p.nq, *dv = dk + p.nk, *lse = dv + p.nk;
        SparseStats want_stats = {0}, got_stats = {0};
        if (sparse) {
            sparse_whole(&p, &cfg, o, lse, dq, dk, dv, &want_stats);
        } else {
            kernel_forward(&p, 1, one, ORDER, o, lse);
            kernel_backward(&p, 1, one, ORDER, o, lse, dq, dk, dv);
        }
        o = got, dq = o + p.nq, dk = dq + p.nq, dv = dk + p.nk, lse = dv + p.nk;
        AttnState *st = attention_cpu_new(&cfg, 1, p.s.num_heads);
        const bool on_ring = attention_cpu_set_ring(st, NULL, 1);
        attention_cpu_sequence(st, p.qp, 130);
        attention_cpu_forward(st, 0, true, &p.s, p.q, p.k, p.v, p.qp, o, lse, sparse ? &got_stats : NULL);
        attention_cpu_backward(st, 0, &p.s, p.q, p.k, p.v, p.qp, o, lse, p.w, dq, dk, dv);
        const double bytes = attention_cpu_ring_bytes(st);
        attention_cpu_free(st);
        EXPECT(memcmp(want, got, (size_t)n * sizeof(float)) == 0 &&
               memcmp(&want_stats, &got_stats, sizeof(SparseStats)) == 0,
               "CPU op on a ring of one, %s: o, lse, dq, dk, dv%s bitwise equal to the kernels on the whole "
               "sequence (documents)", sparse ? "sparse" : "dense", sparse ? " and the plan's statistics" : "");
        EXPECT(!on_ring && bytes == 0, "CPU op on a ring of one, %s: not a ring (%d), no bytes sent (%g)",
               sparse ? "sparse" : "dense", on_ring, bytes);
        if (sparse)
            EXPECT(want_stats.computed < want_stats.causal, "CPU op on a ring of one, sparse: the pattern leaves "
                   "pairs out (computed %g of %g causal)", want_stats.computed, want_stats.causal);
        free(want);
        free(got);
    }
    free_problem(&p);
}

// The decode's cached call (attention_cpu_cached): 24 new queries at the
// last positions of 90 keys, through a ring of one over the keys, bit for
// bit the dense kernel on them (queries at keys' positions 0..23 would see
// fewer keys).
static void test_op_cached(void) {
    Problem p = make_problem(24, 90, 4, 2, 32, 16, 9300);
    for (int64_t t = 0; t < 24; t++) p.qp[t] = 90 - 24 + t;
    const int64_t n = p.nq + p.nl;
    float *want = xcalloc((size_t)n, sizeof(float)), *got = xcalloc((size_t)n, sizeof(float));
    attn_forward_init(&p.s, want, want + p.nq);
    attn_dense_forward_cpu(&p.s, p.q, p.qp, p.k, p.v, p.kp, want, want + p.nq);
    const AttentionConfig cfg = {.type = ATTN_DENSE, .block_size = 16};
    AttnState *st = attention_cpu_new(&cfg, 1, p.s.num_heads);
    attention_cpu_cached(st, &p.s, p.q, p.qp, p.k, p.v, p.kp, got, got + p.nq);
    attention_cpu_free(st);
    EXPECT(memcmp(want, got, (size_t)n * sizeof(float)) == 0, "CPU op's cached call: o, lse of 24 queries at "
           "positions 66..89 against 90 keys bitwise equal to the dense kernel");
    free(want);
    free(got);
    free_problem(&p);
}

int main(void) {
    test_forward_shapes();
    test_backward_shapes();
    test_chunks();
    test_striped();
    test_finite_differences();
    test_determinism();
    test_untouched_rows();
    test_documents();
    test_ring_of_one();
    test_op_ring_of_one();
    test_op_cached();
    return check_exit();
}
