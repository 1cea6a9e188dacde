// test_layout.c: token layouts over context-parallel ranks (attention/layout.h):
// every layout is a partition of the sequence into whole blocks, ascending per
// rank, with the shape its name promises; zigzag balances dense causal work.
#include <stdlib.h>
#include <string.h>

#include "../../attention/layout.h"
#include "../lib/check.h"

// Checks one (kind, N, B, W): returns the dense causal work (sum of pos+1) of
// the busiest rank divided by the mean.
static double check_partition(LayoutKind kind, int64_t N, int B, int W) {
    int64_t num_blocks = (N + B - 1) / B;
    int *owner = malloc((size_t)N * sizeof(int));
    int64_t *pos = malloc((size_t)N * sizeof(int64_t));
    int64_t *blocks = malloc((size_t)num_blocks * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++) owner[i] = -1;
    int partition = 1, aligned = 1, ascending = 1, shape = 1;
    double max_work = 0, total_work = 0;
    int64_t min_blocks = num_blocks, max_blocks = 0;
    for (int r = 0; r < W; r++) {
        int64_t nb = layout_rank_blocks(kind, N, B, W, r, blocks);
        int64_t nt = layout_rank_positions(kind, N, B, W, r, pos);
        if (nb < min_blocks) min_blocks = nb;
        if (nb > max_blocks) max_blocks = nb;
        double work = 0;
        for (int64_t i = 0; i < nt; i++) {
            if (pos[i] < 0 || pos[i] >= N || owner[pos[i]] != -1) partition = 0;
            else owner[pos[i]] = r;
            if (i > 0 && pos[i] <= pos[i - 1]) ascending = 0;
            if (i % B == 0 && pos[i] % B != 0) aligned = 0;
            if (i / B < nb && pos[i] / B != blocks[i / B]) aligned = 0;
            work += (double)(pos[i] + 1);
        }
        for (int64_t i = 0; i < nb; i++) {
            if (kind == LAYOUT_STRIPED && blocks[i] % W != r) shape = 0;
            if (kind == LAYOUT_CONTIGUOUS && i > 0 && blocks[i] != blocks[i - 1] + 1) shape = 0;
        }
        if (kind == LAYOUT_ZIGZAG) {  // at most two runs: r-th and (2W-1-r)-th
            int runs = 0;
            for (int64_t i = 0; i < nb; i++) runs += (i == 0 || blocks[i] != blocks[i - 1] + 1);
            if (runs > 2) shape = 0;
        }
        if (work > max_work) max_work = work;
        total_work += work;
    }
    for (int64_t i = 0; i < N; i++) if (owner[i] < 0) partition = 0;
    if (kind == LAYOUT_CONTIGUOUS && max_blocks - min_blocks > 1) shape = 0;
    if (kind == LAYOUT_ZIGZAG && max_blocks - min_blocks > 2) shape = 0;
    EXPECT(partition && aligned && ascending && shape,
           "%s N=%lld B=%d W=%d: partition %d, block-aligned %d, ascending %d, shape %d",
           layout_name(kind), (long long)N, B, W, partition, aligned, ascending, shape);
    free(owner); free(pos); free(blocks);
    return max_work / (total_work / W);
}

int main(void) {
    const int64_t lengths[] = {1, 7, 64, 100, 1000, 4099};
    const int blocks[] = {1, 16, 64};
    for (int kind = 0; kind < 3; kind++)
        for (size_t n = 0; n < sizeof(lengths) / sizeof(lengths[0]); n++)
            for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++)
                for (int W = 1; W <= 8; W *= 2) check_partition(kind, lengths[n], blocks[b], W);

    // Dense causal work per rank on 16 ranks: zigzag near 1, contiguous ~2.
    double contiguous = check_partition(LAYOUT_CONTIGUOUS, 1 << 16, 128, 16);
    double zigzag = check_partition(LAYOUT_ZIGZAG, 1 << 16, 128, 16);
    EXPECT(zigzag < 1.01 && contiguous > 1.8, "dense causal imbalance on 16 ranks: zigzag %.3f, contiguous %.3f",
           zigzag, contiguous);
    EXPECT(layout_parse("striped") == LAYOUT_STRIPED && layout_parse("zigzag") == LAYOUT_ZIGZAG &&
           layout_parse("contiguous") == LAYOUT_CONTIGUOUS && layout_parse("ring") == -1,
           "layout names parse");
    return check_exit();
}
