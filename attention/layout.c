// layout.c: which global blocks and token positions each context-parallel
// rank holds (contiguous / zigzag / striped), and the document rule of the
// masks (attn_doc_first), see layout.h.
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"

static const char *layout_names[] = {
    [LAYOUT_CONTIGUOUS] = "contiguous", [LAYOUT_ZIGZAG] = "zigzag", [LAYOUT_STRIPED] = "striped"};

int layout_parse(const char *name) {
    for (int kind = 0; kind < (int)(sizeof(layout_names) / sizeof(layout_names[0])); kind++) {
        if (strcmp(name, layout_names[kind]) == 0) return kind;
    }
    return -1;
}

const char *layout_name(LayoutKind kind) { return layout_names[kind]; }

// Blocks [first, last) into blocks[count...]; returns the new count.
static int64_t append_run(int64_t *blocks, int64_t count, int64_t first, int64_t last) {
    for (int64_t b = first; b < last; b++) {
        if (blocks) blocks[count] = b;
        count++;
    }
    return count;
}

int64_t layout_rank_blocks(LayoutKind kind, int64_t seq_len, int block_size, int world, int rank,
                           int64_t *blocks) {
    CHECK(seq_len > 0 && block_size > 0 && world > 0 && rank >= 0 && rank < world,
          "layout: bad shape (seq_len %lld, block_size %d, rank %d of %d)", (long long)seq_len,
          block_size, rank, world);
    int64_t num_blocks = (seq_len + block_size - 1) / block_size;
    switch (kind) {
    case LAYOUT_CONTIGUOUS:
        return append_run(blocks, 0, num_blocks * rank / world, num_blocks * (rank + 1) / world);
    case LAYOUT_ZIGZAG: {
        int64_t runs = 2 * (int64_t)world, mirror = runs - 1 - rank;
        int64_t count = append_run(blocks, 0, num_blocks * rank / runs, num_blocks * (rank + 1) / runs);
        return append_run(blocks, count, num_blocks * mirror / runs, num_blocks * (mirror + 1) / runs);
    }
    case LAYOUT_STRIPED: {
        int64_t count = 0;
        for (int64_t b = rank; b < num_blocks; b += world) {
            if (blocks) blocks[count] = b;
            count++;
        }
        return count;
    }
    }
    fail("layout_rank_blocks: unknown layout %d", (int)kind);
}

int64_t layout_rank_positions(LayoutKind kind, int64_t seq_len, int block_size, int world,
                              int rank, int64_t *pos) {
    int64_t num_blocks = layout_rank_blocks(kind, seq_len, block_size, world, rank, NULL);
    int64_t *blocks = xmalloc((size_t)(num_blocks > 0 ? num_blocks : 1) * sizeof(int64_t));
    layout_rank_blocks(kind, seq_len, block_size, world, rank, blocks);
    int64_t count = 0;
    for (int64_t i = 0; i < num_blocks; i++) {
        int64_t first = blocks[i] * block_size;
        int64_t last = first + block_size < seq_len ? first + block_size : seq_len;
        for (int64_t p = first; p < last; p++) {
            if (pos) pos[count] = p;
            count++;
        }
    }
    free(blocks);
    return count;
}

int64_t attn_doc_first(const int64_t *doc_starts, int64_t doc_count, int64_t p) {
    int64_t lo = 0, hi = doc_count;                                // first start > p: hi
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (doc_starts[mid] <= p) lo = mid + 1; else hi = mid;
    }
    return hi == 0 ? INT64_MIN : doc_starts[hi - 1];
}
