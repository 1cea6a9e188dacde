// gpu_test_cublaslt.c: cuBLASLt matmuls (the real library on a GPU, the
// subset in tests/sim/cudasim/ under the CPU execution model) against OpenBLAS's
// cblas_sgemm on the host: every transpose combination, leading dimensions
// larger than the rows (the padding holds NaN, so reading it shows), bf16 and
// fp32 inputs and outputs, alpha/beta, C and D equal, the bias epilogue and
// both bias-gradient epilogues, odd shapes (1, 17, 67), matrices only
// 16-byte aligned with the heuristic's minimum-alignment preferences set. Each reference is
// computed by cblas_sgemm either column-major as cuBLASLt is asked, or
// row-major on the transposed problem (D^T = op(B)^T op(A)^T), so a layout
// argument taken the wrong way round fails in both. Also: bf16 outputs round
// to nearest even (two exact ties), and bad arguments return the documented
// status. Every case runs each of the heuristic's answers (up to 8, split-K
// among them, parts added in fp32): the answers are distinct algorithms, and
// each meets the tolerances. Built natively with nvcc (needs a GPU) and by the sim build.
//   gpu_test_cublaslt [small]       every check (all small: `small` as the other GPU tests take it)
//   gpu_test_cublaslt host-matrix   a misuse the sim must stop (tests/sim/test_sim_libs.sh)
//   gpu_test_cublaslt misaligned    another: matrices 16-byte aligned, the heuristic told nothing (256)
//   gpu_test_cublaslt other-layout  another: an algorithm used for a layout it was not chosen for
//
// Tolerances: fp32 outputs max|D - ref| <= 1e-5 max|ref| (other summation
// orders), bf16 outputs 1e-2: two roundings of 2^-8 at most, as some
// algorithms round the product to bf16 before they add beta C and the bias
// (the sim always does; gpu_test_matmul bounds it element by element), and
// none per split-K part (the heuristic is told to reduce split-K parts in
// fp32, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK).
#include <cblas.h>
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"

static const size_t MAX_WORKSPACE = 32 << 20;

// A column-major rows x cols matrix with leading dimension ld >= rows: its
// values on the host (fp32, bf16-rounded when the type is bf16; padding rows
// NaN) and its copy on the device in the given type.
typedef struct {
    int64_t rows, cols, ld;
    cudaDataType_t type;
    float *host;
    void *dev;
} Matrix;

// The heuristic's answers asked for per problem (as model/matmul_cuda.cu asks).
#define ANSWERS 8

// The host values into x's device copy, in its type (allocated by the first call): a matrix's values, or an
// output's starting values again.
static void upload(Matrix *x) {
    const int64_t count = x->ld * x->cols;
    const size_t bytes = (size_t)count * (x->type == CUDA_R_16BF ? 2 : 4);
    if (!x->dev) CUDA_CHECK(cudaMalloc(&x->dev, bytes ? bytes : 1));
    if (x->type == CUDA_R_16BF) {
        uint16_t *bits = xmalloc((size_t)count * sizeof(uint16_t) + 1);
        for (int64_t i = 0; i < count; i++) bits[i] = f32_to_bf16(x->host[i]);
        CUDA_CHECK(cudaMemcpy(x->dev, bits, bytes, cudaMemcpyHostToDevice));
        free(bits);
    } else {
        CUDA_CHECK(cudaMemcpy(x->dev, x->host, bytes, cudaMemcpyHostToDevice));
    }
}

static float *download(const void *dev, cudaDataType_t type, int64_t count) {
    return type == CUDA_R_16BF ? from_device_bf16(dev, count) : from_device_f32(dev, count);
}

static float round_to(cudaDataType_t type, float x) { return type == CUDA_R_16BF ? bf16_to_f32(f32_to_bf16(x)) : x; }

static Matrix random_matrix(Rng *rng, int64_t rows, int64_t cols, int64_t pad, cudaDataType_t type) {
    Matrix x = {rows, cols, rows + pad, type, NULL, NULL};
    x.host = xmalloc((size_t)(x.ld * cols) * sizeof(float) + 1);
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < x.ld; i++)
            x.host[i + j * x.ld] = i < rows ? round_to(type, (float)rng_normal(rng)) : NAN;
    upload(&x);
    return x;
}

static void matrix_free(Matrix *x) {
    free(x->host);
    CUDA_CHECK(cudaFree(x->dev));
}

static cublasLtMatrixLayout_t layout_of(const Matrix *x) {
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, x->type, (uint64_t)x->rows, (uint64_t)x->cols, x->ld));
    return l;
}

typedef struct {
    int m, n, k, pad;
    cublasOperation_t ta, tb;
    cudaDataType_t ab, cd;   // type of A and B; of C and D
    float alpha, beta;
    cublasLtEpilogue_t epilogue;
    int in_place;            // D is C
    int row_major_ref;       // reference computed row-major on the transposed problem
} Case;

static const char *op_name(cublasOperation_t op) { return op == CUBLAS_OP_N ? "N" : "T"; }
static const char *type_name(cudaDataType_t t) { return t == CUDA_R_16BF ? "bf16" : "f32"; }
static const char *epilogue_name(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS ? "bias" : e == CUBLASLT_EPILOGUE_BGRADA ? "bgrada"
         : e == CUBLASLT_EPILOGUE_BGRADB ? "bgradb" : "none";
}

static void set_desc(cublasLtMatmulDesc_t desc, cublasOperation_t ta, cublasOperation_t tb,
                     cublasLtEpilogue_t epilogue, void *bias, cudaDataType_t bias_type) {
    int32_t op = ta;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op));
    op = tb;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op));
    const uint32_t e = epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (epilogue == CUBLASLT_EPILOGUE_DEFAULT) return;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const int32_t bt = bias_type;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
}

// Up to `count` of the heuristic's algorithms for these descriptors, best first, into r; how many (at least one).
static int heuristic_answers(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                             cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, int count,
                             cublasLtMatmulHeuristicResult_t *r) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_ws = MAX_WORKSPACE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                   sizeof max_ws));
    // One rounding of a bf16 D (the tolerance): no split-K whose parts are added up in D's type.
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                   sizeof reductions));
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, d, pref, count, r, &found));
    CHECK(found >= 1 && found <= count, "cuBLASLt heuristic: %d algorithms (asked for %d)", found, count);
    for (int i = 0; i < found; i++)
        CHECK(r[i].workspaceSize <= MAX_WORKSPACE, "cuBLASLt heuristic: answer %d needs %zu bytes of workspace", i,
              r[i].workspaceSize);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

// The heuristic's first algorithm for these descriptors and a workspace of its size (NULL when it needs none).
static cublasLtMatmulHeuristicResult_t pick_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                                 cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                 cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, void **ws) {
    cublasLtMatmulHeuristicResult_t r;
    heuristic_answers(lt, desc, a, b, c, d, 1, &r);
    *ws = NULL;
    if (r.workspaceSize) CUDA_CHECK(cudaMalloc(ws, r.workspaceSize));
    return r;
}

// An algorithm's parts of k (1: not split).
static uint32_t splits_of(const cublasLtMatmulAlgo_t *algo) {
    uint32_t splits;
    size_t written;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                                      &written));
    return splits;
}

// Over every case: the most answers of one problem, and whether some answer split k.
static int most_answers;
static bool some_split;

// ref (column-major m x n, leading dimension ldc) = alpha op(A) op(B) + beta ref, by OpenBLAS.
static void reference_gemm(const Case *c, const Matrix *a, const Matrix *b, float *ref, int64_t ldc) {
    const enum CBLAS_TRANSPOSE ta = c->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    const enum CBLAS_TRANSPOSE tb = c->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    if (c->row_major_ref)   // a column-major X with ld is the row-major X^T with the same ld
        cblas_sgemm(CblasRowMajor, tb, ta, c->n, c->m, c->k, c->alpha, b->host, (int)b->ld, a->host, (int)a->ld,
                    c->beta, ref, (int)ldc);
    else
        cblas_sgemm(CblasColMajor, ta, tb, c->m, c->n, c->k, c->alpha, a->host, (int)a->ld, b->host, (int)b->ld,
                    c->beta, ref, (int)ldc);
}

// Element (i, j) of op(X), X column-major.
static float op_at(const Matrix *x, cublasOperation_t t, int64_t i, int64_t j) {
    return t == CUBLAS_OP_N ? x->host[i + j * x->ld] : x->host[j + i * x->ld];
}

static void run_case(cublasLtHandle_t lt, const Case *c, uint64_t seed) {
    char name[160];
    snprintf(name, sizeof name, "cublaslt m%d n%d k%d pad%d %s%s %s->%s alpha %g beta %g %s%s ref-%s", c->m, c->n,
             c->k, c->pad, op_name(c->ta), op_name(c->tb), type_name(c->ab), type_name(c->cd), c->alpha, c->beta,
             epilogue_name(c->epilogue), c->in_place ? " C=D" : "", c->row_major_ref ? "rowmajor" : "colmajor");
    Rng rng;
    rng_seed(&rng, seed);
    Matrix a = c->ta == CUBLAS_OP_N ? random_matrix(&rng, c->m, c->k, c->pad, c->ab)
                                    : random_matrix(&rng, c->k, c->m, c->pad, c->ab);
    Matrix b = c->tb == CUBLAS_OP_N ? random_matrix(&rng, c->k, c->n, c->pad + 1, c->ab)
                                    : random_matrix(&rng, c->n, c->k, c->pad + 1, c->ab);
    Matrix cm = random_matrix(&rng, c->m, c->n, c->pad, c->cd);
    // D: NaN inside (every element must be written), 7 in the padding (must stay).
    Matrix d = cm;
    if (!c->in_place) {
        d = (Matrix){c->m, c->n, c->m + 2, c->cd, NULL, NULL};
        d.host = xmalloc((size_t)(d.ld * d.cols) * sizeof(float) + 1);
        for (int64_t j = 0; j < d.cols; j++)
            for (int64_t i = 0; i < d.ld; i++) d.host[i + j * d.ld] = i < d.rows ? NAN : 7.0f;
    }
    const int64_t bias_len = c->epilogue == CUBLASLT_EPILOGUE_BGRADB ? c->n : c->m;
    Matrix bias = random_matrix(&rng, bias_len, 1, 0, c->cd);

    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_desc(desc, c->ta, c->tb, c->epilogue, bias.dev, c->cd);
    cublasLtMatrixLayout_t la = layout_of(&a), lb = layout_of(&b), lc = layout_of(&cm), ld = layout_of(&d);
    cublasLtMatmulHeuristicResult_t answers[ANSWERS];
    const int found = heuristic_answers(lt, desc, la, lb, lc, ld, ANSWERS, answers);
    size_t ws_bytes = 0;
    for (int i = 0; i < found; i++)
        if (answers[i].workspaceSize > ws_bytes) ws_bytes = answers[i].workspaceSize;
    void *ws = NULL;
    if (ws_bytes) CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));

    // Reference, packed m x n (ld m): beta C + alpha op(A) op(B) (+ bias), rounded to D's type.
    const int64_t m = c->m, n = c->n, k = c->k;
    float *ref = xmalloc((size_t)(m * n) * sizeof(float));
    float *out = xmalloc((size_t)(m * n) * sizeof(float));
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) ref[i + j * m] = cm.host[i + j * cm.ld];
    reference_gemm(c, &a, &b, ref, m);
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float r = ref[i + j * m];
            if (c->epilogue == CUBLASLT_EPILOGUE_BIAS) r += bias.host[i];
            ref[i + j * m] = round_to(c->cd, r);
        }
    // bgrada: sum over k of op(A)'s row i (i < m); bgradb: of op(B)'s column j (j < n).
    float *ref_bias = xmalloc((size_t)bias_len * sizeof(float));
    for (int64_t i = 0; i < bias_len; i++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++)
            s += c->epilogue == CUBLASLT_EPILOGUE_BGRADA ? op_at(&a, c->ta, i, p) : op_at(&b, c->tb, p, i);
        ref_bias[i] = round_to(c->cd, (float)s);
    }
    const double tol = c->cd == CUDA_R_16BF ? 1e-2 : 1e-5;
    // Every answer of the heuristic, each on fresh C and D (whichever a caller keeps, by timing or not).
    int distinct = 1;
    for (int answer = 0; answer < found; answer++) {
        for (int other = 0; other < answer; other++)
            distinct &= memcmp(&answers[answer].algo, &answers[other].algo, sizeof answers[answer].algo) != 0;
        some_split |= splits_of(&answers[answer].algo) > 1;
        upload(&cm);
        if (!c->in_place) upload(&d);
        CUBLAS_CHECK(cublasLtMatmul(lt, desc, &c->alpha, a.dev, la, b.dev, lb, &c->beta, cm.dev, lc, d.dev, ld,
                                    &answers[answer].algo, ws, answers[answer].workspaceSize, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        float *got = download(d.dev, d.type, d.ld * d.cols);
        int pad_kept = 1;
        for (int64_t j = 0; j < n; j++) {
            for (int64_t i = 0; i < m; i++) out[i + j * m] = got[i + j * d.ld];
            for (int64_t i = m; i < d.ld && !c->in_place; i++) pad_kept &= got[i + j * d.ld] == 7.0f;
        }
        const double err = max_rel_diff(out, ref, m * n);
        EXPECT_COUNTED(err <= tol, "%s answer %d of %d (split-K %u): D max rel err %.2e (tol %.0e)", name, answer + 1,
                       found, splits_of(&answers[answer].algo), err, tol);
        if (!c->in_place)
            EXPECT_COUNTED(pad_kept, "%s answer %d of %d: D's padding rows untouched", name, answer + 1, found);
        if (c->epilogue == CUBLASLT_EPILOGUE_BGRADA || c->epilogue == CUBLASLT_EPILOGUE_BGRADB) {
            float *got_bias = download(bias.dev, bias.type, bias_len);
            const double berr = max_rel_diff(got_bias, ref_bias, bias_len);
            EXPECT_COUNTED(berr <= tol, "%s answer %d of %d: bias gradient max rel err %.2e (tol %.0e)", name,
                           answer + 1, found, berr, tol);
            free(got_bias);
        }
        free(got);
    }
    EXPECT_COUNTED(distinct, "%s: the heuristic's %d answers are distinct algorithms", name, found);
    if (found > most_answers) most_answers = found;
    free(ref);
    free(ref_bias);
    free(out);
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    CUDA_CHECK(cudaStreamDestroy(stream));
    if (ws) CUDA_CHECK(cudaFree(ws));
    matrix_free(&a);
    matrix_free(&b);
    matrix_free(&cm);
    if (!c->in_place) matrix_free(&d);
    matrix_free(&bias);
}

// bf16 output rounds to nearest, ties to even: D = A [1 1]^T with A's rows
// [1, 2^-8] and [1 + 2^-7, 2^-8]: the exact fp32 sums 1 + 2^-8 and 1 + 3 2^-8
// lie halfway between bf16 neighbours and round to 1 and 1 + 2^-6 (truncation
// would give 1 + 2^-7 for the second, rounding half up 1 + 2^-7 for the first).
static void check_round_to_even(cublasLtHandle_t lt) {
    const float a_host[4] = {1.0f, 1.0f + 0x1p-7f, 0x1p-8f, 0x1p-8f};   // 2 x 2, column-major
    const float b_host[2] = {1.0f, 1.0f};
    Matrix a = {2, 2, 2, CUDA_R_16BF, xmalloc(sizeof a_host), NULL};
    Matrix b = {2, 1, 2, CUDA_R_16BF, xmalloc(sizeof b_host), NULL};
    memcpy(a.host, a_host, sizeof a_host);
    memcpy(b.host, b_host, sizeof b_host);
    upload(&a);
    upload(&b);
    Matrix d = {2, 1, 2, CUDA_R_16BF, NULL, poisoned(4)};
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t la = layout_of(&a), lb = layout_of(&b), ld = layout_of(&d);
    void *ws;
    const cublasLtMatmulHeuristicResult_t algo = pick_algo(lt, desc, la, lb, ld, ld, &ws);
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt, desc, &one, a.dev, la, b.dev, lb, &zero, d.dev, ld, d.dev, ld, &algo.algo, ws,
                             algo.workspaceSize, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    uint16_t bits[2];
    CUDA_CHECK(cudaMemcpy(bits, d.dev, sizeof bits, cudaMemcpyDeviceToHost));
    EXPECT_COUNTED(bf16_to_f32(bits[0]) == 1.0f && bf16_to_f32(bits[1]) == 1.0f + 0x1p-6f,
                   "cublaslt bf16 output ties round to even: %.8g %.8g (want 1 and %.8g)", bf16_to_f32(bits[0]),
                   bf16_to_f32(bits[1]), 1.0f + 0x1p-6f);
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    if (ws) CUDA_CHECK(cudaFree(ws));
    matrix_free(&a);
    matrix_free(&b);
    CUDA_CHECK(cudaFree(d.dev));
}

// The status of a heuristic query (then, if it found an algorithm, of the matmul) on these layouts.
static cublasStatus_t try_matmul(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                 cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, void *buf) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &r, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const float one = 1.0f;
    st = cublasLtMatmul(lt, desc, &one, buf, la, buf, lb, &one, buf, lc, buf, lc, NULL, NULL, 0, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    return st;
}

// The heuristic's status for desc (op ta, N) with `epilogue` (fp32 vector `bias`), reset to op N, N and
// DEFAULT after.
static cublasStatus_t heuristic_status(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                       cublasOperation_t ta, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t cd,
                                       cublasLtEpilogue_t epilogue, void *bias) {
    set_desc(desc, ta, CUBLAS_OP_N, epilogue, bias, CUDA_R_32F);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, cd, cd, pref, 1, &r, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    set_desc(desc, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, CUDA_R_32F);
    return st;
}

// Bad arguments (cuBLAS documentation, cublasLtMatmul() and the descriptor
// functions): shapes that do not chain and ld < rows are
// CUBLAS_STATUS_INVALID_VALUE, type combinations outside the supported table
// CUBLAS_STATUS_NOT_SUPPORTED, a workspace smaller than the algorithm's need
// INVALID_VALUE, an attribute of the wrong size INVALID_VALUE.
static void check_bad_arguments(cublasLtHandle_t lt) {
    void *buf;
    CUDA_CHECK(cudaMalloc(&buf, 1 << 16));
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t a16x8, b9x4, b8x4, c16x4, a16x8_f32, a8x16_f32, b8x4_f32, c16x4_bf16;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a16x8, CUDA_R_16BF, 16, 8, 16));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b9x4, CUDA_R_16BF, 9, 4, 9));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b8x4, CUDA_R_16BF, 8, 4, 8));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c16x4, CUDA_R_32F, 16, 4, 16));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a16x8_f32, CUDA_R_32F, 16, 8, 16));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a8x16_f32, CUDA_R_32F, 8, 16, 8));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b8x4_f32, CUDA_R_32F, 8, 4, 8));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c16x4_bf16, CUDA_R_16BF, 16, 4, 16));

    cublasStatus_t st = try_matmul(lt, desc, a16x8, b8x4, c16x4, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_SUCCESS, "cublaslt good arguments: %s", cublasLtGetStatusName(st));
    st = try_matmul(lt, desc, a16x8, b9x4, c16x4, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_INVALID_VALUE, "cublaslt k of A 8 != rows of B 9: %s",
                   cublasLtGetStatusName(st));
    const int32_t t = CUBLAS_OP_T;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    st = try_matmul(lt, desc, a16x8, b8x4, c16x4, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_INVALID_VALUE, "cublaslt op(A) = A^T is 8 x 16, D 16 rows: %s",
                   cublasLtGetStatusName(st));
    const int32_t n_op = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &n_op, sizeof n_op));
    st = try_matmul(lt, desc, a16x8, b8x4_f32, c16x4, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_INVALID_VALUE, "cublaslt A bf16 with B fp32 (as an H200 answers): %s",
                   cublasLtGetStatusName(st));
    st = try_matmul(lt, desc, a16x8_f32, b8x4_f32, c16x4_bf16, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_NOT_SUPPORTED, "cublaslt fp32 A, B with bf16 C, D: %s",
                   cublasLtGetStatusName(st));
    // ld 15 < 16 rows: refused by the layout or by the matmul.
    cublasLtMatrixLayout_t short_ld;
    st = cublasLtMatrixLayoutCreate(&short_ld, CUDA_R_16BF, 16, 8, 15);
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = try_matmul(lt, desc, short_ld, b8x4, c16x4, buf);
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(short_ld));
    }
    EXPECT_COUNTED(st == CUBLAS_STATUS_INVALID_VALUE, "cublaslt ld 15 < 16 rows: %s", cublasLtGetStatusName(st));
    const int64_t wrong_size = CUBLAS_OP_T;
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &wrong_size, sizeof wrong_size);
    EXPECT_COUNTED(st == CUBLAS_STATUS_INVALID_VALUE, "cublaslt TRANSB attribute of 8 bytes: %s",
                   cublasLtGetStatusName(st));
    st = cublasLtMatmulAlgoGetHeuristic(NULL, desc, a16x8, b8x4, c16x4, c16x4, NULL, 1, NULL, NULL);
    EXPECT_COUNTED(st == CUBLAS_STATUS_NOT_INITIALIZED, "cublaslt heuristic without a handle: %s",
                   cublasLtGetStatusName(st));
    // No algorithm: the heuristic answers CUBLAS_STATUS_NOT_SUPPORTED (not success with 0 results). As measured
    // on an H200 (cuBLASLt of CUDA 13): the BGRADA epilogue with fp32 A transposed has none; with fp32 A not
    // transposed, and with bf16, it has.
    st = heuristic_status(lt, desc, a8x16_f32, CUBLAS_OP_T, b8x4_f32, c16x4, CUBLASLT_EPILOGUE_BGRADA, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_NOT_SUPPORTED, "cublaslt BGRADA with fp32 A^T, B: heuristic %s",
                   cublasLtGetStatusName(st));
    st = heuristic_status(lt, desc, a16x8_f32, CUBLAS_OP_N, b8x4_f32, c16x4, CUBLASLT_EPILOGUE_BGRADA, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_SUCCESS, "cublaslt BGRADA with fp32 A, B: heuristic %s",
                   cublasLtGetStatusName(st));
    st = heuristic_status(lt, desc, a16x8, CUBLAS_OP_N, b8x4, c16x4, CUBLASLT_EPILOGUE_BGRADA, buf);
    EXPECT_COUNTED(st == CUBLAS_STATUS_SUCCESS, "cublaslt BGRADA with bf16 A, B: heuristic %s",
                   cublasLtGetStatusName(st));
    // A workspace one byte short of the algorithm's need (when it needs one).
    void *ws;
    const cublasLtMatmulHeuristicResult_t algo = pick_algo(lt, desc, a16x8, b8x4, c16x4, c16x4, &ws);
    const float one = 1.0f;
    if (algo.workspaceSize) {
        st = cublasLtMatmul(lt, desc, &one, buf, a16x8, buf, b8x4, &one, buf, c16x4, buf, c16x4, &algo.algo, ws,
                            algo.workspaceSize - 1, 0);
        EXPECT_COUNTED(st == CUBLAS_STATUS_INVALID_VALUE, "cublaslt workspace %zu - 1 bytes: %s",
                       algo.workspaceSize, cublasLtGetStatusName(st));
    } else {
        printf("note: the heuristic's algorithm needs no workspace; the short-workspace check does not apply\n");
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    if (ws) CUDA_CHECK(cudaFree(ws));
    cublasLtMatrixLayout_t all[] = {a16x8, b9x4, b8x4, c16x4, a16x8_f32, a8x16_f32, b8x4_f32, c16x4_bf16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(all[i]));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    CUDA_CHECK(cudaFree(buf));
}

// D (fp32, 128 x 5) = A (bf16, 128 x 128) B (bf16, 128 x 5), each matrix 16
// bytes past the start of its allocation (leading dimensions of 256 bytes or
// more: only the pointers are less aligned), the heuristic asked with
// MIN_ALIGNMENT_{A,B,C,D}_BYTES = `alignment` (0: not set, the default 256).
// Returns max |D - ref| / max |ref| (ref by cblas_sgemm).
static double offset_matmul(cublasLtHandle_t lt, uint32_t alignment) {
    Rng rng;
    rng_seed(&rng, 5);
    const int m = 128, n = 5, k = 128;
    Matrix a = random_matrix(&rng, m, k, 0, CUDA_R_16BF), b = random_matrix(&rng, k, n, 0, CUDA_R_16BF);
    char *a_dev, *b_dev, *d_dev;
    CUDA_CHECK(cudaMalloc((void **)&a_dev, (size_t)(m * k) * 2 + 16));
    CUDA_CHECK(cudaMalloc((void **)&b_dev, (size_t)(k * n) * 2 + 16));
    CUDA_CHECK(cudaMalloc((void **)&d_dev, (size_t)(m * n) * 4 + 16));
    CUDA_CHECK(cudaMemcpy(a_dev + 16, a.dev, (size_t)(m * k) * 2, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(b_dev + 16, b.dev, (size_t)(k * n) * 2, cudaMemcpyDeviceToDevice));
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t la = layout_of(&a), lb = layout_of(&b), ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_ws = MAX_WORKSPACE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                      sizeof max_ws));
    const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && alignment; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &alignment, sizeof alignment));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &r, &found));
    CHECK(found == 1, "cuBLASLt heuristic: no algorithm for 16-byte aligned matrices");
    void *ws = NULL;
    if (r.workspaceSize) CUDA_CHECK(cudaMalloc(&ws, r.workspaceSize));
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt, desc, &one, a_dev + 16, la, b_dev + 16, lb, &zero, d_dev + 16, ld, d_dev + 16,
                                ld, &r.algo, ws, r.workspaceSize, 0));
    float *got = from_device_f32((const float *)(d_dev + 16), m * n);
    float *ref = xmalloc((size_t)(m * n) * sizeof(float));
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.host, m, b.host, k, 0.0f, ref, m);
    const double err = max_rel_diff(got, ref, m * n);
    free(got);
    free(ref);
    if (ws) CUDA_CHECK(cudaFree(ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    CUDA_CHECK(cudaFree(a_dev));
    CUDA_CHECK(cudaFree(b_dev));
    CUDA_CHECK(cudaFree(d_dev));
    matrix_free(&a);
    matrix_free(&b);
    return err;
}

// `other-layout`: an algorithm the heuristic chose for A (bf16, 128 x 128)
// with a leading dimension of 128 (256 bytes), used for the same A laid out
// with a leading dimension of 130 (260 bytes: 4-byte aligned); the sim ends
// with one line naming A's leading dimension.
static void misuse_other_layout(cublasLtHandle_t lt) {
    const int m = 128, n = 5, k = 128, ld_other = 130;
    void *a, *b, *d;
    CUDA_CHECK(cudaMalloc(&a, (size_t)(ld_other * k) * 2));
    CUDA_CHECK(cudaMalloc(&b, (size_t)(k * n) * 2));
    CUDA_CHECK(cudaMalloc(&d, (size_t)(m * n) * 4));
    CUDA_CHECK(cudaMemset(a, 0, (size_t)(ld_other * k) * 2));
    CUDA_CHECK(cudaMemset(b, 0, (size_t)(k * n) * 2));
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t la, la_other, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la_other, CUDA_R_16BF, m, k, ld_other));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &r, &found));
    CHECK(found == 1 && r.workspaceSize == 0, "cuBLASLt heuristic: no algorithm without workspace for 128 x 5 x 128");
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt, desc, &one, a, la_other, b, lb, &zero, d, ld, d, ld, &r.algo, NULL, 0, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("FAIL cublaslt algorithm used for another layout: accepted\n");
    exit(1);
}

// `host-matrix`: a matmul given a host array as B (a fault on a GPU; the sim
// ends with one line naming the argument).
static void misuse_host_matrix(cublasLtHandle_t lt) {
    float host_b[4] = {0};
    float *a = poisoned(sizeof host_b), *d = poisoned(sizeof host_b);
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 2, 2, 2));
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt, desc, &one, a, l, host_b, l, &zero, d, l, d, l, NULL, NULL, 0, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("FAIL cublaslt host matrix: accepted\n");
    exit(1);
}

int main(int argc, char **argv) {
    const int misuse = argc == 2 && strcmp(argv[1], "host-matrix") == 0;
    const int misaligned = argc == 2 && strcmp(argv[1], "misaligned") == 0;
    const int other_layout = argc == 2 && strcmp(argv[1], "other-layout") == 0;
    CHECK(argc == 1 || misuse || misaligned || other_layout || (argc == 2 && strcmp(argv[1], "small") == 0),
          "usage: %s [small|host-matrix|misaligned|other-layout]",
          argv[0]);
    cublasLtHandle_t lt;
    CUBLAS_CHECK(cublasLtCreate(&lt));
    if (misuse) misuse_host_matrix(lt);
    if (other_layout) misuse_other_layout(lt);
    if (misaligned) {   // an algorithm chosen for 256-byte alignment given 16-byte aligned matrices
        offset_matmul(lt, 0);
        printf("FAIL cublaslt misaligned matrices: accepted\n");
        return 1;
    }
    const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
    const int shapes[4][3] = {{17, 5, 67}, {1, 67, 17}, {67, 1, 1}, {64, 48, 32}};   // m, n, k
    uint64_t seed = 100;
    int variant = 0;
    // Every transpose combination x shape, alternating types, padding, scales and reference layouts.
    for (int s = 0; s < 4; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++, variant++) {
                const cudaDataType_t ab = variant % 2 ? CUDA_R_32F : CUDA_R_16BF;
                const cudaDataType_t cd = ab == CUDA_R_32F || variant % 4 == 2 ? CUDA_R_32F : CUDA_R_16BF;
                const Case c = {shapes[s][0], shapes[s][1], shapes[s][2], variant % 3 * 2, ops[ta], ops[tb], ab, cd,
                                variant % 2 ? 1.0f : 0.75f, variant % 3 ? 0.5f : 0.0f, CUBLASLT_EPILOGUE_DEFAULT,
                                0, variant / 2 % 2};
                run_case(lt, &c, seed++);
            }
    // C = D, bias and bias-gradient epilogues.
    static const Case extra[] = {
        {17, 5, 67, 3, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_32F, 1.0f, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, 1, 0},
        {17, 9, 67, 1, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, 2.0f, -1.0f, CUBLASLT_EPILOGUE_DEFAULT, 1,
         1},
        {17, 5, 67, 2, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_BIAS, 0, 0},
        {67, 17, 5, 0, CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_32F, CUDA_R_32F, 0.5f, 1.0f, CUBLASLT_EPILOGUE_BIAS, 0, 1},
        {64, 48, 32, 1, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_32F, 1.0f, 0.0f, CUBLASLT_EPILOGUE_BIAS, 1, 0},
        {17, 67, 5, 0, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_BGRADB, 0,
         0},
        {48, 17, 64, 2, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F, CUDA_R_32F, 1.0f, 1.0f, CUBLASLT_EPILOGUE_BGRADB, 0, 1},
        {17, 67, 5, 1, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_32F, 1.0f, 0.0f, CUBLASLT_EPILOGUE_BGRADA, 0, 0},
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) run_case(lt, &extra[i], seed++);
    // What a caller choosing among the answers (model/matmul_cuda.cu) needs the heuristic to offer.
    EXPECT_COUNTED(most_answers >= 2, "cublaslt heuristic: up to %d answers for one problem (want several)",
                   most_answers);
    printf("info: some answer splits k (split-K): %s\n", some_split ? "yes" : "no");
#ifdef CUDASIM_CPU_TIMING
    EXPECT_COUNTED(some_split, "cublaslt heuristic (sim): some answer splits k, its parts added in fp32");
#endif
    check_round_to_even(lt);
    const double err = offset_matmul(lt, 16);
    EXPECT_COUNTED(err <= 1e-5, "cublaslt matrices 16 bytes past their allocation, heuristic told 16-byte alignment: "
                   "D max rel err %.2e (tol 1e-05)", err);
    check_bad_arguments(lt);
    CUBLAS_CHECK(cublasLtDestroy(lt));
    printf("%d checks\n", checks);
    return check_exit();
}
