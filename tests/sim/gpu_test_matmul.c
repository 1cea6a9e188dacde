// gpu_test_matmul.c: the CUDA backend's GEMMs (model/matmul_cuda.cu, cuBLASLt;
// the sim's subset under the CPU execution model) against double-precision
// loops written here: the forward with and without bias, and the three
// backward outputs (dinp written over non-zero values: beta 0; dweight and
// dbias, by bias_grad_cuda, accumulated into non-zero values), each of dinp,
// dweight, dbias skipped in turn, on shapes that are no multiple of any tile
// (T 1, 7, 130; IC, OC 24, 40, 257, 1000), with tensors 256-byte aligned and,
// alternately, only 16-byte aligned (the heuristic must be told). Then more
// distinct problems than the algorithm cache holds, and the first again.
// Then the cases again with the algorithms chosen by timing (the report
// checked against the cost), and once more for each other answer of the
// heuristic kept in turn (matmul_cuda_choose).
//   gpu_test_matmul [small]    small: the shapes above; without: also T 1037 at 896 x 1152 (first pass)
//
// Tolerance, element by element, from the error analysis of a sum: an
// element is a sum of K products of bf16 values (exact in fp32) plus its
// starting value and the bias; summed in fp32 in any order, each addition
// rounds by at most 2^-24 (u) of its partial sum, so the fp32 sum is within
// (K + 2) u sum|terms| of the exact one. We allow twice that (tensor cores may
// truncate instead of rounding) plus u for the reference's own rounding:
//   fp32 outputs (dweight, dbias): |got - ref| <= (K + 3) 2^-23 sum|terms|
//   bf16 outputs (out, dinp):      the same + 2^-8 |ref| (one rounding to
//                                  8 significant bits: half an ulp is at most 2^-8 of the value)
//                                  + 2^-8 |product| when the bias is added
// A written dinp (beta 0) has no start value, so no second rounding: its bound
// is the one-rounding one. The last term is a second rounding: some of cuBLASLt's algorithms round the
// product to bf16 before they add the bias (measured on an H200: the forward
// with bias at T 130 x 257 x 1000; the sim, which always does, reproduces
// that worst ratio against the one-rounding bound to the last digit). Where
// the bias cancels the product, that rounding is many times the one-rounding
// bound. Split-K
// algorithms that add their parts in bf16 would round once more per part; the
// backend forbids them (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK).
// ref, sum|terms| and |product| are computed here in double. Each check prints the
// worst |got - ref| / bound (must be <= 1). Starting values and the bias are of
// the size of the product, so an output overwritten instead of accumulated (or
// dinp accumulated instead of written), or a bias left out, is off by about its
// own size.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../../model/matmul_cuda.h"
#include "../lib/check.h"
#include "gpu_common.h"

// The double-precision reference of R x C outputs: each value, the sum of
// its |terms| and |product| (the sum of the products alone; 0 without a start
// value, when nothing is added to the product).
typedef struct {
    double *value, *abs_sum, *product;
} Reference;

static Reference reference_alloc(int64_t n) {
    Reference r = {xmalloc((size_t)n * sizeof(double)), xmalloc((size_t)n * sizeof(double)),
                   xmalloc((size_t)n * sizeof(double))};
    return r;
}

static void reference_free(Reference *r) {
    free(r->value);
    free(r->abs_sum);
    free(r->product);
}

// Worst |got - ref| / bound over n elements (see the top of the file); NaN
// or a difference where the bound is 0 gives infinity.
static double worst_ratio(const float *got, const Reference *ref, int64_t n, int64_t K, int bf16_out) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double diff = fabs((double)got[i] - ref->value[i]);
        const double rounding = bf16_out ? 0x1p-8 * (fabs(ref->value[i]) + ref->product[i]) : 0.0;
        const double bound = (double)(K + 3) * 0x1p-23 * ref->abs_sum[i] + rounding;
        const double r = diff == 0 ? 0 : bound > 0 ? diff / bound : INFINITY;
        if (!(r <= worst)) worst = isnan(r) ? INFINITY : r;
    }
    return worst;
}

// A device copy of bytes at `offset` bytes into its own allocation (base, freed by device_free).
typedef struct {
    void *base;
    void *ptr;
} DeviceBuf;

static DeviceBuf device_at(const void *host, size_t bytes, size_t offset) {
    DeviceBuf b;
    CUDA_CHECK(cudaMalloc(&b.base, bytes + offset));
    CUDA_CHECK(cudaMemset(b.base, 0xff, bytes + offset));
    b.ptr = (char *)b.base + offset;
    if (host) CUDA_CHECK(cudaMemcpy(b.ptr, host, bytes, cudaMemcpyHostToDevice));
    return b;
}

static void device_free(DeviceBuf *b) { CUDA_CHECK(cudaFree(b->base)); }

// n values of N(0, scale^2), bf16: bits and fp32 values.
static void random_scaled_bf16(Rng *rng, int64_t n, double scale, uint16_t **bits, float **values) {
    *bits = xmalloc((size_t)n * sizeof(uint16_t) + 1);
    *values = xmalloc((size_t)n * sizeof(float) + 1);
    for (int64_t i = 0; i < n; i++) {
        (*bits)[i] = f32_to_bf16((float)(scale * rng_normal(rng)));
        (*values)[i] = bf16_to_f32((*bits)[i]);
    }
}

static float *random_scaled_f32(Rng *rng, int64_t n, double scale) {
    float *x = xmalloc((size_t)n * sizeof(float) + 1);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(rng));
    return x;
}

// ref[r, c] = start[r sr + c sc] + sum_k x[r xr + k xk] y[c yc + k yk] in double, R x C
// row-major (start NULL: 0).
static void reference(Reference *ref, int64_t R, int64_t C, int64_t K, const float *x, int64_t xr, int64_t xk,
                      const float *y, int64_t yc, int64_t yk, const float *start, int64_t sr, int64_t sc) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            double product = 0, abs = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)x[r * xr + k * xk] * y[c * yc + k * yk];
                product += p;
                abs += fabs(p);
            }
            const double begin = start ? start[r * sr + c * sc] : 0.0;
            ref->value[r * C + c] = begin + product;
            ref->abs_sum[r * C + c] = fabs(begin) + abs;
            ref->product[r * C + c] = start ? fabs(product) : 0.0;
        }
}

// One counted check of n outputs (sums of K products) against the reference; frees got.
static void check_output(const char *name, const char *what, float *got, const Reference *ref, int64_t n, int64_t K,
                         int bf16_out) {
    const double worst = worst_ratio(got, ref, n, K, bf16_out);
    EXPECT_COUNTED(worst <= 1, "%s: %s, worst error / bound %.3f", name, what, worst);
    free(got);
}

typedef struct {
    int64_t T;
    int IC, OC;
    int bias;          // forward with a bias
    int skip;          // backward output left NULL: 0 none, 1 dinp, 2 dweight, 3 dbias
    size_t offset;     // bytes every tensor starts past its allocation's start (0 or 16)
} Case;

static const char *skip_name(int skip) {
    return skip == 1 ? "no dinp" : skip == 2 ? "no dweight" : skip == 3 ? "no dbias" : "all grads";
}

// One case under the context's choice of algorithms, named with `pass`.
static void run_case(MatmulCuda *mm, const Case *c, uint64_t seed, const char *pass) {
    const int64_t T = c->T, IC = c->IC, OC = c->OC;
    char name[160];
    snprintf(name, sizeof name, "matmul%s T%lld IC%lld OC%lld %s %s align+%zu", pass, (long long)T, (long long)IC,
             (long long)OC, c->bias ? "bias" : "no bias", skip_name(c->skip), c->offset);
    Rng rng;
    rng_seed(&rng, seed);
    uint16_t *inp_b, *w_b, *bias_b, *dout_b, *dinp0_b;
    float *inp, *w, *bias, *dout, *dinp0;
    random_bf16(&rng, T * IC, &inp_b, &inp);
    random_bf16(&rng, OC * IC, &w_b, &w);
    random_scaled_bf16(&rng, OC, sqrt((double)IC), &bias_b, &bias);
    random_bf16(&rng, T * OC, &dout_b, &dout);
    random_scaled_bf16(&rng, T * IC, sqrt((double)OC), &dinp0_b, &dinp0);
    float *dw0 = random_scaled_f32(&rng, OC * IC, sqrt((double)T));
    float *db0 = random_scaled_f32(&rng, OC, sqrt((double)T));

    const size_t off = c->offset;
    DeviceBuf d_inp = device_at(inp_b, (size_t)(T * IC) * 2, off), d_w = device_at(w_b, (size_t)(OC * IC) * 2, off);
    DeviceBuf d_bias = device_at(bias_b, (size_t)OC * 2, off), d_dout = device_at(dout_b, (size_t)(T * OC) * 2, off);
    DeviceBuf d_out = device_at(NULL, (size_t)(T * OC) * 2, off);   // NaN: every element must be written
    DeviceBuf d_dinp = device_at(dinp0_b, (size_t)(T * IC) * 2, off);
    DeviceBuf d_dw = device_at(dw0, (size_t)(OC * IC) * 4, off), d_db = device_at(db0, (size_t)OC * 4, off);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    matmul_forward_cuda(mm, d_out.ptr, d_inp.ptr, d_w.ptr, c->bias ? d_bias.ptr : NULL, T, (int)IC, (int)OC, stream);
    matmul_backward_cuda(mm, c->skip == 1 ? NULL : d_dinp.ptr, c->skip == 2 ? NULL : d_dw.ptr, d_dout.ptr,
                         d_inp.ptr, d_w.ptr, T, (int)IC, (int)OC, stream);
    if (c->skip != 3) bias_grad_cuda(mm, d_db.ptr, d_dout.ptr, (int)OC, T, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaStreamDestroy(stream));

    Reference ref = reference_alloc(T * (IC > OC ? IC : OC) + OC * IC);
    // out[t, o] = bias[o] + sum_i inp[t, i] w[o, i]
    reference(&ref, T, OC, IC, inp, IC, 1, w, IC, 1, c->bias ? bias : NULL, 0, 1);
    check_output(name, "forward", from_device_bf16(d_out.ptr, T * OC), &ref, T * OC, IC, 1);
    if (c->skip != 1) {   // dinp[t, i] = sum_o dout[t, o] w[o, i], written over dinp0
        reference(&ref, T, IC, OC, dout, OC, 1, w, 1, IC, NULL, 0, 0);
        check_output(name, "dinp = dout W", from_device_bf16(d_dinp.ptr, T * IC), &ref, T * IC, OC, 1);
    }
    if (c->skip != 2) {   // dw[o, i] = dw0[o, i] + sum_t dout[t, o] inp[t, i]
        reference(&ref, OC, IC, T, dout, 1, OC, inp, 1, IC, dw0, IC, 1);
        check_output(name, "dweight += dout^T inp", from_device_f32(d_dw.ptr, OC * IC), &ref, OC * IC, T, 0);
    }
    if (c->skip != 3) {   // db[o] = db0[o] + sum_t dout[t, o] 1
        float *ones = xmalloc((size_t)T * sizeof(float));
        for (int64_t t = 0; t < T; t++) ones[t] = 1.0f;
        reference(&ref, OC, 1, T, dout, 1, OC, ones, 0, 1, db0, 1, 0);
        check_output(name, "dbias += colsum(dout)", from_device_f32(d_db.ptr, OC), &ref, OC, T, 0);
        free(ones);
    }
    reference_free(&ref);
    DeviceBuf all[] = {d_inp, d_w, d_bias, d_dout, d_out, d_dinp, d_dw, d_db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) device_free(&all[i]);
    free(inp_b); free(w_b); free(bias_b); free(dout_b); free(dinp0_b);
    free(inp); free(w); free(bias); free(dout); free(dinp0); free(dw0); free(db0);
}

// More distinct problems than the cache holds (one token, OC 1..PROBLEMS), then
// the first again: an algorithm evicted and asked for anew still gives out = W x.
#define PROBLEMS 150
static void check_cache_eviction(MatmulCuda *mm) {
    const int IC = 24;
    Rng rng;
    rng_seed(&rng, 7);
    uint16_t *x_b, *w_b;
    float *x, *w;
    random_bf16(&rng, IC, &x_b, &x);
    random_bf16(&rng, (int64_t)PROBLEMS * IC, &w_b, &w);
    uint16_t *d_x = to_device(x_b, (size_t)IC * 2), *d_w = to_device(w_b, (size_t)PROBLEMS * IC * 2);
    uint16_t *d_out = poisoned((size_t)PROBLEMS * 2);
    for (int oc = PROBLEMS; oc >= 1; oc--) matmul_forward_cuda(mm, d_out, d_x, d_w, NULL, 1, IC, oc, 0);
    matmul_forward_cuda(mm, d_out, d_x, d_w, NULL, 1, IC, PROBLEMS, 0);
    Reference ref = reference_alloc(PROBLEMS);
    reference(&ref, 1, PROBLEMS, IC, x, 0, 1, w, IC, 1, NULL, 0, 0);
    char name[96];
    snprintf(name, sizeof name, "matmul %d problems through a cache of fewer, then the first again", PROBLEMS);
    check_output(name, "forward", from_device_bf16(d_out, PROBLEMS), &ref, PROBLEMS, IC, 1);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_w));
    CUDA_CHECK(cudaFree(d_out));
    reference_free(&ref);
    free(x_b); free(w_b); free(x); free(w);
}

// The cases above (T 1, 7, 130 by four IC x OC; small false: also T 1037 at 896 x 1152), each under `pass`.
static void run_cases(MatmulCuda *mm, bool small, const char *pass) {
    const int64_t tokens[3] = {1, 7, 130};
    const int dims[4][2] = {{24, 40}, {40, 24}, {257, 1000}, {1000, 257}};   // IC, OC
    uint64_t seed = 1;
    int n = 0;
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 4; d++, n++) {
            const Case c = {tokens[s], dims[d][0], dims[d][1], n % 2 == 0, n % 4, n % 3 == 1 ? 16 : 0};
            run_case(mm, &c, seed++, pass);
        }
    if (!small) {
        const Case big_bias = {1037, 896, 1152, 1, 0, 16};
        const Case big = {1037, 896, 1152, 0, 0, 0};
        run_case(mm, &big, seed++, pass);
        run_case(mm, &big_bias, seed++, pass);
    }
}

// The report of a timed pass (matmul_cuda_choose): one line per problem, "gemm choice: OP m M n N k K...:
// answer I of A (...)", 1 <= I <= A <= MATMUL_CUDA_ANSWERS, those timed (" ms") as many as the cost's
// problems, their A adding up to its answers, its launches a warm-up and MATMUL_CUDA_TIMED_RUNS runs of
// each. Returns the most answers of a problem.
static int check_report(MatmulCuda *mm, FILE *report) {
    rewind(report);
    char line[512];
    int lines = 0, well_formed = 0, most = 0;
    int64_t timed = 0, answers = 0;
    while (fgets(line, sizeof line, report)) {
        const char *at = strstr(line, ": answer ");
        int chosen = 0, of = 0;
        lines++;
        if (strncmp(line, "gemm choice: ", 13) || !at || sscanf(at, ": answer %d of %d", &chosen, &of) != 2) continue;
        well_formed += chosen >= 1 && chosen <= of && of <= MATMUL_CUDA_ANSWERS;
        if (of > most) most = of;
        if (strstr(line, " ms")) {
            timed++;
            answers += of;
        }
    }
    const MatmulChoiceCost cost = matmul_cuda_choice_cost(mm);
    EXPECT_COUNTED(lines > 0 && well_formed == lines, "matmul timed choice: %d report lines, %d of them "
                   "\"gemm choice: ...: answer I of A\" with I <= A <= %d", lines, well_formed, MATMUL_CUDA_ANSWERS);
    EXPECT_COUNTED(timed > 0 && cost.problems == timed && cost.answers == answers &&
                   cost.launches == answers * (1 + MATMUL_CUDA_TIMED_RUNS),
                   "matmul timed choice: %lld problems timed (cost %lld), %lld answers (cost %lld), %lld launches",
                   (long long)timed, (long long)cost.problems, (long long)answers, (long long)cost.answers,
                   (long long)cost.launches);
    return most;
}

int main(int argc, char **argv) {
    const int small = argc == 2 && strcmp(argv[1], "small") == 0;
    CHECK(argc == 1 || small, "usage: %s [small]", argv[0]);
    MatmulCuda *mm = matmul_cuda_create();
    run_cases(mm, small, "");
    // Timed: the fastest answer of each problem, the timed runs leaving the outputs that are added to alone.
    FILE *report = tmpfile();
    CHECK(report, "gpu_test_matmul: no temporary file for the choices' report");
    matmul_cuda_choose(mm, true, -1, report);
    run_cases(mm, true, " timed");
    const int most = check_report(mm, report);
    fclose(report);
    // Every other answer of the heuristic kept in turn: whichever the timing picks meets the bounds.
    for (int keep = 1; keep < most; keep++) {
        char pass[32];
        snprintf(pass, sizeof pass, " answer %d", keep + 1);
        matmul_cuda_choose(mm, false, keep, NULL);
        run_cases(mm, true, pass);
    }
    matmul_cuda_choose(mm, false, 0, NULL);
    check_cache_eviction(mm);
    matmul_cuda_destroy(mm);
    printf("%d checks\n", checks);
    return check_exit();
}
