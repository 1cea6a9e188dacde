// test_plan_cost.c: the attention kernels' cost model (attention/kernels/kernel_cost.c).
// Its predictions for the dense kernels at the shapes the H200 measured
// (docs/PERFORMANCE.md, "Measured on a GPU": causal, 16 q heads, head dims
// 64 and 128, 16K and 64K tokens; counted as the kernels that ran there,
// measured_forward_counts and measured_backward_counts) within the stated
// calibration error of 8 %; more work never predicts less time; each
// phase's time follows its own rate; fewer co-resident blocks never predict
// less time.
#include <math.h>
#include <stdio.h>

#include "../../attention/kernels/kernel_cost.h"
#include "../lib/check.h"

#define CALIBRATION_ERROR 0.08

static double predicted_ms(const KernelCounts *c, int d, bool backward, int blocks_per_sm, const AttnGpuRates *g) {
    return 1e3 * attn_cost(c, attn_exp2_count(c, d, backward), blocks_per_sm, g).seconds;
}

// The dense forward the H200 measured: 8 warps of 16 query rows over tile
// pairs of 128 queries x 64 keys (kernel_counts.c's formulas with 16 rows a
// warp: mma_abt K/16 x (1 + N/16) ldmatrix.x4, mma_pb K/16 x N/16, each
// K/16 x N/8 mma; 320 shared bytes per mma.sync), one block per SM at head
// dim 128 and two at 64. Today's forward (32 rows a warp) replaced it after
// the measurement, so the calibration counts the kernel that ran.
static KernelCounts measured_forward_counts(int d, int64_t n, double heads) {
    const double BM = 128, BN = 64, NW = BM / 16, q_tiles = heads * (double)((n + 127) / 128);
    const double pairs = heads * flash_forward_pairs(n, 128, 64);
    return (KernelCounts){
        .launches = 1, .blocks = q_tiles,
        .mma = pairs * NW * (d / 16.0 * BN / 8 + BN / 16 * d / 8.0),
        .ldmatrix_bytes = 512 * pairs * NW * (d / 16.0 * (1 + BN / 16) + BN / 16 * d / 16.0),
        .cp_async_bytes = 2.0 * d * (q_tiles * BM + pairs * 2 * BN),
        .barriers = q_tiles + 2 * pairs};
}

// The dense backward the H200 measured: a CTA of 64 keys (4 warps of 16 keys
// holding dK, dV) over query tiles of 64 (head dim 64) or 32 (128) queries,
// 16 rows a warp over padded tiles (S^T, dP^T mma_abt; dV, dK mma_pb; dQ
// mma_atb over 4 / (BM / 16) warps of D / that columns: 320 and 346 shared
// bytes per mma.sync), dQ added per pair, two barriers a pair, two blocks per
// SM. Today's backward (128 keys, 8 warps of 32 rows) replaced it after the
// measurement, so the calibration counts the kernel that ran.
static KernelCounts measured_backward_counts(int d, int64_t n, double heads) {
    const double BM = d == 128 ? 32 : 64, BN = 64, NW = BN / 16, WC = NW / (BM / 16), DQC = d / WC;
    const double k_tiles = heads * (double)((n + 63) / 64), pairs = heads * flash_backward_pairs(n, (int)BM, 64);
    return (KernelCounts){
        .launches = 1, .blocks = k_tiles,
        .mma = pairs * NW * (2 * d / 16.0 * BM / 8 + 2 * BM / 16 * d / 8.0 + BN / 16 * DQC / 8),
        .ldmatrix_bytes = 512 * pairs * NW * (2 * d / 16.0 * (1 + BM / 16) + 2 * BM / 16 * d / 16.0 +
                                              BN / 16 * (1 + DQC / 16)),
        .cp_async_bytes = 2.0 * d * (k_tiles * 2 * BN + pairs * 2 * BM),
        .shuffles = NW * 10 * k_tiles,
        .barriers = k_tiles + 2 * pairs,
        .atomics = d * (pairs * BM + 2 * heads * (double)n)};
}

int main(void) {
    const AttnGpuRates *h200 = attn_gpu_rates("h200");
    EXPECT(h200 && attn_gpu_rates("a100-80g") && attn_gpu_rates("h100"), "rates_for_every_profile");
    EXPECT(attn_gpu_rates("nonesuch") == NULL, "no_rates_for_an_unknown_gpu");
    if (!h200) return check_exit();

    // head dim, tokens, measured forward and backward ms (H200).
    const struct { int d; int64_t n; double fwd_ms, bwd_ms; } measured[] = {
        {128, 16384, 6.22, 21.53}, {128, 65536, 100.35, 337.69}, {64, 16384, 3.53, 11.19}, {64, 65536, 48.05, 172.90}};
    for (int i = 0; i < 4; i++) {
        const int d = measured[i].d;
        KernelCounts today_fwd, today_bwd;
        attn_pass_counts(d, measured[i].n, 16, 1.0, 64, &today_fwd, &today_bwd);
        const KernelCounts fwd = measured_forward_counts(d, measured[i].n, 16);
        EXPECT(fabs((fwd.ldmatrix_bytes + fwd.cp_async_bytes) / fwd.mma - 320) < 1 &&
               today_fwd.mma == fwd.mma && today_fwd.cp_async_bytes == fwd.cp_async_bytes,
               "measured_forward_geometry d=%d: %.1f shared bytes per mma.sync, the same products as today's", d,
               (fwd.ldmatrix_bytes + fwd.cp_async_bytes) / fwd.mma);
        // The old backward's FLOPs over its pairs: the causal square's within the few diagonal tiles either
        // kernel computes past it (0.5 %), and 320 (d 64) or 346 (d 128) shared bytes per mma.sync.
        const KernelCounts bwd = measured_backward_counts(d, measured[i].n, 16);
        const double bwd_bytes = (bwd.ldmatrix_bytes + bwd.cp_async_bytes) / bwd.mma;
        EXPECT(fabs(bwd.mma / today_bwd.mma - 1) < 0.005 && fabs(bwd_bytes - (d == 128 ? 346 : 320)) < 1,
               "measured_backward_geometry d=%d: %.1f shared bytes per mma.sync, %.4f of today's mma.sync", d,
               bwd_bytes, bwd.mma / today_bwd.mma);
        const double f = predicted_ms(&fwd, d, false, d == 128 ? 1 : 2, h200),
                     b = predicted_ms(&bwd, d, true, 2, h200);
        EXPECT(fabs(f / measured[i].fwd_ms - 1) <= CALIBRATION_ERROR,
               "calibrated_forward d=%d n=%lld: predicted %.2f ms, measured %.2f", measured[i].d,
               (long long)measured[i].n, f, measured[i].fwd_ms);
        EXPECT(fabs(b / measured[i].bwd_ms - 1) <= CALIBRATION_ERROR,
               "calibrated_backward d=%d n=%lld: predicted %.2f ms, measured %.2f", measured[i].d,
               (long long)measured[i].n, b, measured[i].bwd_ms);
    }

    // Monotonic: each count raised alone (and all at once) never lowers the prediction, and raises it
    // where the model gives that count a cost.
    KernelCounts base, bwd;
    attn_pass_counts(128, 16384, 16, 1.0, 64, &base, &bwd);
    base.atomics = bwd.atomics / 4;   // some atomics, so that their phase has a cost
    const double exp2 = attn_exp2_count(&base, 128, false), t0 = attn_cost(&base, exp2, 1, h200).seconds;
    double *fields[] = {&base.mma, &base.ldmatrix_bytes, &base.cp_async_bytes, &base.barriers, &base.atomics};
    const char *names[] = {"mma", "ldmatrix_bytes", "cp_async_bytes", "barriers", "atomics"};
    for (int i = 0; i < 5; i++) {
        const double keep = *fields[i];
        *fields[i] = keep * 1.5;
        const double t = attn_cost(&base, exp2, 1, h200).seconds;
        *fields[i] = keep;
        EXPECT(t > t0, "monotonic_in_%s: %.4g ms at 1.5x, %.4g ms", names[i], 1e3 * t, 1e3 * t0);
    }
    EXPECT(attn_cost(&base, 2 * exp2, 1, h200).seconds > t0, "monotonic_in_exp2");
    EXPECT(attn_cost(&base, exp2, 2, h200).seconds < t0 && attn_cost(&base, exp2, 4, h200).seconds <
           attn_cost(&base, exp2, 2, h200).seconds, "more_blocks_per_sm_hide_more");

    // Each phase at its own rate: mma at mma_per_clock per SM per clock, bytes at 128 per SM per clock.
    const AttnCost c = attn_cost(&base, exp2, 1, h200);
    const double per_sm = h200->sms * h200->clock_ghz * 1e9;
    EXPECT(fabs(c.mma * per_sm * h200->mma_per_clock / base.mma - 1) < 1e-12 &&
           fabs(c.smem * per_sm * 128 / (base.ldmatrix_bytes + base.cp_async_bytes) - 1) < 1e-12 &&
           fabs(c.exp2 * per_sm * 16 / exp2 - 1) < 1e-12, "phase_rates");
    EXPECT(c.seconds >= fmax(fmax(c.mma, c.smem), fmax(c.exp2, c.atomics)) &&
           c.seconds <= c.mma + c.smem + c.exp2 + c.atomics + c.barriers + 1e-15, "between_the_bound_and_the_sum");
    // The exp2 count: one per score; the forward's 128 x 64 tile pair at head dim 128 has 8192 scores.
    KernelCounts pair = flash_forward_counts(128, 1, 1);
    EXPECT(fabs(attn_exp2_count(&pair, 128, false) - 128 * 64) < 1e-9, "exp2_one_per_score: %.0f",
           attn_exp2_count(&pair, 128, false));
    // A faster GPU (the H200's clock over the H100's) predicts less time for the same work.
    EXPECT(attn_cost(&base, exp2, 1, attn_gpu_rates("h100")).seconds > t0, "faster_clock_less_time");
    return check_exit();
}
