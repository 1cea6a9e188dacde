// sparse_flash_cpu.c: block-sparse + vertical-column flash attention on the
// CPU in fp32, one key chunk per call (sparse.h, docs/ARCHITECTURE.md). The work is a
// SparseIndex: per (q head, query block) row, the selected key blocks and the
// extra key columns. Each call maps the chunk's local blocks to global blocks
// and computes only the index's blocks and columns present in the chunk, with
// the token-exact causal mask, through the same tiles as the dense kernel
// (flash_tiles.h): a selected block is one key tile; a row's columns are
// gathered into key tiles of up to B columns.
// Forward: one owner per row (online softmax over its blocks, then its column
// tiles, merged into the running (o, lse) like the dense kernel, so dense and
// sparse chunks can be mixed). Backward, per kv head group, in two passes
// without atomics: (1) per row, dQ over its blocks and column tiles; the
// column tiles' dK, dV parts go to a scratch slot per (row, column);
// (2) per key tile, dK, dV over the rows that selected it (a transposed block
// index built per call), plus the scratch slots of its columns in row order.
// Results do not depend on the thread count.
// A call may compute only part of the index (SparsePart): the blocks (ring
// steps when the columns are gathered), or the columns against K/V rows at an
// arbitrary ascending list of key positions (the gathered columns).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flash_tiles.h"
#include "sparse_flash_cpu.h"
#include "../../dist/util.h"

// Token i of a block-aligned arrangement of T tokens at global positions pos
// holds position first[i / B] * B + i % B; only the sequence's last block may
// be short. first == NULL: the blocks are pos[i * B] / B.
static void check_aligned(const int64_t *pos, int64_t T, int B, int64_t N, const int64_t *first,
                          const char *what) {
    for (int64_t t = 0; t < T; t++) {
        const int64_t block = first ? first[t / B] : pos[t - t % B] / B;
        CHECK(block >= 0 && block * B + t % B == pos[t] && pos[t] < N,
              "sparse attention: %s token %lld at position %lld is not block-aligned "
              "(block size %d, sequence %lld)", what, (long long)t, (long long)pos[t], B,
              (long long)N);
    }
    CHECK(T % B == 0 || pos[T - 1] == N - 1,
          "sparse attention: %s ends with a short block that is not the sequence's last", what);
}

// Entries of every row ascending and in range: blocks <= the row's query
// block, columns < N.
static void check_index(const SparseIndex *x, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t qb = x->q_blocks[r % x->num_q_blocks];
        for (int64_t e = x->block_start[r]; e < x->block_start[r + 1]; e++)
            CHECK(x->blocks[e] >= 0 && x->blocks[e] <= qb &&
                  (e == x->block_start[r] || x->blocks[e] > x->blocks[e - 1]),
                  "sparse index: row %lld block %lld out of order or after query block %lld",
                  (long long)r, (long long)x->blocks[e], (long long)qb);
        for (int64_t e = x->column_start[r]; e < x->column_start[r + 1]; e++)
            CHECK(x->columns[e] >= 0 && x->columns[e] < x->seq_len &&
                  (e == x->column_start[r] || x->columns[e] > x->columns[e - 1]),
                  "sparse index: row %lld column %lld out of order or out of range",
                  (long long)r, (long long)x->columns[e]);
    }
}

// Local key token of column position col in this call, or -1: in the chunk's
// blocks (SPARSE_ALL), in the ascending list k_pos [Tk] (SPARSE_COLUMNS).
static int64_t column_key(SparsePart part, const SparseView *c, const int64_t *k_pos, int64_t Tk,
                          int B, int64_t col) {
    if (part == SPARSE_BLOCKS) return -1;
    if (part == SPARSE_ALL) return c->local_block[col / B] < 0 ? -1 : c->local_block[col / B] * B + col % B;
    int64_t lo = 0, hi = Tk;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (k_pos[mid] < col) lo = mid + 1; else hi = mid;
    }
    return lo < Tk && k_pos[lo] == col ? lo : -1;
}

// Checks the call against the index and builds its view (attn_args.h; free
// with chunk_view_free).
static SparseView chunk_view(SparsePart part, const AttnDims *d, const SparseIndex *x,
                            const int64_t *q_pos, const int64_t *k_pos) {
    const int B = d->B;
    const int64_t N = x->seq_len, nqb = (d->Tq + B - 1) / B, nglobal = (N + B - 1) / B;
    CHECK(x->num_heads == d->Hq && x->block_size == B && x->num_q_blocks == nqb,
          "sparse attention: index (%d heads, block %d, %lld query blocks) does not match the "
          "call (%d heads, block %d, %lld query blocks)", x->num_heads, x->block_size,
          (long long)x->num_q_blocks, d->Hq, B, (long long)nqb);
    check_aligned(q_pos, d->Tq, B, N, x->q_blocks, "query");
    SparseView c = {.rows = (int64_t)d->Hq * nqb, .num_q_blocks = nqb, .block_start = x->block_start,
                    .blocks = x->blocks, .column_start = x->column_start, .columns = x->columns};
    check_index(x, c.rows);
    c.local_block = xmalloc((size_t)(nglobal + 1) * sizeof(int64_t));
    for (int64_t b = 0; b < nglobal; b++) c.local_block[b] = -1;
    if (part == SPARSE_COLUMNS) {
        for (int64_t j = 0; j < d->Tk; j++)
            CHECK(k_pos[j] >= 0 && k_pos[j] < N && (j == 0 || k_pos[j] > k_pos[j - 1]),
                  "sparse attention: column key %lld at position %lld out of order or out of range",
                  (long long)j, (long long)k_pos[j]);
    } else {
        check_aligned(k_pos, d->Tk, B, N, NULL, "key");
        for (int64_t j = 0; j * B < d->Tk; j++) {
            const int64_t global = k_pos[j * B] / B;
            CHECK(c.local_block[global] < 0, "sparse attention: key block %lld appears twice in "
                  "the chunk", (long long)global);
            c.local_block[global] = j;
        }
    }

    c.col_start = xmalloc((size_t)(c.rows + 1) * sizeof(int64_t));
    c.col_start[0] = 0;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < c.rows; r++) {
        int64_t n = 0;
        for (int64_t e = c.column_start[r]; e < c.column_start[r + 1]; e++)
            n += column_key(part, &c, k_pos, d->Tk, B, c.columns[e]) >= 0;
        c.col_start[r + 1] = n;
    }
    for (int64_t r = 0; r < c.rows; r++) c.col_start[r + 1] += c.col_start[r];
    c.col_key = xmalloc((size_t)(c.col_start[c.rows] + 1) * sizeof(int64_t));
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < c.rows; r++) {
        int64_t n = c.col_start[r];
        for (int64_t e = c.column_start[r]; e < c.column_start[r + 1]; e++) {
            const int64_t key = column_key(part, &c, k_pos, d->Tk, B, c.columns[e]);
            if (key >= 0) c.col_key[n++] = key;
        }
    }
    return c;
}

static void chunk_view_free(SparseView *c) {
    free(c->local_block); free(c->col_start); free(c->col_key);
}

// Gather up to B columns (local key tokens idx [n]) of kv head g: kT [D, Bp]
// and, into `rows` [n, Dp], v (forward) or k (backward); kp [n] their
// positions. Returns 1 when every one is visible to every query of tile qt
// (no mask needed).
static int gather_columns(const AttnDims *d, const float *k, const float *rows_src,
                          const int64_t *k_pos, const int64_t *idx, int n, int g, const Tiles *t,
                          int64_t qt, float *kT, float *rows, int64_t *kp) {
    load_cols(kT, k, 0, idx, n, d->Hkv, g, d->D, round_up(d->B));
    load_rows(rows, rows_src, 0, idx, n, d->Hkv, g, d->D, round_up(d->D), 1.0f);
    int64_t lo = INT64_MAX, hi = 0;
    for (int j = 0; j < n; j++) {
        kp[j] = k_pos[idx[j]];
        hi = kp[j] > hi ? kp[j] : hi;
        lo = kp[j] < lo ? kp[j] : lo;
    }
    return hi <= t->q_lo[qt] && lo >= t->f_hi[qt];
}

void attn_sparse_forward_part_cpu(SparsePart part, const AttnShape *shape,
                                  const SparseIndex *index, const float *q, const int64_t *q_pos,
                                  const float *k, const float *v, const int64_t *k_pos, float *o,
                                  float *lse) {
    const AttnDims d = dims_of(shape);
    if (d.Tq == 0 || d.Tk == 0) return;
    const int Bp = round_up(d.B), Dp = round_up(d.D);
    SparseView c = chunk_view(part, &d, index, q_pos, k_pos);
    const Tiles t = make_tiles(&d, shape, q_pos, k_pos);
    const int64_t nqb = t.nqt;
    const AttnOut out = {o, lse};

    #pragma omp parallel
    {
        ForwardBuffers b = forward_buffers(&d);
        int64_t *kp = xmalloc((size_t)d.B * sizeof(int64_t));
        // Later query blocks first: under a causal pattern they carry the most work.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < c.rows; w++) {
            const int64_t r = c.rows - 1 - w, i = r % nqb, i0 = i * d.B;
            const int h = (int)(r / nqb), g = h / d.group, bq = tile_len(d.Tq, i0, d.B);
            forward_begin(&d, &b, q, h, i0, bq);
            for (int64_t e = c.block_start[r]; e < c.block_start[r + 1]; e++) {
                const int64_t kt = c.local_block[c.blocks[e]], j0 = kt * d.B;
                if (kt < 0 || tile_hidden(&t, i, kt)) continue;    // not in this chunk, or masked
                const int bk = tile_len(d.Tk, j0, d.B);
                load_cols(b.kT, k, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                load_rows(b.vs, v, j0, NULL, bk, d.Hkv, g, d.D, Dp, 1.0f);
                forward_tile(&d, &b, q_pos + i0, t.q_first + i0, k_pos + j0, tile_full(&t, i, kt),
                             bq, bk);
            }
            for (int64_t e = c.col_start[r]; e < c.col_start[r + 1]; e += d.B) {
                const int n = tile_len(c.col_start[r + 1], e, d.B);
                const int full = gather_columns(&d, k, v, k_pos, c.col_key + e, n, g, &t, i,
                                                b.kT, b.vs, kp);
                forward_tile(&d, &b, q_pos + i0, t.q_first + i0, kp, full, bq, n);
            }
            forward_end(&d, &b, h, i0, bq, &out);
        }
        forward_buffers_free(&b);
        free(kp);
    }
    free(t.q_lo);
    chunk_view_free(&c);
}

// The backward's transposed index: per (q head h, local key tile kt), bucket
// h * nkt + kt, the local query blocks that selected the tile (ascending),
// q_block[q_start[bucket] ..], and the column slots (SparseView numbering) of
// the rows' columns in the tile, in row order, slot[s_start[bucket] ..].
typedef struct {
    int64_t *q_start, *q_block, *s_start, *slot;
} KeyView;

// Counting sort of the chunk's block entries and column slots by bucket.
static KeyView key_view(const AttnDims *d, const SparseView *c, int64_t nkt) {
    const int64_t nqb = c->num_q_blocks, buckets = (int64_t)d->Hq * nkt;
    KeyView kv = {xcalloc((size_t)buckets + 1, sizeof(int64_t)), NULL,
                  xcalloc((size_t)buckets + 1, sizeof(int64_t)), NULL};
    for (int64_t r = 0; r < c->rows; r++) {
        const int64_t base = r / nqb * nkt;
        for (int64_t e = c->block_start[r]; e < c->block_start[r + 1]; e++) {
            const int64_t kt = c->local_block[c->blocks[e]];
            if (kt >= 0) kv.q_start[base + kt + 1]++;
        }
        for (int64_t s = c->col_start[r]; s < c->col_start[r + 1]; s++)
            kv.s_start[base + c->col_key[s] / d->B + 1]++;
    }
    for (int64_t b = 0; b < buckets; b++) {
        kv.q_start[b + 1] += kv.q_start[b];
        kv.s_start[b + 1] += kv.s_start[b];
    }
    kv.q_block = xmalloc((size_t)(kv.q_start[buckets] + 1) * sizeof(int64_t));
    kv.slot = xmalloc((size_t)(kv.s_start[buckets] + 1) * sizeof(int64_t));
    int64_t *qfill = xmalloc((size_t)(2 * buckets + 1) * sizeof(int64_t)), *sfill = qfill + buckets;
    memcpy(qfill, kv.q_start, (size_t)buckets * sizeof(int64_t));
    memcpy(sfill, kv.s_start, (size_t)buckets * sizeof(int64_t));
    for (int64_t r = 0; r < c->rows; r++) {
        const int64_t base = r / nqb * nkt;
        for (int64_t e = c->block_start[r]; e < c->block_start[r + 1]; e++) {
            const int64_t kt = c->local_block[c->blocks[e]];
            if (kt >= 0) kv.q_block[qfill[base + kt]++] = r % nqb;
        }
        for (int64_t s = c->col_start[r]; s < c->col_start[r + 1]; s++)
            kv.slot[sfill[base + c->col_key[s] / d->B]++] = s;
    }
    free(qfill);
    return kv;
}

static void key_view_free(KeyView *kv) {
    free(kv->q_start); free(kv->q_block); free(kv->s_start); free(kv->slot);
}

void attn_sparse_backward_part_cpu(SparsePart part, const AttnShape *shape,
                                   const SparseIndex *index, const float *q, const int64_t *q_pos,
                                   const float *k, const float *v, const int64_t *k_pos,
                                   const float *lse, const float *delta, const float *dout,
                                   float *dq, float *dk, float *dv) {
    const AttnDims d = dims_of(shape);
    if (d.Tq == 0 || d.Tk == 0) return;
    const int Bp = round_up(d.B), Dp = round_up(d.D);
    SparseView c = chunk_view(part, &d, index, q_pos, k_pos);
    const Tiles t = make_tiles(&d, shape, q_pos, k_pos);
    const GradArgs a = {d, {q, k, v, dout}, {q_pos, k_pos, t.q_first}, {lse, delta, dq, dk, dv}};
    const int64_t nqb = t.nqt, nkt = t.nkt, group_rows = d.group * nqb;
    KeyView kv = key_view(&d, &c, nkt);
    // Column scratch of one kv group: per slot, dV part then dK part [2, Dp].
    int64_t most = 0;
    for (int g = 0; g < d.Hkv; g++) {
        const int64_t n = c.col_start[(g + 1) * group_rows] - c.col_start[g * group_rows];
        most = n > most ? n : most;
    }
    float *scratch = xmalloc_aligned((size_t)(most + 1) * 2 * Dp * sizeof(float));
    const int64_t ld = 2 * (int64_t)Dp;

    #pragma omp parallel
    {
        GradBuffers b = grad_buffers(&d);
        int64_t *kp = xmalloc((size_t)d.B * sizeof(int64_t));
        for (int g = 0; g < d.Hkv; g++) {
            const int64_t slot0 = c.col_start[g * group_rows];
            // Pass 1: dQ of the group's rows; their columns' dK, dV parts to scratch.
            #pragma omp for schedule(dynamic)
            for (int64_t w = 0; w < group_rows; w++) {
                const int64_t r = (g + 1) * group_rows - 1 - w, i = r % nqb, i0 = i * d.B;
                const int h = (int)(r / nqb), bq = tile_len(d.Tq, i0, d.B);
                memset(b.acc, 0, (size_t)d.B * Dp * sizeof(float));
                grad_load_query(&a, &b, h, i0, bq);
                for (int64_t e = c.block_start[r]; e < c.block_start[r + 1]; e++) {
                    const int64_t kt = c.local_block[c.blocks[e]], j0 = kt * d.B;
                    if (kt < 0 || tile_hidden(&t, i, kt)) continue;
                    const int bk = tile_len(d.Tk, j0, d.B);
                    load_cols(b.kT, k, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                    load_cols(b.vT, v, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                    load_rows(b.ks, k, j0, NULL, bk, d.Hkv, g, d.D, Dp, 1.0f);
                    grad_pair_q(&a, &b, h, i0, bq, k_pos + j0, bk, tile_full(&t, i, kt));
                }
                for (int64_t e = c.col_start[r]; e < c.col_start[r + 1]; e += d.B) {
                    const int n = tile_len(c.col_start[r + 1], e, d.B);
                    const int full = gather_columns(&d, k, k, k_pos, c.col_key + e, n, g, &t,
                                                    i, b.kT, b.ks, kp);
                    load_cols(b.vT, v, 0, c.col_key + e, n, d.Hkv, g, d.D, Bp);
                    grad_pair_q(&a, &b, h, i0, bq, kp, n, full);
                    float *sv = scratch + (e - slot0) * ld, *sk = sv + Dp;
                    gemm_tile(sv, ld, b.p, 1, Bp, b.dos, Dp, n, Dp, bq, 0);   // P^T dO
                    gemm_tile(sk, ld, b.ds, 1, Bp, b.qs, Dp, n, Dp, bq, 0);   // dS^T scale Q
                }
                grad_store_q(&a, &b, h, i0, bq);
            }

            // Pass 2: dK, dV of the group's key tiles.
            #pragma omp for schedule(dynamic)
            for (int64_t kt = 0; kt < nkt; kt++) {
                const int64_t j0 = kt * d.B;
                const int bk = tile_len(d.Tk, j0, d.B);
                float *dka = b.acc, *dva = b.acc + (size_t)d.B * Dp;
                memset(b.acc, 0, 2 * (size_t)d.B * Dp * sizeof(float));
                load_cols(b.kT, k, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                load_cols(b.vT, v, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                for (int h = g * d.group; h < (g + 1) * d.group; h++) {
                    const int64_t bucket = h * nkt + kt;
                    for (int64_t e = kv.q_start[bucket]; e < kv.q_start[bucket + 1]; e++) {
                        const int64_t i = kv.q_block[e], i0 = i * d.B;
                        if (tile_hidden(&t, i, kt)) continue;
                        grad_pair_kv(&a, &b, h, i0, tile_len(d.Tq, i0, d.B), k_pos + j0, bk,
                                     tile_full(&t, i, kt));
                    }
                    for (int64_t e = kv.s_start[bucket]; e < kv.s_start[bucket + 1]; e++) {
                        const int64_t s = kv.slot[e], j = c.col_key[s] - j0;
                        const float *sv = scratch + (s - slot0) * ld, *sk = sv + Dp;
                        for (int x = 0; x < Dp; x++) {
                            dva[j * Dp + x] += sv[x];
                            dka[j * Dp + x] += sk[x];
                        }
                    }
                }
                grad_store_kv(&a, &b, g, j0, bk);
            }
        }
        grad_buffers_free(&b);
        free(kp);
    }
    free(scratch);
    key_view_free(&kv);
    free(t.q_lo);
    chunk_view_free(&c);
}

void attn_sparse_forward_cpu(const AttnShape *shape, const SparseIndex *index,
                             const float *q, const int64_t *q_pos, const float *k,
                             const float *v, const int64_t *k_pos, float *o, float *lse) {
    attn_sparse_forward_part_cpu(SPARSE_ALL, shape, index, q, q_pos, k, v, k_pos, o, lse);
}

void attn_sparse_backward_cpu(const AttnShape *shape, const SparseIndex *index,
                              const float *q, const int64_t *q_pos, const float *k,
                              const float *v, const int64_t *k_pos, const float *lse,
                              const float *delta, const float *dout, float *dq, float *dk,
                              float *dv) {
    attn_sparse_backward_part_cpu(SPARSE_ALL, shape, index, q, q_pos, k, v, k_pos, lse, delta,
                                  dout, dq, dk, dv);
}
