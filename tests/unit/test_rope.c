// test_rope.c: the RoPE frequency table (model/rope.c) and the backend's rope
// op. Without arguments it runs its own checks: plain RoPE is θ^(-2i/D); YaRN
// keeps the high-frequency pairs, divides the low ones by the factor, blends
// between, and derives the attention factor; the rope op rotates by
// pos·inv_freq with cos and sin scaled by the attention factor, and its
// inverse is the transpose; positions restart at document starts. With arguments it prints a table for
// tests/reference/test_rope.py to compare with its torch reference:
//   test_rope table D THETA FACTOR ORIGINAL MAX_POS BETA_FAST BETA_SLOW ATTENTION_FACTOR MSCALE MSCALE_ALL_DIM TRUNCATE
// prints "attention_factor X" and one "inv_freq I X" line per pair (%.17g).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../model/backend.h"
#include "../../model/rope.h"
#include "../lib/check.h"

static ModelConfig yarn_config(int D, double theta, double factor, int original, int max_pos) {
    ModelConfig c = {.head_dim = D, .rope_theta = theta, .max_position_embeddings = max_pos};
    c.rope_scaling = (RopeScaling){.type = ROPE_YARN, .factor = factor, .original_max_position_embeddings = original,
                                   .beta_fast = 32, .beta_slow = 1, .truncate = true};
    return c;
}

static void test_plain(void) {
    ModelConfig c = {.head_dim = 16, .rope_theta = 10000.0};
    double inv[8];
    double af = rope_frequencies(&c, 16, inv);
    int exact = 1;
    for (int i = 0; i < 8; i++) exact &= inv[i] == pow(10000.0, -2.0 * i / 16);
    EXPECT(exact && af == 1.0, "plain RoPE: inv_freq = theta^(-2i/D), attention factor 1");
    c.rope_scaling.type = ROPE_NONE;
    double again[8];
    af = rope_frequencies(&c, 16, again);
    EXPECT(!memcmp(inv, again, sizeof(inv)) && af == 1.0, "type none is plain RoPE");
}

static void test_yarn_shape(void) {
    // Qwen2.5 at 4x: D 128, theta 1e6, original 32768.
    enum { D = 128 };
    ModelConfig c = yarn_config(D, 1e6, 4.0, 32768, 131072);
    double inv[D / 2], plain[D / 2];
    double af = rope_frequencies(&c, D, inv);
    for (int i = 0; i < D / 2; i++) plain[i] = pow(1e6, -2.0 * i / D);
    // Pairs turning more than beta_fast times over 32768 tokens keep their frequency.
    int kept = 1, divided = 1, between = 1;
    for (int i = 0; i < D / 2; i++) {
        double turns = 32768 * plain[i] / (2 * M_PI);
        if (turns > 64) kept &= inv[i] == plain[i];
        if (turns < 0.5) divided &= fabs(inv[i] - plain[i] / 4) <= 1e-15 * plain[i];
        between &= inv[i] <= plain[i] && inv[i] >= plain[i] / 4 * (1 - 1e-15);
    }
    EXPECT(kept, "yarn: high-frequency pairs keep theta^(-2i/D)");
    EXPECT(divided, "yarn: low-frequency pairs are divided by the factor");
    EXPECT(between, "yarn: every pair between plain/factor and plain");
    EXPECT(fabs(af - (0.1 * log(4.0) + 1)) < 1e-15, "yarn: attention factor 0.1 ln(s) + 1 = %.17g", af);
    c.rope_scaling.attention_factor = 0.75;
    EXPECT(rope_frequencies(&c, D, inv) == 0.75, "yarn: explicit attention_factor wins");
    c.rope_scaling.attention_factor = 0;
    c.rope_scaling.mscale = 2;
    c.rope_scaling.mscale_all_dim = 1;
    af = rope_frequencies(&c, D, inv);
    EXPECT(fabs(af - (0.2 * log(4.0) + 1) / (0.1 * log(4.0) + 1)) < 1e-15, "yarn: mscale / mscale_all_dim ratio");
    c = yarn_config(D, 1e6, 1.0, 32768, 32768);
    af = rope_frequencies(&c, D, inv);
    EXPECT(!memcmp(inv, plain, sizeof(inv)) && af == 1.0, "yarn with factor 1 is plain RoPE");
    c = yarn_config(D, 1e6, 4.0, 0, 32768);
    double with_zero[D / 2];
    rope_frequencies(&c, D, with_zero);
    c.rope_scaling.original_max_position_embeddings = 32768;
    rope_frequencies(&c, D, inv);
    EXPECT(!memcmp(inv, with_zero, sizeof(inv)), "original 0 means max_position_embeddings");
}

// The op against the definition: x' = af·(x cos + rotate_half(x) sin), per
// head, split out of the fused q|k|v rows; k's head is each token's first q
// head, so it comes out rotated as q's first head; v is copied; the inverse
// joins them back into the fused rows, rotated by the transpose.
static void test_rope_op(void) {
    enum { T = 5, H = 3, D = 16, W = (H + 2) * D };
    const Backend *be = backend_cpu();
    ModelConfig c = yarn_config(D, 10000.0, 8.0, 64, 512);
    double inv[D / 2];
    double af = rope_frequencies(&c, D, inv);
    int64_t pos[T] = {0, 1, 7, 100, 4000};
    float qkv[T * W], back[T * W], y[T * H * D], k[T * D], v[T * D];
    for (int i = 0; i < T * W; i++) qkv[i] = (float)sin(0.37 * i + 1.0);
    for (int t = 0; t < T; t++) memcpy(qkv + t * W + H * D, qkv + t * W, sizeof(float) * D);
    be->rope((Act *)qkv, (Act *)y, (Act *)k, (Act *)v, H, 1, pos, T, D, inv, af, 0);  // the CPU backend: Act is fp32
    int k_differs = 0, v_differs = 0;
    for (int t = 0; t < T; t++) {
        k_differs += memcmp(k + t * D, y + t * H * D, sizeof(float) * D) != 0;
        v_differs += memcmp(v + t * D, qkv + t * W + (H + 1) * D, sizeof(float) * D) != 0;
    }
    EXPECT(k_differs == 0, "rope of q and k in one call: k's head rotated as q's first head (%d tokens differ)",
           k_differs);
    EXPECT(v_differs == 0, "rope's split copies v out of the fused rows (%d tokens differ)", v_differs);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D; i++) {
                const float *x = qkv + t * W + h * D;
                int p = i % (D / 2);
                double angle = (double)pos[t] * inv[p];
                double rot = i < D / 2 ? -x[i + D / 2] : x[i - D / 2];
                double want = af * (x[i] * cos(angle) + rot * sin(angle));
                worst = fmax(worst, fabs(y[(t * H + h) * D + i] - want));
            }
    EXPECT(worst < 1e-6, "rope op = af (x cos + rotate_half(x) sin) (max err %.2e)", worst);
    be->rope((Act *)back, (Act *)y, (Act *)k, (Act *)v, H, 1, pos, T, D, inv, af, 1);
    double err = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < W; i++) {
            double scale = i < (H + 1) * D ? af * af : 1.0;   // q and k rotated there and back; v copied
            err = fmax(err, fabs(back[t * W + i] - scale * qkv[t * W + i]));
        }
    EXPECT(err < 1e-6, "inverse rope is the transpose, joined: R^T R x = af^2 x, v as it was (max err %.2e)", err);
}

static int print_table(char **argv) {
    int D = atoi(argv[0]);
    ModelConfig c = yarn_config(D, atof(argv[1]), atof(argv[2]), atoi(argv[3]), atoi(argv[4]));
    RopeScaling *rs = &c.rope_scaling;
    rs->beta_fast = atof(argv[5]);
    rs->beta_slow = atof(argv[6]);
    rs->attention_factor = atof(argv[7]);
    rs->mscale = atof(argv[8]);
    rs->mscale_all_dim = atof(argv[9]);
    rs->truncate = atoi(argv[10]) != 0;
    double *inv = malloc(sizeof(double) * (size_t)(D / 2));
    printf("attention_factor %.17g\n", rope_frequencies(&c, D, inv));
    for (int i = 0; i < D / 2; i++) printf("inv_freq %d %.17g\n", i, inv[i]);
    free(inv);
    return 0;
}

// RoPE positions restarting at documents: a sequence starting mid-document
// (positions before the first start count from 0), a one-token document, and
// one rank's striped slice (global positions with gaps).
static void test_document_positions(void) {
    const int64_t starts[] = {3, 4, 9};
    int64_t all[12], out[12];
    for (int t = 0; t < 12; t++) all[t] = t;
    rope_document_positions(all, 12, starts, 3, out);
    const int64_t want[12] = {0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 1, 2};
    EXPECT(!memcmp(out, want, sizeof(want)), "document positions of a whole sequence restart at 3, 4 and 9");
    const int64_t slice[6] = {2, 3, 6, 7, 10, 11}, slice_want[6] = {2, 0, 2, 3, 1, 2};
    rope_document_positions(slice, 6, starts, 3, out);
    EXPECT(!memcmp(out, slice_want, sizeof(slice_want)), "document positions of a striped slice (blocks of 2 on "
           "rank 1 of 2) count from each token's own document start");
    rope_document_positions(slice, 6, NULL, 0, out);
    EXPECT(!memcmp(out, slice, sizeof(slice)), "no documents: the global positions");
}

int main(int argc, char **argv) {
    if (argc == 13 && !strcmp(argv[1], "table")) return print_table(argv + 2);
    if (argc != 1) {
        fprintf(stderr, "usage: test_rope [table D THETA FACTOR ORIGINAL MAX_POS BETA_FAST BETA_SLOW "
                        "ATTENTION_FACTOR MSCALE MSCALE_ALL_DIM TRUNCATE]\n");
        return 2;
    }
    test_plain();
    test_yarn_shape();
    test_rope_op();
    test_document_positions();
    return check_exit();
}
