// gpu_test_ops.c: the CUDA backend's element-wise, RMSNorm, embedding, RoPE,
// SwiGLU, cross-entropy, AdamW and conversion kernels (model/ops_cuda.cu, and
// the shared element-wise kernels of dist/cuda_elementwise.cuh)
// against independent double-precision loops on the same bf16-rounded inputs,
// on shapes that are not multiples of any tile (T 1, 7, 37, 130; H 24, 40,
// 896; V 257, 1000). Outputs that an op writes are poisoned (NaN) first;
// outputs that it accumulates into start from random values, which the
// reference includes. Needs a GPU or the sim (tests/sim/test_sim.sh).
//   build/tests/gpu_test_ops         every case
//   build/tests/gpu_test_ops small   without the larger cases (sim, compute-sanitizer)
//
// Tolerances, per element: |got - want| <= bound. bf16 keeps 8 significant
// bits, so one rounding to nearest is off by at most U16 = 2^-8 of the value;
// fp32 by U32 = 2^-24. A bf16 output computed in fp32 and rounded once gets
// U16 |want| plus a few U32 times the magnitudes of the fp32 terms it was
// formed from (which covers cancellation); an fp32 sum of k terms gets k U32
// times the sum of their magnitudes. Where a result is exactly one rounding
// of an exact value (accumulate, conversions, the bf16 copy of AdamW)
// it must match bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../../model/ops_cuda.h"
#include "../lib/check.h"
#include "gpu_common.h"

#define U16 (1.0 / 256)
#define U32 (1.0 / 16777216)

static Rng rng;

// The worst |got - want| / bound over n elements (bound 0: only equality passes).
static double worst_ratio(const float *got, const double *want, const double *bound, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        const double r = d == 0 ? 0 : d / bound[i];
        if (!(r <= worst)) worst = r;   // NaN sticks
    }
    return worst;
}

static void expect_within(const char *op, const char *what, const char *shape, const float *got,
                          const double *want, const double *bound, int64_t n) {
    const double r = worst_ratio(got, want, bound, n);
    EXPECT_COUNTED(r <= 1.0, "%s %s %s: worst error %.3g of its bound", op, what, shape, r);
}

static double *dalloc(int64_t n) { return xmalloc((size_t)(n ? n : 1) * sizeof(double)); }

// n bf16 values sigma * N(0, 1): bits and fp32 values.
static void random_bf16_scaled(int64_t n, double sigma, uint16_t **bits, float **values) {
    random_bf16(&rng, n, bits, values);
    for (int64_t i = 0; i < n; i++) {
        (*bits)[i] = f32_to_bf16((float)(sigma * (*values)[i]));
        (*values)[i] = bf16_to_f32((*bits)[i]);
    }
}

static float *download_bf16(const uint16_t *dev, int64_t n) { return from_device_bf16(dev, n); }

// ---- embedding ----

// Tokens with repeats: runs of one token, interleaved frequent ones and rare ones.
static int32_t *random_tokens(int64_t T, int V) {
    int32_t *tok = xmalloc((size_t)T * sizeof(int32_t));
    const int32_t frequent[3] = {0, (int32_t)(V / 2), V - 1};
    for (int64_t t = 0; t < T; t++) {
        const uint64_t kind = rng_below(&rng, 4);
        if (kind == 0 && t > 0) tok[t] = tok[t - 1];
        else if (kind == 1) tok[t] = frequent[rng_below(&rng, 3)];
        else tok[t] = (int32_t)rng_below(&rng, (uint64_t)V);
    }
    return tok;
}

static void test_embedding(int64_t T, int H, int V) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%lld H=%d V=%d", (long long)T, H, V);
    int32_t *tok = random_tokens(T, V);
    uint16_t *table, *dout;
    float *tablef, *doutf;
    random_bf16(&rng, (int64_t)V * H, &table, &tablef);
    random_bf16(&rng, T * H, &dout, &doutf);
    float *dtable0 = random_f32(&rng, (int64_t)V * H);
    int32_t *d_tok = to_device(tok, (size_t)T * sizeof(int32_t));
    uint16_t *d_table = to_device(table, (size_t)V * H * 2), *d_dout = to_device(dout, (size_t)T * H * 2);
    uint16_t *d_out = poisoned((size_t)T * H * 2);

    // Forward: a copy, bit for bit.
    embedding_forward_cuda(d_out, d_tok, d_table, T, H, 0);
    uint16_t *out = xmalloc((size_t)T * H * 2 + 1);
    CUDA_CHECK(cudaMemcpy(out, d_out, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < H; c++) wrong += out[t * H + c] != table[(int64_t)tok[t] * H + c];
    EXPECT_COUNTED(wrong == 0, "embedding_forward %s: %lld elements differ from the table rows", shape,
                   (long long)wrong);

    // Backward into a random dtable: fp32 sums of at most T + 1 terms per element.
    const int64_t n = (int64_t)V * H;
    double *want = dalloc(n), *mag = dalloc(n), *bound = dalloc(n);
    for (int64_t i = 0; i < n; i++) { want[i] = dtable0[i]; mag[i] = fabs(dtable0[i]); }
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < H; c++) {
            want[(int64_t)tok[t] * H + c] += doutf[t * H + c];
            mag[(int64_t)tok[t] * H + c] += fabs(doutf[t * H + c]);
        }
    for (int64_t i = 0; i < n; i++) bound[i] = (double)(T + 1) * U32 * mag[i];
    float *got[2];
    for (int run = 0; run < 2; run++) {
        float *d_dtable = to_device(dtable0, (size_t)n * sizeof(float));
        embedding_backward_cuda(d_dtable, d_tok, d_dout, T, H, 0);
        got[run] = from_device_f32(d_dtable, n);
        CUDA_CHECK(cudaFree(d_dtable));
    }
    expect_within("embedding_backward", "dtable", shape, got[0], want, bound, n);
    EXPECT_COUNTED(memcmp(got[0], got[1], (size_t)n * sizeof(float)) == 0,
                   "embedding_backward %s: two runs agree bit for bit", shape);

    CUDA_CHECK(cudaFree(d_tok)); CUDA_CHECK(cudaFree(d_table)); CUDA_CHECK(cudaFree(d_dout));
    CUDA_CHECK(cudaFree(d_out));
    free(tok); free(table); free(tablef); free(dout); free(doutf); free(dtable0); free(out);
    free(want); free(mag); free(bound); free(got[0]); free(got[1]);
}

// ---- RMSNorm ----

static void test_rmsnorm(int64_t T, int H) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%lld H=%d", (long long)T, H);
    const int64_t n = T * H;
    const float eps = 1e-6f;
    uint16_t *x, *w, *dy, *dx0;
    float *xf, *wf, *dyf, *dx0f;
    random_bf16(&rng, n, &x, &xf);
    random_bf16(&rng, H, &w, &wf);
    random_bf16(&rng, n, &dy, &dyf);
    random_bf16(&rng, n, &dx0, &dx0f);
    float *dw0 = random_f32(&rng, H);
    uint16_t *d_x = to_device(x, (size_t)n * 2), *d_w = to_device(w, (size_t)H * 2);
    uint16_t *d_dy = to_device(dy, (size_t)n * 2), *d_dx = to_device(dx0, (size_t)n * 2);
    uint16_t *d_out = poisoned((size_t)n * 2);
    float *d_rstd = poisoned((size_t)T * sizeof(float));
    float *d_dw = to_device(dw0, (size_t)H * sizeof(float));

    rmsnorm_forward_cuda(d_out, d_rstd, d_x, d_w, T, H, eps, 0);
    float *out = download_bf16(d_out, n), *rstd = from_device_f32(d_rstd, T);
    double *want = dalloc(n), *bound = dalloc(n), *want_r = dalloc(T), *bound_r = dalloc(T);
    float *rf = xmalloc((size_t)T * sizeof(float));   // the reference rstd in fp32: the backward's input
    for (int64_t t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)xf[t * H + c] * xf[t * H + c];
        want_r[t] = 1.0 / sqrt(ss / H + eps);
        bound_r[t] = 2 * U32 * want_r[t];
        rf[t] = (float)want_r[t];
        for (int c = 0; c < H; c++) {
            want[t * H + c] = xf[t * H + c] * want_r[t] * wf[c];
            bound[t * H + c] = (U16 + 4 * U32) * fabs(want[t * H + c]);
        }
    }
    expect_within("rmsnorm_forward", "rstd", shape, rstd, want_r, bound_r, T);
    expect_within("rmsnorm_forward", "out", shape, out, want, bound, n);

    // Backward from the reference rstd, into random dinp and dweight.
    float *d_r = to_device(rf, (size_t)T * sizeof(float));
    rmsnorm_backward_cuda(d_dx, d_dw, d_dy, d_x, d_w, d_r, T, H, 0);
    float *dx = download_bf16(d_dx, n), *dw = from_device_f32(d_dw, H);
    double *want_w = dalloc(H), *bound_w = dalloc(H);
    for (int c = 0; c < H; c++) { want_w[c] = dw0[c]; bound_w[c] = fabs(dw0[c]); }
    for (int64_t t = 0; t < T; t++) {
        const double r = rf[t];
        double dot = 0;
        for (int c = 0; c < H; c++) dot += (double)wf[c] * dyf[t * H + c] * xf[t * H + c];
        const double coef = dot / H * r * r * r;
        for (int c = 0; c < H; c++) {
            const int64_t i = t * H + c;
            const double a = r * wf[c] * dyf[i], b = coef * xf[i];
            want[i] = dx0f[i] + a - b;
            bound[i] = U16 * fabs(want[i]) + 8 * U32 * (fabs(dx0f[i]) + fabs(a) + fabs(b));
            want_w[c] += (double)dyf[i] * xf[i] * r;
            bound_w[c] += fabs((double)dyf[i] * xf[i] * r);
        }
    }
    for (int c = 0; c < H; c++) bound_w[c] *= (double)(T + 4) * U32;
    expect_within("rmsnorm_backward", "dinp", shape, dx, want, bound, n);
    expect_within("rmsnorm_backward", "dweight", shape, dw, want_w, bound_w, H);

    CUDA_CHECK(cudaFree(d_x)); CUDA_CHECK(cudaFree(d_w)); CUDA_CHECK(cudaFree(d_dy)); CUDA_CHECK(cudaFree(d_dx));
    CUDA_CHECK(cudaFree(d_out)); CUDA_CHECK(cudaFree(d_rstd)); CUDA_CHECK(cudaFree(d_dw)); CUDA_CHECK(cudaFree(d_r));
    free(x); free(xf); free(w); free(wf); free(dy); free(dyf); free(dx0); free(dx0f); free(dw0); free(out);
    free(rstd); free(want); free(bound); free(want_r); free(bound_r); free(rf); free(dx); free(dw);
    free(want_w); free(bound_w);
}

// The fused residual add + norm: x must become x + delta rounded once, bit for
// bit (the sum of two bf16 values is exact in fp32 here, as for accumulate),
// out and rstd the norm of that rounded x within rmsnorm_forward's bounds,
// and all three bitwise what accumulate_cuda then rmsnorm_forward_cuda give.
// offset shifts every tensor by that many elements (offset 1: no row is
// 16-byte aligned, the element-by-element path).
static void test_residual_rmsnorm(int64_t T, int H, int offset) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%lld H=%d offset=%d", (long long)T, H, offset);
    const int64_t n = T * H;
    const size_t bytes = (size_t)(n + offset) * 2;
    const float eps = 1e-6f;
    uint16_t *x, *delta, *w;
    float *xf, *deltaf, *wf;
    random_bf16(&rng, n + offset, &x, &xf);
    random_bf16(&rng, n + offset, &delta, &deltaf);
    random_bf16(&rng, H + offset, &w, &wf);
    uint16_t *d_x = to_device(x, bytes), *d_delta = to_device(delta, bytes);
    uint16_t *d_w = to_device(w, (size_t)(H + offset) * 2), *d_out = poisoned(bytes);
    uint16_t *d_x2 = to_device(x, bytes), *d_out2 = poisoned(bytes);
    float *d_rstd = poisoned((size_t)T * sizeof(float)), *d_rstd2 = poisoned((size_t)T * sizeof(float));

    residual_rmsnorm_forward_cuda(d_out + offset, d_rstd, d_x + offset, d_delta + offset, d_w + offset, T, H, eps, 0);
    accumulate_cuda(d_x2 + offset, d_delta + offset, n, 0);
    rmsnorm_forward_cuda(d_out2 + offset, d_rstd2, d_x2 + offset, d_w + offset, T, H, eps, 0);
    uint16_t *sum = xmalloc(bytes), *out = xmalloc(bytes), *sum2 = xmalloc(bytes), *out2 = xmalloc(bytes);
    CUDA_CHECK(cudaMemcpy(sum, d_x, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(out, d_out, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(sum2, d_x2, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(out2, d_out2, bytes, cudaMemcpyDeviceToHost));
    float *rstd = from_device_f32(d_rstd, T), *rstd2 = from_device_f32(d_rstd2, T);

    int64_t wrong = 0;
    float *sumf = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        const uint16_t want_bits = f32_to_bf16((float)((double)xf[offset + i] + deltaf[offset + i]));
        wrong += sum[offset + i] != want_bits;
        sumf[i] = bf16_to_f32(want_bits);
    }
    EXPECT_COUNTED(wrong == 0, "residual_rmsnorm_forward x %s: %lld elements are not x + delta rounded once", shape,
                   (long long)wrong);
    double *want = dalloc(n), *bound = dalloc(n), *want_r = dalloc(T), *bound_r = dalloc(T);
    float *outf = xmalloc((size_t)n * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)sumf[t * H + c] * sumf[t * H + c];
        want_r[t] = 1.0 / sqrt(ss / H + eps);
        bound_r[t] = 2 * U32 * want_r[t];
        for (int c = 0; c < H; c++) {
            const int64_t i = t * H + c;
            want[i] = sumf[i] * want_r[t] * wf[offset + c];
            bound[i] = (U16 + 4 * U32) * fabs(want[i]);
            outf[i] = bf16_to_f32(out[offset + i]);
        }
    }
    expect_within("residual_rmsnorm_forward", "rstd", shape, rstd, want_r, bound_r, T);
    expect_within("residual_rmsnorm_forward", "out", shape, outf, want, bound, n);
    EXPECT_COUNTED(!memcmp(sum, sum2, bytes) && !memcmp(out, out2, bytes) &&
                       !memcmp(rstd, rstd2, (size_t)T * sizeof(float)),
                   "residual_rmsnorm_forward %s: not bitwise accumulate then rmsnorm_forward", shape);

    CUDA_CHECK(cudaFree(d_x)); CUDA_CHECK(cudaFree(d_delta)); CUDA_CHECK(cudaFree(d_w));
    CUDA_CHECK(cudaFree(d_out)); CUDA_CHECK(cudaFree(d_x2)); CUDA_CHECK(cudaFree(d_out2));
    CUDA_CHECK(cudaFree(d_rstd)); CUDA_CHECK(cudaFree(d_rstd2));
    free(x); free(xf); free(delta); free(deltaf); free(w); free(wf); free(sum); free(out); free(sum2); free(out2);
    free(rstd); free(rstd2); free(sumf); free(want); free(bound); free(want_r); free(bound_r); free(outf);
}

// ---- RoPE ----

// The fused rows qkv [T, (heads + 2 k_heads) D] (k_heads = (heads + 1) / 2)
// split into q [T, heads, D], k and v [T, k_heads, D] (one buffer, in turn)
// or, inverse, joined back; q and k against the formula, v copied exactly.
static void test_rope(int64_t T, int heads, int D, double attention_factor, int inverse) {
    char shape[96];
    snprintf(shape, sizeof shape, "T=%lld heads=%d D=%d factor=%g inverse=%d", (long long)T, heads, D,
             attention_factor, inverse);
    const int half = D / 2, k_heads = (heads + 1) / 2;
    const int64_t QD = (int64_t)heads * D, KD = (int64_t)k_heads * D, W = QD + 2 * KD, n = T * W;
    uint16_t *x;
    float *xf;
    random_bf16(&rng, n, &x, &xf);   // the input: the fused rows, or q, k, v in turn
    int64_t *pos = xmalloc((size_t)T * sizeof(int64_t));
    for (int64_t t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int64_t)rng_below(&rng, 600000);   // up to 586K
    double *inv_freq = dalloc(half);
    for (int i = 0; i < half; i++) inv_freq[i] = pow(1e6, -2.0 * i / D);
    uint16_t *d_in = to_device(x, (size_t)n * 2), *d_out = poisoned((size_t)n * 2);
    int64_t *d_pos = to_device(pos, (size_t)T * sizeof(int64_t));
    double *d_inv = to_device(inv_freq, (size_t)half * sizeof(double));

    uint16_t *fused = inverse ? d_out : d_in, *apart = inverse ? d_in : d_out;
    rope_cuda(fused, apart, apart + T * QD, apart + T * (QD + KD), heads, k_heads, d_pos, T, D, d_inv,
              attention_factor, inverse, 0);
    float *got = download_bf16(d_out, n);
    double *want = dalloc(n), *bound = dalloc(n);
    // Part p (q, k, v): its heads, its columns in the fused rows, its first element apart.
    const struct { int heads; int64_t column, at; } parts[3] = {{heads, 0, 0}, {k_heads, QD, T * QD},
                                                                 {k_heads, QD + KD, T * (QD + KD)}};
    for (int p = 0; p < 3; p++)
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                const double angle = (double)pos[t] * inv_freq[i];
                const double c = p == 2 ? 1 : attention_factor * cos(angle);
                const double s = p == 2 ? 0 : attention_factor * sin(angle) * (inverse ? -1 : 1);
                const int H = parts[p].heads;
                for (int h = 0; h < H; h++) {
                    const int64_t f = t * W + parts[p].column + h * D + i, a = parts[p].at + (t * H + h) * D + i;
                    const int64_t from = inverse ? a : f, to = inverse ? f : a;
                    const double x1 = xf[from], x2 = xf[from + half];
                    want[to] = x1 * c - x2 * s;
                    want[to + half] = x2 * c + x1 * s;
                    const double slack = p == 2 ? 0 : 4 * U32 * attention_factor * (fabs(x1) + fabs(x2));
                    bound[to] = p == 2 ? 0 : U16 * fabs(want[to]) + slack;
                    bound[to + half] = p == 2 ? 0 : U16 * fabs(want[to + half]) + slack;
                }
            }
    expect_within("rope", "q, k and v", shape, got, want, bound, n);

    CUDA_CHECK(cudaFree(d_in)); CUDA_CHECK(cudaFree(d_out)); CUDA_CHECK(cudaFree(d_pos)); CUDA_CHECK(cudaFree(d_inv));
    free(x); free(xf); free(pos); free(inv_freq); free(got); free(want); free(bound);
}

// ---- SwiGLU, accumulate ----

// gate_up [rows, 2I] (each row gate [I] then up [I]); I not a multiple of 8:
// groups across rows, element by element.
static void test_swiglu(int64_t rows, int I) {
    char shape[48];
    snprintf(shape, sizeof shape, "rows=%lld I=%d", (long long)rows, I);
    const int64_t n = rows * I;
    uint16_t *g, *u, *dy;
    float *gf, *uf, *dyf;
    random_bf16_scaled(n, 3.0, &g, &gf);   // sigmoid's tails and g(1 - s) near -1
    random_bf16(&rng, n, &u, &uf);
    random_bf16(&rng, n, &dy, &dyf);
    uint16_t *gu = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) gu[i / I * 2 * I + i % I] = g[i], gu[i / I * 2 * I + I + i % I] = u[i];
    uint16_t *d_gu = to_device(gu, (size_t)n * 4), *d_dy = to_device(dy, (size_t)n * 2);
    // NaN: the backward writes every element (it does not add to them)
    uint16_t *d_dgu = poisoned((size_t)n * 4), *d_out = poisoned((size_t)n * 2);

    swiglu_forward_cuda(d_out, d_gu, rows, I, 0);
    swiglu_backward_cuda(d_dgu, d_dy, d_gu, rows, I, 0);
    float *out = download_bf16(d_out, n), *dgu = download_bf16(d_dgu, 2 * n);
    float *dg = xmalloc((size_t)(n ? n : 1) * sizeof(float)), *du = xmalloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) dg[i] = dgu[i / I * 2 * I + i % I], du[i] = dgu[i / I * 2 * I + I + i % I];
    double *want = dalloc(n), *bound = dalloc(n), *want_g = dalloc(n), *bound_g = dalloc(n);
    double *want_u = dalloc(n), *bound_u = dalloc(n);
    for (int64_t i = 0; i < n; i++) {
        const double x = gf[i], s = 1.0 / (1.0 + exp(-x));
        want[i] = x * s * uf[i];
        bound[i] = (U16 + 8 * U32) * fabs(want[i]);
        const double a = dyf[i] * uf[i] * s;
        want_g[i] = a * (1.0 + x * (1.0 - s));
        bound_g[i] = U16 * fabs(want_g[i]) + 16 * U32 * fabs(a) * (1.0 + fabs(x));
        want_u[i] = dyf[i] * x * s;
        bound_u[i] = U16 * fabs(want_u[i]) + 8 * U32 * fabs(dyf[i] * x * s);
    }
    expect_within("swiglu_forward", "out", shape, out, want, bound, n);
    expect_within("swiglu_backward", "dgate", shape, dg, want_g, bound_g, n);
    expect_within("swiglu_backward", "dup", shape, du, want_u, bound_u, n);

    CUDA_CHECK(cudaFree(d_gu)); CUDA_CHECK(cudaFree(d_dy)); CUDA_CHECK(cudaFree(d_dgu)); CUDA_CHECK(cudaFree(d_out));
    free(g); free(gf); free(u); free(uf); free(dy); free(dyf); free(gu); free(dgu);
    free(out); free(dg); free(du); free(want); free(bound); free(want_g); free(bound_g); free(want_u);
    free(bound_u);
}

// accumulate: the sum of two bf16 values is exact in fp32 here (exponents
// within 16 of each other), so y must be that sum rounded once, bit for bit.
// offset: y and x start that many elements into their buffers (1: not
// 16-byte aligned, every group element by element).
static void test_accumulate(int64_t n, int offset) {
    uint16_t *y, *x;
    float *yf, *xf;
    random_bf16(&rng, n + offset, &y, &yf);
    random_bf16(&rng, n + offset, &x, &xf);
    uint16_t *d_y = to_device(y, (size_t)(n + offset) * 2), *d_x = to_device(x, (size_t)(n + offset) * 2);
    accumulate_cuda(d_y + offset, d_x + offset, n, 0);
    uint16_t *got = xmalloc((size_t)(n + offset) * 2 + 1);
    CUDA_CHECK(cudaMemcpy(got, d_y, (size_t)(n + offset) * 2, cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t i = 0; i < offset; i++) wrong += got[i] != y[i];
    for (int64_t i = offset; i < n + offset; i++) wrong += got[i] != f32_to_bf16((float)((double)yf[i] + xf[i]));
    EXPECT_COUNTED(wrong == 0, "accumulate n=%lld offset=%d: %lld elements are not y + x rounded once (or, before "
                   "the offset, changed)", (long long)n, offset, (long long)wrong);

    CUDA_CHECK(cudaFree(d_y)); CUDA_CHECK(cudaFree(d_x));
    free(y); free(yf); free(x); free(xf); free(got);
}

// ---- sum of squares ----

// Two tensors added into one device total that starts at 5: double sums, so
// the relative error is a few U64 times the number of terms.
static void test_sum_squares(int64_t n1, int64_t n2) {
    float *a = random_f32(&rng, n1), *b = random_f32(&rng, n2);
    float *d_a = to_device(a, (size_t)n1 * sizeof(float)), *d_b = to_device(b, (size_t)n2 * sizeof(float));
    const double start = 5.0;
    double *d_total = to_device(&start, sizeof(double));
    sum_squares_cuda(d_a, n1, d_total, 0);
    sum_squares_cuda(d_b, n2, d_total, 0);
    double got;
    CUDA_CHECK(cudaMemcpy(&got, d_total, sizeof(got), cudaMemcpyDeviceToHost));
    double want = start;
    for (int64_t i = 0; i < n1; i++) want += (double)a[i] * a[i];
    for (int64_t i = 0; i < n2; i++) want += (double)b[i] * b[i];
    EXPECT_COUNTED(fabs(got - want) <= 1e-13 * (double)(n1 + n2) * want,
                   "sum_squares n=%lld+%lld: %.17g vs %.17g", (long long)n1, (long long)n2, got, want);
    CUDA_CHECK(cudaFree(d_a)); CUDA_CHECK(cudaFree(d_b)); CUDA_CHECK(cudaFree(d_total));
    free(a); free(b);
}

// ---- cross entropy ----

// Logits 4 N(0, 1) in bf16; about one target in five is -1 (a zero row).
// The fp32 log-sum-exp is off by at most ~1e-5 (a sum of <= V / 256 + 13
// rounded terms per thread and merge, times |lse| < 40), so each row's loss
// by 1e-5 and each probability relatively by 2e-5.
static void test_cross_entropy(int64_t C, int V) {
    char shape[48];
    snprintf(shape, sizeof shape, "C=%lld V=%d", (long long)C, V);
    const int64_t n = C * V;
    const float grad_scale = 1.0f / 37;
    uint16_t *logits;
    float *lf;
    random_bf16_scaled(n, 4.0, &logits, &lf);
    int32_t *targets = xmalloc((size_t)C * sizeof(int32_t));
    for (int64_t t = 0; t < C; t++) targets[t] = rng_below(&rng, 5) == 0 ? -1 : (int32_t)rng_below(&rng, V);
    uint16_t *d_logits = to_device(logits, (size_t)n * 2);
    int32_t *d_targets = to_device(targets, (size_t)C * sizeof(int32_t));
    const double start = 1.5;
    double *d_loss = to_device(&start, sizeof(double));

    cross_entropy_cuda(d_logits, d_targets, C, V, grad_scale, d_loss, 0);
    double loss;
    CUDA_CHECK(cudaMemcpy(&loss, d_loss, sizeof(loss), cudaMemcpyDeviceToHost));
    float *got = download_bf16(d_logits, n);
    double *want = dalloc(n), *bound = dalloc(n);
    double want_loss = start;
    for (int64_t t = 0; t < C; t++) {
        const float *x = lf + t * V;
        double mx = x[0], sum = 0;
        for (int i = 1; i < V; i++) mx = fmax(mx, x[i]);
        for (int i = 0; i < V; i++) sum += exp(x[i] - mx);
        const double lse = mx + log(sum);
        if (targets[t] >= 0) want_loss += lse - x[targets[t]];
        for (int i = 0; i < V; i++) {
            const int64_t j = t * V + i;
            if (targets[t] < 0) { want[j] = 0; bound[j] = 0; continue; }
            const double p = exp(x[i] - lse), onehot = i == targets[t];
            want[j] = (p - onehot) * grad_scale;
            bound[j] = U16 * fabs(want[j]) + 2e-5 * grad_scale * (p + onehot);
        }
    }
    expect_within("cross_entropy", "dlogits", shape, got, want, bound, n);
    EXPECT_COUNTED(fabs(loss - want_loss) <= 1e-5 * (double)C, "cross_entropy loss %s: %.9g vs %.9g", shape,
                   loss, want_loss);

    CUDA_CHECK(cudaFree(d_logits)); CUDA_CHECK(cudaFree(d_targets)); CUDA_CHECK(cudaFree(d_loss));
    free(logits); free(lf); free(targets); free(got); free(want); free(bound);
}

// ---- AdamW ----

// fp32 update of a few operations: m and v within 4 U32 of the magnitudes of
// their two terms (bm, bv; the kernel may contract a product and a sum into an
// FMA, which rounds once less). The parameter: 2 U32 |p'| for its own
// roundings, 16 U32 lr (|update| + |decay|) for the division, square root and
// products, plus m's error carried through the update, lr bm / c1 / (sqrt(vhat)
// + eps): when beta1 m and (1 - beta1) g nearly cancel, m' is small and its
// error (a few U32 of the cancelled terms) is not small relative to it, nor
// then to the update (v has no cancellation: its terms are >= 0). Every 5th
// element is such a cancellation with p = 0, so a bound without m's error
// fails. The bf16 copy is the updated fp32 parameter rounded once, bit for bit.
// One launch over a table of three runs: [0, a) without weight decay, [a + 1,
// b) and [b, n) with it; element a lies in no run and keeps its bits (and its
// bf16 copy its poison). The gradients are scaled by 1/2 (clipping; exact).
static void test_adamw(int64_t n) {
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
    const int64_t step = 3, a = n / 3, b = a + 1 + (n - a - 1) / 2;
    const AdamWRun runs[3] = {{0, a, 0.0f}, {a + 1, b - a - 1, wd}, {b, n - b, wd}};
    float *p = random_f32(&rng, n), *g = random_f32(&rng, n), *m = random_f32(&rng, n), *v = random_f32(&rng, n);
    for (int64_t i = 0; i < n; i++) {
        m[i] *= 0.1f;
        v[i] = v[i] * v[i] * 0.01f;
        if (i % 5 == 0) {   // beta1 m + (1 - beta1) g grad_scale cancels to a few U32 of its terms
            g[i] = (float)(-(double)beta1 * m[i] / (1.0 - beta1) / grad_scale);
            p[i] = 0;
        }
    }
    float *d_p = to_device(p, (size_t)n * 4), *d_g = to_device(g, (size_t)n * 4);
    float *d_m = to_device(m, (size_t)n * 4), *d_v = to_device(v, (size_t)n * 4);
    AdamWRun *d_runs = to_device(runs, sizeof runs);
    uint16_t *d_pb = poisoned((size_t)n * 2);
    adamw_cuda(d_p, d_pb, d_g, d_m, d_v, d_runs, 3, lr, beta1, beta2, eps, grad_scale, step, 0);
    float *gp = from_device_f32(d_p, n), *gm = from_device_f32(d_m, n), *gv = from_device_f32(d_v, n);
    uint16_t *gb = xmalloc((size_t)n * 2 + 1), *poison = xmalloc(2);
    CUDA_CHECK(cudaMemcpy(gb, d_pb, (size_t)n * 2, cudaMemcpyDeviceToHost));
    memcpy(poison, gb + a, 2);
    double *wp = dalloc(n), *wm = dalloc(n), *wv = dalloc(n), *bp = dalloc(n), *bm = dalloc(n), *bv = dalloc(n);
    const double c1 = 1 - pow(beta1, (double)step), c2 = 1 - pow(beta2, (double)step);
    int64_t wrong_copy = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == a) {   // in no run: unchanged
            wm[i] = m[i], wv[i] = v[i], wp[i] = p[i];
            bm[i] = bv[i] = bp[i] = 0;
            continue;
        }
        const double gi = (double)g[i] * grad_scale, decay = i < a ? 0.0 : (double)wd * p[i];
        const double a1 = (double)beta1 * m[i], b1 = (1.0 - beta1) * gi;
        wm[i] = a1 + b1;
        bm[i] = 4 * U32 * (fabs(a1) + fabs(b1));
        const double a2 = (double)beta2 * v[i], b2 = (1.0 - beta2) * gi * gi;
        wv[i] = a2 + b2;
        bv[i] = 4 * U32 * (a2 + b2);
        const double update = wm[i] / c1 / (sqrt(wv[i] / c2) + eps);
        wp[i] = p[i] - lr * (update + decay);
        bp[i] = 2 * U32 * fabs(wp[i]) + 16 * U32 * lr * (fabs(update) + fabs(decay))
              + lr * bm[i] / c1 / (sqrt(wv[i] / c2) + eps);
        wrong_copy += gb[i] != f32_to_bf16(gp[i]);
    }
    char shape[32];
    snprintf(shape, sizeof shape, "n=%lld", (long long)n);
    expect_within("adamw", "m", shape, gm, wm, bm, n);
    expect_within("adamw", "v", shape, gv, wv, bv, n);
    expect_within("adamw", "param", shape, gp, wp, bp, n);
    EXPECT_COUNTED(wrong_copy == 0, "adamw bf16 copy %s: %lld elements are not the parameter rounded", shape,
                   (long long)wrong_copy);
    EXPECT_COUNTED(gp[a] == p[a] && isnan(bf16_to_f32(poison[0])),
                   "adamw %s: the element in no run keeps its parameter and its (poisoned) bf16 copy", shape);
    CUDA_CHECK(cudaFree(d_p)); CUDA_CHECK(cudaFree(d_g)); CUDA_CHECK(cudaFree(d_m)); CUDA_CHECK(cudaFree(d_v));
    CUDA_CHECK(cudaFree(d_pb)); CUDA_CHECK(cudaFree(d_runs));
    free(p); free(g); free(m); free(v); free(gp); free(gm); free(gv); free(gb); free(poison);
    free(wp); free(wm); free(wv); free(bp); free(bm); free(bv);
}

// ---- conversions ----

// Random values plus the rounding's edge cases: ties to even both ways, the
// largest value that rounds to inf, zeros of both signs, inf, a subnormal.
static void test_conversions(int64_t n) {
    static const float edges[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3961514e38f, 3.4028235e38f,
                                  0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f};
    const int64_t ne = (int64_t)(sizeof edges / sizeof edges[0]), total = n + ne;
    float *x = random_f32(&rng, total);
    memcpy(x + n, edges, sizeof edges);
    float *d_x = to_device(x, (size_t)total * 4);
    uint16_t *d_b = poisoned((size_t)total * 2);
    float *d_back = poisoned((size_t)total * 4);
    f32_to_bf16_cuda(d_b, d_x, total, 0);
    bf16_to_f32_cuda(d_back, d_b, total, 0);
    uint16_t *b = xmalloc((size_t)total * 2);
    CUDA_CHECK(cudaMemcpy(b, d_b, (size_t)total * 2, cudaMemcpyDeviceToHost));
    float *back = from_device_f32(d_back, total);
    int64_t wrong_b = 0, wrong_f = 0;
    for (int64_t i = 0; i < total; i++) {
        wrong_b += b[i] != f32_to_bf16(x[i]);
        uint32_t bits;
        memcpy(&bits, &back[i], 4);
        wrong_f += bits != (uint32_t)b[i] << 16;
    }
    EXPECT_COUNTED(wrong_b == 0, "f32_to_bf16 n=%lld: %lld elements not rounded to nearest even", (long long)total,
                   (long long)wrong_b);
    EXPECT_COUNTED(wrong_f == 0, "bf16_to_f32 n=%lld: %lld elements not exact", (long long)total,
                   (long long)wrong_f);
    CUDA_CHECK(cudaFree(d_x)); CUDA_CHECK(cudaFree(d_b)); CUDA_CHECK(cudaFree(d_back));
    free(x); free(b); free(back);
}

int main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    CHECK(argc == 1 || small, "usage: %s [small]", argv[0]);
    rng_seed(&rng, 2024);

    test_embedding(1, 24, 257);
    test_embedding(7, 40, 1000);
    test_embedding(37, 896, 257);
    test_embedding(130, 40, 1000);
    test_embedding(130, 896, 1000);
    test_embedding(600, 40, 257);        // several chunks of token ids per block
    test_rmsnorm(1, 24);
    test_rmsnorm(7, 40);
    test_rmsnorm(37, 896);
    test_rmsnorm(130, 40);
    test_rmsnorm(130, 896);
    test_rmsnorm(2100, 300);             // several rows per block (both grids are capped), every warp busy
    test_residual_rmsnorm(1, 24, 0);
    test_residual_rmsnorm(7, 40, 0);
    test_residual_rmsnorm(37, 896, 0);
    test_residual_rmsnorm(130, 300, 0);  // H not a multiple of 8: rows element by element
    test_residual_rmsnorm(37, 40, 1);    // unaligned
    test_residual_rmsnorm(2100, 40, 0);  // several rows per block
    test_rope(1, 2, 64, 1.0, 0);
    test_rope(7, 3, 64, 1.0, 1);
    test_rope(37, 2, 128, 1.2, 0);
    test_rope(130, 3, 128, 1.2, 1);
    test_swiglu(1, 1);
    test_swiglu(7, 40);
    test_swiglu(37, 896);
    test_swiglu(7, 143);                 // rows not whole groups: element by element
    test_swiglu(1, 1001);                // a tail group of 1
    test_accumulate(1, 0);
    test_accumulate(130 * 40, 0);
    test_accumulate(1003, 0);      // a tail group of 3
    test_accumulate(1003, 1);      // unaligned
    test_sum_squares(1, 7);
    test_sum_squares(130 * 896, 600001);   // a full grid, several elements per thread
    test_cross_entropy(1, 257);
    test_cross_entropy(7, 1000);
    test_cross_entropy(37, 257);
    test_cross_entropy(130, 1000);
    test_cross_entropy(2100, 257);       // several rows per block
    test_adamw(7);
    test_adamw(130 * 40 + 3);
    test_conversions(1000);
    if (!small) {
        test_embedding(4099, 896, 151936);
        test_rmsnorm(4099, 896);
        test_rope(4099, 14, 64, 1.0, 0);
        test_swiglu(4099, 4864);
        test_cross_entropy(1000, 151936);
        test_adamw(50000000);
    }
    printf("%d checks: %d passed, %d failed\n", checks, checks - check_failures, check_failures);
    return check_exit();
}
