// bench_documents.c: dense causal attention on the CPU with packed documents
// (AttnShape.doc_starts, data.doc_mask: true) against the same problem
// without, at 32768 tokens (2 q / 1 kv heads, D 64, block 64): forward and
// backward times and their ratios to the time without documents, next to
// the ideal ratio Σ L(L+1)/2 ÷ N(N+1)/2 (causal score elements inside the
// documents ÷ all causal score elements) and the tile ratio (block x block
// tiles holding a visible pair ÷ causal tiles: what a kernel skipping whole
// tiles and masking the rest per element computes). Documents: two
// sequences each of log-normal lengths with mean 1500 tokens and σ 1.0 and
// 1.5 (data/synthetic.c, the generator of scripts/bench_packing.sh), and
// few long documents of N/2, N/4, N/8, N/16, N/16 tokens. ROUNDS rounds,
// each timing the problem without documents and then every case: a ratio
// is a case's time over its own round's time without documents (the pair
// within one minute, so the machine's speed drifting between rounds cancels),
// the median over the rounds, with the smallest and largest beside it; times
// are the fastest round's. Prints a markdown table (scripts/bench_documents.sh).
//   bench_documents [tokens]      default 32768
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "../attention/attention_api.h"
#include "../data/synthetic.h"
#include "../dist/util.h"
#include "bench_layer.h"

enum { HQ = 2, HKV = 1, HEAD_DIM = 64, BLOCK = 64, CASES = 5, ROUNDS = 5 };

// One row: documents beginning at starts [count] (starts[0] = 0).
typedef struct {
    const char *name;
    int64_t *starts, count;
} Case;

// Σ L(L+1)/2 over the documents ÷ N(N+1)/2; *longest gets the longest L.
static double ideal_ratio(const Case *c, int64_t N, int64_t *longest) {
    double kept = 0;
    *longest = 0;
    for (int64_t d = 0; d < c->count; d++) {
        const int64_t L = (d + 1 < c->count ? c->starts[d + 1] : N) - c->starts[d];
        kept += 0.5 * (double)L * (double)(L + 1);
        if (L > *longest) *longest = L;
    }
    return kept / (0.5 * (double)N * (double)(N + 1));
}

// Tiles (query tile, key tile <= it) with a visible pair ÷ causal tiles: the
// keys from the document start of the tile's first query up to the tile.
static double tile_ratio(const Case *c, int64_t N) {
    const int64_t nt = (N + BLOCK - 1) / BLOCK;
    double kept = 0;
    for (int64_t qt = 0; qt < nt; qt++)
        kept += (double)(qt - attn_doc_first(c->starts, c->count, qt * BLOCK) / BLOCK + 1);
    return kept / (0.5 * (double)nt * (double)(nt + 1));
}

// The median, smallest and largest of x [n] (sorted in place).
static void median_range(double *x, int n, double *median, double *lo, double *hi) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            const double y = x[j];
            x[j] = x[j - 1];
            x[j - 1] = y;
        }
    *median = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    *lo = x[0];
    *hi = x[n - 1];
}

int main(int argc, char **argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 32768;
    if (N < 16 * BLOCK) fail("bench_documents: tokens %lld: expected >= %d", (long long)N, 16 * BLOCK);
    Case cases[CASES] = {{.name = "log-normal mean 1500, σ 1.0, seed 1"}, {.name = "log-normal mean 1500, σ 1.0, seed 2"},
                         {.name = "log-normal mean 1500, σ 1.5, seed 1"}, {.name = "log-normal mean 1500, σ 1.5, seed 2"},
                         {.name = "few long: N/2, N/4, N/8, N/16, N/16"}};
    for (int i = 0; i < CASES; i++) cases[i].starts = xmalloc((size_t)N * sizeof(int64_t));
    for (int i = 0; i < 4; i++) {
        const double sigma = i < 2 ? 1.0 : 1.5;
        cases[i].count = synthetic_document_starts(1 + (uint64_t)(i % 2), log(1500.0) - sigma * sigma / 2, sigma,
                                                   N, cases[i].starts);
    }
    const int64_t few[CASES] = {0, N / 2, 3 * N / 4, 7 * N / 8, 15 * N / 16};
    for (int d = 0; d < CASES; d++) cases[4].starts[d] = few[d];
    cases[4].count = CASES;

    Layer L = make_layer(N, HQ, HKV, HEAD_DIM, BLOCK);
    // causal[pass], best[case][pass]: fastest times; ratio[case][pass][round]:
    // the case over its round's time without documents.
    double causal[2] = {INFINITY, INFINITY}, best[CASES][2], ratio[CASES][2][ROUNDS], t[2], t_causal[2];
    for (int i = 0; i < CASES; i++) best[i][0] = best[i][1] = INFINITY;
    layer_time(&L, NULL, t);  // warm-up: memory and threads
    for (int round = 0; round < ROUNDS; round++) {
        L.s.doc_starts = NULL;
        L.s.doc_count = 0;
        layer_time(&L, NULL, t_causal);
        for (int p = 0; p < 2; p++) causal[p] = fmin(causal[p], t_causal[p]);
        for (int i = 0; i < CASES; i++) {
            L.s.doc_starts = cases[i].starts;
            L.s.doc_count = cases[i].count;
            layer_time(&L, NULL, t);
            for (int p = 0; p < 2; p++) {
                best[i][p] = fmin(best[i][p], t[p]);
                ratio[i][p][round] = t[p] / t_causal[p];
            }
        }
        fprintf(stderr, "round %d of %d done\n", round + 1, ROUNDS);
    }
    printf("dense causal attention, one layer: N=%lld, D=%d, %d q / %d kv heads, block %d, %d threads; "
           "without documents (fastest of %d rounds): forward %.0f ms, backward %.0f ms\n\n", (long long)N, HEAD_DIM,
           HQ, HKV, BLOCK, omp_get_max_threads(), ROUNDS, 1e3 * causal[0], 1e3 * causal[1]);
    printf("| documents | count | longest | ideal | tiles | fwd ms | bwd ms | fwd ratio (min-max) | bwd ratio (min-max) "
           "| fwd ratio/ideal | bwd ratio/ideal |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < CASES; i++) {
        int64_t longest;
        const double ideal = ideal_ratio(&cases[i], N, &longest);
        double med[2], lo[2], hi[2];
        for (int p = 0; p < 2; p++) median_range(ratio[i][p], ROUNDS, &med[p], &lo[p], &hi[p]);
        printf("| %s | %lld | %lld | %.4f | %.4f | %.0f | %.0f | %.4f (%.4f-%.4f) | %.4f (%.4f-%.4f) | %.2f | %.2f |\n",
               cases[i].name, (long long)cases[i].count, (long long)longest, ideal, tile_ratio(&cases[i], N),
               1e3 * best[i][0], 1e3 * best[i][1], med[0], lo[0], hi[0], med[1], lo[1], hi[1], med[0] / ideal,
               med[1] / ideal);
        free(cases[i].starts);
    }
    free_layer(&L);
    return 0;
}
