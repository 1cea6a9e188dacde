// test_ring_need.c: ring_send selected's dense need (attention/ring/ring_plan.h)
// on rings of a layout on paper (ring_init_layout): ring_dense_need sets
// exactly the key blocks a brute-force scan finds for every query tile, over
// sequences of more than 64 and 128 blocks (several words per rank), every
// layout, 1 to 4 ranks, with and without documents; ring_dense_need_kept
// returns the bits it keeps while nothing changed and computes them again
// after ring_dense_need_forget and when the block size or the document
// starts' contents change.
#include <stdlib.h>
#include <string.h>

#include "../../attention/layout.h"
#include "../../attention/ring/ring_plan.h"
#include "../../attention/ring/ring_sparse.h"
#include "../lib/check.h"

// The need by its definition, one (rank, query tile, key, block) at a time:
// block b is read when one of its keys is visible to one of the tile's queries.
static void brute_need(const Ring *ring, const AttnShape *shape, int64_t N, int64_t words, uint64_t *bits) {
    const int B = shape->block_size;
    memset(bits, 0, sizeof(uint64_t) * (size_t)(ring->cp->size * words));
    for (int r = 0; r < ring->cp->size; r++) {
        const int64_t T = ring->counts[r], *pos = ring->positions + ring->offsets[r];
        for (int64_t t = 0; t < T; t++) {
            int64_t first = 0;
            for (int64_t s = 0; s < shape->doc_count; s++)
                if (shape->doc_starts[s] <= pos[t]) first = shape->doc_starts[s];
            const int64_t tile_last = pos[(t / B) * B + B - 1 < T ? (t / B) * B + B - 1 : T - 1];
            for (int64_t key = 0; key < N; key++)
                if (key <= tile_last && key >= first && t % B == 0)
                    bits[r * words + key / B / 64] |= (uint64_t)1 << (key / B % 64);
        }
    }
}

static int same_bits(const uint64_t *a, const uint64_t *b, int64_t n) {
    return !memcmp(a, b, sizeof(uint64_t) * (size_t)n);
}

static void check_exact(void) {
    const int B = 4;
    const int64_t lengths[] = {B * 64 * 2 + 3 * B, B * 130, B * 70 + B};   // 131, 130, 71 blocks
    int64_t starts[] = {0, B * 9 + 5, B * 63, B * 64 + 2, B * 100};
    for (int W = 1; W <= 4; W *= 2)
        for (int l = 0; l < 3; l++)
            for (size_t n = 0; n < sizeof(lengths) / sizeof(lengths[0]); n++)
                for (int docs = 0; docs < 2; docs++) {
                    const int64_t N = lengths[n], words = ring_need_words(N, B);
                    Comm comm;
                    Ring ring;
                    ring_init_layout(&ring, &comm, (LayoutKind)l, N, B, W, W);
                    const AttnShape shape = {.block_size = B, .doc_starts = docs ? starts : NULL,
                                             .doc_count = docs ? 5 : 0};
                    uint64_t *got = malloc(sizeof(uint64_t) * (size_t)(W * words));
                    uint64_t *want = malloc(sizeof(uint64_t) * (size_t)(W * words));
                    ring_dense_need(&ring, &shape, words, got);
                    brute_need(&ring, &shape, N, words, want);
                    EXPECT(same_bits(got, want, W * words), "ring_dense_need_exact_%s_W%d_N%lld%s",
                           layout_name((LayoutKind)l), W, (long long)N, docs ? "_documents" : "");
                    free(got);
                    free(want);
                    ring_free(&ring);
                }
}

static void check_kept(void) {
    const int B = 4, W = 2;
    const int64_t N = B * 80, words = ring_need_words(N, B);
    Comm comm;
    Ring ring;
    ring_init_layout(&ring, &comm, LAYOUT_ZIGZAG, N, B, W, W);
    int64_t starts[] = {0, B * 30};
    AttnShape shape = {.block_size = B, .doc_starts = starts, .doc_count = 2};
    uint64_t *fresh = malloc(sizeof(uint64_t) * (size_t)(W * words));
    RingDenseNeed kept = {0};

    RingNeed need = ring_dense_need_kept(&kept, &ring, &shape);
    ring_dense_need(&ring, &shape, words, fresh);
    EXPECT(need.block_size == B && need.words == words && same_bits(need.need, fresh, W * words),
           "ring_dense_need_kept_first: the bits of ring_dense_need");
    kept.bits[0] ^= 1;                        // a mark that only a recomputation removes
    need = ring_dense_need_kept(&kept, &ring, &shape);
    EXPECT((need.need[0] ^ fresh[0]) == 1, "ring_dense_need_kept_same: the same call again is not recomputed");

    starts[1] = B * 50;                       // the same array, other contents
    need = ring_dense_need_kept(&kept, &ring, &shape);
    ring_dense_need(&ring, &shape, words, fresh);
    EXPECT(same_bits(need.need, fresh, W * words), "ring_dense_need_kept_documents: other document starts recompute");

    kept.bits[0] ^= 1;
    shape.doc_starts = NULL;
    shape.doc_count = 0;
    need = ring_dense_need_kept(&kept, &ring, &shape);
    ring_dense_need(&ring, &shape, words, fresh);
    EXPECT(same_bits(need.need, fresh, W * words), "ring_dense_need_kept_no_documents: dropping them recomputes");

    kept.bits[0] ^= 1;
    ring_dense_need_forget(&kept);
    need = ring_dense_need_kept(&kept, &ring, &shape);
    EXPECT(same_bits(need.need, fresh, W * words), "ring_dense_need_kept_forget: a new sequence recomputes");

    ring_free(&ring);
    shape.block_size = 2 * B;                 // the same tokens in blocks of 2B
    const int64_t words2 = ring_need_words(N, 2 * B);
    ring_init_layout(&ring, &comm, LAYOUT_ZIGZAG, N, 2 * B, W, W);
    need = ring_dense_need_kept(&kept, &ring, &shape);
    ring_dense_need(&ring, &shape, words2, fresh);
    EXPECT(need.block_size == 2 * B && same_bits(need.need, fresh, W * words2),
           "ring_dense_need_kept_block_size: another block size recomputes");
    ring_dense_need_free(&kept);
    free(fresh);
    ring_free(&ring);
}

int main(void) {
    check_exact();
    check_kept();
    return check_exit();
}
