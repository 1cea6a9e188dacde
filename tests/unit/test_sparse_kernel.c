// test_sparse_kernel.c: the sparse CPU flash attention
// (attention/kernels/sparse_flash_cpu.c) on random valid indices (random key blocks
// per row including the diagonal, random extra columns outside them) against
// the double-precision masked reference of attn_ref.h applying exactly the
// index's mask; the "all causal blocks" index against the dense kernel; key
// chunks of a striped layout (and striped query blocks) against one chunk;
// rows without a key in a chunk left untouched; o poisoned with NaN where it
// must be fully written; thread-count independence.
//
// Tolerances, as test_attention.c: max |kernel - reference| / max |reference|
// per tensor, 1e-5 for O and LSE and 1e-4 for dQ, dK, dV (fp32 against
// double); the kernel against itself (other chunking, the dense kernel with
// the same tile order) within 1e-6.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/layout.h"
#include "../../attention/sparse/sparse.h"
#include "../../dist/util.h"
#include "attn_ref.h"
#include "../lib/check.h"

#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4
#define TOL_SAME 1e-6

// A random valid index over the query blocks q_blocks [nqb] of a sequence of
// N tokens: per row the diagonal block, each earlier block with probability
// pb, and each key position up to the row's last query and outside the row's
// blocks with probability pc (pb = 1, pc = 0: dense causal).
static SparseIndex random_index(Rng *rng, int Hq, int B, int64_t N, const int64_t *q_blocks,
                                int64_t nqb, double pb, double pc) {
    const int64_t rows = Hq * nqb, nblocks = (N + B - 1) / B;
    SparseIndex x = {Hq, B, N, nqb, xmalloc((size_t)nqb * sizeof(int64_t)),
                     xmalloc((size_t)(rows + 1) * sizeof(int64_t)),
                     xmalloc((size_t)(rows * nblocks + 1) * sizeof(int64_t)),
                     xmalloc((size_t)(rows + 1) * sizeof(int64_t)),
                     xmalloc((size_t)(rows * N + 1) * sizeof(int64_t))};
    memcpy(x.q_blocks, q_blocks, (size_t)nqb * sizeof(int64_t));
    x.block_start[0] = x.column_start[0] = 0;
    unsigned char *selected = xmalloc((size_t)nblocks);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t qb = q_blocks[r % nqb], last = (qb + 1) * B < N ? (qb + 1) * B - 1 : N - 1;
        int64_t nb = x.block_start[r], nc = x.column_start[r];
        for (int64_t b = 0; b <= qb; b++) {
            selected[b] = b == qb || rng_uniform(rng) < pb;
            if (selected[b]) x.blocks[nb++] = b;
        }
        for (int64_t c = 0; c <= last; c++)
            if (!selected[c / B] && rng_uniform(rng) < pc) x.columns[nc++] = c;
        x.block_start[r + 1] = nb;
        x.column_start[r + 1] = nc;
    }
    free(selected);
    return x;
}

// The index's mask for reference(): [Hq, Tq, Tk], 1 where key j lies in a
// selected block or is a column of query i's row (causality is the reference's).
static unsigned char *index_mask(const SparseIndex *x, const Problem *p) {
    const int64_t Tq = p->s.q_tokens, Tk = p->s.k_tokens;
    const int B = x->block_size;
    unsigned char *mask = xcalloc((size_t)(x->num_heads * Tq * Tk), 1);
    for (int h = 0; h < x->num_heads; h++)
        for (int64_t i = 0; i < Tq; i++) {
            const int64_t r = h * x->num_q_blocks + i / B;
            unsigned char *row = mask + (h * Tq + i) * Tk;
            for (int64_t j = 0; j < Tk; j++) {
                for (int64_t e = x->block_start[r]; e < x->block_start[r + 1]; e++)
                    row[j] |= x->blocks[e] == p->kp[j] / B;
                for (int64_t e = x->column_start[r]; e < x->column_start[r + 1]; e++)
                    row[j] |= x->columns[e] == p->kp[j];
            }
        }
    return mask;
}

// Key chunks: chunk c holds the keys at positions pos[start[c] .. start[c + 1])
// (positions index the problem's keys, which sit at positions 0 .. Tk - 1).
typedef struct {
    int n;
    int64_t start[5];
    int64_t *pos;
} Chunks;

// One chunk of all keys, or the W ranks' tokens of a layout.
static Chunks make_chunks(LayoutKind kind, int64_t N, int B, int W) {
    Chunks c = {.n = W, .pos = xmalloc((size_t)N * sizeof(int64_t))};
    c.start[0] = 0;
    for (int r = 0; r < W; r++)
        c.start[r + 1] = c.start[r] + layout_rank_positions(kind, N, B, W, r, c.pos + c.start[r]);
    return c;
}

// x [n, H, D] rows of the tensor src [*, H, D] at the positions pos [n].
static float *gather(const float *src, const int64_t *pos, int64_t n, int64_t row) {
    float *x = xmalloc((size_t)(n * row + 1) * sizeof(float));
    for (int64_t t = 0; t < n; t++) memcpy(x + t * row, src + pos[t] * row, (size_t)row * sizeof(float));
    return x;
}

// dk, dv [N, row] at positions pos [n] += gk, gv [n, row].
static void scatter_add(const int64_t *pos, int64_t n, int64_t row, const float *gk, const float *gv,
                        float *dk, float *dv) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < row; e++) {
            dk[pos[t] * row + e] += gk[t * row + e];
            dv[pos[t] * row + e] += gv[t * row + e];
        }
}

// The kernels over the chunks visited in `order` (NULL: 0, 1, ...): forward
// into (o, lse) as they are (no init), then, when dq != NULL, the backward of
// loss = sum(o * w) into zeroed dq, dk, dv (dk, dv scattered back to positions).
// dense: use the dense kernels instead (same chunks).
static void run_chunks(const Problem *p, const SparseIndex *x, const Chunks *c, const int *order,
                       int dense, float *o, float *lse, float *dq, float *dk, float *dv) {
    const int64_t row = (int64_t)p->s.num_kv_heads * p->s.head_dim;
    for (int pass = 0; pass < (dq ? 2 : 1); pass++) {
        float *delta = NULL;
        if (pass == 1) {
            delta = xmalloc((size_t)p->nl * sizeof(float));
            attn_backward_delta(&p->s, o, p->w, delta);
            memset(dq, 0, (size_t)p->nq * sizeof(float));
            memset(dk, 0, (size_t)p->nk * sizeof(float));
            memset(dv, 0, (size_t)p->nk * sizeof(float));
        }
        for (int ci = 0; ci < c->n; ci++) {
            const int ch = order ? order[ci] : ci;
            const int64_t *pos = c->pos + c->start[ch], n = c->start[ch + 1] - c->start[ch];
            AttnShape s = p->s;
            s.k_tokens = n;
            float *k = gather(p->k, pos, n, row), *v = gather(p->v, pos, n, row);
            if (pass == 0 && dense) attn_dense_forward_cpu(&s, p->q, p->qp, k, v, pos, o, lse);
            if (pass == 0 && !dense)
                attn_sparse_forward_cpu(&s, x, p->q, p->qp, k, v, pos, o, lse);
            if (pass == 1) {
                float *gk = xcalloc((size_t)(2 * n * row + 1), sizeof(float)), *gv = gk + n * row;
                if (dense)
                    attn_dense_backward_cpu(&s, p->q, p->qp, k, v, pos, lse, delta, p->w, dq, gk, gv);
                else
                    attn_sparse_backward_cpu(&s, x, p->q, p->qp, k, v, pos, lse, delta, p->w, dq,
                                             gk, gv);
                scatter_add(pos, n, row, gk, gv, dk, dv);
                free(gk);
            }
            free(k); free(v);
        }
        free(delta);
    }
}

// Result tensors of one run: o, dq [nq]; dk, dv [nk]; lse [nl].
typedef struct {
    float *o, *dq, *dk, *dv, *lse;
} Result;

// One allocation: free(r.o).
static Result result_alloc(const Problem *p) {
    Result r;
    r.o = xmalloc((size_t)(2 * p->nq + 2 * p->nk + p->nl) * sizeof(float));
    r.dq = r.o + p->nq; r.dk = r.dq + p->nq; r.dv = r.dk + p->nk; r.lse = r.dv + p->nk;
    return r;
}

// Forward from attn_forward_init and backward over the chunks.
static Result run(const Problem *p, const SparseIndex *x, const Chunks *c, const int *order,
                  int dense) {
    Result r = result_alloc(p);
    attn_forward_init(&p->s, r.o, r.lse);
    run_chunks(p, x, c, order, dense, r.o, r.lse, r.dq, r.dk, r.dv);
    return r;
}

// err = {o, lse, dq, dk, dv} of a result against the masked double reference.
static void against_reference(const Problem *p, const SparseIndex *x, const Result *r,
                              double err[5]) {
    double *q = to_double(p->q, p->nq), *k = to_double(p->k, p->nk);
    double *v = to_double(p->v, p->nk), *w = to_double(p->w, p->nq);
    double *ro = xmalloc((size_t)(2 * p->nq + 2 * p->nk + p->nl) * sizeof(double));
    double *rdq = ro + p->nq, *rdk = rdq + p->nq, *rdv = rdk + p->nk, *rlse = rdv + p->nk;
    unsigned char *mask = index_mask(x, p), *docs = doc_mask(p);
    if (docs)
        for (int64_t e = 0; e < p->nl * p->s.k_tokens; e++) mask[e] &= docs[e];
    free(docs);
    reference(&p->s, mask, q, p->qp, k, v, p->kp, w, ro, rlse, rdq, rdk, rdv);
    err[0] = rel_err(r->o, ro, p->nq);
    err[1] = rel_err(r->lse, rlse, p->nl);
    err[2] = rel_err(r->dq, rdq, p->nq);
    err[3] = rel_err(r->dk, rdk, p->nk);
    err[4] = rel_err(r->dv, rdv, p->nk);
    free(q); free(k); free(v); free(w); free(ro); free(mask);
}

// Largest max_rel_diff over the five tensors of two results.
static double result_diff(const Problem *p, const Result *a, const Result *b) {
    const double d[] = {max_rel_diff(a->o, b->o, p->nq), max_rel_diff(a->lse, b->lse, p->nl),
                        max_rel_diff(a->dq, b->dq, p->nq), max_rel_diff(a->dk, b->dk, p->nk),
                        max_rel_diff(a->dv, b->dv, p->nk)};
    double m = 0;
    for (int i = 0; i < 5; i++) m = d[i] > m || d[i] != d[i] ? d[i] : m;
    return m;
}

// A problem of N keys and the queries of every block (W = 0) or of rank
// `rank` of a striped layout over W ranks, with a random index (pb, pc).
typedef struct {
    Problem p;
    SparseIndex x;
} Case;

static Case make_case(int64_t N, int B, int Hq, int Hkv, int D, int W, int rank, double pb,
                      double pc, uint64_t seed) {
    const int64_t Tq = W ? layout_rank_positions(LAYOUT_STRIPED, N, B, W, rank, NULL) : N;
    Case c = {.p = make_problem(Tq, N, Hq, Hkv, D, B, seed)};
    int64_t nqb = (N + B - 1) / B, *qb = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) qb[i] = i;
    if (W) {
        layout_rank_positions(LAYOUT_STRIPED, N, B, W, rank, c.p.qp);
        nqb = layout_rank_blocks(LAYOUT_STRIPED, N, B, W, rank, qb);
    }
    Rng rng; rng_seed(&rng, seed + 1);
    c.x = random_index(&rng, Hq, B, N, qb, nqb, pb, pc);
    free(qb);
    return c;
}

static void free_case(Case *c) {
    sparse_index_free(&c->x);
    free_problem(&c->p);
}

// Forward and backward against the reference over lengths that B does not
// divide, B in {4, 16, 64}, GQA 1/2/4 and D in {8, 32, 64}, one key chunk.
static void test_random_indices(void) {
    const int64_t Ns[] = {77, 150, 300};
    const int blocks[] = {4, 16, 64}, ratios[] = {1, 2, 4}, dims[] = {8, 32, 64};
    for (int a = 0; a < 3; a++)
        for (int r = 0; r < 3; r++) {
            double worst[5] = {0};
            for (int d = 0; d < 3; d++) {
                const int64_t N = Ns[a];
                const int B = blocks[a], Hq = 2 * ratios[r];
                Case cs = make_case(N, B, Hq, 2, dims[d], 0, 0, 0.3, 0.15, 100 + 10 * a + 3 * r + d);
                const Problem p = cs.p;
                const SparseIndex x = cs.x;
                Chunks c = make_chunks(LAYOUT_CONTIGUOUS, N, B, 1);
                Result res = run(&p, &x, &c, NULL, 0);
                double err[5];
                against_reference(&p, &x, &res, err);
                for (int e = 0; e < 5; e++) worst[e] = fmax(worst[e], err[e]);
                free(res.o); free(c.pos); free_case(&cs);
            }
            EXPECT(worst[0] < TOL_FWD && worst[1] < TOL_FWD,
                   "forward N=%ld block=%d gqa=%d D=8,32,64 (o %.1e, lse %.1e)", (long)Ns[a],
                   blocks[a], ratios[r], worst[0], worst[1]);
            EXPECT(worst[2] < TOL_GRAD && worst[3] < TOL_GRAD && worst[4] < TOL_GRAD,
                   "backward N=%ld block=%d gqa=%d D=8,32,64 (dq %.1e, dk %.1e, dv %.1e)",
                   (long)Ns[a], blocks[a], ratios[r], worst[2], worst[3], worst[4]);
        }
}

// The index of every causal block equals the dense kernel, in one chunk and
// in 3 contiguous chunks; and dense and sparse chunks mix.
static void test_dense_equivalence(void) {
    const int64_t Ns[] = {150, 100};
    const int blocks[] = {16, 64}, Hqs[] = {4, 8}, dims[] = {32, 64};
    for (int a = 0; a < 2; a++) {
        Case cs = make_case(Ns[a], blocks[a], Hqs[a], 2, dims[a], 0, 0, 1.0, 0.0, 300 + a);
        const Problem p = cs.p;
        const SparseIndex x = cs.x;
        for (int W = 1; W <= 3; W += 2) {
            Chunks c = make_chunks(LAYOUT_CONTIGUOUS, Ns[a], blocks[a], W);
            Result s = run(&p, &x, &c, NULL, 0), d = run(&p, &x, &c, NULL, 1);
            const double diff = result_diff(&p, &s, &d);
            EXPECT(diff < TOL_SAME, "all causal blocks = dense kernel: N=%ld block=%d gqa=%d "
                   "D=%d, %d chunk(s) (max diff %.1e)", (long)Ns[a], blocks[a], Hqs[a] / 2,
                   dims[a], W, diff);
            if (W == 3) {
                // chunk 0 dense, chunks 1 and 2 sparse, forward only
                Result m = result_alloc(&p);
                attn_forward_init(&p.s, m.o, m.lse);
                Chunks first = c, rest = c;
                first.n = 1;
                rest.n = 2;
                rest.pos = c.pos + c.start[1];
                for (int i = 0; i <= 2; i++) rest.start[i] = c.start[i + 1] - c.start[1];
                run_chunks(&p, &x, &first, NULL, 1, m.o, m.lse, NULL, NULL, NULL);
                run_chunks(&p, &x, &rest, NULL, 0, m.o, m.lse, NULL, NULL, NULL);
                const double dm = fmax(max_rel_diff(m.o, d.o, p.nq), max_rel_diff(m.lse, d.lse, p.nl));
                EXPECT(dm < TOL_SAME, "dense chunk then sparse chunks = dense forward: N=%ld "
                       "(max diff %.1e)", (long)Ns[a], dm);
                free(m.o);
            }
            free(s.o); free(d.o); free(c.pos);
        }
        free_case(&cs);
    }
}

// Keys in the 2 or 3 chunks of a striped layout (visited out of order) equal
// one chunk and the reference; queries all blocks, or one rank's striped blocks.
static void test_striped_chunks(void) {
    const int64_t N = 200;
    const int B = 16, Hq = 4, order3[] = {2, 0, 1}, order2[] = {1, 0};
    for (int W = 2; W <= 3; W++)
        for (int sub = 0; sub < 2; sub++) {
            Case cs = make_case(N, B, Hq, 2, 32, sub ? W : 0, 1, 0.3, 0.1, 400 + 10 * W + sub);
            const Problem p = cs.p;
            const SparseIndex x = cs.x;
            Chunks one = make_chunks(LAYOUT_CONTIGUOUS, N, B, 1);
            Chunks many = make_chunks(LAYOUT_STRIPED, N, B, W);
            Result r1 = run(&p, &x, &one, NULL, 0);
            Result rw = run(&p, &x, &many, W == 3 ? order3 : order2, 0);
            double err[5];
            against_reference(&p, &x, &rw, err);
            const double diff = fmax(max_rel_diff(rw.o, r1.o, p.nq), max_rel_diff(rw.lse, r1.lse, p.nl));
            const double gdiff = fmax(max_rel_diff(rw.dq, r1.dq, p.nq),
                                      fmax(max_rel_diff(rw.dk, r1.dk, p.nk),
                                           max_rel_diff(rw.dv, r1.dv, p.nk)));
            EXPECT(diff < TOL_FWD && gdiff < TOL_GRAD,
                   "%d striped key chunks = one chunk, queries %s (o/lse %.1e, grads %.1e)", W,
                   sub ? "rank 1's striped blocks" : "all blocks", diff, gdiff);
            EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD &&
                   err[3] < TOL_GRAD && err[4] < TOL_GRAD,
                   "%d striped key chunks, queries %s: reference (o %.1e, lse %.1e, dq %.1e, "
                   "dk %.1e, dv %.1e)", W, sub ? "rank 1's striped blocks" : "all blocks",
                   err[0], err[1], err[2], err[3], err[4]);
            free(r1.o); free(rw.o); free(one.pos); free(many.pos);
            free_case(&cs);
        }
}

// Rank 0's striped queries against rank 1's keys: rows without a key of the
// chunk in their pattern keep (o, lse) and dq bit for bit, keys no row
// selects keep dk, dv; the others change.
static void test_untouched_rows(void) {
    const int64_t N = 160;
    const int B = 16, Hq = 4, Hkv = 2, D = 16;
    Case cs = make_case(N, B, Hq, Hkv, D, 3, 0, 0.15, 0.02, 500);
    const Problem p = cs.p;
    const SparseIndex x = cs.x;
    const int64_t Tq = p.s.q_tokens, nqb = x.num_q_blocks;
    Rng rng; rng_seed(&rng, 502);
    Chunks c = make_chunks(LAYOUT_STRIPED, N, B, 3);
    const int64_t *pos = c.pos + c.start[1], n = c.start[2] - c.start[1];   // rank 1's keys
    const int64_t row = (int64_t)Hkv * D;
    float *k = gather(p.k, pos, n, row), *v = gather(p.v, pos, n, row);
    AttnShape s = p.s;
    s.k_tokens = n;

    // Which rows see the chunk; which chunk keys some row selects.
    unsigned char *in_chunk = xcalloc((size_t)(N / B + 1), 1), *key_used = xcalloc((size_t)n, 1);
    unsigned char *row_sees = xcalloc((size_t)(Hq * nqb), 1);
    for (int64_t t = 0; t < n; t++) in_chunk[pos[t] / B] = 1;
    for (int64_t r = 0; r < Hq * nqb; r++) {
        for (int64_t e = x.block_start[r]; e < x.block_start[r + 1]; e++)
            if (in_chunk[x.blocks[e]]) {
                row_sees[r] = 1;
                for (int64_t t = 0; t < n; t++) key_used[t] |= pos[t] / B == x.blocks[e];
            }
        for (int64_t e = x.column_start[r]; e < x.column_start[r + 1]; e++)
            for (int64_t t = 0; t < n; t++)
                if (pos[t] == x.columns[e]) row_sees[r] = key_used[t] = 1;
    }

    float *buf = xmalloc((size_t)(2 * (p.nq + p.nl) + 2 * (p.nq + 2 * n * row) + p.nl) *
                         sizeof(float));
    float *o = buf, *o0 = o + p.nq, *lse = o0 + p.nq, *lse0 = lse + p.nl;
    float *dq = lse0 + p.nl, *dq0 = dq + p.nq, *g = dq0 + p.nq, *g0 = g + 2 * n * row;
    float *delta = g0 + 2 * n * row;
    for (int64_t i = 0; i < p.nq; i++) o0[i] = (float)rng_normal(&rng);
    for (int64_t i = 0; i < p.nl; i++) lse0[i] = (float)rng_normal(&rng);
    for (int64_t i = 0; i < p.nq; i++) dq0[i] = (float)rng_normal(&rng);
    for (int64_t i = 0; i < 2 * n * row; i++) g0[i] = (float)rng_normal(&rng);
    memcpy(o, o0, (size_t)p.nq * sizeof(float));
    memcpy(lse, lse0, (size_t)p.nl * sizeof(float));
    memcpy(dq, dq0, (size_t)p.nq * sizeof(float));
    memcpy(g, g0, (size_t)2 * n * row * sizeof(float));
    attn_sparse_forward_cpu(&s, &x, p.q, p.qp, k, v, pos, o, lse);
    attn_backward_delta(&p.s, o, p.w, delta);
    attn_sparse_backward_cpu(&s, &x, p.q, p.qp, k, v, pos, lse, delta, p.w, dq, g, g + n * row);

    int same = 1, changed = 1, nsee = 0, nmiss = 0;
    for (int h = 0; h < Hq; h++)
        for (int64_t t = 0; t < Tq; t++) {
            const int64_t r = h * nqb + t / B, e = (t * Hq + h) * D;
            int eq = memcmp(o + e, o0 + e, (size_t)D * sizeof(float)) == 0 &&
                     lse[h * Tq + t] == lse0[h * Tq + t] &&
                     memcmp(dq + e, dq0 + e, (size_t)D * sizeof(float)) == 0;
            if (row_sees[r]) { changed &= !eq; nsee++; } else { same &= eq; nmiss++; }
        }
    int keys_same = 1, keys_changed = 1, nused = 0;
    for (int64_t t = 0; t < n; t++) {
        int eq = 1;
        for (int64_t e = 0; e < row; e++)
            eq &= g[t * row + e] == g0[t * row + e] && g[n * row + t * row + e] == g0[n * row + t * row + e];
        if (key_used[t]) { keys_changed &= !eq; nused++; } else keys_same &= eq;
    }
    EXPECT(same && changed && nsee > 0 && nmiss > 0,
           "rows without a key in the chunk keep o, lse, dq bit for bit (%d rows), the others "
           "change (%d rows)", nmiss, nsee);
    EXPECT(keys_same && keys_changed && nused > 0 && nused < n,
           "chunk keys no row selects keep dk, dv; the %d others change", nused);
    free(buf); free(in_chunk); free(key_used); free(row_sees); free(k); free(v);
    free(c.pos); free_case(&cs);
}

// o poisoned with NaN (lse -inf: no result yet) is fully written by the
// forward over striped chunks, and matches the reference.
static void test_poisoned_output(void) {
    Case cs = make_case(120, 8, 4, 1, 24, 0, 0, 0.2, 0.1, 600);
    const Problem p = cs.p;
    const SparseIndex x = cs.x;
    Chunks c = make_chunks(LAYOUT_STRIPED, 120, 8, 3);
    Result r = result_alloc(&p);
    for (int64_t i = 0; i < p.nq; i++) r.o[i] = NAN;
    for (int64_t i = 0; i < p.nl; i++) r.lse[i] = -INFINITY;
    run_chunks(&p, &x, &c, NULL, 0, r.o, r.lse, r.dq, r.dk, r.dv);
    int finite = 1;
    for (int64_t i = 0; i < p.nq; i++) finite &= isfinite(r.o[i]);
    double err[5];
    against_reference(&p, &x, &r, err);
    EXPECT(finite && err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD,
           "o poisoned with NaN is fully written (finite %d, o %.1e, lse %.1e, dq %.1e)", finite,
           err[0], err[1], err[2]);
    free(r.o); free(c.pos); free_case(&cs);
}

// Forward and backward with 1, 2 and 3 threads are bitwise equal.
static void test_determinism(void) {
    Case cs = make_case(257, 16, 4, 2, 32, 0, 0, 0.3, 0.2, 700);
    const Problem p = cs.p;
    const SparseIndex x = cs.x;
    Chunks c = make_chunks(LAYOUT_STRIPED, 257, 16, 2);
    const int saved = omp_get_max_threads();
    Result r[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        r[t] = run(&p, &x, &c, NULL, 0);
    }
    omp_set_num_threads(saved);
    const size_t bytes = (size_t)(2 * p.nq + 2 * p.nk + p.nl) * sizeof(float);
    EXPECT(memcmp(r[0].o, r[1].o, bytes) == 0 && memcmp(r[0].o, r[2].o, bytes) == 0,
           "o, lse, dq, dk, dv bitwise equal with 1, 2 and 3 threads");
    for (int t = 0; t < 3; t++) free(r[t].o);
    free(c.pos); free_case(&cs);
}

// Chunk ch of c: its positions, gathered K and V (free them), its shape.
static AttnShape chunk_kv(const Problem *p, const Chunks *c, int ch, const int64_t **pos, float **k, float **v) {
    const int64_t row = (int64_t)p->s.num_kv_heads * p->s.head_dim, m = c->start[ch + 1] - c->start[ch];
    AttnShape s = p->s;
    s.k_tokens = m;
    *pos = c->pos + c->start[ch];
    *k = gather(p->k, *pos, m, row);
    *v = gather(p->v, *pos, m, row);
    return s;
}

// The parts of a call add up to the whole: SPARSE_BLOCKS over 3 striped
// chunks plus SPARSE_COLUMNS against one list of key positions (every
// column of the index and other positions) equal SPARSE_ALL in one chunk;
// without the columns the result differs.
static void test_parts(void) {
    Case cs = make_case(150, 16, 4, 2, 32, 0, 0, 0.3, 0.15, 900);
    const Problem p = cs.p;
    const int64_t row = (int64_t)p.s.num_kv_heads * p.s.head_dim, N = p.s.k_tokens;
    Chunks whole = make_chunks(LAYOUT_CONTIGUOUS, N, 16, 1), striped = make_chunks(LAYOUT_STRIPED, N, 16, 3);
    Result ref = run(&p, &cs.x, &whole, NULL, 0);
    // The column list: every index column and every position divisible by 5.
    unsigned char *in = xcalloc((size_t)N, 1);
    for (int64_t e = 0; e < cs.x.column_start[cs.x.num_heads * cs.x.num_q_blocks]; e++) in[cs.x.columns[e]] = 1;
    int64_t *list = xmalloc((size_t)N * sizeof(int64_t)), n = 0;
    for (int64_t t = 0; t < N; t++)
        if (in[t] || t % 5 == 0) list[n++] = t;
    float *kl = gather(p.k, list, n, row), *vl = gather(p.v, list, n, row);
    float *dkl = xcalloc((size_t)(2 * n * row + 1), sizeof(float)), *dvl = dkl + n * row;
    AttnShape s = p.s;
    s.k_tokens = n;
    for (int with_columns = 1; with_columns >= 0; with_columns--) {
        Result r = result_alloc(&p);
        attn_forward_init(&p.s, r.o, r.lse);
        for (int ch = 0; ch < striped.n; ch++) {
            const int64_t *pos;
            float *k, *v;
            const AttnShape sc = chunk_kv(&p, &striped, ch, &pos, &k, &v);
            attn_sparse_forward_part_cpu(SPARSE_BLOCKS, &sc, &cs.x, p.q, p.qp, k, v, pos, r.o, r.lse);
            free(k); free(v);
        }
        if (with_columns) attn_sparse_forward_part_cpu(SPARSE_COLUMNS, &s, &cs.x, p.q, p.qp, kl, vl, list, r.o, r.lse);
        // Backward: blocks chunk by chunk, columns once; dK/dV scattered home.
        float *delta = xmalloc((size_t)p.nl * sizeof(float));
        attn_backward_delta(&p.s, r.o, p.w, delta);
        memset(r.dq, 0, (size_t)p.nq * sizeof(float));
        memset(r.dk, 0, (size_t)p.nk * sizeof(float));
        memset(r.dv, 0, (size_t)p.nk * sizeof(float));
        for (int ch = 0; ch < striped.n; ch++) {
            const int64_t *pos;
            float *k, *v;
            const AttnShape sc = chunk_kv(&p, &striped, ch, &pos, &k, &v);
            const int64_t m = sc.k_tokens;
            float *gk = xcalloc((size_t)(2 * m * row + 1), sizeof(float)), *gv = gk + m * row;
            attn_sparse_backward_part_cpu(SPARSE_BLOCKS, &sc, &cs.x, p.q, p.qp, k, v, pos, r.lse, delta, p.w,
                                          r.dq, gk, gv);
            scatter_add(pos, m, row, gk, gv, r.dk, r.dv);
            free(k); free(v); free(gk);
        }
        if (with_columns) {
            attn_sparse_backward_part_cpu(SPARSE_COLUMNS, &s, &cs.x, p.q, p.qp, kl, vl, list, r.lse, delta, p.w,
                                          r.dq, dkl, dvl);
            scatter_add(list, n, row, dkl, dvl, r.dk, r.dv);
        }
        const double diff = result_diff(&p, &r, &ref);
        if (with_columns) EXPECT(diff < TOL_FWD, "parts_blocks_plus_columns_equal_all (max rel diff %.1e)", diff);
        else EXPECT(diff > 1e-3, "parts_blocks_without_columns_differ (max rel diff %.1e)", diff);
        free(delta); free(r.o);
    }
    free(in); free(list); free(kl); free(vl); free(dkl); free(ref.o);
    free(whole.pos); free(striped.pos); free_case(&cs);
}

// Documents (AttnShape.doc_starts) crossing blocks, one-token documents and
// position 0 continuing a document, block 16: a random index against the
// masked reference, all queries and the striped queries of rank 1 of 3 over
// the 3 ranks' key chunks; the index of every causal block equals the dense
// kernel with the same documents.
static void test_documents(void) {
    static const int64_t starts[] = {5, 16, 17, 18, 40, 41, 42, 100, 149};
    for (int W = 0; W < 4; W += 3) {
        Case cs = make_case(150, 16, 4, 2, 32, W, 1, 0.4, 0.2, 700 + W);
        cs.p.s.doc_starts = starts;
        cs.p.s.doc_count = (int64_t)(sizeof starts / sizeof starts[0]);
        Chunks c = make_chunks(W ? LAYOUT_STRIPED : LAYOUT_CONTIGUOUS, 150, 16, W ? W : 1);
        Result res = run(&cs.p, &cs.x, &c, NULL, 0);
        double err[5];
        against_reference(&cs.p, &cs.x, &res, err);
        EXPECT(err[0] < TOL_FWD && err[1] < TOL_FWD && err[2] < TOL_GRAD && err[3] < TOL_GRAD &&
               err[4] < TOL_GRAD, "documents, random index, %s: o %.1e lse %.1e dq %.1e dk %.1e "
               "dv %.1e", W ? "striped rank 1 of 3, 3 chunks" : "one chunk", err[0], err[1],
               err[2], err[3], err[4]);
        free(res.o); free(c.pos); free_case(&cs);
    }
    Case cs = make_case(150, 16, 4, 2, 32, 0, 0, 1.0, 0.0, 710);
    cs.p.s.doc_starts = starts;
    cs.p.s.doc_count = (int64_t)(sizeof starts / sizeof starts[0]);
    Chunks c = make_chunks(LAYOUT_CONTIGUOUS, 150, 16, 1);
    Result sparse = run(&cs.p, &cs.x, &c, NULL, 0), dense = run(&cs.p, &cs.x, &c, NULL, 1);
    const double diff = result_diff(&cs.p, &sparse, &dense);
    EXPECT(diff < 1e-6, "documents: every causal block equals the dense kernel (%.1e)", diff);
    free(sparse.o); free(dense.o); free(c.pos); free_case(&cs);
}

int main(void) {
    test_random_indices();
    test_dense_equivalence();
    test_striped_chunks();
    test_untouched_rows();
    test_poisoned_output();
    test_determinism();
    test_parts();
    test_documents();
    return check_exit();
}
