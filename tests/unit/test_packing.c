// test_packing.c: balanced packing (data/packing.c): every bin is filled
// exactly, every token of the step lands in one bin once, a document is cut
// only where no bin has room for it, the plan is deterministic, the
// attention work is balanced far better than consecutive windows on
// log-normal document lengths, and the edge cases (a document longer than
// the step, one bin, the longest-first rule on a hand example) come out as
// worked by hand. Training with it end to end: tests/cli/test_train_ops.sh.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/ring/balance.h"
#include "../../data/packing.h"
#include "../../data/synthetic.h"
#include "../../dist/util.h"
#include "../lib/check.h"

// Work of the sequential packing: consecutive windows of N tokens (bins of
// them), each document cut at the window ends; work [bins].
static void window_work(const int64_t *starts, int64_t docs, int bins, int64_t N, double *work) {
    int64_t total = bins * N;
    memset(work, 0, sizeof(double) * (size_t)bins);
    for (int64_t d = 0; d < docs; d++) {
        int64_t s = starts[d], e = d + 1 < docs ? starts[d + 1] : total;
        for (int64_t w0 = s; w0 < e;) {
            int64_t w1 = (w0 / N + 1) * N < e ? (w0 / N + 1) * N : e;
            work[w0 / N] += 0.5 * (double)(w1 - w0) * (double)(w1 - w0 + 1);
            w0 = w1;
        }
    }
}

// The best max/mean any packing of these pieces can reach: the largest
// piece's work, or the mean when that is larger.
static double imbalance_bound(const PackPiece *pieces, int64_t n, const double *work, int bins) {
    double largest = 0, mean = 0;
    for (int64_t i = 0; i < n; i++) largest = fmax(largest, 0.5 * (double)pieces[i].length * (pieces[i].length + 1));
    for (int b = 0; b < bins; b++) mean += work[b] / bins;
    return fmax(largest / mean, 1.0);
}

static void test_plan(void) {
    const int bins = 16;
    const int64_t N = 4096, total = bins * N;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)total);
    int64_t docs = synthetic_document_starts(3, log(150), 1.0, total, starts);
    PackPiece *pieces = malloc(sizeof(PackPiece) * (size_t)(docs + 1 + bins));
    int64_t n = pack_balanced(starts, docs, bins, bins, N, pieces);
    int *owner = malloc(sizeof(int) * (size_t)total);
    int64_t *filled = calloc(bins, sizeof(int64_t));
    for (int64_t t = 0; t < total; t++) owner[t] = -1;
    bool once = true, ordered = true;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t t = pieces[i].start; t < pieces[i].start + pieces[i].length; t++) {
            once &= owner[t] < 0;
            owner[t] = pieces[i].bin;
        }
        filled[pieces[i].bin] += pieces[i].length;
        if (i > 0) ordered &= pieces[i - 1].bin < pieces[i].bin ||
                              (pieces[i - 1].bin == pieces[i].bin && pieces[i - 1].start < pieces[i].start);
    }
    bool covered = true, exact = true;
    for (int64_t t = 0; t < total; t++) covered &= owner[t] >= 0;
    for (int b = 0; b < bins; b++) exact &= filled[b] == N;
    EXPECT(once && covered, "every token of the step lands in exactly one bin (%lld documents, %lld pieces)",
           (long long)docs, (long long)n);
    EXPECT(exact, "every bin holds exactly %lld tokens", (long long)N);
    EXPECT(ordered, "pieces ordered by bin, then by stream position");
    // A piece never crosses a document start; splits (pieces not starting a document) are at most one per bin.
    int64_t splits = 0, k = 0;
    bool within = true;
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = pieces[i].start, e = s + pieces[i].length;
        k = 0;
        while (k < docs && starts[k] <= s) k++;
        within &= k == docs || starts[k] >= e;
        splits += starts[k - 1] != s;
    }
    EXPECT(within && splits <= bins, "pieces stay inside their documents; %lld split(s) for %d bins", (long long)splits,
           bins);
    PackPiece *again = malloc(sizeof(PackPiece) * (size_t)(docs + 1 + bins));
    EXPECT(pack_balanced(starts, docs, bins, bins, N, again) == n && !memcmp(again, pieces, sizeof(PackPiece) * (size_t)n),
           "the plan is deterministic");
    double work[16], windows[16];
    pack_work(pieces, n, bins, work);
    window_work(starts, docs, bins, N, windows);
    double before = balance_max_over_mean(windows, bins), after = balance_max_over_mean(work, bins);
    double bound = imbalance_bound(pieces, n, work, bins);
    EXPECT(after < 1.05 * bound && after < before, "attention work max/mean: %.3f balanced (bound %.3f) vs %.3f "
           "sequential", after, bound, before);
    free(again); free(filled); free(owner); free(pieces); free(starts);
}

// Edge cases: one document longer than the step; one bin; no listed start.
static void test_edges(void) {
    PackPiece pieces[8];
    const int64_t none[1] = {0};
    int64_t n = pack_balanced(none, 0, 3, 3, 10, pieces);
    EXPECT(n == 3 && pieces[0].length == 10 && pieces[1].start == 10 && pieces[2].bin == 2,
           "one document over 3 bins of 10: cut into the 3 bins in order");
    const int64_t two[2] = {0, 7};
    n = pack_balanced(two, 2, 1, 1, 10, pieces);
    EXPECT(n == 2 && pieces[0].start == 0 && pieces[1].start == 7, "one bin: the documents in stream order");
    // Lengths 6, 5, 5, 4 in 2 bins of 10: LPT puts 6+4 and 5+5.
    const int64_t four[4] = {0, 6, 11, 16};
    n = pack_balanced(four, 4, 2, 2, 10, pieces);
    EXPECT(n == 4 && pieces[0].bin == 0 && pieces[0].start == 0 && pieces[1].start == 16 && pieces[2].start == 6 &&
           pieces[3].start == 11, "lengths 6, 5, 5, 4 into 2 bins of 10: {6, 4} and {5, 5}");
}

// ----------------------------------------------------------------------------
// `test_packing measure`: the tables of docs/PERFORMANCE.md (Packing)

#define MEASURE_N 32768
#define MEASURE_STEPS 200

// Rank work [D] of a step's sequence work [M * D]: rank d runs sequences
// mb * D + d.
static void rank_work(const double *seq, int M, int D, double *rank) {
    for (int d = 0; d < D; d++) {
        rank[d] = 0;
        for (int mb = 0; mb < M; mb++) rank[d] += seq[mb * D + d];
    }
}

// Over MEASURE_STEPS steps of D ranks x M micro-batches of 32K tokens with
// log-normal documents (mean `mean` tokens, shape sigma): the mean and the
// worst step's max/mean rank work, sequential and balanced, and the bound.
static void measure_packing(double mean, double sigma, int D, int M) {
    int bins = D * M;
    int64_t total = (int64_t)bins * MEASURE_N;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)total);
    PackPiece *pieces = malloc(sizeof(PackPiece) * (size_t)(total + 1 + bins));
    double *seq = malloc(sizeof(double) * (size_t)bins), *rank = malloc(sizeof(double) * (size_t)D);
    double sum[3] = {0}, worst[3] = {0};
    for (int step = 0; step < MEASURE_STEPS; step++) {
        int64_t docs = synthetic_document_starts(1000 + (uint64_t)step, log(mean) - sigma * sigma / 2, sigma, total,
                                                 starts);
        int64_t n = pack_balanced(starts, docs, bins, D, MEASURE_N, pieces);
        double got[3];
        window_work(starts, docs, bins, MEASURE_N, seq);
        rank_work(seq, M, D, rank);
        got[0] = balance_max_over_mean(rank, D);
        pack_work(pieces, n, bins, seq);
        rank_work(seq, M, D, rank);
        got[1] = balance_max_over_mean(rank, D);
        got[2] = imbalance_bound(pieces, n, rank, D);
        for (int i = 0; i < 3; i++) {
            sum[i] += got[i] / MEASURE_STEPS;
            worst[i] = fmax(worst[i], got[i]);
        }
    }
    printf("| %.0f | %.1f | %d | %d | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) |\n", mean, sigma, D, M, sum[0], worst[0],
           sum[1], worst[1], sum[2], worst[2]);
    free(starts); free(pieces); free(seq); free(rank);
}

// Context-parallel layouts: one 32K sequence with documents over W ranks in
// blocks of 128, max/mean rank work of document-masked dense attention,
// mean (worst) over MEASURE_STEPS sequences; and without documents.
static void measure_layouts(double mean, double sigma, int W) {
    static const LayoutKind kinds[3] = {LAYOUT_CONTIGUOUS, LAYOUT_ZIGZAG, LAYOUT_STRIPED};
    int64_t *starts = malloc(sizeof(int64_t) * MEASURE_N);
    double work[32], sum[3] = {0}, worst[3] = {0}, single[3];
    const int64_t none[1] = {0};
    for (int k = 0; k < 3; k++) {
        balance_document_work(kinds[k], MEASURE_N, 128, W, none, 1, work);
        single[k] = balance_max_over_mean(work, W);
    }
    for (int s = 0; s < MEASURE_STEPS; s++) {
        int64_t docs = synthetic_document_starts(5000 + (uint64_t)s, log(mean) - sigma * sigma / 2, sigma, MEASURE_N,
                                                 starts);
        for (int k = 0; k < 3; k++) {
            balance_document_work(kinds[k], MEASURE_N, 128, W, starts, docs, work);
            double got = balance_max_over_mean(work, W);
            sum[k] += got / MEASURE_STEPS;
            worst[k] = fmax(worst[k], got);
        }
    }
    printf("| %.0f | %.1f | %d |", mean, sigma, W);
    for (int k = 0; k < 3; k++) printf(" %.2f (%.2f) / %.2f |", sum[k], worst[k], single[k]);
    printf("\n");
    free(starts);
}

static void measure(void) {
    static const double shapes[2][2] = {{1500, 1.0}, {1500, 1.5}};
    static const int ranks[4] = {4, 8, 16, 32};
    printf("Packing: max/mean attention work per dp rank, mean (worst) over %d steps of 32K-token sequences\n\n"
           "| mean doc | sigma | dp | micro | sequential | balanced | bound |\n|---|---|---|---|---|---|---|\n",
           MEASURE_STEPS);
    for (int sh = 0; sh < 2; sh++)
        for (int m = 1; m <= 4; m *= 4)
            for (int r = 0; r < 4; r++) measure_packing(shapes[sh][0], shapes[sh][1], ranks[r], m);
    printf("\nLayouts: max/mean attention work per cp rank of one 32K sequence, blocks of 128, documents: mean "
           "(worst) over %d sequences / one document\n\n| mean doc | sigma | cp | contiguous | zigzag | striped |\n"
           "|---|---|---|---|---|---|\n", MEASURE_STEPS);
    for (int sh = 0; sh < 2; sh++)
        for (int r = 0; r < 4; r++) measure_layouts(shapes[sh][0], shapes[sh][1], ranks[r]);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "measure")) {
        measure();
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: test_packing [measure]\n");
        return 2;
    }
    test_plan();
    test_edges();
    return check_exit();
}
