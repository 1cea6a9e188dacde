// ring_plan.c: the geometry of the ring schedules (ring_plan.h), and
// ring_send_tokens, the byte planner of ring_send built on it. No MPI.
#include "ring_plan.h"

#include <stdlib.h>
#include <string.h>

#include "../../dist/util.h"

int ring_rank_at(const Place *p, int o, int i) {
    return ((o % p->outer + p->outer) % p->outer) * p->inner + (i % p->inner + p->inner) % p->inner;
}

Place ring_place(const Ring *ring, int r, int64_t kv) {
    Place p = {.inner = ring->inner, .outer = ring->outer, .o = r / ring->inner, .i = r % ring->inner, .kv = kv};
    p.inner_next = ring_rank_at(&p, p.o, p.i + 1);
    p.inner_prev = ring_rank_at(&p, p.o, p.i - 1);
    p.outer_next = ring_rank_at(&p, p.o + 1, p.i);
    p.outer_prev = ring_rank_at(&p, p.o - 1, p.i);
    return p;
}

int ring_chunk_at(const Place *p, int so, int si) { return ring_rank_at(p, p->o - so, p->i - si); }

Holdings ring_kv_serves(const Place *p, int so, int si) {
    return (Holdings){so, si > 0 ? so + 1 : p->outer, si, p->inner};
}

// A dK/dV accumulator leaving holding (so, si) carries what its holders
// added: on the inner ring (si < inner-1) inner steps 0 .. si of outer step
// so; after the last inner step (to the next node or home) every holding of
// outer steps 0 .. so. Other rows are zero (no holder used their block).
static Holdings dkv_carries(const Place *p, int so, int si) {
    return si < p->inner - 1 ? (Holdings){so, so + 1, 0, si + 1} : (Holdings){0, so + 1, 0, p->inner};
}

int64_t ring_selected_tokens(const Ring *ring, const Place *p, const RingNeed *need, int c, Holdings h,
                             uint64_t *mask, int64_t *sel) {
    const int64_t count = ring->counts[c], *pos = ring->positions + ring->offsets[c];
    if (!need) {
        for (int64_t t = 0; t < count; t++) sel[t] = t;
        return count;
    }
    const int c_o = c / p->inner, c_i = c % p->inner;
    memset(mask, 0, (size_t)need->words * sizeof(uint64_t));
    for (int o = h.o_from; o < h.o_to; o++)
        for (int i = h.i_from; i < h.i_to; i++) {
            if (o == 0 && i == 0) continue;
            const uint64_t *row = need->need + (int64_t)ring_rank_at(p, c_o + o, c_i + i) * need->words;
            for (int64_t w = 0; w < need->words; w++) mask[w] |= row[w];
        }
    int64_t n = 0;
    for (int64_t t = 0; t < count; t++) {
        const int64_t b = pos[t] / need->block_size;
        if (mask[b / 64] >> (b % 64) & 1) sel[n++] = t;
    }
    return n;
}

int64_t ring_dkv_rows(const Ring *ring, const Place *p, const RingNeed *need, int c, int so, int si,
                      uint64_t *mask, int64_t *sel) {
    if (so == 0 && si == 0) return -1;
    return ring_selected_tokens(ring, p, need, c, dkv_carries(p, so, si), mask, sel);
}

bool ring_chunk_visible(const int64_t *q_pos, int64_t Tq, const int64_t *k_pos, int64_t Tk,
                        const int64_t *doc_starts, int64_t doc_count) {
    // A query q sees keys in [first(q), q]; both ends grow with q, so one
    // pass over the keys finds the first at or after each query's first.
    int64_t j = 0;
    for (int64_t i = 0; i < Tq && j < Tk; i++) {
        const int64_t first = attn_doc_first(doc_starts, doc_count, q_pos[i]);
        while (j < Tk && k_pos[j] < first) j++;
        if (j < Tk && k_pos[j] <= q_pos[i]) return true;
    }
    return false;
}

int64_t ring_need_words(int64_t seq_len, int block_size) {
    return ((seq_len + block_size - 1) / block_size + 63) / 64;
}

// Bits lo .. hi (inclusive) of row set, a word at a time.
static void set_bit_range(uint64_t *row, int64_t lo, int64_t hi) {
    for (int64_t w = lo / 64; w <= hi / 64; w++) {
        const int from = w == lo / 64 ? (int)(lo % 64) : 0, to = w == hi / 64 ? (int)(hi % 64) : 63;
        row[w] |= (~(uint64_t)0 >> (63 - to)) & (~(uint64_t)0 << from);
    }
}

void ring_dense_need(const Ring *ring, const AttnShape *shape, int64_t words, uint64_t *bits) {
    const int W = ring->cp->size, B = shape->block_size;
    memset(bits, 0, (size_t)(W * words) * sizeof(uint64_t));
    for (int r = 0; r < W; r++) {
        const int64_t T = ring->counts[r], *pos = ring->positions + ring->offsets[r];
        uint64_t *row = bits + r * words;
        for (int64_t t = 0; t < T; t++)
            CHECK(pos[t] - t % B == pos[t - t % B] && pos[t - t % B] % B == 0,
                  "ring: rank %d token %lld at position %lld is not in a whole block of %d (expected a layout's "
                  "block-aligned positions)", r, (long long)t, (long long)pos[t], B);
        for (int64_t i0 = 0; i0 < T; i0 += B) {               // query tile: tokens i0 .. last
            const int64_t last = (i0 + B < T ? i0 + B : T) - 1;
            const int64_t first = attn_doc_first(shape->doc_starts, shape->doc_count, pos[i0]);
            set_bit_range(row, first > 0 ? first / B : 0, pos[last] / B);
        }
    }
}

RingNeed ring_dense_need_kept(RingDenseNeed *kept, const Ring *ring, const AttnShape *shape) {
    const int64_t words = ring_need_words(ring->offsets[ring->cp->size], shape->block_size);
    const int64_t doc_count = shape->doc_starts ? shape->doc_count : 0;
    const size_t doc_bytes = sizeof(int64_t) * (size_t)doc_count;
    if (kept->block_size != shape->block_size || kept->doc_count != doc_count ||
        (doc_count && memcmp(kept->doc_starts, shape->doc_starts, doc_bytes))) {
        kept->bits = xrealloc(kept->bits, sizeof(uint64_t) * (size_t)(ring->cp->size * words));
        ring_dense_need(ring, shape, words, kept->bits);
        kept->doc_starts = xrealloc(kept->doc_starts, doc_bytes + sizeof(int64_t));
        if (doc_count) memcpy(kept->doc_starts, shape->doc_starts, doc_bytes);
        kept->doc_count = doc_count;
        kept->block_size = shape->block_size;
    }
    return (RingNeed){.block_size = shape->block_size, .words = words, .need = kept->bits};
}

void ring_dense_need_forget(RingDenseNeed *kept) { kept->block_size = 0; }

void ring_dense_need_free(RingDenseNeed *kept) {
    free(kept->bits);
    free(kept->doc_starts);
    *kept = (RingDenseNeed){0};
}

void ring_send_tokens(const Ring *ring, const RingNeed *need, int64_t *kv_tokens, int64_t *dkv_tokens) {
    const int W = ring->cp->size;
    uint64_t *mask = xmalloc((size_t)(need ? need->words : 1) * sizeof(uint64_t));
    int64_t *sel = xmalloc((size_t)(ring->max_count + 1) * sizeof(int64_t));
    memset(kv_tokens, 0, (size_t)W * W * sizeof(int64_t));
    memset(dkv_tokens, 0, (size_t)W * W * sizeof(int64_t));
    for (int r = 0; r < W; r++) {
        const Place p = ring_place(ring, r, 1);
        for (int so = 0; so < p.outer; so++)
            for (int si = 0; si < p.inner; si++) {
                const int64_t at = (int64_t)r * W + so * p.inner + si;
                const int c = ring_chunk_at(&p, so, si);
                if (si == 0 && so < p.outer - 1)      // outer: to holding (so + 1, 0)
                    kv_tokens[at] += ring_selected_tokens(ring, &p, need, c, ring_kv_serves(&p, so + 1, 0), mask, sel);
                if (si < p.inner - 1)                  // inner: to holding (so, si + 1)
                    kv_tokens[at] += ring_selected_tokens(ring, &p, need, c, ring_kv_serves(&p, so, si + 1), mask, sel);
                const int64_t dkv = ring_dkv_rows(ring, &p, need, c, so, si, mask, sel);
                dkv_tokens[at] = dkv > 0 ? dkv : 0;   // the owner's holding sends none
            }
    }
    free(mask);
    free(sel);
}
