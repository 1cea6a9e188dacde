// test_balance.c: ring work per rank and step (attention/ring/balance.h) on
// indices built by hand: dense causal work is balanced by zigzag and not by
// contiguous; a diagonal-band pattern is balanced by striped and not by
// zigzag; the work adds up to the pattern's score elements.
#include <stdlib.h>
#include <string.h>

#include "../../attention/ring/balance.h"
#include "../lib/check.h"

typedef int (*BlockRule)(int64_t qb, int64_t kb);

static int rule_dense(int64_t qb, int64_t kb) { return kb <= qb; }
// the diagonal block and slash lines at block offsets 5, 37, 70
static int rule_slashes(int64_t qb, int64_t kb) {
    int64_t d = qb - kb;
    return d == 0 || d == 5 || d == 37 || d == 70;
}

// One head, every query block, blocks chosen by rule, no columns.
static void make_index(SparseIndex *ix, int64_t N, int B, BlockRule rule) {
    int64_t nb = (N + B - 1) / B;
    memset(ix, 0, sizeof(*ix));
    ix->num_heads = 1; ix->block_size = B; ix->seq_len = N; ix->num_q_blocks = nb;
    ix->q_blocks = malloc(sizeof(int64_t) * (size_t)nb);
    ix->block_start = calloc((size_t)nb + 1, sizeof(int64_t));
    ix->column_start = calloc((size_t)nb + 1, sizeof(int64_t));
    ix->blocks = malloc(sizeof(int64_t) * (size_t)(nb * (nb + 1) / 2));
    ix->columns = malloc(sizeof(int64_t));
    int64_t n = 0;
    for (int64_t qb = 0; qb < nb; qb++) {
        ix->q_blocks[qb] = qb;
        for (int64_t kb = 0; kb <= qb; kb++) if (rule(qb, kb)) ix->blocks[n++] = kb;
        ix->block_start[qb + 1] = n;
    }
}

// Step imbalance (rank imbalance into *rank), total work into *total.
static double imbalance(const SparseIndex *ix, LayoutKind layout, int W, bool gathered, double *rank,
                        double *total) {
    double *work = malloc(sizeof(double) * (size_t)W * W);
    balance_work(ix, layout, W, gathered, work);
    *total = 0;
    for (int i = 0; i < W * W; i++) *total += work[i];
    *rank = balance_rank_imbalance(work, W);
    double result = balance_step_imbalance(work, W);
    free(work);
    return result;
}

// Adds the first `count` positions as columns to every row (a sink).
static void add_sink_columns(SparseIndex *ix, int64_t count) {
    int64_t rows = ix->num_q_blocks;
    free(ix->columns);
    ix->columns = malloc(sizeof(int64_t) * (size_t)(rows * count));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < count; c++) ix->columns[r * count + c] = c;
        ix->column_start[r + 1] = (r + 1) * count;
    }
}

int main(void) {
    const int W = 8, B = 16;
    const int64_t N = 16 * B * W + 5;  // a short last block
    SparseIndex dense, slashes;
    make_index(&dense, N, B, rule_dense);
    make_index(&slashes, N, B, rule_slashes);
    double total, rank, expect = (double)N * (N + 1) / 2;
    double zz = imbalance(&dense, LAYOUT_ZIGZAG, W, false, &rank, &total);
    EXPECT(total == expect, "dense work adds up to N(N+1)/2 = %.0f (got %.0f)", expect, total);
    double zz_rank = rank;
    double contiguous = imbalance(&dense, LAYOUT_CONTIGUOUS, W, false, &rank, &total);
    EXPECT(zz < 1.1 && zz_rank < 1.1 && contiguous > 1.5 && rank > 1.5,
           "dense causal: zigzag step %.3f rank %.3f (< 1.1), contiguous step %.3f rank %.3f (> 1.5)", zz, zz_rank,
           contiguous, rank);
    double striped = imbalance(&slashes, LAYOUT_STRIPED, W, false, &rank, &total);
    double slash_zz = imbalance(&slashes, LAYOUT_ZIGZAG, W, false, &zz_rank, &total);
    EXPECT(striped < 1.1 && rank < 1.1 && slash_zz > 1.5,
           "slash lines: striped step %.3f rank %.3f (< 1.1), zigzag step %.3f (> 1.5) rank %.3f", striped, rank,
           slash_zz, zz_rank);
    add_sink_columns(&slashes, 8);
    double in_ring = imbalance(&slashes, LAYOUT_STRIPED, W, false, &rank, &total);
    double gathered = imbalance(&slashes, LAYOUT_STRIPED, W, true, &rank, &total);
    EXPECT(gathered < 1.1 && in_ring > gathered,
           "sink columns, striped: gathered up front step %.3f (< 1.1), computed in the ring %.3f", gathered, in_ring);
    double work1[1];
    balance_work(&dense, LAYOUT_STRIPED, 1, false, work1);
    EXPECT(work1[0] == expect && balance_step_imbalance(work1, 1) == 1.0, "one rank: all work in one step");
    sparse_index_free(&dense);
    sparse_index_free(&slashes);
    return check_exit();
}
