// flash_cpu.c: dense causal flash attention on the CPU in fp32, one key chunk
// per call (see attention.h). Tiles of block_size queries x block_size keys,
// online softmax with fp32 running max/sum/accumulator, never a Tq x Tk matrix.
// The mask is by global position (key j visible to query i iff
// k_pos[j] <= q_pos[i], and with documents k_pos[j] at or after the start of
// query i's document); per-tile position bounds skip fully masked tiles and
// drop the per-element test in fully visible ones. Parallel over (head, tile)
// with one owner per output tile, so results do not depend on thread count.
// The backward (FlashAttention-2, P recomputed from the final LSE) makes two
// passes: dK, dV per (kv head, key tile), then dQ per (q head, query tile).
// The tile routines (register-blocked products, polynomial exp, online
// softmax, gradient pairs) are in flash_tiles.h, shared with the sparse kernel.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flash_cpu.h"
#include "flash_tiles.h"
#include "../../dist/util.h"

void attn_forward_init(const AttnShape *shape, float *o, float *lse) {
    int64_t rows = shape->q_tokens * shape->num_heads;
    memset(o, 0, (size_t)(rows * shape->head_dim) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) lse[r] = -INFINITY;
}

void attn_dense_forward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                            const float *k, const float *v, const int64_t *k_pos,
                            float *o, float *lse) {
    const AttnDims d = dims_of(shape);
    const int Bp = round_up(d.B), Dp = round_up(d.D);
    const Tiles t = make_tiles(&d, shape, q_pos, k_pos);
    if (t.nqt == 0 || t.nkt == 0) { free(t.q_lo); return; }
    const AttnOut out = {o, lse};

    #pragma omp parallel
    {
        ForwardBuffers b = forward_buffers(&d);
        // Later query tiles first: under a causal mask they carry the most work.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < d.Hq * t.nqt; w++) {
            const int h = (int)(w / t.nqt), g = h / d.group;
            const int64_t qt = t.nqt - 1 - w % t.nqt, i0 = qt * d.B;
            const int bq = tile_len(d.Tq, i0, d.B);
            forward_begin(&d, &b, q, h, i0, bq);
            for (int64_t kt = 0; kt < t.nkt; kt++) {
                if (tile_hidden(&t, qt, kt)) continue;
                const int64_t j0 = kt * d.B;
                const int bk = tile_len(d.Tk, j0, d.B);
                load_cols(b.kT, k, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                load_rows(b.vs, v, j0, NULL, bk, d.Hkv, g, d.D, Dp, 1.0f);
                forward_tile(&d, &b, q_pos + i0, t.q_first + i0, k_pos + j0, tile_full(&t, qt, kt),
                             bq, bk);
            }
            forward_end(&d, &b, h, i0, bq, &out);
        }
        forward_buffers_free(&b);
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

void attn_dense_backward_cpu(const AttnShape *shape, const float *q, const int64_t *q_pos,
                             const float *k, const float *v, const int64_t *k_pos,
                             const float *lse, const float *delta, const float *dout,
                             float *dq, float *dk, float *dv) {
    const AttnDims d = dims_of(shape);
    const int Bp = round_up(d.B), Dp = round_up(d.D);
    const Tiles t = make_tiles(&d, shape, q_pos, k_pos);
    if (t.nqt == 0 || t.nkt == 0) { free(t.q_lo); return; }
    const GradArgs a = {d, {q, k, v, dout}, {q_pos, k_pos, t.q_first}, {lse, delta, dq, dk, dv}};

    #pragma omp parallel
    {
        GradBuffers b = grad_buffers(&d);
        // Pass 1: dK, dV of one (kv head, key tile), over its group's q heads
        // and every query tile that sees it.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < d.Hkv * t.nkt; w++) {
            const int g = (int)(w / t.nkt);
            const int64_t kt = w % t.nkt, j0 = kt * d.B;
            const int bk = tile_len(d.Tk, j0, d.B);
            memset(b.acc, 0, 2 * (size_t)d.B * Dp * sizeof(float));
            load_cols(b.kT, k, j0, NULL, bk, d.Hkv, g, d.D, Bp);
            load_cols(b.vT, v, j0, NULL, bk, d.Hkv, g, d.D, Bp);
            for (int h = g * d.group; h < (g + 1) * d.group; h++) {
                for (int64_t qt = 0; qt < t.nqt; qt++) {
                    if (tile_hidden(&t, qt, kt)) continue;
                    const int64_t i0 = qt * d.B;
                    grad_pair_kv(&a, &b, h, i0, tile_len(d.Tq, i0, d.B), k_pos + j0, bk,
                                 tile_full(&t, qt, kt));
                }
            }
            grad_store_kv(&a, &b, g, j0, bk);
        }

        // Pass 2: dQ of one (q head, query tile), recomputing P and dS; later
        // query tiles (more causal work) first.
        #pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < d.Hq * t.nqt; w++) {
            const int h = (int)(w / t.nqt), g = h / d.group;
            const int64_t qt = t.nqt - 1 - w % t.nqt, i0 = qt * d.B;
            const int bq = tile_len(d.Tq, i0, d.B);
            memset(b.acc, 0, (size_t)d.B * Dp * sizeof(float));
            grad_load_query(&a, &b, h, i0, bq);
            for (int64_t kt = 0; kt < t.nkt; kt++) {
                if (tile_hidden(&t, qt, kt)) continue;
                const int64_t j0 = kt * d.B;
                const int bk = tile_len(d.Tk, j0, d.B);
                load_cols(b.kT, k, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                load_cols(b.vT, v, j0, NULL, bk, d.Hkv, g, d.D, Bp);
                load_rows(b.ks, k, j0, NULL, bk, d.Hkv, g, d.D, Dp, 1.0f);
                grad_pair_q(&a, &b, h, i0, bq, k_pos + j0, bk, tile_full(&t, qt, kt));
            }
            grad_store_q(&a, &b, h, i0, bq);
        }
        grad_buffers_free(&b);
    }
    free(t.q_lo);
}
