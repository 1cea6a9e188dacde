// rope.c: RoPE inverse frequencies and attention factor, plain or YaRN.
// YaRN (Peng et al. 2023) as transformers computes it, with D = head_dim,
// b = rope_theta, s = factor, L = the original context:
//   extrapolation_i = b^(-2i/D), interpolation_i = extrapolation_i / s
//   dim(r) = D ln(L / (2π r)) / (2 ln b)       the pair index that turns r times over L
//   low = max(floor(dim(beta_fast)), 0), high = min(ceil(dim(beta_slow)), D - 1)
//         (no floor/ceil when truncate is false; high += 0.001 when equal)
//   ramp_i = clamp((i - low) / (high - low), 0, 1)
//   inv_freq_i = interpolation_i · ramp_i + extrapolation_i · (1 - ramp_i)
//   attention factor = attention_factor if set, else
//                      m(s, mscale) / m(s, mscale_all_dim) when both are set, else m(s, 1),
//   m(s, k) = 1 if s <= 1 else 0.1 k ln(s) + 1.
// High-frequency pairs (many turns over L) keep their frequency, low ones are
// divided by s, and the band between is blended.
#include "rope.h"

#include <math.h>

#include "../dist/util.h"

bool rope_is_yarn(const RopeScaling *rs) { return rs->type == ROPE_YARN; }

int rope_original_context(const ModelConfig *c) {
    int original = c->rope_scaling.original_max_position_embeddings;
    return original > 0 ? original : c->max_position_embeddings;
}

static double yarn_mscale(double scale, double k) { return scale <= 1 ? 1.0 : 0.1 * k * log(scale) + 1.0; }

// The (fractional) pair index whose wavelength fits `rotations` times into L.
static double correction_dim(double rotations, int D, double base, double L) {
    return D * log(L / (rotations * 2 * M_PI)) / (2 * log(base));
}

double rope_frequencies(const ModelConfig *c, int D, double *inv_freq) {
    const RopeScaling *rs = &c->rope_scaling;
    int half = D / 2;
    double base = c->rope_theta;
    for (int i = 0; i < half; i++) inv_freq[i] = pow(base, -2.0 * i / D);
    if (!rope_is_yarn(rs)) return 1.0;
    double s = rs->factor, L = rope_original_context(c);
    double low = correction_dim(rs->beta_fast, D, base, L), high = correction_dim(rs->beta_slow, D, base, L);
    if (rs->truncate) { low = floor(low); high = ceil(high); }
    low = fmax(low, 0.0);
    high = fmin(high, D - 1.0);
    if (low == high) high += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
        inv_freq[i] = inv_freq[i] / s * ramp + inv_freq[i] * (1.0 - ramp);
    }
    if (rs->attention_factor > 0) return rs->attention_factor;
    if (rs->mscale > 0 && rs->mscale_all_dim > 0) return yarn_mscale(s, rs->mscale) / yarn_mscale(s, rs->mscale_all_dim);
    return yarn_mscale(s, 1.0);
}

void rope_document_positions(const int64_t *positions, int64_t T, const int64_t *doc_starts, int64_t count,
                             int64_t *out) {
    int64_t next = 0;  // documents [0, next) begin at or before positions[t]
    for (int64_t t = 0; t < T; t++) {
        CHECK(t == 0 || positions[t] > positions[t - 1], "rope_document_positions: positions not ascending at %lld",
              (long long)t);
        while (next < count && doc_starts[next] <= positions[t]) next++;
        out[t] = positions[t] - (next > 0 ? doc_starts[next - 1] : 0);
    }
}
