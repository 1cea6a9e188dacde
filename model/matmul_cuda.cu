// matmul_cuda.cu: the GEMMs of the CUDA backend (API in matmul_cuda.h):
// forward, dinp and dweight through cuBLASLt (bf16 A and B, fp32 compute),
// the bias added by cuBLASLt's BIAS epilogue, the bias gradients by a
// two-pass column sum of our own.
//
// Row-major <-> column-major, once for every call below: cuBLASLt reads
// matrices column-major, and a row-major X[r, c] (element at r * ld + c) read
// column-major is X^T, c x r with the same leading dimension. So each
// row-major product Y = P Q is asked as Y^T = Q^T P^T on the same memory,
// with no copy and no transpose of data:
//   forward  out^T[OC, T]  = W[OC, IC]      . inp^T[IC, T]   A = W (stored IC x OC) op T,  B = inp op N
//   dinp     dinp^T[IC, T] = W^T[IC, OC] . dout^T[OC, T]    A = W op N,  B = dout (stored OC x T) op N
//   dweight  dW^T[IC, OC]  += inp^T[IC, T]  . dout[T, OC]    A = inp op N,  B = dout op T
// The bias of the forward is a vector over out^T's rows (OC): the BIAS
// epilogue's vector of D's rows, added to every column (token).
//
// Accuracy: the product is summed in fp32; a bf16 output is rounded once,
// or twice when the bias is added (some of cuBLASLt's algorithms
// round the product first, measured on an H200). The heuristic could also
// pick a split-K algorithm whose parts are added up in D's type (one more
// rounding per part), so the preferences allow only no split or a reduction
// in the compute type (fp32).
//
// Choice of algorithm (matmul_cuda_choose): each problem's first use asks
// the heuristic for up to MATMUL_CUDA_ANSWERS answers and keeps one, its
// first or the fastest of them timed on the stream; the call then runs the
// kept one, which later calls of the problem reuse from the cache. Every
// answer obeys the preferences above, so any of them meets the bounds of
// tests/sim/gpu_test_matmul.c.
//
// The bias gradient does not use the BGRADB epilogue: that epilogue writes
// (does not add to) its vector, while the backend accumulates into dbias, and
// it rides on one dweight GEMM each. A column sum in two passes (partial
// sums per slice of tokens into the workspace, then the slices in order) is
// as cheap (one read of dout) and gives the same bits on every run.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/cuda_check.h"
#include "../dist/cuda_kernel.h"
#include "matmul_cuda.h"

// Everything that selects an algorithm: shape, transposes, output type,
// epilogue, beta 0 or not (C read or not: other timings) and the alignment
// (bytes, power of two <= 256) of A, B, C = D.
typedef struct {
    int64_t m, n, k;
    int32_t transa, transb, d_type, epilogue, adds;
    uint32_t align_a, align_b, align_d;
} GemmKey;

typedef struct {
    GemmKey key;
    cublasLtMatmulAlgo_t algo;
} GemmAlgo;

// Distinct problems of one model: 7 GEMMs x 3 per layer shape, the LM head and
// its last chunk, times a few alignments. When full, the oldest entry goes.
#define ALGO_CACHE_SIZE 128

struct MatmulCuda {
    cublasLtHandle_t lt;
    void *workspace;   // MATMUL_CUDA_WORKSPACE_BYTES, then MATMUL_CUDA_TIMING_BYTES (timing_out)
    void *timing_out;  // where the timed runs of a problem with beta != 0 write their output
    cudaStream_t second;       // matmul_cuda_second_stream's stream, and its workspace
    void *second_workspace;    // MATMUL_CUDA_WORKSPACE_BYTES; NULL until a second stream is set
    GemmAlgo cache[ALGO_CACHE_SIZE];
    int cached;        // entries filled
    int next;          // the entry replaced when the cache is full
    bool timed;        // matmul_cuda_choose's arguments
    int keep;
    FILE *report;
    cudaEvent_t start[MATMUL_CUDA_ANSWERS], end[MATMUL_CUDA_ANSWERS];   // around each answer's timed runs
    MatmulChoiceCost cost;
};

// ---- kernels: the bias gradient ----

#define BIAS_COLS 32    // columns per block: one per lane
#define BIAS_WARPS 8    // token rows read at once per block
#define BIAS_SUM_THREADS 256

// partial[s, o] = sum over the tokens t of slice s of dout[t, o], fp32.
// grid (column blocks, slices), block (32, 8): lane -> column, warp -> every 8th token.
__global__ void __launch_bounds__(BIAS_COLS * BIAS_WARPS)
bias_grad_partial_kernel(float *partial, const __nv_bfloat16 *dout, int64_t T, int OC, int64_t slice_tokens) {
    STATIC_SHARED(float, sums, [BIAS_WARPS][BIAS_COLS]);
    const int col = blockIdx.x * BIAS_COLS + threadIdx.x;
    const int64_t t0 = (int64_t)blockIdx.y * slice_tokens;
    const int64_t t1 = t0 + slice_tokens < T ? t0 + slice_tokens : T;
    float s = 0.0f;
    if (col < OC)
        for (int64_t t = t0 + threadIdx.y; t < t1; t += BIAS_WARPS) s += __bfloat162float(dout[t * OC + col]);
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || col >= OC) return;
    float total = 0.0f;
    for (int w = 0; w < BIAS_WARPS; w++) total += sums[w][threadIdx.x];
    partial[(int64_t)blockIdx.y * OC + col] = total;
}

// dbias[o] += sum over slices s (in order) of partial[s, o]; one thread per column.
__global__ void __launch_bounds__(BIAS_SUM_THREADS)
bias_grad_sum_kernel(float *dbias, const float *partial, int OC, int slices) {
    const int col = blockIdx.x * BIAS_SUM_THREADS + threadIdx.x;
    if (col >= OC) return;
    float s = 0.0f;
    for (int r = 0; r < slices; r++) s += partial[(int64_t)r * OC + col];
    dbias[col] += s;
}

// ---- the context ----

// The timed runs' output starts zeroed (a C read with beta != 0: no NaN or denormal to slow an answer).
extern "C" MatmulCuda *matmul_cuda_create(void) {
    MatmulCuda *mm = (MatmulCuda *)xmalloc(sizeof *mm);
    memset(mm, 0, sizeof *mm);
    CUBLAS_CHECK(cublasLtCreate(&mm->lt));
    CUDA_CHECK(cudaMalloc(&mm->workspace, MATMUL_CUDA_WORKSPACE_BYTES + MATMUL_CUDA_TIMING_BYTES));
    mm->timing_out = (char *)mm->workspace + MATMUL_CUDA_WORKSPACE_BYTES;
    CUDA_CHECK(cudaMemset(mm->timing_out, 0, MATMUL_CUDA_TIMING_BYTES));
    for (int i = 0; i < MATMUL_CUDA_ANSWERS; i++) {
        CUDA_CHECK(cudaEventCreate(&mm->start[i]));
        CUDA_CHECK(cudaEventCreate(&mm->end[i]));
    }
    return mm;
}

extern "C" void matmul_cuda_destroy(MatmulCuda *mm) {
    if (!mm) return;
    CUDA_CHECK(cudaFree(mm->workspace));   // synchronises the device first
    CUDA_CHECK(cudaFree(mm->second_workspace));
    for (int i = 0; i < MATMUL_CUDA_ANSWERS; i++) {
        CUDA_CHECK(cudaEventDestroy(mm->start[i]));
        CUDA_CHECK(cudaEventDestroy(mm->end[i]));
    }
    CUBLAS_CHECK(cublasLtDestroy(mm->lt));
    free(mm);
}

extern "C" void matmul_cuda_second_stream(MatmulCuda *mm, cudaStream_t stream) {
    if (!mm->second_workspace) CUDA_CHECK(cudaMalloc(&mm->second_workspace, MATMUL_CUDA_WORKSPACE_BYTES));
    mm->second = stream;
}

// The workspace of the calls on `stream`.
static void *workspace_of(const MatmulCuda *mm, cudaStream_t stream) {
    return mm->second_workspace && stream == mm->second ? mm->second_workspace : mm->workspace;
}

extern "C" void matmul_cuda_choose(MatmulCuda *mm, bool timed, int keep, FILE *report) {
    mm->timed = timed;
    mm->keep = keep;
    mm->report = report;
    mm->cached = mm->next = 0;
}

extern "C" MatmulChoiceCost matmul_cuda_choice_cost(const MatmulCuda *mm) { return mm->cost; }

static void check_aligned(const void *p, const char *name) {
    CHECK(((uintptr_t)p & 15) == 0, "matmul (CUDA): %s is not 16-byte aligned", name);
}

// The largest power of two <= 256 that divides the address (cuBLASLt's
// preferences assume 256 unless told otherwise).
static uint32_t alignment_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a /= 2;
    return a;
}

// One GEMM call as cuBLASLt takes it: descriptors, operands, stream, and what it is ("forward", "dinp",
// "dweight": the choice's report).
typedef struct {
    const char *op;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    const void *a, *b;
    void *d;
    float beta;
    cudaStream_t stream;
} GemmCall;

// D = op(A) op(B) + beta D of the call, into `d` (the call's D or the timed runs' output), by `algo`.
static void run_gemm(MatmulCuda *mm, const GemmCall *c, void *d, const cublasLtMatmulAlgo_t *algo) {
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(mm->lt, c->desc, &alpha, c->a, c->la, c->b, c->lb, &c->beta, d, c->ld, d, c->ld, algo,
                                workspace_of(mm, c->stream), MATMUL_CUDA_WORKSPACE_BYTES, c->stream));
}

// Up to MATMUL_CUDA_ANSWERS answers of the heuristic for this problem, best first, into results; how many.
static int heuristic_answers(MatmulCuda *mm, const GemmKey *key, const GemmCall *c,
                             cublasLtMatmulHeuristicResult_t *results) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = MATMUL_CUDA_WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &max_workspace, sizeof max_workspace));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &key->align_a, sizeof key->align_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &key->align_b, sizeof key->align_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                      &key->align_d, sizeof key->align_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                      &key->align_d, sizeof key->align_d));
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                      sizeof reductions));
    int found = 0;
    // No algorithm is CUBLAS_STATUS_NOT_SUPPORTED (or none found): one line naming the problem.
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(mm->lt, c->desc, c->la, c->lb, c->ld, c->ld, pref,
                                                             MATMUL_CUDA_ANSWERS, results, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    int usable = 0;   // an answer whose state is not success has no algorithm
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; i++)
        if (results[i].state == CUBLAS_STATUS_SUCCESS) results[usable++] = results[i];
    found = usable;
    CHECK(st == CUBLAS_STATUS_SUCCESS && found >= 1,
          "matmul (CUDA): cuBLASLt has no algorithm for m %lld n %lld k %lld (%s)", (long long)key->m,
          (long long)key->n, (long long)key->k, cublasLtGetStatusName(st));
    return found;
}

// Each of the answers run once, then MATMUL_CUDA_TIMED_RUNS times between two events, into `out`; ms[i] the
// timed runs' milliseconds of answer i. Returns the fastest (the first of equals).
static int time_answers(MatmulCuda *mm, const GemmCall *c, void *out, const cublasLtMatmulHeuristicResult_t *results,
                        int found, float *ms) {
    for (int i = 0; i < found; i++) {
        run_gemm(mm, c, out, &results[i].algo);
        CUDA_CHECK(cudaEventRecord(mm->start[i], c->stream));
        for (int r = 0; r < MATMUL_CUDA_TIMED_RUNS; r++) run_gemm(mm, c, out, &results[i].algo);
        CUDA_CHECK(cudaEventRecord(mm->end[i], c->stream));
    }
    CUDA_CHECK(cudaEventSynchronize(mm->end[found - 1]));
    int best = 0;
    for (int i = 0; i < found; i++) {
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], mm->start[i], mm->end[i]));
        if (ms[i] < ms[best]) best = i;
    }
    mm->cost.problems++;
    mm->cost.answers += found;
    mm->cost.launches += (int64_t)found * (1 + MATMUL_CUDA_TIMED_RUNS);
    return best;
}

// "algo ID tile TILE split-K N" of an answer.
static void describe_algo(const cublasLtMatmulAlgo_t *algo, char *out, size_t size) {
    int32_t id;
    uint32_t tile, splits;
    size_t written;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written));
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                                      &written));
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                                      &written));
    snprintf(out, size, "algo %d tile %u split-K %u", id, tile, splits);
}

// The algorithm of this problem: from the cache, or chosen now (matmul_cuda_choose) and reported.
static const cublasLtMatmulAlgo_t *find_algo(MatmulCuda *mm, const GemmKey *key, const GemmCall *c) {
    for (int i = 0; i < mm->cached; i++)
        if (memcmp(&mm->cache[i].key, key, sizeof *key) == 0) return &mm->cache[i].algo;
    const double t0 = now_seconds();
    cublasLtMatmulHeuristicResult_t results[MATMUL_CUDA_ANSWERS];
    const int found = heuristic_answers(mm, key, c, results);
    const int keep = mm->keep < 0 ? 0 : mm->keep < found ? mm->keep : found - 1;
    const size_t out_bytes = (size_t)(key->m * key->n) * (key->d_type == CUDA_R_16BF ? 2 : 4);
    // beta 0: in place (the call writes D after them); else apart, when D fits.
    void *out = !key->adds ? c->d : out_bytes <= MATMUL_CUDA_TIMING_BYTES ? mm->timing_out : NULL;
    float ms[MATMUL_CUDA_ANSWERS];
    int chosen = keep;
    const bool timing = mm->timed && found > 1 && out;
    if (timing) {
        const int fastest = time_answers(mm, c, out, results, found, ms);
        if (mm->keep < 0) chosen = fastest;
        mm->cost.seconds += now_seconds() - t0;
    }
    if (mm->timed && mm->report) {
        char algo[64];
        describe_algo(&results[chosen].algo, algo, sizeof algo);
        fprintf(mm->report, "gemm choice: %s m %lld n %lld k %lld%s%s: answer %d of %d (%s)", c->op, (long long)key->m,
                (long long)key->n, (long long)key->k, key->epilogue == CUBLASLT_EPILOGUE_BIAS ? " bias" : "",
                key->adds ? " beta 1" : "", chosen + 1, found, algo);
        if (timing)
            fprintf(mm->report, " %.3f ms%s, the first %.3f ms\n", ms[chosen] / MATMUL_CUDA_TIMED_RUNS,
                    mm->keep >= 0 ? " (kept as told)" : " (the fastest)",
                    ms[0] / MATMUL_CUDA_TIMED_RUNS);
        else
            fprintf(mm->report, ", untimed (%s)\n", found == 1 ? "the only answer"
                    : "its output with beta 1 is larger than the timed runs' own");
    }
    GemmAlgo *slot;
    if (mm->cached < ALGO_CACHE_SIZE) {
        slot = &mm->cache[mm->cached++];
    } else {
        slot = &mm->cache[mm->next];
        mm->next = (mm->next + 1) % ALGO_CACHE_SIZE;
    }
    slot->key = *key;
    slot->algo = results[chosen].algo;
    return &slot->algo;
}

// D[m, n] = op(A) op(B) + beta D (+ bias[m] when not NULL), cuBLASLt's
// column-major terms; A (a_rows x a_cols) and B (b_rows x b_cols) bf16 as
// stored, packed (leading dimension = rows); D packed, of type d_type; bias bf16.
static void gemm(MatmulCuda *mm, const char *op, const uint16_t *a, int64_t a_rows, int64_t a_cols,
                 cublasOperation_t ta, const uint16_t *b, int64_t b_rows, int64_t b_cols, cublasOperation_t tb,
                 void *d, cudaDataType_t d_type, float beta, const uint16_t *bias, cudaStream_t stream) {
    GemmKey key;
    memset(&key, 0, sizeof key);   // the padding too: keys are compared with memcmp
    key.m = ta == CUBLAS_OP_N ? a_rows : a_cols;
    key.k = ta == CUBLAS_OP_N ? a_cols : a_rows;
    key.n = tb == CUBLAS_OP_N ? b_cols : b_rows;
    key.transa = ta;
    key.transb = tb;
    key.d_type = d_type;
    key.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    key.adds = beta != 0.0f;
    key.align_a = alignment_of(a);
    key.align_b = alignment_of(b);
    key.align_d = alignment_of(d);

    GemmCall c = {op, NULL, NULL, NULL, NULL, a, b, d, beta, stream};
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t op_a = ta, op_b = tb;
    const uint32_t epilogue = (uint32_t)key.epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias) {
        const int32_t bias_type = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.la, CUDA_R_16BF, (uint64_t)a_rows, (uint64_t)a_cols, a_rows));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_16BF, (uint64_t)b_rows, (uint64_t)b_cols, b_rows));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.ld, d_type, (uint64_t)key.m, (uint64_t)key.n, key.m));
    run_gemm(mm, &c, d, find_algo(mm, &key, &c));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(c.la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(c.lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(c.ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(c.desc));
}

static void check_dims(int64_t T, int IC, int OC) {
    CHECK(T >= 0 && IC > 0 && OC > 0, "matmul (CUDA): shape T %lld IC %d OC %d (expected T >= 0, IC, OC > 0)",
          (long long)T, IC, OC);
}

// ---- the operations ----

extern "C" void matmul_forward_cuda(MatmulCuda *mm, uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                                    const uint16_t *bias, int64_t T, int IC, int OC, cudaStream_t stream) {
    check_dims(T, IC, OC);
    if (T == 0) return;
    check_aligned(out, "out"); check_aligned(inp, "inp"); check_aligned(weight, "weight");
    if (bias) check_aligned(bias, "bias");
    gemm(mm, "forward", weight, IC, OC, CUBLAS_OP_T, inp, IC, T, CUBLAS_OP_N, out, CUDA_R_16BF, 0.0f, bias, stream);
}

// dbias[OC] += colsum(dout[T, OC]): slices of tokens summed into the workspace, then the slices in order.
extern "C" void bias_grad_cuda(MatmulCuda *mm, float *dbias, const uint16_t *dout, int OC, int64_t T,
                               cudaStream_t stream) {
    check_dims(T, 1, OC);
    if (T == 0) return;
    check_aligned(dbias, "dbias"); check_aligned(dout, "dout");
    const int col_blocks = (OC + BIAS_COLS - 1) / BIAS_COLS;
    // About 1024 blocks (several waves on 108-132 SMs), each slice at least 64 tokens, the partial sums
    // within the workspace.
    int64_t slices = (1024 + col_blocks - 1) / col_blocks;
    const int64_t most_by_tokens = (T + 63) / 64;
    const int64_t most_by_workspace = (int64_t)(MATMUL_CUDA_WORKSPACE_BYTES / ((size_t)OC * sizeof(float)));
    if (slices > most_by_tokens) slices = most_by_tokens;
    if (slices > most_by_workspace) slices = most_by_workspace;
    if (slices > 65535) slices = 65535;
    const int64_t slice_tokens = (T + slices - 1) / slices;
    slices = (T + slice_tokens - 1) / slice_tokens;
    float *partial = (float *)workspace_of(mm, stream);
    CUDA_LAUNCH(bias_grad_partial_kernel, dim3((unsigned)col_blocks, (unsigned)slices), dim3(BIAS_COLS, BIAS_WARPS),
                0, stream, partial, (const __nv_bfloat16 *)dout, T, OC, slice_tokens);
    CUDA_CHECK(cudaGetLastError());
    CUDA_LAUNCH(bias_grad_sum_kernel, (unsigned)((OC + BIAS_SUM_THREADS - 1) / BIAS_SUM_THREADS), BIAS_SUM_THREADS,
                0, stream, dbias, (const float *)partial, OC, (int)slices);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void matmul_backward_cuda(MatmulCuda *mm, uint16_t *dinp, float *dweight, const uint16_t *dout,
                                     const uint16_t *inp, const uint16_t *weight, int64_t T, int IC, int OC,
                                     cudaStream_t stream) {
    check_dims(T, IC, OC);
    if (T == 0) return;
    check_aligned(dout, "dout");
    if (dinp) {
        check_aligned(dinp, "dinp"); check_aligned(weight, "weight");
        gemm(mm, "dinp", weight, IC, OC, CUBLAS_OP_N, dout, OC, T, CUBLAS_OP_N, dinp, CUDA_R_16BF, 0.0f, NULL,
             stream);
    }
    if (dweight) {
        check_aligned(dweight, "dweight"); check_aligned(inp, "inp");
        gemm(mm, "dweight", inp, IC, T, CUBLAS_OP_N, dout, OC, T, CUBLAS_OP_T, dweight, CUDA_R_32F, 1.0f, NULL,
             stream);
    }
}
