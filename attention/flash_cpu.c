// flash_cpu.c: dense causal flash attention on the CPU in fp32, one key chunk
// per call (see attention.h). Tiles of block_size queries x block_size keys,
// online softmax with fp32 running max/sum/accumulator, never a Tq x Tk matrix.
// The mask is by global position (key j visible to query i iff
// k_pos[j] <= q_pos[i]); per-tile position bounds skip fully masked tiles and
// drop the per-element test in fully visible ones. Parallel over (head, tile)
// with one owner per output tile, so results do not depend on thread count.
// The backward (FlashAttention-2, P recomputed from the final LSE) makes two
// passes: dK, dV per (kv head, key tile), then dQ per (q head, query tile).
// Tile products run through one register-blocked kernel on tiles padded to
// the vector width, and exp through a polynomial that vectorises.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "../dist/util.h"

// Min and max position of each tile: pos [T] -> lo, hi [ceil(T / block)].
static void tile_bounds(const int64_t *pos, int64_t T, int block, int64_t *lo, int64_t *hi) {
    for (int64_t t0 = 0, b = 0; t0 < T; t0 += block, b++) {
        int64_t end = t0 + block < T ? t0 + block : T;
        lo[b] = hi[b] = pos[t0];
        for (int64_t t = t0 + 1; t < end; t++) {
            if (pos[t] < lo[b]) lo[b] = pos[t];
            if (pos[t] > hi[b]) hi[b] = pos[t];
        }
    }
}

// Floats per vector register; padded tile widths are multiples of it.
#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
#define MR 8   // rows of a register block in the tile products

static int round_up(int x) { return (x + VW - 1) / VW * VW; }

// dst [n, ld] = mult * x[t0 .. t0+n, head, :] with x [T, H, D]; columns
// D .. ld (padding) are zero.
static void load_rows(float *restrict dst, const float *restrict x, int64_t t0, int n,
                      int H, int head, int D, int ld, float mult) {
    for (int i = 0; i < n; i++) {
        const float *restrict src = x + ((t0 + i) * H + head) * (int64_t)D;
        float *restrict row = dst + (int64_t)i * ld;
        for (int d = 0; d < D; d++) row[d] = mult * src[d];
        for (int d = D; d < ld; d++) row[d] = 0.0f;
    }
}

// dst [D, ld] with dst[d, j] = x[t0 + j, head, d] for j < n: a transposed
// tile; columns n .. round_up(n) (padding) are zero.
static void load_cols(float *restrict dst, const float *restrict x, int64_t t0, int n,
                      int H, int head, int D, int ld) {
    for (int j = 0; j < n; j++) {
        const float *restrict src = x + ((t0 + j) * H + head) * (int64_t)D;
        for (int d = 0; d < D; d++) dst[(int64_t)d * ld + j] = src[d];
    }
    for (int d = 0; d < D; d++)
        for (int j = n; j < round_up(n); j++) dst[(int64_t)d * ld + j] = 0.0f;
}

// exp(x) in fp32 that vectorises (libm's expf does not): Cody-Waite range
// reduction and Cephes' degree-6 polynomial, relative error ~2e-7. Exactly 0
// below -87 (so exp(-inf) = 0); x is clamped at 88 (masked garbage stays finite).
static inline float exp_fast(float x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;   // round(x / ln 2)
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;      // x - n ln 2
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) * (1 << 23);             // 2^n
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

// One register of VW floats (GCC vector extension; unaligned loads allowed).
typedef float vec __attribute__((vector_size(VW * sizeof(float)), aligned(sizeof(float))));

// R <= MR rows x VW columns of c (+)= a b, held in registers over the K loop.
static inline __attribute__((always_inline)) void
gemm_block(const int R, float *restrict c, int64_t ldc, const float *restrict a, int64_t ai,
           int64_t ak, const float *restrict b, int64_t ldb, int K, int accumulate) {
    vec acc[MR];
    for (int r = 0; r < R; r++) acc[r] = accumulate ? *(const vec *)(c + r * ldc) : (vec){0};
    for (int k = 0; k < K; k++) {
        const vec bk = *(const vec *)(b + k * ldb);
        for (int r = 0; r < R; r++) acc[r] += a[r * ai + k * ak] * bk;
    }
    for (int r = 0; r < R; r++) *(vec *)(c + r * ldc) = acc[r];
}

// c [m, n] = (accumulate ? c : 0) + a b, with a [m, K] addressed as
// a[i * ai + k * ak] (so a transposed operand needs no copy), b [K, ldb],
// c [m, ldc]; n is a multiple of VW. All tile products go through here.
static void gemm_tile(float *restrict c, int64_t ldc, const float *restrict a, int64_t ai,
                      int64_t ak, const float *restrict b, int64_t ldb, int m, int n, int K,
                      int accumulate) {
    for (int j0 = 0; j0 < n; j0 += VW) {
        int i = 0;
        for (; i + MR <= m; i += MR)
            gemm_block(MR, c + i * ldc + j0, ldc, a + i * ai, ai, ak, b + j0, ldb, K, accumulate);
        for (; i < m; i++)
            gemm_block(1, c + i * ldc + j0, ldc, a + i * ai, ai, ak, b + j0, ldb, K, accumulate);
    }
}

void attn_forward_init(const AttnShape *shape, float *o, float *lse) {
    int64_t rows = shape->q_tokens * shape->num_heads;
    memset(o, 0, (size_t)(rows * shape->head_dim) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) lse[r] = -INFINITY;
}

static void check_shape(const AttnShape *s) {
    CHECK(s->block_size >= 1, "attention block_size %d < 1", s->block_size);
    CHECK(s->num_kv_heads >= 1 && s->num_heads % s->num_kv_heads == 0,
          "attention: %d q heads not a multiple of %d kv heads", s->num_heads, s->num_kv_heads);
    CHECK(s->head_dim >= 1 && s->q_tokens >= 0 && s->k_tokens >= 0, "attention: bad shape");
}

// Tile counts and per-tile position bounds of one call: lo/hi [nqt] for the
// queries, [nkt] for the keys (one allocation, free(q_lo)).
typedef struct {
    int64_t nqt, nkt;
    int64_t *q_lo, *q_hi, *k_lo, *k_hi;
} Tiles;

static Tiles make_tiles(const AttnShape *s, const int64_t *q_pos, const int64_t *k_pos) {
    const int B = s->block_size;
    Tiles t = {.nqt = (s->q_tokens + B - 1) / B, .nkt = (s->k_tokens + B - 1) / B};
    t.q_lo = xmalloc((size_t)(2 * t.nqt + 2 * t.nkt + 1) * sizeof(int64_t));
    t.q_hi = t.q_lo + t.nqt; t.k_lo = t.q_hi + t.nqt; t.k_hi = t.k_lo + t.nkt;
    tile_bounds(q_pos, s->q_tokens, B, t.q_lo, t.q_hi);
    tile_bounds(k_pos, s->k_tokens, B, t.k_lo, t.k_hi);
    return t;
}

static int tile_len(int64_t T, int64_t t0, int B) { return (int)(T - t0 < B ? T - t0 : B); }

void attn_dense_forward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                            const float *k, const float *v, const int64_t *k_pos,
                            float *o, float *lse) {
    check_shape(shape);
    const int64_t Tq = shape->q_tokens, Tk = shape->k_tokens;
    const int Hq = shape->num_heads, Hkv = shape->num_kv_heads, D = shape->head_dim;
    const int B = shape->block_size, group = Hq / Hkv, Bp = round_up(B), Dp = round_up(D);
    const Tiles t = make_tiles(shape, q_pos, k_pos);
    if (t.nqt == 0 || t.nkt == 0) { free(t.q_lo); return; }

    #pragma omp parallel
    {
        float *qs = xmalloc_aligned((size_t)B * Dp * sizeof(float));   // [B, Dp] scale * q
        float *kT = xmalloc_aligned((size_t)D * Bp * sizeof(float));   // [D, Bp]
        float *vs = xmalloc_aligned((size_t)B * Dp * sizeof(float));   // [B, Dp]
        float *acc = xmalloc_aligned((size_t)B * Dp * sizeof(float));  // [B, Dp] unnormalised o
        float *s = xmalloc_aligned((size_t)B * Bp * sizeof(float));    // [B, Bp] scores, then p
        float *m = xmalloc_aligned(2 * (size_t)B * sizeof(float));     // [B] running max
        float *l = m + B;                                              // [B] running sum

        // Later query tiles first: under a causal mask they carry the most work.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < Hq * t.nqt; w++) {
            const int h = (int)(w / t.nqt), g = h / group;
            const int64_t qt = t.nqt - 1 - w % t.nqt, i0 = qt * B;
            const int bq = tile_len(Tq, i0, B);
            load_rows(qs, q, i0, bq, Hq, h, D, Dp, shape->scale);
            memset(acc, 0, (size_t)bq * Dp * sizeof(float));
            for (int i = 0; i < bq; i++) { m[i] = -INFINITY; l[i] = 0.0f; }

            for (int64_t kt = 0; kt < t.nkt; kt++) {
                if (t.k_lo[kt] > t.q_hi[qt]) continue;           // every key after every query
                const int full = t.k_hi[kt] <= t.q_lo[qt];       // every key visible
                const int64_t j0 = kt * B;
                const int bk = tile_len(Tk, j0, B);
                load_cols(kT, k, j0, bk, Hkv, g, D, Bp);
                load_rows(vs, v, j0, bk, Hkv, g, D, Dp, 1.0f);
                gemm_tile(s, Bp, qs, Dp, 1, kT, Bp, bq, round_up(bk), D, 0);   // S = scale Q K^T
                for (int i = 0; i < bq; i++) {
                    float *restrict srow = s + (int64_t)i * Bp;
                    if (!full) {
                        const int64_t qp = q_pos[i0 + i];
                        for (int j = 0; j < bk; j++)
                            if (k_pos[j0 + j] > qp) srow[j] = -INFINITY;
                    }
                    float mx = m[i];
                    for (int j = 0; j < bk; j++) mx = srow[j] > mx ? srow[j] : mx;
                    if (mx == -INFINITY) {                       // nothing visible yet
                        for (int j = 0; j < bk; j++) srow[j] = 0.0f;
                        continue;
                    }
                    float corr = exp_fast(m[i] - mx), sum = 0.0f;
                    #pragma omp simd reduction(+:sum)
                    for (int j = 0; j < bk; j++) {
                        srow[j] = exp_fast(srow[j] - mx);
                        sum += srow[j];
                    }
                    l[i] = l[i] * corr + sum;
                    m[i] = mx;
                    float *restrict arow = acc + (int64_t)i * Dp;
                    for (int d = 0; d < Dp; d++) arow[d] *= corr;
                }
                gemm_tile(acc, Dp, s, Bp, 1, vs, Dp, bq, Dp, bk, 1);           // acc += P V
            }

            // Merge this chunk's (acc / l, m + log l) into the running (o, lse).
            for (int i = 0; i < bq; i++) {
                if (m[i] == -INFINITY) continue;                 // row saw no key here
                float *restrict orow = o + ((i0 + i) * Hq + h) * (int64_t)D;
                float *lrow = lse + h * Tq + i0 + i;
                const float chunk = m[i] + logf(l[i]), old = *lrow;
                const float mx = fmaxf(old, chunk);
                const float a = expf(old - mx), b = expf(chunk - mx);
                const float wa = a / (a + b), wb = b / (a + b) / l[i];
                const float *restrict arow = acc + (int64_t)i * Dp;
                for (int d = 0; d < D; d++) orow[d] = wa * orow[d] + wb * arow[d];
                *lrow = mx + logf(a + b);
            }
        }
        free(qs); free(kT); free(vs); free(acc); free(s); free(m);
    }
    free(t.q_lo);
}

void attn_backward_delta(const AttnShape *shape, const float *o, const float *dout, float *delta) {
    const int64_t Tq = shape->q_tokens;
    const int Hq = shape->num_heads, D = shape->head_dim;
    #pragma omp parallel for
    for (int64_t t = 0; t < Tq; t++) {
        for (int h = 0; h < Hq; h++) {
            const float *restrict orow = o + (t * Hq + h) * (int64_t)D;
            const float *restrict drow = dout + (t * Hq + h) * (int64_t)D;
            float sum = 0.0f;
            for (int d = 0; d < D; d++) sum += orow[d] * drow[d];
            delta[h * Tq + t] = sum;
        }
    }
}

// One (query tile, key tile) pair of the backward: p = P and ds = P (dP - delta),
// [bq, Bp] each, zero on masked entries and on rows that never saw a key
// (lse = -inf). qs, dos [bq, Dp]; kT, vT [D, Bp]; lse, delta, qp [bq]; kp [bk].
static void tile_grad(const float *qs, const float *dos, const float *kT, const float *vT,
                      const float *lse, const float *delta, const int64_t *qp,
                      const int64_t *kp, int full, int bq, int bk, int D, int Bp, int Dp,
                      float *restrict p, float *restrict ds) {
    gemm_tile(p, Bp, qs, Dp, 1, kT, Bp, bq, round_up(bk), D, 0);    // S = scale Q K^T
    gemm_tile(ds, Bp, dos, Dp, 1, vT, Bp, bq, round_up(bk), D, 0);  // dP = dO V^T
    for (int i = 0; i < bq; i++) {
        float *restrict prow = p + (int64_t)i * Bp, *restrict dsrow = ds + (int64_t)i * Bp;
        if (lse[i] == -INFINITY) {
            for (int j = 0; j < bk; j++) prow[j] = dsrow[j] = 0.0f;
            continue;
        }
        const float li = lse[i], di = delta[i];
        if (!full)
            for (int j = 0; j < bk; j++)
                if (kp[j] > qp[i]) prow[j] = -INFINITY;
        for (int j = 0; j < bk; j++) {
            prow[j] = exp_fast(prow[j] - li);
            dsrow[j] = prow[j] * (dsrow[j] - di);
        }
    }
}

void attn_dense_backward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                             const float *k, const float *v, const int64_t *k_pos,
                             const float *lse, const float *delta, const float *dout,
                             float *dq, float *dk, float *dv) {
    check_shape(shape);
    const int64_t Tq = shape->q_tokens, Tk = shape->k_tokens;
    const int Hq = shape->num_heads, Hkv = shape->num_kv_heads, D = shape->head_dim;
    const int B = shape->block_size, group = Hq / Hkv, Bp = round_up(B), Dp = round_up(D);
    const float scale = shape->scale;
    const Tiles t = make_tiles(shape, q_pos, k_pos);
    if (t.nqt == 0 || t.nkt == 0) { free(t.q_lo); return; }
    const size_t rows = (size_t)B * Dp * sizeof(float), cols = (size_t)D * Bp * sizeof(float);

    #pragma omp parallel
    {
        float *qs = xmalloc_aligned(rows);                             // [B, Dp] scale * q
        float *dos = xmalloc_aligned(rows);                            // [B, Dp] dO
        float *ks = xmalloc_aligned(rows);                             // [B, Dp]
        float *kT = xmalloc_aligned(cols);                             // [D, Bp]
        float *vT = xmalloc_aligned(cols);                             // [D, Bp]
        float *acc = xmalloc_aligned(2 * rows);                        // [B, Dp] dK or dQ, then dV
        float *p = xmalloc_aligned((size_t)B * Bp * sizeof(float));    // [B, Bp]
        float *ds = xmalloc_aligned((size_t)B * Bp * sizeof(float));   // [B, Bp]

        // Pass 1: dK, dV of one (kv head, key tile), over its group's q heads
        // and every query tile that sees it.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < Hkv * t.nkt; w++) {
            const int g = (int)(w / t.nkt);
            const int64_t kt = w % t.nkt, j0 = kt * B;
            const int bk = tile_len(Tk, j0, B);
            float *dka = acc, *dva = acc + (size_t)B * Dp;
            memset(acc, 0, 2 * rows);
            load_cols(kT, k, j0, bk, Hkv, g, D, Bp);
            load_cols(vT, v, j0, bk, Hkv, g, D, Bp);
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int64_t qt = 0; qt < t.nqt; qt++) {
                    if (t.k_lo[kt] > t.q_hi[qt]) continue;
                    const int64_t i0 = qt * B;
                    const int bq = tile_len(Tq, i0, B);
                    load_rows(qs, q, i0, bq, Hq, h, D, Dp, scale);
                    load_rows(dos, dout, i0, bq, Hq, h, D, Dp, 1.0f);
                    tile_grad(qs, dos, kT, vT, lse + h * Tq + i0, delta + h * Tq + i0,
                              q_pos + i0, k_pos + j0, t.k_hi[kt] <= t.q_lo[qt], bq, bk, D,
                              Bp, Dp, p, ds);
                    gemm_tile(dva, Dp, p, 1, Bp, dos, Dp, bk, Dp, bq, 1);   // dV += P^T dO
                    gemm_tile(dka, Dp, ds, 1, Bp, qs, Dp, bk, Dp, bq, 1);   // dK += dS^T scale Q
                }
            }
            for (int j = 0; j < bk; j++) {
                float *restrict dkrow = dk + ((j0 + j) * Hkv + g) * (int64_t)D;
                float *restrict dvrow = dv + ((j0 + j) * Hkv + g) * (int64_t)D;
                for (int d = 0; d < D; d++) {
                    dkrow[d] += dka[(int64_t)j * Dp + d];
                    dvrow[d] += dva[(int64_t)j * Dp + d];
                }
            }
        }

        // Pass 2: dQ of one (q head, query tile), recomputing P and dS; later
        // query tiles (more causal work) first.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < Hq * t.nqt; w++) {
            const int h = (int)(w / t.nqt), g = h / group;
            const int64_t qt = t.nqt - 1 - w % t.nqt, i0 = qt * B;
            const int bq = tile_len(Tq, i0, B);
            memset(acc, 0, rows);
            load_rows(qs, q, i0, bq, Hq, h, D, Dp, scale);
            load_rows(dos, dout, i0, bq, Hq, h, D, Dp, 1.0f);
            for (int64_t kt = 0; kt < t.nkt; kt++) {
                if (t.k_lo[kt] > t.q_hi[qt]) continue;
                const int64_t j0 = kt * B;
                const int bk = tile_len(Tk, j0, B);
                load_cols(kT, k, j0, bk, Hkv, g, D, Bp);
                load_cols(vT, v, j0, bk, Hkv, g, D, Bp);
                load_rows(ks, k, j0, bk, Hkv, g, D, Dp, 1.0f);
                tile_grad(qs, dos, kT, vT, lse + h * Tq + i0, delta + h * Tq + i0, q_pos + i0,
                          k_pos + j0, t.k_hi[kt] <= t.q_lo[qt], bq, bk, D, Bp, Dp, p, ds);
                gemm_tile(acc, Dp, ds, Bp, 1, ks, Dp, bq, Dp, bk, 1);       // dQ/scale += dS K
            }
            for (int i = 0; i < bq; i++) {
                float *restrict dqrow = dq + ((i0 + i) * Hq + h) * (int64_t)D;
                for (int d = 0; d < D; d++) dqrow[d] += scale * acc[(int64_t)i * Dp + d];
            }
        }
        free(qs); free(dos); free(ks); free(kT); free(vT); free(acc); free(p); free(ds);
    }
    free(t.q_lo);
}
