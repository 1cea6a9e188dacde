// sparse_estimate.c: vertical-slash pattern estimation (docs/ARCHITECTURE.md, Attention) on the
// CPU, see sparse.h. The last Lq queries of the sequence are scored against
// one key chunk at a time: pass 1 merges each row's log-sum-exp over chunks,
// pass 2 turns the final lse into softmax column sums (vertical) and diagonal
// sums (slash), and the recall pass measures how much of each row's mass a
// pattern covers (the estimation rows, or the recall sample's rows, drawn
// by sparse_recall_rows away from them). Scores come in tiles S [Lq, EST_TILE] = scale Q K^T from
// cblas_sgemm straight out of the strided [T, H, D] layout (no copies);
// OpenMP runs over q heads, so every output element has one owner and the
// results do not depend on the thread count. Softmax statistics are fp32.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "sparse.h"
#include "../../dist/util.h"

// Keys per score tile: S [Lq, EST_TILE] stays in cache for Lq up to a few hundred.
#define EST_TILE 256

static void check_est_shape(const AttnShape *s) {
    CHECK(s->num_kv_heads >= 1 && s->num_heads % s->num_kv_heads == 0,
          "estimation: %d q heads not a multiple of %d kv heads", s->num_heads, s->num_kv_heads);
    CHECK(s->head_dim >= 1 && s->q_tokens >= 0 && s->q_tokens <= (1 << 24) && s->k_tokens >= 0,
          "estimation: bad shape");
}

// Smallest and largest of pos [n].
static void pos_range(const int64_t *pos, int64_t n, int64_t *lo, int64_t *hi) {
    *lo = INT64_MAX; *hi = -1;
    for (int64_t i = 0; i < n; i++) {
        *lo = pos[i] < *lo ? pos[i] : *lo;
        *hi = pos[i] > *hi ? pos[i] : *hi;
    }
}

// s [Lq, n] = scale * qe[:, h, :] k[j0 .. j0+n, kv head of h, :]^T, with -inf
// where the key lies after the query (k_pos > qe_pos) or, with documents
// (sh->doc_starts), before the query's document. q_lo, q_hi: the range
// of qe_pos. Returns 0 when every key of the tile lies after every query (s
// untouched).
static int score_tile(const AttnShape *sh, const float *qe, const int64_t *qe_pos, int64_t q_lo,
                      int64_t q_hi, const float *k, const int64_t *k_pos, int h, int64_t j0,
                      int n, float *s) {
    const int Hq = sh->num_heads, Hkv = sh->num_kv_heads, D = sh->head_dim;
    const int Lq = (int)sh->q_tokens, g = h / (Hq / Hkv);
    int64_t k_lo, k_hi;
    pos_range(k_pos + j0, n, &k_lo, &k_hi);
    if (k_lo > q_hi) return 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lq, n, D, sh->scale, qe + (int64_t)h * D,
                Hq * D, k + (j0 * Hkv + g) * (int64_t)D, Hkv * D, 0.0f, s, n);
    if (k_hi <= q_lo && !sh->doc_starts) return 1;               // every key visible
    for (int i = 0; i < Lq; i++) {
        const int64_t first = attn_doc_first(sh->doc_starts, sh->doc_count, qe_pos[i]);
        for (int j = 0; j < n; j++)
            if (k_pos[j0 + j] > qe_pos[i] || k_pos[j0 + j] < first) s[(int64_t)i * n + j] = -INFINITY;
    }
    return 1;
}

void sparse_estimate_lse(const AttnShape *shape, const float *qe, const int64_t *qe_pos,
                         const float *k, const int64_t *k_pos, float *lse_est) {
    check_est_shape(shape);
    const int64_t Lq = shape->q_tokens, Tk = shape->k_tokens;
    int64_t q_lo, q_hi;
    pos_range(qe_pos, Lq, &q_lo, &q_hi);
    if (Lq == 0 || Tk == 0) return;

    #pragma omp parallel
    {
        float *s = xmalloc((size_t)Lq * EST_TILE * sizeof(float));   // [Lq, EST_TILE]
        float *m = xmalloc(2 * (size_t)Lq * sizeof(float));          // [Lq] running max
        float *l = m + Lq;                                           // [Lq] running sum
        #pragma omp for schedule(dynamic)
        for (int h = 0; h < shape->num_heads; h++) {
            for (int64_t i = 0; i < Lq; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
            for (int64_t j0 = 0; j0 < Tk; j0 += EST_TILE) {
                const int n = (int)(Tk - j0 < EST_TILE ? Tk - j0 : EST_TILE);
                if (!score_tile(shape, qe, qe_pos, q_lo, q_hi, k, k_pos, h, j0, n, s)) continue;
                for (int64_t i = 0; i < Lq; i++) {
                    const float *srow = s + i * n;
                    float mx = m[i];
                    for (int j = 0; j < n; j++) mx = srow[j] > mx ? srow[j] : mx;
                    if (mx == -INFINITY) continue;               // nothing visible yet
                    float sum = 0.0f;
                    for (int j = 0; j < n; j++) sum += expf(srow[j] - mx);
                    l[i] = l[i] * expf(m[i] - mx) + sum;
                    m[i] = mx;
                }
            }
            for (int64_t i = 0; i < Lq; i++) {
                if (m[i] == -INFINITY) continue;                 // row saw no key here
                float *row = lse_est + h * Lq + i;
                const float chunk = m[i] + logf(l[i]), mx = fmaxf(*row, chunk);
                *row = mx + logf(expf(*row - mx) + expf(chunk - mx));
            }
        }
        free(s); free(m);
    }
}

void sparse_estimate_scores(const AttnShape *shape, const float *qe, const int64_t *qe_pos,
                            const float *k, const int64_t *k_pos, const float *lse_est,
                            int64_t seq_len, float *vertical, float *slash) {
    check_est_shape(shape);
    const int64_t Lq = shape->q_tokens, Tk = shape->k_tokens, N = seq_len;
    int64_t q_lo, q_hi;
    pos_range(qe_pos, Lq, &q_lo, &q_hi);
    if (Lq == 0 || Tk == 0) return;
    CHECK(q_lo >= 0 && q_hi < N, "estimation: query positions %lld..%lld outside a sequence of %lld",
          (long long)q_lo, (long long)q_hi, (long long)N);
    for (int64_t j = 0; j < Tk; j++)
        CHECK(k_pos[j] >= 0 && k_pos[j] < N, "estimation: key position %lld outside [0, %lld)",
              (long long)k_pos[j], (long long)N);

    #pragma omp parallel
    {
        float *s = xmalloc((size_t)Lq * EST_TILE * sizeof(float));   // [Lq, EST_TILE]
        #pragma omp for schedule(dynamic)
        for (int h = 0; h < shape->num_heads; h++) {
            float *vert = vertical + h * N, *sl = slash + h * N;
            const float *lse = lse_est + h * Lq;
            for (int64_t j0 = 0; j0 < Tk; j0 += EST_TILE) {
                const int n = (int)(Tk - j0 < EST_TILE ? Tk - j0 : EST_TILE);
                if (!score_tile(shape, qe, qe_pos, q_lo, q_hi, k, k_pos, h, j0, n, s)) continue;
                for (int64_t i = 0; i < Lq; i++) {
                    if (lse[i] == -INFINITY) continue;
                    float *srow = s + i * n;
                    for (int j = 0; j < n; j++) {
                        srow[j] = expf(srow[j] - lse[i]);        // 0 where masked
                        if (srow[j] != 0.0f) sl[qe_pos[i] - k_pos[j0 + j]] += srow[j];
                    }
                }
                for (int j = 0; j < n; j++) {
                    float col = 0.0f;
                    for (int64_t i = 0; i < Lq; i++)
                        if (lse[i] != -INFINITY) col += s[i * n + j];
                    vert[k_pos[j0 + j]] += col;
                }
            }
        }
        free(s);
    }
}

// First index in sorted a[0..n) with a[i] >= x.
static int64_t lower_bound(const int64_t *a, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Whether key position kp lies in index row r (a selected block or a column).
static int in_row(const SparseIndex *ix, int64_t r, int64_t kp) {
    const int64_t b0 = ix->block_start[r], nb = ix->block_start[r + 1] - b0;
    const int64_t c0 = ix->column_start[r], nc = ix->column_start[r + 1] - c0;
    const int64_t kb = kp / ix->block_size;
    const int64_t bi = lower_bound(ix->blocks + b0, nb, kb);
    if (bi < nb && ix->blocks[b0 + bi] == kb) return 1;
    const int64_t ci = lower_bound(ix->columns + c0, nc, kp);
    return ci < nc && ix->columns[c0 + ci] == kp;
}

void sparse_estimate_recall(const AttnShape *shape, const SparseIndex *est_index,
                            const float *qe, const int64_t *qe_pos, const float *k,
                            const int64_t *k_pos, const float *lse_est, double *covered) {
    check_est_shape(shape);
    const int64_t Lq = shape->q_tokens, Tk = shape->k_tokens, nqb = est_index->num_q_blocks;
    int64_t q_lo, q_hi;
    pos_range(qe_pos, Lq, &q_lo, &q_hi);
    CHECK(est_index->num_heads == shape->num_heads, "recall: index has %d heads, shape %d",
          est_index->num_heads, shape->num_heads);
    if (Lq == 0 || Tk == 0) return;
    // The local index block of every estimation query.
    int64_t *qb_of = xmalloc((size_t)Lq * sizeof(int64_t));
    for (int64_t i = 0; i < Lq; i++) {
        const int64_t qb = qe_pos[i] / est_index->block_size;
        qb_of[i] = -1;
        for (int64_t b = 0; b < nqb; b++)
            if (est_index->q_blocks[b] == qb) qb_of[i] = b;
        CHECK(qb_of[i] >= 0, "recall: query block %lld not in the estimation index", (long long)qb);
    }

    #pragma omp parallel
    {
        float *s = xmalloc((size_t)Lq * EST_TILE * sizeof(float));   // [Lq, EST_TILE]
        char *in = xmalloc((size_t)nqb * EST_TILE);                  // [nqb, EST_TILE] key in row
        #pragma omp for schedule(dynamic)
        for (int h = 0; h < shape->num_heads; h++) {
            const float *lse = lse_est + h * Lq;
            double sum = 0.0;
            for (int64_t j0 = 0; j0 < Tk; j0 += EST_TILE) {
                const int n = (int)(Tk - j0 < EST_TILE ? Tk - j0 : EST_TILE);
                if (!score_tile(shape, qe, qe_pos, q_lo, q_hi, k, k_pos, h, j0, n, s)) continue;
                for (int64_t b = 0; b < nqb; b++)
                    for (int j = 0; j < n; j++)
                        in[b * EST_TILE + j] = (char)in_row(est_index, h * nqb + b, k_pos[j0 + j]);
                for (int64_t i = 0; i < Lq; i++) {
                    if (lse[i] == -INFINITY) continue;
                    const char *inrow = in + qb_of[i] * EST_TILE;
                    float part = 0.0f;
                    for (int j = 0; j < n; j++)
                        if (inrow[j]) part += expf(s[i * n + j] - lse[i]);
                    sum += part;
                }
            }
            covered[h] += sum;
        }
        free(s); free(in);
    }
    free(qb_of);
}

double sparse_pattern_mass(const SparsePattern *pattern, int sink, const AttnShape *rows_shape, const float *qe,
                           const int64_t *qe_pos, const float *k, const int64_t *k_pos, const float *lse_est) {
    const int Hq = rows_shape->num_heads;
    SparseIndex index;
    sparse_index_for_rows(pattern, rows_shape, sink, qe_pos, rows_shape->q_tokens, &index);
    double *covered = xcalloc((size_t)Hq, sizeof(double)), mass = 0;
    sparse_estimate_recall(rows_shape, &index, qe, qe_pos, k, k_pos, lse_est, covered);
    for (int h = 0; h < Hq; h++) mass += covered[h];
    free(covered);
    sparse_index_free(&index);
    return mass;
}
