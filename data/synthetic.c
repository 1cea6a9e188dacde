// synthetic.c: the built-in synthetic sequence generator, and log-normal
// document lengths for packed-document measurements.
#include "synthetic.h"

#include <math.h>

#include "../dist/util.h"

// The j-th likely successor of token a: a fixed hash of (seed, a, j).
static int32_t successor(uint64_t seed, int32_t a, int j, int vocab_size) {
    Rng r;
    rng_seed(&r, seed ^ ((uint64_t)a * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)(j + 1) << 48));
    return (int32_t)rng_below(&r, (uint64_t)vocab_size);
}

void synthetic_sequence(uint64_t seed, int64_t index, int vocab_size, int32_t *out, int64_t n) {
    Rng rng;
    rng_seed(&rng, seed * 0x2545f4914f6cdd1dULL + (uint64_t)index);
    int32_t prev = (int32_t)rng_below(&rng, (uint64_t)vocab_size);
    int64_t t = 0;
    while (t < n) {
        int64_t seg_len = 8 + (int64_t)rng_below(&rng, 25), repeats = 2 + (int64_t)rng_below(&rng, 3);
        int64_t start = t;
        for (int64_t i = 0; i < seg_len && t < n; i++, t++) {
            // 90%: one of 4 successors; 10%: any token.
            prev = rng_uniform(&rng) < 0.9 ? successor(seed, prev, (int)rng_below(&rng, 4), vocab_size)
                                            : (int32_t)rng_below(&rng, (uint64_t)vocab_size);
            out[t] = prev;
        }
        for (int64_t r = 1; r < repeats; r++)
            for (int64_t i = 0; i < seg_len && t < n; i++, t++) out[t] = out[start + i];
    }
}

int64_t synthetic_document_starts(uint64_t seed, double mu, double sigma, int64_t total, int64_t *starts) {
    Rng rng;
    rng_seed(&rng, seed);
    int64_t count = 0;
    for (int64_t at = 0; at < total;) {
        double u1 = rng_uniform(&rng), u2 = rng_uniform(&rng);
        double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2 * M_PI * u2);
        int64_t len = (int64_t)exp(mu + sigma * z);
        starts[count++] = at;
        at += len < 1 ? 1 : len;
    }
    return count;
}
