// cublasLt.cpp: the cuBLASLt subset of the CPU execution model of CUDA
// (declared in include/cublasLt.h). Semantics from the cuBLAS documentation,
// "Using the cuBLASLt API": D = alpha * op(A) * op(B) + beta * C (+ epilogue),
// column-major matrices (element (i, j) at i + j * ld), fp32 accumulation and
// scaling, bf16 outputs rounded to nearest even. Arguments are checked when
// the call is made, as the library does, and return its status codes; the
// arithmetic runs stream-ordered (cudasim::enqueue).
#include <cublasLt.h>

#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cudasim.h"

extern "C" {
#include "../../../dist/util.h"
}

struct cublasLtContext {
    int live;
};

struct cublasLtMatmulDescOpaque {
    cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void *bias = nullptr;
    int32_t bias_type = -1;   // -1: the type of D
};

struct cublasLtMatrixLayoutOpaque {
    cudaDataType_t type;
    cublasLtOrder_t order;
    uint64_t rows, cols;
    int64_t ld;
};

struct cublasLtMatmulPreferenceOpaque {
    uint64_t max_workspace = 0;
    uint32_t min_alignment[4] = {256, 256, 256, 256};   // A, B, C, D
    uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};

// An algorithm of the sim: data[0] marks it, data[1] is its workspace need,
// data[2..5] the alignments of A, B, C, D it was chosen for (of the pointers
// and of the leading dimensions in bytes), data[6] its parts of k (1: none),
// data[7] its id, the order in which it sums k:
//   ALGO_IN_ORDER       k in order, one part;
//   ALGO_SPLIT_COMPUTE  k in data[6] parts, each summed apart in fp32 (in the
//                       workspace), then added up in fp32 in order
//                       (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
//   ALGO_SPLIT_OUTPUT   k in data[6] parts, each added to D as stored, in D's
//                       type (INPLACE / OUTPUT_TYPE: a bf16 D rounded once per part);
//   ALGO_REVERSED       k from its end, one part (another tile's order).
// Their results differ from each other's within rounding, as real algorithms' do.
static const uint64_t ALGO_MAGIC = 0x53494d414c474fULL;
enum { ALGO_IN_ORDER, ALGO_SPLIT_COMPUTE, ALGO_SPLIT_OUTPUT, ALGO_REVERSED };
// Workspace the algorithm asks for (at most what the preference allows): not
// used for arithmetic, but filled with garbage when the matmul runs, so that a
// caller that keeps its own data in memory it lent as workspace loses it.
static const size_t ALGO_WORKSPACE = 1 << 20;

// cuBLAS documentation, cublasLtCreate() / cublasLtDestroy().
extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documentation, cublasStatus_t.
extern "C" const char *cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char *cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return cublasLtGetStatusName(status);
    }
}

// cuBLAS documentation, cublasLtMatmulDescCreate(): the sim supports only
// CUBLAS_COMPUTE_32F with CUDA_R_32F scaling (what the project uses).
extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                   cublasComputeType_t computeType, cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *matmulDesc = new cublasLtMatmulDescOpaque();
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

// An attribute's value: buf holds exactly size bytes, else CUBLAS_STATUS_INVALID_VALUE.
static cublasStatus_t copy_attribute(void *dst, size_t size, const void *buf, size_t sizeInBytes) {
    if (sizeInBytes != size) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(dst, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documentation, cublasLtMatmulDescSetAttribute() and
// cublasLtMatmulDescAttributes_t: buf NULL or sizeInBytes not the size of the
// attribute -> CUBLAS_STATUS_INVALID_VALUE.
extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                         cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                         size_t sizeInBytes) {
    if (!matmulDesc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        int32_t op;
        if (sizeInBytes != sizeof op) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&op, buf, sizeof op);
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
        // Real types: op C (conjugate transpose) is op T.
        const cublasOperation_t t = op == CUBLAS_OP_N ? CUBLAS_OP_N : CUBLAS_OP_T;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? matmulDesc->transa : matmulDesc->transb) = t;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t e;
        if (sizeInBytes != sizeof e) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&e, buf, sizeof e);
        matmulDesc->epilogue = (cublasLtEpilogue_t)e;   // unsupported values: NOT_SUPPORTED at use
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return copy_attribute(&matmulDesc->bias, sizeof(void *), buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return copy_attribute(&matmulDesc->bias_type, sizeof(int32_t), buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        break;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

// cuBLAS documentation, cublasLtMatrixLayoutCreate(): column-major by default.
extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                                     uint64_t rows, uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    *matLayout = new cublasLtMatrixLayoutOpaque{type, CUBLASLT_ORDER_COL, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documentation, cublasLtMatrixLayoutSetAttribute(): only the order is
// settable here; a row-major order is accepted and refused at use (NOT_SUPPORTED).
extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                           cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                           size_t sizeInBytes) {
    if (!matLayout || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr != CUBLASLT_MATRIX_LAYOUT_ORDER || sizeInBytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t order;
    memcpy(&order, buf, sizeof order);
    matLayout->order = (cublasLtOrder_t)order;
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documentation, cublasLtMatmulPreferenceCreate() / SetAttribute().
extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new cublasLtMatmulPreferenceOpaque();
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmulPreferenceAttributes_t: MAX_WORKSPACE_BYTES (uint64_t) and
// MIN_ALIGNMENT_{A,B,C,D}_BYTES (uint32_t, default 256: "selecting a smaller
// value will exclude algorithms that can not work with matrix A that is not
// as strictly aligned as they need").
extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void *buf, size_t sizeInBytes) {
    if (!pref || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return copy_attribute(&pref->max_workspace, sizeof(uint64_t), buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        return copy_attribute(&pref->reduction_mask, sizeof(uint32_t), buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return copy_attribute(&pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES],
                              sizeof(uint32_t), buf, sizeInBytes);
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

static size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// The largest power of two <= 256 dividing the leading dimension in bytes
// (256 for one column: no second column to reach).
static uint64_t ld_alignment(const cublasLtMatrixLayoutOpaque *l) {
    const uint64_t bytes = (uint64_t)l->ld * element_bytes(l->type);
    uint64_t a = 256;
    while (l->cols > 1 && a > 1 && bytes % a) a /= 2;
    return a;
}

// Bytes a column-major rows x cols matrix with leading dimension ld spans.
static size_t span_bytes(const cublasLtMatrixLayoutOpaque *l) {
    if (l->rows == 0 || l->cols == 0) return 0;
    return ((l->cols - 1) * (size_t)l->ld + l->rows) * element_bytes(l->type);
}

static uint64_t k_of(const cublasLtMatmulDescOpaque *d, const cublasLtMatrixLayoutOpaque *A) {
    return d->transa == CUBLAS_OP_N ? A->cols : A->rows;
}

static cudaDataType_t bias_type(const cublasLtMatmulDescOpaque *d, const cublasLtMatrixLayoutOpaque *D) {
    return d->bias_type < 0 ? D->type : (cudaDataType_t)d->bias_type;
}

// The shapes and types of one matmul (cuBLAS documentation, cublasLtMatmul():
// "Datatypes Supported" for CUBLAS_COMPUTE_32F / CUDA_R_32F scale, and the
// dimension rules of D = op(A) op(B): op(A) m x k, op(B) k x n, C and D m x n).
static cublasStatus_t check_matmul(const cublasLtMatmulDescOpaque *d, const cublasLtMatrixLayoutOpaque *A,
                                   const cublasLtMatrixLayoutOpaque *B, const cublasLtMatrixLayoutOpaque *C,
                                   const cublasLtMatrixLayoutOpaque *D) {
    if (!d || !A || !B || !C || !D) return CUBLAS_STATUS_INVALID_VALUE;
    for (const cublasLtMatrixLayoutOpaque *l : {A, B, C, D}) {
        if (l->order != CUBLASLT_ORDER_COL) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (l->type != CUDA_R_32F && l->type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    }
    // A and B of one type (another: INVALID_VALUE, as an H200 answers); C and D of one type; fp32 inputs give
    // fp32 outputs.
    if (A->type != B->type) return CUBLAS_STATUS_INVALID_VALUE;
    if (C->type != D->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (A->type == CUDA_R_32F && D->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const uint64_t m = D->rows, n = D->cols;
    const uint64_t a_rows = d->transa == CUBLAS_OP_N ? A->rows : A->cols;
    const uint64_t k = d->transa == CUBLAS_OP_N ? A->cols : A->rows;
    const uint64_t b_rows = d->transb == CUBLAS_OP_N ? B->rows : B->cols;
    const uint64_t b_cols = d->transb == CUBLAS_OP_N ? B->cols : B->rows;
    if (a_rows != m || b_rows != k || b_cols != n || C->rows != m || C->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB: {
        // Bias elements are D's type (cublasLtMatmulDescAttributes_t, BIAS_DATA_TYPE); the sim also accepts
        // fp32 bias with a bf16 D.
        const cudaDataType_t bt = bias_type(d, D);
        if (bt != D->type && bt != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
        return CUBLAS_STATUS_SUCCESS;
    }
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

// cuBLAS documentation, cublasLtMatmulAlgoGetHeuristic(): up to
// requestedAlgoCount algorithms, best first, each needing at most the
// preference's maximum workspace and assuming for each of A, B, C and D the
// preference's minimum alignment or its leading dimension's (in bytes),
// whichever is smaller. The answers, as the documented schemes allow (the
// REDUCTION_SCHEME_MASK excluding some): k split in two halves added up in
// D's type (k >= 2; first when allowed, so that a caller who takes the first
// answer without a mask gets a bf16 D rounded once per part); k in order; k
// from its end; k in 2 and in 4 parts added up in fp32 (k >= 2, 4; their
// partial products in the workspace, when it holds them).
extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                         cublasLtMatmulDesc_t operationDesc,
                                                         cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                         cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                         cublasLtMatmulPreference_t preference,
                                                         int requestedAlgoCount,
                                                         cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                         int *returnAlgoCount) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!preference || requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    const cublasStatus_t st = check_matmul(operationDesc, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    // No algorithm fits: NOT_SUPPORTED, not success with none returned. Measured on an H200 (cuBLASLt of
    // CUDA 13): the BGRADA epilogue has no algorithm for fp32 A transposed (it has one for fp32 A as
    // stored, and for bf16).
    if (operationDesc->epilogue == CUBLASLT_EPILOGUE_BGRADA && Adesc->type == CUDA_R_32F &&
        operationDesc->transa == CUBLAS_OP_T)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    // CUDASIM_CUBLASLT_NO_ALGORITHM (set, not empty): a library with no algorithm for any problem, so that a
    // caller's answer to "none" can be tested.
    const char *none = getenv("CUDASIM_CUBLASLT_NO_ALGORITHM");
    if (none && *none) return CUBLAS_STATUS_NOT_SUPPORTED;
    const size_t need = (preference->max_workspace < ALGO_WORKSPACE ? preference->max_workspace : ALGO_WORKSPACE)
                        & ~(size_t)255;
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    r.algo.data[0] = ALGO_MAGIC;
    // The heuristic sees the layouts, so an algorithm it picks suits their leading dimensions; the pointers it
    // does not see: it assumes the preference's alignments for them.
    const cublasLtMatrixLayoutOpaque *layouts[4] = {Adesc, Bdesc, Cdesc ? Cdesc : Ddesc, Ddesc};
    for (int i = 0; i < 4; i++) {
        const uint64_t ld = ld_alignment(layouts[i]);
        r.algo.data[2 + i] = preference->min_alignment[i] < ld ? preference->min_alignment[i] : ld;
    }
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    const uint64_t k = k_of(operationDesc, Adesc);
    const uint32_t output_type_reduction = CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    const bool in_output_type = preference->reduction_mask & output_type_reduction;
    const bool in_compute_type = preference->reduction_mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const size_t partials = (size_t)Ddesc->rows * Ddesc->cols * sizeof(float);   // one part's fp32 products
    const struct {
        uint64_t id, splits;
        bool offered;
    } answers[] = {
        {ALGO_SPLIT_OUTPUT, 2, k >= 2 && in_output_type},
        {ALGO_IN_ORDER, 1, true},
        {ALGO_REVERSED, 1, true},
        {ALGO_SPLIT_COMPUTE, 2, k >= 2 && in_compute_type && 2 * partials <= preference->max_workspace},
        {ALGO_SPLIT_COMPUTE, 4, k >= 4 && in_compute_type && 4 * partials <= preference->max_workspace},
    };
    for (const auto &answer : answers) {
        if (!answer.offered || *returnAlgoCount == requestedAlgoCount) continue;
        const size_t parts = answer.id == ALGO_SPLIT_COMPUTE ? (answer.splits * partials + 255) & ~(size_t)255 : 0;
        r.workspaceSize = parts > need ? parts : need;
        r.algo.data[1] = r.workspaceSize;
        r.algo.data[6] = answer.splits;
        r.algo.data[7] = answer.id;
        heuristicResultsArray[(*returnAlgoCount)++] = r;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documentation, cublasLtMatmulAlgoConfigGetAttribute(): one
// attribute of an algorithm; sizeInBytes 0 with sizeWritten asks its size;
// another size than the attribute's is INVALID_VALUE.
extern "C" cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                               cublasLtMatmulAlgoConfigAttributes_t attr, void *buf,
                                                               size_t sizeInBytes, size_t *sizeWritten) {
    if (!algo || algo->data[0] != ALGO_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
    uint32_t value;
    switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: value = (uint32_t)algo->data[7]; break;   // int32_t: the same bytes
    case CUBLASLT_ALGO_CONFIG_TILE_ID: value = 0; break;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: value = (uint32_t)algo->data[6]; break;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
        value = algo->data[6] == 1 ? CUBLASLT_REDUCTION_SCHEME_NONE
              : algo->data[7] == ALGO_SPLIT_COMPUTE ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
              : CUBLASLT_REDUCTION_SCHEME_INPLACE;
        break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (sizeWritten) *sizeWritten = sizeof value;
    if (sizeInBytes == 0 && sizeWritten) return CUBLAS_STATUS_SUCCESS;
    if (!buf || sizeInBytes != sizeof value) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, &value, sizeof value);
    return CUBLAS_STATUS_SUCCESS;
}

static float load(const void *p, cudaDataType_t t, size_t i) {
    return t == CUDA_R_16BF ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void store(void *p, cudaDataType_t t, size_t i, float x) {
    if (t == CUDA_R_16BF) ((uint16_t *)p)[i] = f32_to_bf16(x);
    else ((float *)p)[i] = x;
}

// x rounded to type t's precision (bf16: to nearest even), as a float.
static float round_to(cudaDataType_t t, float x) { return t == CUDA_R_16BF ? bf16_to_f32(f32_to_bf16(x)) : x; }

// op(X) as a dense row-major rows x depth fp32 matrix: op(A) (m x k) with
// rows = m; op(B)^T (n x k) with rows = n, so both dot products run along k.
static std::vector<float> op_rows(const void *x, const cublasLtMatrixLayoutOpaque &l, bool transposed_rows,
                                  uint64_t rows, uint64_t depth) {
    std::vector<float> out(rows * depth);
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < depth; c++) {
            // element (r, c) of the view: stored at (r, c) or, transposed, at (c, r)
            const uint64_t i = transposed_rows ? c : r, j = transposed_rows ? r : c;
            out[r * depth + c] = load(x, l.type, i + j * (size_t)l.ld);
        }
    return out;
}

struct MatmulCall {
    cublasLtMatmulDescOpaque desc;
    cublasLtMatrixLayoutOpaque A, B, C, D;
    float alpha, beta;
    const void *a, *b, *c;
    void *d;
    void *workspace;
    size_t workspace_bytes;
    uint64_t splits, algo;   // the algorithm's parts of k and id (data[6], data[7])
};

// sum over p < k of x[p] y[p] in fp32, in the order of algorithm `algo`: from
// the end (ALGO_REVERSED), else in `splits` parts summed apart, then added up
// in order (one part: the plain sum in order).
static float dot(const float *x, const float *y, uint64_t k, uint64_t algo, uint64_t splits) {
    if (algo == ALGO_REVERSED) {
        float s = 0;
        for (uint64_t p = k; p-- > 0;) s += x[p] * y[p];
        return s;
    }
    const uint64_t part = (k + splits - 1) / splits;
    float total = 0;
    for (uint64_t p0 = 0; p0 < k; p0 += part) {
        const uint64_t p1 = p0 + part < k ? p0 + part : k;
        float s = 0;
        for (uint64_t p = p0; p < p1; p++) s += x[p] * y[p];
        total += s;
    }
    return total;
}

// The arithmetic of one matmul, run in stream order.
static void run_matmul(const MatmulCall &mc) {
    const uint64_t m = mc.D.rows, n = mc.D.cols;
    const uint64_t k = k_of(&mc.desc, &mc.A);
    if (mc.workspace_bytes) memset(mc.workspace, 0xa5, mc.workspace_bytes);
    // op(A) row i: stored as column i of A when A is transposed; op(B) column j likewise.
    const std::vector<float> a = op_rows(mc.a, mc.A, mc.desc.transa != CUBLAS_OP_N, m, k);
    const std::vector<float> b = op_rows(mc.b, mc.B, mc.desc.transb == CUBLAS_OP_N, n, k);
    const cudaDataType_t bt = bias_type(&mc.desc, &mc.D);
    if (mc.desc.epilogue == CUBLASLT_EPILOGUE_BGRADA)   // bias[i] = sum_k op(A)[i, k], i < m
        for (uint64_t i = 0; i < m; i++) {
            float s = 0;
            for (uint64_t p = 0; p < k; p++) s += a[i * k + p];
            store(mc.desc.bias, bt, i, s);
        }
    if (mc.desc.epilogue == CUBLASLT_EPILOGUE_BGRADB)   // bias[j] = sum_k op(B)[k, j], j < n
        for (uint64_t j = 0; j < n; j++) {
            float s = 0;
            for (uint64_t p = 0; p < k; p++) s += b[j * k + p];
            store(mc.desc.bias, bt, j, s);
        }
    // ALGO_SPLIT_OUTPUT: k in `splits` parts, the first part with beta C and the bias, each further part
    // added to D as stored (in D's type), as an in-place split-K reduction does. Every other algorithm: one
    // part, its products summed in its order (dot).
    const bool in_output_type = mc.algo == ALGO_SPLIT_OUTPUT;
    const uint64_t parts = in_output_type ? mc.splits : 1;
    const uint64_t part = (k + parts - 1) / parts;
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            const size_t at = i + j * (size_t)mc.D.ld;
            for (uint64_t p0 = 0; p0 < k || p0 == 0; p0 += part ? part : 1) {
                const uint64_t p1 = p0 + part < k ? p0 + part : k;
                const float acc = dot(a.data() + i * k + p0, b.data() + j * k + p0, p1 - p0, mc.algo,
                                      in_output_type ? 1 : mc.splits);
                float x = mc.alpha * acc;
                if (p0 > 0) {
                    x += load(mc.d, mc.D.type, at);
                } else {
                    // The product is rounded to D's type before beta C and the bias are added to it.
                    const bool bias = mc.desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
                    if (mc.beta != 0 || bias) x = round_to(mc.D.type, x);
                    // beta == 0: C is not read (it may hold NaN), as in BLAS.
                    if (mc.beta != 0) x += mc.beta * load(mc.c, mc.C.type, i + j * (size_t)mc.C.ld);
                    if (bias) x += load(mc.desc.bias, bt, i);
                }
                store(mc.d, mc.D.type, at, x);
            }
        }
}

static void require_device(const void *p, size_t bytes, const char *what) {
    if (bytes && !cudasim::is_device(p, bytes))
        cudasim::fail("cublasLtMatmul: %s (%p, %zu bytes) is not inside one device allocation", what, p, bytes);
}

// An algorithm from the heuristic may rely on the alignment it was chosen for
// (cublasLtMatmulAlgoCapAttributes_t, MIN_ALIGNMENT_*_BYTES: "required for
// buffer pointer, leading dimension"). Given a less aligned matrix, or one
// laid out with another leading dimension than the heuristic was shown, it may
// fault or read wrong data on a GPU, so the sim stops.
static void require_alignment(const void *p, const cublasLtMatrixLayoutOpaque *l, uint64_t alignment,
                              const char *what) {
    if (alignment > 1 && (uintptr_t)p % alignment != 0)
        cudasim::fail("cublasLtMatmul: %s (%p) is not %llu-byte aligned, as the algorithm from the heuristic assumes "
                      "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%s_BYTES)", what, p, (unsigned long long)alignment, what);
    if (ld_alignment(l) < alignment)
        cudasim::fail("cublasLtMatmul: %s's leading dimension (%lld elements, %llu bytes) is not a multiple of the "
                      "%llu bytes the algorithm from the heuristic assumes (it was chosen for another layout)",
                      what, (long long)l->ld, (unsigned long long)(l->ld * element_bytes(l->type)),
                      (unsigned long long)alignment);
}

// cuBLAS documentation, cublasLtMatmul(): D = alpha * op(A) op(B) + beta * C.
// In place (C == D) needs C's and D's layouts to be the same; the workspace
// must be at least what the algorithm needs (else CUBLAS_STATUS_INVALID_VALUE).
// alpha and beta are host pointers (the default pointer mode), read now.
extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                         const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                         const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                         cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                         void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || !A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t st = check_matmul(computeDesc, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (C == D && (Cdesc->ld != Ddesc->ld || Cdesc->type != Ddesc->type)) return CUBLAS_STATUS_INVALID_VALUE;
    if (computeDesc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && !computeDesc->bias) return CUBLAS_STATUS_INVALID_VALUE;
    size_t need = 0;
    uint64_t splits = 1, id = ALGO_IN_ORDER;
    if (algo) {
        if (algo->data[0] != ALGO_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
        need = algo->data[1];
        splits = algo->data[6];
        id = algo->data[7];
    }
    if (workspaceSizeInBytes < need) return CUBLAS_STATUS_INVALID_VALUE;
    MatmulCall mc{*computeDesc, *Adesc, *Bdesc, *Cdesc, *Ddesc, 0, 0, A, B, C, D, workspace, need, splits, id};
    memcpy(&mc.alpha, alpha, sizeof(float));
    memcpy(&mc.beta, beta, sizeof(float));
    if (mc.beta != 0 && !C) return CUBLAS_STATUS_INVALID_VALUE;
    require_device(A, span_bytes(Adesc), "A");
    require_device(B, span_bytes(Bdesc), "B");
    if (mc.beta != 0) require_device(C, span_bytes(Cdesc), "C");
    require_device(D, span_bytes(Ddesc), "D");
    require_device(workspace, need, "the workspace");
    if (algo) {
        require_alignment(A, Adesc, algo->data[2], "A");
        require_alignment(B, Bdesc, algo->data[3], "B");
        if (mc.beta != 0) require_alignment(C, Cdesc, algo->data[4], "C");
        require_alignment(D, Ddesc, algo->data[5], "D");
    }
    const cudaDataType_t bt = bias_type(computeDesc, Ddesc);
    const uint64_t bias_len = computeDesc->epilogue == CUBLASLT_EPILOGUE_BGRADB ? Ddesc->cols : Ddesc->rows;
    if (computeDesc->epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        require_device(computeDesc->bias, bias_len * element_bytes(bt), "the bias vector");
    cudasim::enqueue(stream, "cublasLtMatmul", [mc] { run_matmul(mc); });
    return CUBLAS_STATUS_SUCCESS;
}
