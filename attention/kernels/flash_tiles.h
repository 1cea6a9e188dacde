// flash_tiles.h: the tile machinery shared by the dense (flash_cpu.c) and the
// sparse (sparse_flash_cpu.c) CPU attention kernels; internal to attention/.
// A tile is up to B queries x up to B keys. Operands are padded to the vector
// width VW so that every tile product runs through one register-blocked GEMM,
// and exp runs through a polynomial that vectorises. Key tiles are loaded
// either as a run of consecutive tokens or gathered from a list of token
// indices (the sparse kernel's vertical columns); the masking, online softmax,
// merge and gradient steps are the same for both.
#ifndef MTRAIN_FLASH_TILES_H
#define MTRAIN_FLASH_TILES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../attention.h"
#include "../attn_args.h"
#include "../../dist/util.h"

// Floats per vector register; padded tile widths are multiples of it.
#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
#define MR 8   // rows of a register block in the tile products

// Bp, Dp (in the shapes below): B, D padded to the vector width.
static inline int round_up(int x) { return (x + VW - 1) / VW * VW; }

// Length of the tile that starts at token t0 of T tokens.
static inline int tile_len(int64_t T, int64_t t0, int B) { return (int)(T - t0 < B ? T - t0 : B); }

// The sizes of one kernel call (attn_args.h), the shape checked.
static inline AttnDims dims_of(const AttnShape *s) {
    CHECK(s->block_size >= 1, "attention block_size %d < 1", s->block_size);
    CHECK(s->num_kv_heads >= 1 && s->num_heads % s->num_kv_heads == 0,
          "attention: %d q heads not a multiple of %d kv heads", s->num_heads, s->num_kv_heads);
    CHECK(s->head_dim >= 1 && s->q_tokens >= 0 && s->k_tokens >= 0, "attention: bad shape");
    return attn_dims(s);
}

// dst [n, ld] = mult * x[t, head, :] with x [T, H, D], for the n tokens
// t = idx[i] (idx != NULL) or t = t0 + i; columns D .. ld (padding) are zero.
static inline void load_rows(float *restrict dst, const float *restrict x, int64_t t0,
                             const int64_t *idx, int n, int H, int head, int D, int ld,
                             float mult) {
    for (int i = 0; i < n; i++) {
        const float *restrict src = x + ((idx ? idx[i] : t0 + i) * H + head) * (int64_t)D;
        float *restrict row = dst + (int64_t)i * ld;
        for (int d = 0; d < D; d++) row[d] = mult * src[d];
        for (int d = D; d < ld; d++) row[d] = 0.0f;
    }
}

// dst [D, ld] with dst[d, j] = x[t, head, d] for the n tokens t = idx[j]
// (idx != NULL) or t = t0 + j: a transposed tile; columns n .. round_up(n)
// (padding) are zero.
static inline void load_cols(float *restrict dst, const float *restrict x, int64_t t0,
                             const int64_t *idx, int n, int H, int head, int D, int ld) {
    for (int j = 0; j < n; j++) {
        const float *restrict src = x + ((idx ? idx[j] : t0 + j) * H + head) * (int64_t)D;
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
static inline void gemm_tile(float *restrict c, int64_t ldc, const float *restrict a, int64_t ai,
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

// Min and max position of each tile: pos [T] -> lo, hi [ceil(T / block)].
static inline void tile_bounds(const int64_t *pos, int64_t T, int block, int64_t *lo,
                               int64_t *hi) {
    for (int64_t t0 = 0, b = 0; t0 < T; t0 += block, b++) {
        int64_t end = t0 + block < T ? t0 + block : T;
        lo[b] = hi[b] = pos[t0];
        for (int64_t t = t0 + 1; t < end; t++) {
            if (pos[t] < lo[b]) lo[b] = pos[t];
            if (pos[t] > hi[b]) hi[b] = pos[t];
        }
    }
}

// Tile counts and per-tile position bounds of one call: lo/hi [nqt] for the
// queries, [nkt] for the keys; q_first [Tq] the first key position each query
// may see (attn_doc_first over the shape's documents) and f_lo/f_hi [nqt] its
// bounds per query tile (one allocation, free(q_lo)).
typedef struct {
    int64_t nqt, nkt;
    int64_t *q_lo, *q_hi, *k_lo, *k_hi, *q_first, *f_lo, *f_hi;
} Tiles;

static inline Tiles make_tiles(const AttnDims *d, const AttnShape *s, const int64_t *q_pos,
                               const int64_t *k_pos) {
    Tiles t = {.nqt = (d->Tq + d->B - 1) / d->B, .nkt = (d->Tk + d->B - 1) / d->B};
    t.q_lo = xmalloc((size_t)(4 * t.nqt + 2 * t.nkt + d->Tq + 1) * sizeof(int64_t));
    t.q_hi = t.q_lo + t.nqt; t.k_lo = t.q_hi + t.nqt; t.k_hi = t.k_lo + t.nkt;
    t.f_lo = t.k_hi + t.nkt; t.f_hi = t.f_lo + t.nqt; t.q_first = t.f_hi + t.nqt;
    tile_bounds(q_pos, d->Tq, d->B, t.q_lo, t.q_hi);
    tile_bounds(k_pos, d->Tk, d->B, t.k_lo, t.k_hi);
    for (int64_t i = 0; i < d->Tq; i++)
        t.q_first[i] = attn_doc_first(s->doc_starts, s->doc_count, q_pos[i]);
    tile_bounds(t.q_first, d->Tq, d->B, t.f_lo, t.f_hi);
    return t;
}

// Query tile qt sees no key of key tile kt: every key after every query, or
// before the document of every query.
static inline int tile_hidden(const Tiles *t, int64_t qt, int64_t kt) {
    return t->k_lo[kt] > t->q_hi[qt] || t->k_hi[kt] < t->f_lo[qt];
}

// Every query of tile qt sees every key of tile kt (no per-element mask).
static inline int tile_full(const Tiles *t, int64_t qt, int64_t kt) {
    return t->k_hi[kt] <= t->q_lo[qt] && t->k_lo[kt] >= t->f_hi[qt];
}

// Per-thread tile buffers of the forward (64-byte aligned; free with
// forward_buffers_free): qs [B, Dp] scale * q; kT [D, Bp]; vs [B, Dp];
// acc [B, Dp] unnormalised o; s [B, Bp] scores, then P; m, l [B] running max, sum.
typedef struct {
    float *qs, *kT, *vs, *acc, *s, *m, *l;
} ForwardBuffers;

static inline ForwardBuffers forward_buffers(const AttnDims *d) {
    const size_t rows = (size_t)d->B * round_up(d->D) * sizeof(float);
    const size_t cols = (size_t)d->D * round_up(d->B) * sizeof(float);
    ForwardBuffers b = {xmalloc_aligned(rows), xmalloc_aligned(cols),
                        xmalloc_aligned(rows), xmalloc_aligned(rows),
                        xmalloc_aligned((size_t)d->B * round_up(d->B) * sizeof(float)),
                        xmalloc_aligned(2 * (size_t)d->B * sizeof(float)), NULL};
    b.l = b.m + d->B;
    return b;
}

static inline void forward_buffers_free(ForwardBuffers *b) {
    free(b->qs); free(b->kT); free(b->vs); free(b->acc); free(b->s); free(b->m);
}

// Start the query tile of q head h, queries i0 .. i0 + bq (q [Tq, Hq, D]):
// qs = scale * q, acc = 0, m = -inf, l = 0.
static inline void forward_begin(const AttnDims *d, ForwardBuffers *b, const float *q, int h,
                                 int64_t i0, int bq) {
    load_rows(b->qs, q, i0, NULL, bq, d->Hq, h, d->D, round_up(d->D), d->scale);
    memset(b->acc, 0, (size_t)bq * round_up(d->D) * sizeof(float));
    for (int i = 0; i < bq; i++) { b->m[i] = -INFINITY; b->l[i] = 0.0f; }
}

// One key tile (in b->kT, b->vs; key positions kp [bk]) of the online softmax
// of the query tile in b->qs (positions qp [bq], first visible key positions
// qf [bq]): S = scale Q K^T, masked where kp[j] > qp[i] or kp[j] < qf[i]
// unless `full` (every key visible); m and l updated, acc rescaled, then
// acc += P V.
static inline __attribute__((always_inline)) void
forward_tile(const AttnDims *d, ForwardBuffers *b, const int64_t *qp, const int64_t *qf,
             const int64_t *kp, int full, int bq, int bk) {
    const int Bp = round_up(d->B), Dp = round_up(d->D), D = d->D;
    float *s = b->s, *m = b->m, *l = b->l, *acc = b->acc;
    const float *qs = b->qs, *kT = b->kT, *vs = b->vs;
    gemm_tile(s, Bp, qs, Dp, 1, kT, Bp, bq, round_up(bk), D, 0);   // S = scale Q K^T
    for (int i = 0; i < bq; i++) {
        float *restrict srow = s + (int64_t)i * Bp;
        if (!full) {
            const int64_t qpi = qp[i], qfi = qf[i];
            for (int j = 0; j < bk; j++)
                if (kp[j] > qpi || kp[j] < qfi) srow[j] = -INFINITY;
        }
        float mx = m[i];
        for (int j = 0; j < bk; j++) mx = srow[j] > mx ? srow[j] : mx;
        if (mx == -INFINITY) {                                     // nothing visible yet
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
        for (int c = 0; c < Dp; c++) arow[c] *= corr;
    }
    gemm_tile(acc, Dp, s, Bp, 1, vs, Dp, bq, Dp, bk, 1);                   // acc += P V
}

// Merge the query tile's chunk result (acc / l, m + log l) into the running
// (o, lse) of q head h, queries i0 .. i0 + bq; rows that saw no key in this
// chunk stay as they are, and o is not read where lse is -inf (nor where its
// weight underflows).
static inline void forward_end(const AttnDims *d, const ForwardBuffers *b, int h, int64_t i0,
                               int bq, const AttnOut *out) {
    for (int i = 0; i < bq; i++) {
        if (b->m[i] == -INFINITY) continue;                        // row saw no key here
        float *restrict orow = out->o + ((i0 + i) * d->Hq + h) * (int64_t)d->D;
        float *lrow = out->lse + h * d->Tq + i0 + i;
        const float chunk = b->m[i] + logf(b->l[i]), old = *lrow;
        const float mx = fmaxf(old, chunk);
        const float wold = expf(old - mx), wnew = expf(chunk - mx);
        const float wa = wold / (wold + wnew), wb = wnew / (wold + wnew) / b->l[i];
        const float *restrict arow = b->acc + (int64_t)i * round_up(d->D);
        if (wa == 0.0f)                                            // o is not read (may be unset)
            for (int c = 0; c < d->D; c++) orow[c] = wb * arow[c];
        else
            for (int c = 0; c < d->D; c++) orow[c] = wa * orow[c] + wb * arow[c];
        *lrow = mx + logf(wold + wnew);
    }
}

// The arguments of one backward call (see attn_dense_backward_cpu); pos.q_first
// is Tiles.q_first.
typedef struct {
    AttnDims d;
    AttnInputs in;
    AttnPos pos;
    AttnGrads grads;
} GradArgs;

// Per-thread tile buffers of the backward (64-byte aligned; free with
// grad_buffers_free): qs [B, Dp] scale * q, dos [B, Dp] dO, ks [B, Dp];
// kT, vT [D, Bp]; acc [2, B, Dp] (dK or dQ, then dV); p, ds [B, Bp].
typedef struct {
    float *qs, *dos, *ks, *kT, *vT, *acc, *p, *ds;
} GradBuffers;

static inline GradBuffers grad_buffers(const AttnDims *d) {
    const size_t rows = (size_t)d->B * round_up(d->D) * sizeof(float);
    const size_t cols = (size_t)d->D * round_up(d->B) * sizeof(float);
    const size_t tile = (size_t)d->B * round_up(d->B) * sizeof(float);
    return (GradBuffers){xmalloc_aligned(rows), xmalloc_aligned(rows), xmalloc_aligned(rows),
                         xmalloc_aligned(cols), xmalloc_aligned(cols), xmalloc_aligned(2 * rows),
                         xmalloc_aligned(tile), xmalloc_aligned(tile)};
}

static inline void grad_buffers_free(GradBuffers *b) {
    free(b->qs); free(b->dos); free(b->ks); free(b->kT); free(b->vT); free(b->acc);
    free(b->p); free(b->ds);
}

// Load the query tile of q head h, queries i0 .. i0 + bq: qs = scale * q, dos = dO.
static inline void grad_load_query(const GradArgs *a, GradBuffers *b, int h, int64_t i0, int bq) {
    load_rows(b->qs, a->in.q, i0, NULL, bq, a->d.Hq, h, a->d.D, round_up(a->d.D), a->d.scale);
    load_rows(b->dos, a->in.dout, i0, NULL, bq, a->d.Hq, h, a->d.D, round_up(a->d.D), 1.0f);
}

// One (query tile, key tile) pair: p = P and ds = P (dP - delta), [bq, Bp]
// each, zero on masked entries (kp[j] > q_pos[i] or kp[j] < q_first[i],
// unless `full`) and on rows
// that never saw a key (lse = -inf). The query tile of q head h (queries
// i0 .. i0 + bq) is in b->qs, b->dos, the key tile (positions kp [bk]) in
// b->kT, b->vT.
static inline void grad_pair(const GradArgs *a, GradBuffers *b, int h, int64_t i0, int bq,
                             const int64_t *kp, int bk, int full) {
    const int Bp = round_up(a->d.B), Dp = round_up(a->d.D);
    const float *lse = a->grads.lse + h * a->d.Tq + i0, *delta = a->grads.delta + h * a->d.Tq + i0;
    const int64_t *qp = a->pos.q_pos + i0, *qf = a->pos.q_first + i0;
    float *restrict p = b->p, *restrict ds = b->ds;
    gemm_tile(p, Bp, b->qs, Dp, 1, b->kT, Bp, bq, round_up(bk), a->d.D, 0);    // S = scale Q K^T
    gemm_tile(ds, Bp, b->dos, Dp, 1, b->vT, Bp, bq, round_up(bk), a->d.D, 0);  // dP = dO V^T
    for (int i = 0; i < bq; i++) {
        float *restrict prow = p + (int64_t)i * Bp, *restrict dsrow = ds + (int64_t)i * Bp;
        if (lse[i] == -INFINITY) {
            for (int j = 0; j < bk; j++) prow[j] = dsrow[j] = 0.0f;
            continue;
        }
        const float li = lse[i], di = delta[i];
        if (!full)
            for (int j = 0; j < bk; j++)
                if (kp[j] > qp[i] || kp[j] < qf[i]) prow[j] = -INFINITY;
        for (int j = 0; j < bk; j++) {
            prow[j] = exp_fast(prow[j] - li);
            dsrow[j] = prow[j] * (dsrow[j] - di);
        }
    }
}

// Key side of a pair: loads the query tile, then dK += dS^T scale Q into
// b->acc and dV += P^T dO into b->acc + B * Dp (the key tile's accumulators).
static inline void grad_pair_kv(const GradArgs *a, GradBuffers *b, int h, int64_t i0, int bq,
                                const int64_t *kp, int bk, int full) {
    const int Bp = round_up(a->d.B), Dp = round_up(a->d.D);
    grad_load_query(a, b, h, i0, bq);
    grad_pair(a, b, h, i0, bq, kp, bk, full);
    float *dka = b->acc, *dva = b->acc + (size_t)a->d.B * Dp;
    gemm_tile(dva, Dp, b->p, 1, Bp, b->dos, Dp, bk, Dp, bq, 1);   // dV += P^T dO
    gemm_tile(dka, Dp, b->ds, 1, Bp, b->qs, Dp, bk, Dp, bq, 1);   // dK += dS^T scale Q
}

// Query side of a pair (query tile loaded; key tile in b->kT, b->vT and
// b->ks [bk, Dp]): dQ / scale += dS K into b->acc.
static inline void grad_pair_q(const GradArgs *a, GradBuffers *b, int h, int64_t i0, int bq,
                               const int64_t *kp, int bk, int full) {
    grad_pair(a, b, h, i0, bq, kp, bk, full);
    const int Dp = round_up(a->d.D);
    gemm_tile(b->acc, Dp, b->ds, round_up(a->d.B), 1, b->ks, Dp, bq, Dp, bk, 1);
}

// grads.dk, grads.dv += the key tile's accumulators (kv head g, keys j0 .. j0 + bk).
static inline void grad_store_kv(const GradArgs *a, const GradBuffers *b, int g, int64_t j0,
                                 int bk) {
    const int D = a->d.D, Dp = round_up(a->d.D);
    const float *dka = b->acc, *dva = b->acc + (size_t)a->d.B * Dp;
    for (int j = 0; j < bk; j++) {
        float *restrict dkrow = a->grads.dk + ((j0 + j) * a->d.Hkv + g) * (int64_t)D;
        float *restrict dvrow = a->grads.dv + ((j0 + j) * a->d.Hkv + g) * (int64_t)D;
        for (int c = 0; c < D; c++) {
            dkrow[c] += dka[(int64_t)j * Dp + c];
            dvrow[c] += dva[(int64_t)j * Dp + c];
        }
    }
}

// grads.dq += scale * the query tile's accumulator (q head h, queries i0 .. i0 + bq).
static inline void grad_store_q(const GradArgs *a, const GradBuffers *b, int h, int64_t i0,
                                int bq) {
    for (int i = 0; i < bq; i++) {
        float *restrict dqrow = a->grads.dq + ((i0 + i) * a->d.Hq + h) * (int64_t)a->d.D;
        const float *restrict arow = b->acc + (int64_t)i * round_up(a->d.D);
        for (int c = 0; c < a->d.D; c++) dqrow[c] += a->d.scale * arow[c];
    }
}

#endif
