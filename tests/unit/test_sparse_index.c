// test_sparse_index.c: the sparse pipeline before the kernels (attention/
// sparse.h): estimation against a naive double-precision reference and over
// striped key chunks fed in any order; selection (top-p minimality, caps,
// ties, sink/local, fixed budgets); a planted vertical-slash structure found
// by estimation + selection; index invariants and equality with a brute-force
// token mask from the pattern's definition, for many (N, B) and rank subsets;
// work counts and recall against brute force (the estimation rows, and the
// plan's recall sample against dense attention); the budget file reader.
//   test_sparse_index                      run the checks
//   test_sparse_index --budget FILE L H    print FILE's budgets for L layers x H heads
//                                          (defaults 7 / 9; tests/unit/test_sparse_budget.sh)
//   test_sparse_index --bench N            time estimation + selection + index
//                                          against dense attention at N tokens
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/layout.h"
#include "../../attention/sparse/sparse.h"
#include "../../attention/sparse/sparse_plan.h"
#include "../../dist/util.h"
#include "../lib/check.h"

static float *floats(int64_t n) { return xmalloc((size_t)n * sizeof(float)); }
static double *doubles(int64_t n) { return xmalloc((size_t)n * sizeof(double)); }

static float *randn(Rng *rng, int64_t n, double sd) {
    float *x = floats(n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * rng_normal(rng));
    return x;
}

// scale * q_i . k_j in double for q head h: qe [Lq, Hq, D], k [N, Hkv, D].
static double score_qk(const AttnShape *s, const float *qe, int64_t i, int h, const float *k,
                       int64_t j) {
    const int Hq = s->num_heads, Hkv = s->num_kv_heads, D = s->head_dim, g = h / (Hq / Hkv);
    double dot = 0;
    for (int d = 0; d < D; d++) dot += (double)qe[(i * Hq + h) * D + d] * k[(j * Hkv + g) * D + d];
    return dot * s->scale;
}

static float max_abs_diff_d(const float *a, const double *b, int64_t n, double *scale) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d || e != e) d = e;
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    *scale = s;
    return (float)d;
}

// ------------------------------------------------------------- estimation

// The estimation queries at the end of a sequence of N tokens: qe_pos [Lq].
static int64_t *last_positions(int64_t N, int64_t Lq) {
    int64_t *pos = xmalloc((size_t)Lq * sizeof(int64_t));
    for (int64_t i = 0; i < Lq; i++) pos[i] = N - Lq + i;
    return pos;
}

// Naive double reference of both passes: every query row's full causal
// softmax against all N keys k [N, Hkv, D] at positions 0..N-1: lse [Hq, Lq],
// column sums vert [Hq, N], diagonal sums slash [Hq, N].
static void ref_estimate(const AttnShape *s, const float *qe, const int64_t *qe_pos,
                         const float *k, int64_t N, double *lse, double *vert, double *slash) {
    const int Hq = s->num_heads;
    const int64_t Lq = s->q_tokens;
    double *sc = doubles(N);
    memset(vert, 0, (size_t)(Hq * N) * sizeof(double));
    memset(slash, 0, (size_t)(Hq * N) * sizeof(double));
    for (int h = 0; h < Hq; h++) {
        for (int64_t i = 0; i < Lq; i++) {
            const int64_t q = qe_pos[i];
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= q; j++) {
                sc[j] = score_qk(s, qe, i, h, k, j);
                if (sc[j] > mx) mx = sc[j];
            }
            for (int64_t j = 0; j <= q; j++) sum += exp(sc[j] - mx);
            lse[h * Lq + i] = mx + log(sum);
            for (int64_t j = 0; j <= q; j++) {
                double p = exp(sc[j] - lse[h * Lq + i]);
                vert[h * N + j] += p;
                slash[h * N + q - j] += p;
            }
        }
    }
    free(sc);
}

// The keys rank r of W holds in a striped layout (block B): positions pos and
// keys kc [n, Hkv, D] gathered from k [N, Hkv, D]; returns n.
static int64_t striped_chunk(const AttnShape *s, int64_t N, int W, int r, const float *k,
                             int64_t *pos, float *kc) {
    const int64_t row = (int64_t)s->num_kv_heads * s->head_dim;
    const int64_t n = layout_rank_positions(LAYOUT_STRIPED, N, s->block_size, W, r, pos);
    for (int64_t t = 0; t < n; t++) memcpy(kc + t * row, k + pos[t] * row, (size_t)row * sizeof(float));
    return n;
}

// Both estimation passes over the keys of a striped layout on W ranks, one
// chunk per rank, visiting ranks in the order rank = (start + step * i) mod W.
// k [N, Hkv, D] holds all keys at positions 0..N-1.
static void estimate_chunked(AttnShape s, const float *qe, const int64_t *qe_pos,
                             const float *k, int64_t N, int W, int start, int step,
                             float *lse, float *vert, float *slash) {
    const int Hkv = s.num_kv_heads, D = s.head_dim;
    int64_t *pos = xmalloc((size_t)N * sizeof(int64_t));
    float *kc = floats(N * Hkv * D);
    for (int64_t i = 0; i < s.num_heads * s.q_tokens; i++) lse[i] = -INFINITY;
    memset(vert, 0, (size_t)(s.num_heads * N) * sizeof(float));
    memset(slash, 0, (size_t)(s.num_heads * N) * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < W; i++) {
            const int r = (start + step * i + pass) % W;   // a different order per pass
            s.k_tokens = striped_chunk(&s, N, W, r, k, pos, kc);
            if (pass == 0) sparse_estimate_lse(&s, qe, qe_pos, kc, pos, lse);
            else sparse_estimate_scores(&s, qe, qe_pos, kc, pos, lse, N, vert, slash);
        }
    }
    free(pos); free(kc);
}

static void test_estimation(void) {
    const struct { int64_t N, Lq; int Hq, Hkv, D, B; } cases[] = {
        {1, 1, 2, 1, 8, 16},   {37, 37, 2, 2, 16, 16}, {333, 64, 4, 2, 32, 64},
        {1000, 64, 4, 1, 64, 128}, {777, 17, 8, 2, 40, 32}, {1500, 100, 4, 4, 24, 64},
    };
    Rng rng;
    rng_seed(&rng, 11);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const int64_t N = cases[c].N, Lq = cases[c].Lq;
        const int Hq = cases[c].Hq, Hkv = cases[c].Hkv, D = cases[c].D;
        AttnShape s = {Lq, N, Hq, Hkv, D, cases[c].B, 1.0f / sqrtf((float)D), NULL, 0, NULL};
        float *qe = randn(&rng, Lq * Hq * D, 1.5), *k = randn(&rng, N * Hkv * D, 1.5);
        int64_t *qe_pos = last_positions(N, Lq), *k_pos = last_positions(N, N);
        double *rl = doubles(Hq * Lq);
        double *rv = doubles(Hq * N), *rs = doubles(Hq * N);
        float *lse = floats(Hq * Lq);
        float *v = floats(Hq * N), *sl = floats(Hq * N);
        ref_estimate(&s, qe, qe_pos, k, N, rl, rv, rs);

        // One chunk holding every key.
        for (int64_t i = 0; i < Hq * Lq; i++) lse[i] = -INFINITY;
        memset(v, 0, (size_t)(Hq * N) * sizeof(float));
        memset(sl, 0, (size_t)(Hq * N) * sizeof(float));
        sparse_estimate_lse(&s, qe, qe_pos, k, k_pos, lse);
        sparse_estimate_scores(&s, qe, qe_pos, k, k_pos, lse, N, v, sl);
        double ls, vs, ss;
        double dl = max_abs_diff_d(lse, rl, Hq * Lq, &ls), dv = max_abs_diff_d(v, rv, Hq * N, &vs);
        double dsl = max_abs_diff_d(sl, rs, Hq * N, &ss);
        EXPECT(dl <= 1e-5 * ls && dv <= 1e-4 * vs && dsl <= 1e-4 * ss,
               "estimate N=%lld Lq=%lld Hq=%d Hkv=%d D=%d vs double reference: lse %.2e, "
               "vertical %.2e, slash %.2e (relative to max)", (long long)N, (long long)Lq, Hq,
               Hkv, D, dl / ls, dv / vs, dsl / ss);
        // Mass: every row's softmax sums to 1, in vertical and in slash.
        double mv = 0, ms = 0;
        for (int64_t i = 0; i < Hq * N; i++) { mv += v[i]; ms += sl[i]; }
        EXPECT(fabs(mv - (double)(Hq * Lq)) < 1e-3 * Hq * Lq && fabs(ms - mv) < 1e-3 * Hq * Lq,
               "estimate N=%lld: vertical mass %.4f and slash mass %.4f equal the %lld rows",
               (long long)N, mv, ms, (long long)(Hq * Lq));

        // One thread gives bit-identical results (one owner per output element).
        float *l1 = floats(Hq * Lq), *v1 = xcalloc((size_t)(Hq * N), sizeof(float));
        float *s1 = xcalloc((size_t)(Hq * N), sizeof(float));
        for (int64_t i = 0; i < Hq * Lq; i++) l1[i] = -INFINITY;
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        sparse_estimate_lse(&s, qe, qe_pos, k, k_pos, l1);
        sparse_estimate_scores(&s, qe, qe_pos, k, k_pos, l1, N, v1, s1);
        omp_set_num_threads(threads);
        EXPECT(!memcmp(l1, lse, (size_t)(Hq * Lq) * sizeof(float)) &&
               !memcmp(v1, v, (size_t)(Hq * N) * sizeof(float)) &&
               !memcmp(s1, sl, (size_t)(Hq * N) * sizeof(float)),
               "estimate N=%lld: 1 thread and %d threads agree bit for bit", (long long)N, threads);
        free(l1); free(v1); free(s1);

        // Striped chunks on W = 2, 3 ranks, in two orders, equal one chunk.
        float *lc = floats(Hq * Lq);
        float *vc = floats(Hq * N), *sc = floats(Hq * N);
        for (int W = 2; W <= 3; W++) {
            for (int order = 0; order < 2; order++) {
                estimate_chunked(s, qe, qe_pos, k, N, W, order ? W - 1 : 0, order ? W - 1 : 1, lc, vc, sc);
                double el = max_rel_diff(lc, lse, Hq * Lq), ev = max_rel_diff(vc, v, Hq * N);
                double es = max_rel_diff(sc, sl, Hq * N);
                EXPECT(el < 1e-6 && ev < 1e-5 && es < 1e-5,
                       "estimate N=%lld striped over %d ranks (order %d) equals one chunk: lse %.2e, "
                       "vertical %.2e, slash %.2e", (long long)N, W, order, el, ev, es);
            }
        }
        free(qe); free(k); free(qe_pos); free(k_pos); free(rl); free(rv); free(rs);
        free(lse); free(v); free(sl); free(lc); free(vc); free(sc);
    }
}

// -------------------------------------------------------------- selection

static AttentionConfig select_config(SparseBudget budget, double top_p, int max_v, int max_s,
                                     int sink, int local) {
    AttentionConfig c = {.top_p = top_p, .max_vertical = max_v, .max_slash = max_s,
                         .sink = sink, .local = local, .budget = budget, .vertical = 0, .slash = 0};
    return c;
}

// Head h's vertical (kind 0) or slash (kind 1) lines of p: membership sel
// [N], their count and mass under score [N] and their smallest score.
// Returns whether they are strictly ascending inside [0, N).
static int head_lines(const SparsePattern *p, int kind, int h, const float *score, char *sel,
                      int64_t *count, double *mass, double *min_sel) {
    const int64_t *start = kind ? p->slash_start : p->vertical_start;
    const int64_t *list = kind ? p->slash : p->vertical;
    const int64_t N = p->seq_len;
    int ok = 1;
    memset(sel, 0, (size_t)N);
    *count = start[h + 1] - start[h];
    *mass = 0;
    *min_sel = INFINITY;
    for (int64_t i = start[h]; i < start[h + 1]; i++) {
        ok &= list[i] >= 0 && list[i] < N && (i == start[h] || list[i] > list[i - 1]);
        if (!ok) return 0;
        sel[list[i]] = 1;
        *mass += score[list[i]];
        *min_sel = fmin(*min_sel, score[list[i]]);
    }
    return ok;
}

// Whether the marked lines sel [N] are a top set: every selected line scores
// >= every other, equal scores going to the smaller index.
static int top_set(const float *score, int64_t N, const char *sel) {
    for (int64_t a = 0; a < N; a++) {
        if (!sel[a]) continue;
        for (int64_t b = 0; b < N; b++)
            if (!sel[b] && (score[b] > score[a] || (score[b] == score[a] && b < a))) return 0;
    }
    return 1;
}

// Random scores with exact zeros and many exact ties: quantised u^4.
static float *tied_scores(Rng *rng, int64_t n) {
    float *x = floats(n);
    for (int64_t i = 0; i < n; i++) {
        double u = rng_uniform(rng);
        x[i] = (float)(floor(u * u * u * u * 64.0) / 64.0);
    }
    return x;
}

static void test_selection(void) {
    const int H = 3;
    const int64_t N = 300;
    Rng rng;
    rng_seed(&rng, 5);
    float *vert = tied_scores(&rng, H * N), *slash = tied_scores(&rng, H * N);
    char *sel = xmalloc((size_t)N);
    const double top_ps[] = {0.3, 0.7, 0.9, 0.99};
    for (size_t t = 0; t < sizeof(top_ps) / sizeof(top_ps[0]); t++) {
        for (int cap = 5; cap <= 1000; cap *= 200) {
            AttentionConfig cfg = select_config(BUDGET_TOPP, top_ps[t], cap, cap, 0, 0);
            SparsePattern p;
            sparse_select(&cfg, vert, slash, H, N, NULL, NULL, &p);
            int ok = p.num_heads == H && p.seq_len == N, minimal = 1, reached = 1, top = 1;
            for (int h = 0; h < H; h++) {
                for (int kind = 0; kind < 2; kind++) {
                    const float *score = (kind ? slash : vert) + h * N;
                    int64_t n;
                    double total = 0, mass, min_sel;
                    for (int64_t i = 0; i < N; i++) total += score[i];
                    ok &= head_lines(&p, kind, h, score, sel, &n, &mass, &min_sel) && n <= cap;
                    top &= top_set(score, N, sel);
                    const double target = top_ps[t] * total, eps = 1e-9 * total;
                    if (n < cap) reached &= mass >= target - eps;      // not capped: mass reached
                    if (n > 0) minimal &= mass - min_sel < target - eps;   // one fewer falls short
                }
            }
            EXPECT(ok && reached && minimal && top,
                   "select topp %.2f cap %d: ascending %d, mass reached %d, minimal %d, top lines with "
                   "ties to the smaller index %d", top_ps[t], cap, ok, reached, minimal, top);
            sparse_pattern_free(&p);
        }
    }

    // Caps bind: top_p 0.99 needs far more than 5 lines.
    {
        AttentionConfig cfg = select_config(BUDGET_TOPP, 0.99, 5, 7, 0, 0);
        SparsePattern p;
        sparse_select(&cfg, vert, slash, H, N, NULL, NULL, &p);
        int ok = 1;
        for (int h = 0; h < H; h++)
            ok &= p.vertical_start[h + 1] - p.vertical_start[h] == 5 &&
                  p.slash_start[h + 1] - p.slash_start[h] == 7;
        EXPECT(ok, "select topp: caps max_vertical 5 / max_slash 7 give exactly 5 and 7 lines");
        sparse_pattern_free(&p);
    }

    // top_p = 1 with caps >= N: exactly the lines with mass.
    {
        AttentionConfig cfg = select_config(BUDGET_TOPP, 1.0, (int)N, (int)N, 0, 0);
        SparsePattern p;
        sparse_select(&cfg, vert, slash, H, N, NULL, NULL, &p);
        int ok = 1;
        for (int h = 0; h < H; h++)
            for (int kind = 0; kind < 2; kind++) {
                const float *score = (kind ? slash : vert) + h * N;
                int64_t n;
                double mass, min_sel;
                ok &= head_lines(&p, kind, h, score, sel, &n, &mass, &min_sel);
                for (int64_t i = 0; i < N; i++) ok &= sel[i] == (score[i] > 0);
            }
        EXPECT(ok, "select topp 1.0, caps N: every line with mass and no other");
        sparse_pattern_free(&p);
    }

    // Fixed budgets per head, plus sink and local (which may overlap the top lines).
    {
        const int fv[3] = {0, 4, 40}, fs[3] = {9, 0, 300};
        AttentionConfig cfg = select_config(BUDGET_FIXED, 0.5, 1, 1, 3, 2);
        SparsePattern p;
        sparse_select(&cfg, vert, slash, H, N, fv, fs, &p);
        int ok = 1;
        for (int h = 0; h < H; h++)
            for (int kind = 0; kind < 2; kind++) {
                const float *score = (kind ? slash : vert) + h * N;
                const int64_t want = kind ? fs[h] : fv[h], always = kind ? 2 : 3;
                // Expected: the top `want` by score (ties to the smaller index) plus 0..always-1.
                char *expect = xcalloc((size_t)N, 1);
                for (int64_t r = 0; r < want; r++) {
                    int64_t best = -1;
                    for (int64_t i = 0; i < N; i++)
                        if (expect[i] != 1 && (best < 0 || score[i] > score[best])) best = i;
                    expect[best] = 1;
                }
                for (int64_t i = 0; i < always; i++) expect[i] = expect[i] ? expect[i] : 2;
                int64_t n;
                double mass, min_sel;
                ok &= head_lines(&p, kind, h, score, sel, &n, &mass, &min_sel);
                for (int64_t i = 0; i < N; i++) ok &= sel[i] == (expect[i] != 0);
                free(expect);
            }
        EXPECT(ok, "select fixed per-head budgets {0,4,40} / {9,0,300} + sink 3 + local 2");
        sparse_pattern_free(&p);
    }

    // All scores equal: ties go to the smallest positions / offsets.
    {
        const int64_t n = 10;
        float flat[20];
        for (int i = 0; i < 20; i++) flat[i] = 0.25f;
        AttentionConfig topp = select_config(BUDGET_TOPP, 0.5, 100, 100, 0, 0);
        AttentionConfig fixed = select_config(BUDGET_FIXED, 0.5, 1, 1, 0, 0);
        fixed.vertical = 3; fixed.slash = 6;
        SparsePattern a, b;
        sparse_select(&topp, flat, flat + n, 1, n, NULL, NULL, &a);
        sparse_select(&fixed, flat, flat + n, 1, n, NULL, NULL, &b);
        int ok = a.vertical_start[1] == 5 && a.slash_start[1] == 5 && b.vertical_start[1] == 3 &&
                 b.slash_start[1] == 6;
        for (int64_t i = 0; ok && i < a.vertical_start[1]; i++) ok = a.vertical[i] == i && a.slash[i] == i;
        for (int64_t i = 0; ok && i < b.vertical_start[1]; i++) ok = b.vertical[i] == i;
        for (int64_t i = 0; ok && i < b.slash_start[1]; i++) ok = b.slash[i] == i;
        EXPECT(ok, "select ties: equal scores pick positions 0..4 (topp 0.5), 0..2 and 0..5 (fixed 3 / 6)");
        sparse_pattern_free(&a); sparse_pattern_free(&b);
    }

    // Sink and local clipped to N; zero mass selects only them.
    {
        float zero[4] = {0};
        AttentionConfig cfg = select_config(BUDGET_TOPP, 0.9, 100, 100, 64, 128);
        SparsePattern p;
        sparse_select(&cfg, zero, zero + 2, 1, 2, NULL, NULL, &p);
        int ok = p.vertical_start[1] == 2 && p.slash_start[1] == 2 && p.vertical[0] == 0 &&
                 p.vertical[1] == 1 && p.slash[0] == 0 && p.slash[1] == 1;
        cfg.sink = 1; cfg.local = 0;
        SparsePattern q;
        sparse_select(&cfg, zero, zero + 2, 1, 2, NULL, NULL, &q);
        ok &= q.vertical_start[1] == 1 && q.vertical[0] == 0 && q.slash_start[1] == 0;
        EXPECT(ok, "select sink 64 / local 128 clipped to N = 2; zero mass selects only sink/local");
        sparse_pattern_free(&p); sparse_pattern_free(&q);
    }
    free(vert); free(slash); free(sel);
}

// ------------------------------------------------------------------ index

// A random pattern: each position is vertical with probability pv, each
// offset a slash with probability ps.
static SparsePattern random_pattern(Rng *rng, int H, int64_t N, double pv, double ps) {
    SparsePattern p = {.num_heads = H, .seq_len = N};
    p.vertical_start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    p.slash_start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    p.vertical = xmalloc((size_t)(H * N + 1) * sizeof(int64_t));
    p.slash = xmalloc((size_t)(H * N + 1) * sizeof(int64_t));
    p.vertical_start[0] = p.slash_start[0] = 0;
    int64_t nv = 0, ns = 0;
    for (int h = 0; h < H; h++) {
        for (int64_t i = 0; i < N; i++) {
            if (rng_uniform(rng) < pv) p.vertical[nv++] = i;
            if (rng_uniform(rng) < ps) p.slash[ns++] = i;
        }
        p.vertical_start[h + 1] = nv;
        p.slash_start[h + 1] = ns;
    }
    return p;
}

// Brute force from the pattern's definition, for row (h, query block qb):
// sel_block [nblocks] = the diagonal and every block holding some key q - d
// (q a query of the block, d a slash, q - d >= 0); is_vert [N] the vertical set.
static void brute_row(const SparsePattern *p, int h, int B, int64_t qb, char *sel_block,
                      char *is_vert) {
    const int64_t N = p->seq_len, nblocks = (N + B - 1) / B;
    memset(sel_block, 0, (size_t)nblocks);
    memset(is_vert, 0, (size_t)N);
    sel_block[qb] = 1;
    for (int64_t q = qb * B; q < (qb + 1) * B && q < N; q++)
        for (int64_t s = p->slash_start[h]; s < p->slash_start[h + 1]; s++)
            if (q - p->slash[s] >= 0) sel_block[(q - p->slash[s]) / B] = 1;
    for (int64_t v = p->vertical_start[h]; v < p->vertical_start[h + 1]; v++) is_vert[p->vertical[v]] = 1;
}

// Token-exact: query q sees key k under the brute-force pattern.
static int brute_sees(const char *sel_block, const char *is_vert, int B, int64_t q, int64_t k) {
    return k <= q && (sel_block[k / B] || is_vert[k]);
}

// Why the last index check failed.
static char why[256];

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return 0;
}

// Checks row r = (head h, global query block qb) of an index against the
// invariants and the brute force (scratch: in_block, sel_block [nblocks],
// is_col, is_vert [N]); adds the brute-force counts to *computed, *causal.
static int check_row(const SparsePattern *p, const SparseIndex *ix, int64_t r, int h, int64_t qb,
                     char *in_block, char *is_col, char *sel_block, char *is_vert,
                     double *computed, double *causal) {
    const int B = ix->block_size;
    const int64_t N = p->seq_len, q_last = ((qb + 1) * B < N ? (qb + 1) * B : N) - 1;
    memset(in_block, 0, (size_t)((N + B - 1) / B));
    memset(is_col, 0, (size_t)N);
    for (int64_t b = ix->block_start[r]; b < ix->block_start[r + 1]; b++) {
        const int64_t kb = ix->blocks[b];
        if (kb < 0 || kb > qb)
            return bad("row %lld: key block %lld after query block %lld", (long long)r,
                       (long long)kb, (long long)qb);
        if (b > ix->block_start[r] && kb <= ix->blocks[b - 1])
            return bad("row %lld: blocks not ascending", (long long)r);
        in_block[kb] = 1;
    }
    if (!in_block[qb]) return bad("row %lld: diagonal block missing", (long long)r);
    for (int64_t c = ix->column_start[r]; c < ix->column_start[r + 1]; c++) {
        const int64_t kp = ix->columns[c];
        if (kp < 0 || kp > q_last)
            return bad("row %lld: column %lld after the last query %lld", (long long)r,
                       (long long)kp, (long long)q_last);
        if (c > ix->column_start[r] && kp <= ix->columns[c - 1])
            return bad("row %lld: columns not ascending", (long long)r);
        if (in_block[kp / B])
            return bad("row %lld: column %lld inside a selected block", (long long)r, (long long)kp);
        is_col[kp] = 1;
    }
    brute_row(p, h, B, qb, sel_block, is_vert);
    for (int64_t q = qb * B; q <= q_last; q++) {
        *causal += (double)(q + 1);
        for (int64_t k = 0; k <= q; k++) {
            const int want = brute_sees(sel_block, is_vert, B, q, k);
            const int got = in_block[k / B] || is_col[k];
            // Every line of the pattern is covered, token-exactly.
            int line = k / B == qb || is_vert[k];
            for (int64_t s = p->slash_start[h]; s < p->slash_start[h + 1]; s++)
                line |= p->slash[s] == q - k;
            if (want != got || (line && !got))
                return bad("row %lld: (q %lld, k %lld) index %d, brute force %d, on a line %d", (long long)r,
                           (long long)q, (long long)k, got, want, line);
            *computed += want;
        }
    }
    return 1;
}

// Checks a whole index (see check_row); the brute-force counts go to *computed, *causal.
static int check_index(const SparsePattern *p, const SparseIndex *ix, int B, const int64_t *qbs,
                       int64_t nqb, double *computed, double *causal) {
    const int64_t N = p->seq_len, nblocks = (N + B - 1) / B;
    char *sel_block = xmalloc((size_t)nblocks), *is_vert = xmalloc((size_t)N);
    char *in_block = xmalloc((size_t)nblocks), *is_col = xmalloc((size_t)N);
    int ok = ix->num_heads == p->num_heads && ix->block_size == B && ix->seq_len == N &&
             ix->num_q_blocks == nqb;
    if (!ok) bad("header fields");
    *computed = *causal = 0;
    for (int64_t r = 0; ok && r < p->num_heads * nqb; r++)
        ok = check_row(p, ix, r, (int)(r / nqb), qbs[r % nqb], in_block, is_col, sel_block, is_vert,
                       computed, causal);
    free(sel_block); free(is_vert); free(in_block); free(is_col);
    return ok;
}

// Query positions of the given global blocks, block by block: q_pos [<= nqb * B].
static int64_t block_positions(const int64_t *qbs, int64_t nqb, int B, int64_t N, int64_t *q_pos) {
    int64_t n = 0;
    for (int64_t i = 0; i < nqb; i++)
        for (int64_t q = qbs[i] * B; q < (qbs[i] + 1) * B && q < N; q++) q_pos[n++] = q;
    return n;
}

static void test_index(void) {
    const int64_t lengths[] = {1, 5, 64, 100, 257, 700};
    const int blocks[] = {1, 7, 16, 64};
    const double dens[][2] = {{0, 0}, {0.02, 0.01}, {0.1, 0.2}, {0.5, 0.6}};
    Rng rng;
    rng_seed(&rng, 3);
    int cases = 0, passed = 0;
    for (size_t n = 0; n < sizeof(lengths) / sizeof(lengths[0]); n++) {
        for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++) {
            const int64_t N = lengths[n];
            const int B = blocks[b];
            const int64_t nblocks = (N + B - 1) / B;
            if (N * nblocks > 40000) continue;                   // brute force stays small
            int64_t *qbs = xmalloc((size_t)nblocks * sizeof(int64_t));
            int64_t *q_pos = xmalloc((size_t)N * sizeof(int64_t));
            for (size_t d = 0; d < sizeof(dens) / sizeof(dens[0]); d++) {
                SparsePattern p = random_pattern(&rng, 3, N, dens[d][0], dens[d][1]);
                // Every block (one rank), and rank 1 of a striped layout on 3 ranks.
                for (int W = 1; W <= 3; W += 2) {
                    const int64_t nqb = layout_rank_blocks(LAYOUT_STRIPED, N, B, W, W / 2, qbs);
                    SparseIndex ix;
                    sparse_index_build(&p, B, qbs, nqb, &ix);
                    double computed, causal;
                    int ok = check_index(&p, &ix, B, qbs, nqb, &computed, &causal);
                    SparseStats st = {0};
                    const int64_t nq = block_positions(qbs, nqb, B, N, q_pos);
                    sparse_index_count(&ix, q_pos, nq, NULL, 0, &st);
                    if (ok && (st.computed != computed || st.causal != causal))
                        bad("count computed %.0f causal %.0f, brute force %.0f / %.0f",
                                 st.computed, st.causal, computed, causal);
                    ok &= st.computed == computed && st.causal == causal;
                    cases++;
                    passed += ok;
                    if (!ok) printf("  index N=%lld B=%d density %zu W=%d: %s\n", (long long)N, B, d, W, why);
                    sparse_index_free(&ix);
                }
                sparse_pattern_free(&p);
            }
            free(qbs); free(q_pos);
        }
    }
    EXPECT(cases > 100 && passed == cases,
           "index invariants, brute-force token mask and work counts: %d of %d (N, B, density, rank) cases",
           passed, cases);

    // Dense pattern (every offset a slash): every causal block, no columns, computed == causal.
    {
        const int64_t N = 500;
        const int B = 32;
        SparsePattern p = random_pattern(&rng, 2, N, 1.0, 1.0);
        int64_t qbs[16], q_pos[500];
        for (int64_t i = 0; i < 16; i++) qbs[i] = i;
        SparseIndex ix;
        sparse_index_build(&p, B, qbs, 16, &ix);
        SparseStats st = {0};
        sparse_index_count(&ix, q_pos, block_positions(qbs, 16, B, N, q_pos), NULL, 0, &st);
        int ok = ix.column_start[2 * 16] == 0;
        for (int64_t r = 0; r < 2 * 16; r++) ok &= ix.block_start[r + 1] - ix.block_start[r] == r % 16 + 1;
        EXPECT(ok && st.computed == st.causal && st.causal == 2.0 * N * (N + 1) / 2,
               "index of the full pattern: all causal blocks, no columns, computed %.0f == causal %.0f",
               st.computed, st.causal);
        sparse_index_free(&ix);
        sparse_pattern_free(&p);
    }
}

// ----------------------------------------------------------------- recall

// Recall of random patterns over striped chunks against a double brute force.
static void test_recall(void) {
    const int64_t N = 300, Lq = 40;
    const int Hq = 4, Hkv = 2, D = 32, B = 16, W = 3;
    Rng rng;
    rng_seed(&rng, 9);
    AttnShape s = {Lq, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), NULL, 0, NULL};
    float *qe = randn(&rng, Lq * Hq * D, 2.0), *k = randn(&rng, N * Hkv * D, 2.0);
    int64_t *qe_pos = last_positions(N, Lq);
    double *rl = doubles(Hq * Lq);
    double *rv = doubles(Hq * N), *rs = doubles(Hq * N);
    ref_estimate(&s, qe, qe_pos, k, N, rl, rv, rs);
    float *lse = floats(Hq * Lq);
    float *v = floats(Hq * N), *sl = floats(Hq * N);
    estimate_chunked(s, qe, qe_pos, k, N, W, 1, 1, lse, v, sl);
    const int64_t est_blocks[3] = {16, 17, 18};                  // positions 260..299
    char *sel_block = xmalloc((size_t)((N + B - 1) / B)), *is_vert = xmalloc((size_t)N);
    int64_t *pos = xmalloc((size_t)N * sizeof(int64_t));
    float *kc = floats(N * Hkv * D);
    for (int trial = 0; trial < 3; trial++) {
        SparsePattern p = random_pattern(&rng, Hq, N, 0.05 * trial, 0.03 * trial);
        SparseIndex ix;
        sparse_index_build(&p, B, est_blocks, 3, &ix);
        double covered[4] = {0}, want[4] = {0}, worst = 0;
        for (int r = W - 1; r >= 0; r--) {
            s.k_tokens = striped_chunk(&s, N, W, r, k, pos, kc);
            sparse_estimate_recall(&s, &ix, qe, qe_pos, kc, pos, lse, covered);
        }
        for (int h = 0; h < Hq; h++) {
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t q = qe_pos[i];
                brute_row(&p, h, B, q / B, sel_block, is_vert);
                for (int64_t j = 0; j <= q; j++)
                    if (brute_sees(sel_block, is_vert, B, q, j))
                        want[h] += exp(score_qk(&s, qe, i, h, k, j) - rl[h * Lq + i]);
            }
            worst = fmax(worst, fabs(covered[h] - want[h]) / Lq);
        }
        EXPECT(worst < 1e-5, "recall of random pattern %d over striped chunks vs double brute force: "
               "max |diff| per row %.2e (head 0 mass %.3f of %lld rows)", trial, worst, want[0], (long long)Lq);
        sparse_index_free(&ix);
        sparse_pattern_free(&p);
    }
    free(qe); free(k); free(qe_pos); free(rl); free(rv); free(rs); free(lse); free(v); free(sl);
    free(sel_block); free(is_vert); free(pos); free(kc);
}

// ---------------------------------------------------------- sampled recall

// Whether key position j lies in index row r (a selected block or a column).
static int row_holds(const SparseIndex *ix, int64_t r, int64_t j) {
    for (int64_t e = ix->block_start[r]; e < ix->block_start[r + 1]; e++)
        if (ix->blocks[e] == j / ix->block_size) return 1;
    for (int64_t e = ix->column_start[r]; e < ix->column_start[r + 1]; e++)
        if (ix->columns[e] == j) return 1;
    return 0;
}

// The recall sample's softmax mass inside ix (the whole sequence's index, q
// [N, Hq, D], k [N, Hkv, D] at positions 0..N-1) in double: per sampled row
// its dense causal softmax, summed over the keys its index row holds.
static double brute_sampled_mass(const AttnShape *s, const SparseIndex *ix, const float *q, const float *k,
                                 const int64_t *rows, int64_t n) {
    double mass = 0;
    for (int h = 0; h < s->num_heads; h++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = rows[i], r = h * ix->num_q_blocks + t / ix->block_size;
            double mx = -INFINITY, sum = 0, in = 0;
            for (int64_t j = 0; j <= t; j++) mx = fmax(mx, score_qk(s, q, t, h, k, j));
            for (int64_t j = 0; j <= t; j++) {
                const double p = exp(score_qk(s, q, t, h, k, j) - mx);
                sum += p;
                if (row_holds(ix, r, j)) in += p;
            }
            mass += in / sum;
        }
    return mass;
}

// sparse_plan_local's recall sample: rows spread over the sequence before the
// estimation rows, its mass equal to a double brute force over the plan's
// index, and lower under a smaller budget.
static void test_sampled_recall(void) {
    const int64_t N = 400, Lq = 48;
    const int Hq = 4, Hkv = 2, D = 32, B = 16;
    Rng rng;
    rng_seed(&rng, 21);
    AttnShape s = {N, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), NULL, 0, NULL};
    float *q = randn(&rng, N * Hq * D, 2.0), *k = randn(&rng, N * Hkv * D, 2.0);
    int64_t *pos = last_positions(N, N), rows[SPARSE_RECALL_ROWS];
    const int64_t n = sparse_recall_rows(N, Lq, rows);
    int spread = n == SPARSE_RECALL_ROWS;
    for (int64_t i = 0; i < n; i++)   // one row in each of n equal strata of [0, N - Lq)
        spread &= rows[i] >= i * (N - Lq) / n && rows[i] < (i + 1) * (N - Lq) / n;
    EXPECT(spread, "recall sample: %lld rows, one in each stratum of [0, %lld)", (long long)n, (long long)(N - Lq));
    int64_t few[SPARSE_RECALL_ROWS];
    EXPECT(sparse_recall_rows(40, 48, few) == 40 && few[0] == 0 && few[39] == 39,
           "recall sample of a sequence shorter than last_q: all of its rows");

    AttentionConfig wide = select_config(BUDGET_TOPP, 0.5, 24, 24, 2, 2);
    AttentionConfig narrow = select_config(BUDGET_FIXED, 0, 0, 0, 1, 1);
    wide.type = narrow.type = ATTN_SPARSE;
    wide.last_q = narrow.last_q = (int)Lq;
    narrow.vertical = narrow.slash = 2;
    double recall[2];
    for (int c = 0; c < 2; c++) {
        SparseIndex ix = {0};
        SparseStats st = {0};
        sparse_plan_local(&(SparsePlanCall){.cfg = c ? &narrow : &wide, .shape = &s, .q = q, .k = k, .stats = &st}, pos,
                          &ix);
        const double want = brute_sampled_mass(&s, &ix, q, k, rows, n);
        recall[c] = st.sampled_mass / st.sampled_rows;
        EXPECT(st.sampled_rows == (double)(Hq * n) && fabs(st.sampled_mass - want) <= 1e-5 * Hq * n,
               "sampled recall (%s) %.6f over %.0f rows = double brute force %.6f; estimation rows %.4f",
               c ? "fixed 2/2" : "top_p 0.5, at most 24 lines", recall[c], st.sampled_rows, want / (double)(Hq * n),
               st.covered_mass / st.estimation_rows);
        sparse_index_free(&ix);
    }
    EXPECT(recall[1] < recall[0] - 0.05, "a smaller selection lowers the sampled recall: %.4f (fixed 2/2) vs %.4f",
           recall[1], recall[0]);
    free(q); free(k); free(pos);
}

// --------------------------------------------------------------- planted

// Keys are near one-hot (key j ~ e_j, D >= N) so that a query built as
// alpha * sum of chosen keys gives logit ~alpha exactly on those keys. Head 0
// plants verticals {0, 700} and slashes {0,1,2,3,37,300} (8 keys per row,
// 1/8 of the mass each); head 1 plants vertical {0} and slashes
// {0,1,5,130,512} (6 keys). Estimation + selection must find exactly these.
static void test_planted(void) {
    const int64_t N = 1000, Lq = 64;
    const int Hq = 2, D = 1024, B = 16;
    const int64_t pv[2][2] = {{0, 700}, {0, -1}}, ps[2][6] = {{0, 1, 2, 3, 37, 300}, {0, 1, 5, 130, 512, -1}};
    const int nv[2] = {2, 1}, ns[2] = {6, 5};
    Rng rng;
    rng_seed(&rng, 17);
    AttnShape s = {Lq, N, Hq, 1, D, B, 1.0f, NULL, 0, NULL};
    float *k = randn(&rng, N * D, 0.02), *qe = xcalloc((size_t)(Lq * Hq * D), sizeof(float));
    for (int64_t j = 0; j < N; j++) k[j * D + j] += 1.0f;
    int64_t *qe_pos = last_positions(N, Lq), *k_pos = last_positions(N, N);
    for (int h = 0; h < Hq; h++)
        for (int64_t i = 0; i < Lq; i++) {
            float *q = qe + (i * Hq + h) * D;
            for (int a = 0; a < nv[h]; a++) q[pv[h][a]] += 12.0f;
            for (int a = 0; a < ns[h]; a++) q[qe_pos[i] - ps[h][a]] += 12.0f;
        }
    float *lse = floats(Hq * Lq);
    float *v = xcalloc((size_t)(Hq * N), sizeof(float)), *sl = xcalloc((size_t)(Hq * N), sizeof(float));
    for (int64_t i = 0; i < Hq * Lq; i++) lse[i] = -INFINITY;
    sparse_estimate_lse(&s, qe, qe_pos, k, k_pos, lse);
    sparse_estimate_scores(&s, qe, qe_pos, k, k_pos, lse, N, v, sl);

    // Fixed budgets of exactly the planted counts: exactly the planted lines.
    const int fv[2] = {2, 1}, fs[2] = {6, 5};
    AttentionConfig fixed = select_config(BUDGET_FIXED, 0.9, 1, 1, 0, 0);
    SparsePattern p;
    sparse_select(&fixed, v, sl, Hq, N, fv, fs, &p);
    int exact = 1;
    for (int h = 0; h < Hq; h++) {
        for (int a = 0; a < nv[h]; a++) exact &= p.vertical[p.vertical_start[h] + a] == pv[h][a];
        for (int a = 0; a < ns[h]; a++) exact &= p.slash[p.slash_start[h] + a] == ps[h][a];
    }
    EXPECT(exact, "planted: the top 2+1 vertical and 6+5 slash lines are exactly the planted ones");
    sparse_pattern_free(&p);

    // top_p 0.7: slash mass is 6/8 and 5/6 planted, so the minimal sets are the
    // planted slashes; vertical lines hit the cap of 16 and include the planted.
    AttentionConfig topp = select_config(BUDGET_TOPP, 0.7, 16, 64, 0, 0);
    sparse_select(&topp, v, sl, Hq, N, NULL, NULL, &p);
    int slash_exact = 1, vert_found = 1;
    for (int h = 0; h < Hq; h++) {
        slash_exact &= p.slash_start[h + 1] - p.slash_start[h] == ns[h];
        for (int a = 0; slash_exact && a < ns[h]; a++) slash_exact &= p.slash[p.slash_start[h] + a] == ps[h][a];
        vert_found &= p.vertical_start[h + 1] - p.vertical_start[h] <= 16;
        for (int a = 0; a < nv[h]; a++) {
            int found = 0;
            for (int64_t x = p.vertical_start[h]; x < p.vertical_start[h + 1]; x++) found |= p.vertical[x] == pv[h][a];
            vert_found &= found;
        }
    }
    EXPECT(slash_exact && vert_found,
           "planted: topp 0.7 selects exactly the planted slashes (%lld, %lld lines) and the planted "
           "verticals among <= 16", (long long)(p.slash_start[1] - p.slash_start[0]),
           (long long)(p.slash_start[2] - p.slash_start[1]));

    // Recall of the estimation rows (positions 936..999: blocks 58..62): ~1
    // with the selection; for exactly the planted lines less slash 37 of head
    // 0, ~7/8 for head 0 (those keys fall in no selected block).
    int64_t eb[5];
    for (int64_t b = 0; b < 5; b++) eb[b] = 58 + b;
    SparseIndex ix;
    sparse_index_build(&p, B, eb, 5, &ix);
    double covered[2] = {0};
    sparse_estimate_recall(&s, &ix, qe, qe_pos, k, k_pos, lse, covered);
    sparse_index_free(&ix);
    int64_t vert_start[3] = {0, 2, 3}, vert[3] = {0, 700, 0};
    int64_t slash_start[3] = {0, 5, 10}, slash[10] = {0, 1, 2, 3, 300, 0, 1, 5, 130, 512};
    SparsePattern drop = {Hq, N, vert_start, vert, slash_start, slash};
    sparse_index_build(&drop, B, eb, 5, &ix);
    double dropped[2] = {0};
    sparse_estimate_recall(&s, &ix, qe, qe_pos, k, k_pos, lse, dropped);
    sparse_index_free(&ix);
    EXPECT(covered[0] / Lq > 0.99 && covered[1] / Lq > 0.99 && dropped[0] / Lq < 0.9 &&
           dropped[0] / Lq > 0.85 && dropped[1] / Lq > 0.99,
           "planted: recall %.4f / %.4f with the selection; %.4f / %.4f for the planted lines "
           "without slash 37 of head 0", covered[0] / Lq, covered[1] / Lq, dropped[0] / Lq,
           dropped[1] / Lq);
    sparse_pattern_free(&p);
    free(k); free(qe); free(qe_pos); free(k_pos); free(lse); free(v); free(sl);
}

// ---------------------------------------------------------------- budgets

static void test_budget_good(void) {
    char path[] = "/tmp/test_sparse_budget_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp failed");
    close(fd);
    FILE *f = xfopen(path, "w");
    fputs("# layer head vertical slash\n\n0 0 10 20\n  1\t2   0 5   # trailing comment\n"
          "1 0 1073741824 0\r\n   \n# 1 1 3 3\n", f);
    xfclose_sync(f, path);
    int vert[2 * 3], slash[2 * 3];
    sparse_budget_load(path, 2, 3, 7, 9, vert, slash);
    const int ev[6] = {10, 7, 7, 1073741824, 7, 0}, es[6] = {20, 9, 9, 0, 9, 5};
    int ok = 1;
    for (int i = 0; i < 6; i++) ok &= vert[i] == ev[i] && slash[i] == es[i];
    EXPECT(ok, "budget file: listed heads read (comments, blanks, tabs, CRLF), the rest take the defaults");
    remove(path);
}

// --budget FILE L H: print the table of FILE (for tests/unit/test_sparse_budget.sh).
static int budget_main(const char *path, int layers, int heads) {
    int *vert = xmalloc((size_t)(layers * heads) * sizeof(int)), *slash = xmalloc((size_t)(layers * heads) * sizeof(int));
    sparse_budget_load(path, layers, heads, 7, 9, vert, slash);
    for (int l = 0; l < layers; l++)
        for (int h = 0; h < heads; h++)
            printf("%d %d %d %d\n", l, h, vert[l * heads + h], slash[l * heads + h]);
    free(vert); free(slash);
    return 0;
}

// ------------------------------------------------------------------ bench

// --bench N: estimation (both passes + recall), selection and index of one
// layer (Qwen2.5-0.5B-like heads: 14 q / 2 kv, head dim 64; last_q 64, B 128)
// against dense attention forward of the same layer on one rank.
static int bench_main(int64_t N) {
    const int Hq = 14, Hkv = 2, D = 64, B = 128;
    const int64_t Lq = 64;
    Rng rng;
    rng_seed(&rng, 1);
    float *q = randn(&rng, N * Hq * D, 1.0), *k = randn(&rng, N * Hkv * D, 1.0), *vv = randn(&rng, N * Hkv * D, 1.0);
    int64_t *pos = last_positions(N, N);
    AttnShape est = {Lq, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), NULL, 0, NULL};
    float *lse = floats(Hq * Lq);
    float *v = xcalloc((size_t)(Hq * N), sizeof(float)), *sl = xcalloc((size_t)(Hq * N), sizeof(float));
    for (int64_t i = 0; i < Hq * Lq; i++) lse[i] = -INFINITY;
    const float *qe = q + (N - Lq) * Hq * D;
    const int64_t *qe_pos = pos + N - Lq;
    double t0 = now_seconds();
    sparse_estimate_lse(&est, qe, qe_pos, k, pos, lse);
    sparse_estimate_scores(&est, qe, qe_pos, k, pos, lse, N, v, sl);
    double t1 = now_seconds();
    AttentionConfig cfg = select_config(BUDGET_TOPP, 0.9, 4096, 4096, 64, 128);
    SparsePattern p;
    sparse_select(&cfg, v, sl, Hq, N, NULL, NULL, &p);
    double t2 = now_seconds();
    const int64_t nqb = (N + B - 1) / B;
    int64_t *qbs = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) qbs[i] = i;
    SparseIndex ix;
    sparse_index_build(&p, B, qbs, nqb, &ix);
    double t3 = now_seconds();
    int64_t eb[2] = {(N - Lq) / B, (N - 1) / B};
    SparseIndex est_ix;
    sparse_index_build(&p, B, eb, eb[0] == eb[1] ? 1 : 2, &est_ix);
    double covered[14] = {0};
    sparse_estimate_recall(&est, &est_ix, qe, qe_pos, k, pos, lse, covered);
    SparseStats st = {0};
    sparse_index_count(&ix, pos, N, NULL, 0, &st);
    double t4 = now_seconds();
    AttnShape dense = {N, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), NULL, 0, NULL};
    float *o = floats(N * Hq * D), *dl = floats(N * Hq);
    attn_forward_init(&dense, o, dl);
    double t5 = now_seconds();
    attn_dense_forward_cpu(&dense, q, pos, k, vv, pos, o, dl);
    double t6 = now_seconds();
    double rec = 0;
    for (int h = 0; h < Hq; h++) rec += covered[h];
    const double sparse_part = (t1 - t0) + (t2 - t1) + (t3 - t2);
    printf("N=%lld Hq=%d Hkv=%d D=%d last_q=%lld B=%d: estimation %.1f ms, selection %.1f ms, index %.1f ms, "
           "recall+count %.1f ms; dense forward %.1f ms; estimation+selection+index = %.2f%% of dense forward; "
           "density %.3f, recall %.3f\n",
           (long long)N, Hq, Hkv, D, (long long)Lq, B, 1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2),
           1e3 * (t4 - t3), 1e3 * (t6 - t5), 100.0 * sparse_part / (t6 - t5), st.computed / st.causal,
           rec / (Hq * Lq));
    sparse_pattern_free(&p); sparse_index_free(&ix); sparse_index_free(&est_ix);
    free(q); free(k); free(vv); free(pos); free(lse); free(v); free(sl); free(qbs); free(o); free(dl);
    return 0;
}

// ------------------------------------------------------------- documents

// The document of position p: how many of the starts [n] are at or before it.
static int64_t doc_of(const int64_t *starts, int64_t n, int64_t p) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += starts[i] <= p;
    return d;
}

// Estimation with documents sees only the estimation queries' document: with
// every estimation query in the document [250, 300), the scores over all keys
// equal those over that document's keys alone, and earlier keys score 0.
static void test_documents_estimation(void) {
    static const int64_t starts[] = {100, 250};
    const int64_t N = 300, Lq = 40, first = 250;
    const int Hq = 4, Hkv = 2, D = 32, B = 16;
    Rng rng;
    rng_seed(&rng, 21);
    AttnShape s = {Lq, N, Hq, Hkv, D, B, 1.0f / sqrtf((float)D), starts, 2, NULL};
    float *qe = randn(&rng, Lq * Hq * D, 2.0), *k = randn(&rng, N * Hkv * D, 2.0);
    int64_t *qe_pos = last_positions(N, Lq);
    float *lse = floats(2 * Hq * Lq), *lse_doc = lse + Hq * Lq;
    float *v = floats(4 * Hq * N), *sl = v + Hq * N, *v_doc = sl + Hq * N, *sl_doc = v_doc + Hq * N;
    estimate_chunked(s, qe, qe_pos, k, N, 1, 0, 1, lse, v, sl);
    AttnShape doc = s;
    doc.doc_starts = NULL;
    doc.doc_count = 0;
    doc.k_tokens = N - first;
    int64_t *pos = xmalloc((size_t)N * sizeof(int64_t));
    for (int64_t t = 0; t < N - first; t++) pos[t] = first + t;
    for (int64_t i = 0; i < Hq * Lq; i++) lse_doc[i] = -INFINITY;
    memset(v_doc, 0, 2 * (size_t)(Hq * N) * sizeof(float));
    const float *k_doc = k + first * Hkv * D;
    sparse_estimate_lse(&doc, qe, qe_pos, k_doc, pos, lse_doc);
    sparse_estimate_scores(&doc, qe, qe_pos, k_doc, pos, lse_doc, N, v_doc, sl_doc);
    int before = 1;
    for (int h = 0; h < Hq; h++)
        for (int64_t j = 0; j < first; j++) before &= v[h * N + j] == 0.0f;
    const double dl = max_rel_diff(lse, lse_doc, Hq * Lq), dv = max_rel_diff(v, v_doc, Hq * N);
    const double ds = max_rel_diff(sl, sl_doc, Hq * N);
    EXPECT(before && dl < 1e-6 && dv < 1e-5 && ds < 1e-5, "documents: estimation over all keys equals "
           "estimation over the queries' document (lse %.1e, vertical %.1e, slash %.1e), earlier keys 0",
           dl, dv, ds);
    free(qe); free(k); free(qe_pos); free(lse); free(v); free(pos);
}

// sparse_index_documents on random patterns against a brute force per row:
// the blocks kept are exactly those holding a (query, key) pair of one
// document with key <= query; the columns are the row's columns in its
// queries' documents plus every document's first `sink` tokens up to the
// row's last query, minus the kept blocks, ascending.
static void test_documents_index(void) {
    static const int64_t starts[] = {5, 16, 17, 40, 41, 100, 149, 250};
    const int64_t N = 300, nd = 8;
    const int Hq = 3, B = 16, sink = 3;
    const int64_t nqb = (N + B - 1) / B;
    AttnShape s = {N, N, Hq, 1, 8, B, 1.0f, starts, nd, NULL};
    int64_t *qb = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) qb[i] = i;
    char *want = xmalloc((size_t)N), *block_ok = xmalloc((size_t)nqb);
    Rng rng;
    rng_seed(&rng, 23);
    for (int trial = 0; trial < 3; trial++) {
        SparsePattern p = random_pattern(&rng, Hq, N, 0.05 + 0.1 * trial, 0.05 + 0.05 * trial);
        SparseIndex ix, dx;
        sparse_index_build(&p, B, qb, nqb, &ix);
        sparse_index_build(&p, B, qb, nqb, &dx);
        sparse_index_documents(&s, sink, &dx);
        int bad_blocks = 0, bad_columns = 0;
        for (int64_t r = 0; r < Hq * nqb; r++) {
            const int64_t q0 = qb[r % nqb] * B, q1 = q0 + B < N ? q0 + B : N;
            memset(block_ok, 0, (size_t)nqb);
            for (int64_t i = q0; i < q1; i++)
                for (int64_t j = 0; j <= i; j++) block_ok[j / B] |= doc_of(starts, nd, j) == doc_of(starts, nd, i);
            int64_t n = 0;
            for (int64_t e = ix.block_start[r]; e < ix.block_start[r + 1]; e++) {
                if (!block_ok[ix.blocks[e]]) continue;
                bad_blocks += n >= dx.block_start[r + 1] - dx.block_start[r] ||
                              dx.blocks[dx.block_start[r] + n] != ix.blocks[e];
                n++;
            }
            bad_blocks += n != dx.block_start[r + 1] - dx.block_start[r];
            memset(want, 0, (size_t)N);
            const int64_t lo_doc = doc_of(starts, nd, q0);
            for (int64_t e = ix.column_start[r]; e < ix.column_start[r + 1]; e++)
                want[ix.columns[e]] = doc_of(starts, nd, ix.columns[e]) >= lo_doc;
            for (int64_t j = 0; j < q1; j++) {
                const int64_t d = doc_of(starts, nd, j), start = d ? starts[d - 1] : 0;
                if (d >= lo_doc && j - start < sink) want[j] = 1;
            }
            for (int64_t e = dx.block_start[r]; e < dx.block_start[r + 1]; e++)
                memset(want + dx.blocks[e] * B, 0, (size_t)(dx.blocks[e] * B + B < N ? B : N - dx.blocks[e] * B));
            n = 0;
            for (int64_t j = 0; j < N; j++) {
                if (!want[j]) continue;
                bad_columns += n >= dx.column_start[r + 1] - dx.column_start[r] ||
                               dx.columns[dx.column_start[r] + n] != j;
                n++;
            }
            bad_columns += n != dx.column_start[r + 1] - dx.column_start[r];
        }
        EXPECT(bad_blocks == 0 && bad_columns == 0, "documents: index of random pattern %d against the brute "
               "force (%d rows with wrong blocks, %d with wrong columns; %lld of %lld blocks kept)", trial,
               bad_blocks, bad_columns, (long long)dx.block_start[Hq * nqb], (long long)ix.block_start[Hq * nqb]);
        // Density counts: only (query, key) pairs of one document.
        double computed = 0, causal = 0;
        for (int64_t r = 0; r < Hq * nqb; r++) {
            const int64_t q0 = qb[r % nqb] * B, q1 = q0 + B < N ? q0 + B : N;
            memset(want, 0, (size_t)N);
            for (int64_t e = dx.block_start[r]; e < dx.block_start[r + 1]; e++)
                memset(want + dx.blocks[e] * B, 1, (size_t)(dx.blocks[e] * B + B < N ? B : N - dx.blocks[e] * B));
            for (int64_t e = dx.column_start[r]; e < dx.column_start[r + 1]; e++) want[dx.columns[e]] = 1;
            for (int64_t i = q0; i < q1; i++)
                for (int64_t j = 0; j <= i; j++)
                    if (doc_of(starts, nd, j) == doc_of(starts, nd, i)) { causal++; computed += want[j]; }
        }
        SparseStats st = {0};
        int64_t *q_pos = xmalloc((size_t)N * sizeof(int64_t));
        for (int64_t t = 0; t < N; t++) q_pos[t] = t;
        sparse_index_count(&dx, q_pos, N, starts, nd, &st);
        free(q_pos);
        EXPECT(st.computed == computed && st.causal == causal, "documents: density counts of pattern %d "
               "(computed %.0f of %.0f, brute force %.0f of %.0f)", trial, st.computed, st.causal, computed, causal);
        sparse_index_free(&ix);
        sparse_index_free(&dx);
        sparse_pattern_free(&p);
    }
    AttnShape none = s;
    none.doc_starts = NULL;
    SparsePattern p = random_pattern(&rng, Hq, N, 0.1, 0.1);
    SparseIndex ix, same;
    sparse_index_build(&p, B, qb, nqb, &ix);
    sparse_index_build(&p, B, qb, nqb, &same);
    sparse_index_documents(&none, sink, &same);
    const int64_t rows = Hq * nqb;
    EXPECT(!memcmp(ix.block_start, same.block_start, (size_t)(rows + 1) * sizeof(int64_t)) &&
           !memcmp(ix.blocks, same.blocks, (size_t)ix.block_start[rows] * sizeof(int64_t)) &&
           !memcmp(ix.column_start, same.column_start, (size_t)(rows + 1) * sizeof(int64_t)) &&
           !memcmp(ix.columns, same.columns, (size_t)ix.column_start[rows] * sizeof(int64_t)),
           "no documents: the index is left as it is");
    sparse_index_free(&ix);
    sparse_index_free(&same);
    sparse_pattern_free(&p);
    free(qb); free(want); free(block_ok);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--budget")) return budget_main(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc == 3 && !strcmp(argv[1], "--bench")) return bench_main(atoll(argv[2]));
    test_estimation();
    test_selection();
    test_index();
    test_recall();
    test_sampled_recall();
    test_planted();
    test_budget_good();
    test_documents_estimation();
    test_documents_index();
    return check_exit();
}
