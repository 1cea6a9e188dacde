// gpu_bench_sparse.c: times the GPU sparse attention pipeline against our
// dense CUDA kernels on one GPU: 16 q heads, 2 kv heads, head dim 128, bf16,
// one key chunk holding the whole sequence, index block 128, on planted
// vertical-slash inputs (below) at about 95% sparsity.
//   build/tests/gpu_bench_sparse [--slash-fraction F] N...
// Per length, one line (read by scripts/bench_attention.sh):
//   sparse N dense_ms sparse_ms est_ms density dense_measured
// dense_ms: dense forward + backward (as gpu_bench_attention); measured for
// N <= DENSE_MAX, else estimated as the largest measured length's time times
// (N / that length)^2 (dense_measured 0). sparse_ms: sparse forward +
// backward with the index of this run. est_ms: estimation (2 passes over the
// last 64 queries), selection and index build, all on the GPU. density:
// computed score elements / causal ones, from the index. Medians of 3 after
// one warm-up.
//
// Planted inputs (stateless hashes, uniform [-1, 1) noise per element): per
// kv group g, a direction u_g and per position t a vector r_t,g. Queries:
// q_t = noise + r_t,g + u_g. Keys: noise; keys at ~1024 hashed positions
// + 3 u_g (vertical lines); key j + 3 r_{j+d},g for one planted offset d of
// PLANTED (chosen by j) (slash lines). Budget fixed: 1024 vertical and
// F N / 128 - 1 slash lines per head (F = 0.0125 unless --slash-fraction;
// plus sink 64, local 128), which makes about 5% of the causal elements
// (F = 0.04: about 10%).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/kernels/sparse_cuda.h"
#include "../../attention/sparse/sparse_select_cuda.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"

#define HQ 16
#define HKV 2
#define HEAD_DIM 128
#define BLOCK 128
#define LAST_Q 64
#define REPS 3
#define DENSE_MAX 131072
#define VERTICAL 1024

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// splitmix64 of (stream, a, b, c) -> uniform [-1, 1).
static float hash_uniform(uint64_t stream, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = (stream << 56) ^ (a << 16) ^ (b << 8) ^ c;
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (float)(x >> 40) * 0x1p-23f - 1.0f;
}

enum { S_QNOISE = 1, S_R, S_U, S_KNOISE, S_V, S_DOUT, S_VERT, S_SLASH };

// The planted slash offsets: count of them in [BLOCK, N / 2).
static int64_t *planted_offsets(int64_t n, int count) {
    int64_t *d = xmalloc((size_t)count * sizeof(int64_t));
    for (int i = 0; i < count; i++)
        d[i] = BLOCK + (int64_t)((hash_uniform(S_SLASH, (uint64_t)i, 0, 0) + 1.0f) * 0.5f * (float)(n / 2 - BLOCK));
    return d;
}

// q or dout [n, HQ, D] (planted: q) as bf16 bits.
static uint16_t *make_queries(int64_t n, int planted, int stream) {
    uint16_t *x = xmalloc((size_t)(n * HQ * HEAD_DIM) * sizeof(uint16_t));
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < HQ; h++) {
            const int g = h / (HQ / HKV);
            for (int d = 0; d < HEAD_DIM; d++) {
                float y = hash_uniform((uint64_t)stream, (uint64_t)t, (uint64_t)h, (uint64_t)d);
                if (planted) y += hash_uniform(S_R, (uint64_t)t, (uint64_t)g, (uint64_t)d) +
                                  hash_uniform(S_U, 0, (uint64_t)g, (uint64_t)d);
                x[(t * HQ + h) * HEAD_DIM + d] = f32_to_bf16(y);
            }
        }
    return x;
}

// k or v [n, HKV, D] (planted: k) as bf16 bits.
static uint16_t *make_keys(int64_t n, int planted, int stream, const int64_t *offsets, int noffsets) {
    uint16_t *x = xmalloc((size_t)(n * HKV * HEAD_DIM) * sizeof(uint16_t));
    const float vertical_p = (float)VERTICAL / (float)n * 2.0f - 1.0f;    // hash < this: ~VERTICAL positions
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        const int vertical = hash_uniform(S_VERT, (uint64_t)j, 0, 0) < vertical_p;
        const int64_t target = j + offsets[j % noffsets];
        for (int g = 0; g < HKV; g++)
            for (int d = 0; d < HEAD_DIM; d++) {
                float y = hash_uniform((uint64_t)stream, (uint64_t)j, (uint64_t)g, (uint64_t)d);
                if (planted && vertical) y += 3.0f * hash_uniform(S_U, 0, (uint64_t)g, (uint64_t)d);
                if (planted && target < n) y += 3.0f * hash_uniform(S_R, (uint64_t)target, (uint64_t)g, (uint64_t)d);
                x[(j * HKV + g) * HEAD_DIM + d] = f32_to_bf16(y);
            }
    }
    return x;
}

static void *to_device(const void *host, size_t bytes) {
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, bytes));
    CUDA_CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return dev;
}

static void *device_alloc(size_t bytes) {
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, bytes));
    return dev;
}

static float median(float *x, int n) {
    qsort(x, (size_t)n, sizeof(float), compare_floats);
    return x[n / 2];
}

// The backward's pieces before the kernel, dense or sparse: zeroed gradients, delta.
static void backward_start(const AttnShape *s, const uint16_t *o, const uint16_t *dout, float *delta, float *dq,
                           float *dk, float *dv) {
    const int64_t nq = s->q_tokens * HQ * HEAD_DIM, nk = s->k_tokens * HKV * HEAD_DIM;
    CUDA_CHECK(cudaMemsetAsync(dq, 0, (size_t)nq * sizeof(float), 0));
    CUDA_CHECK(cudaMemsetAsync(dk, 0, (size_t)nk * sizeof(float), 0));
    CUDA_CHECK(cudaMemsetAsync(dv, 0, (size_t)nk * sizeof(float), 0));
    attn_backward_delta_cuda(s, o, dout, delta, 0);
}

int main(int argc, char **argv) {
    int first = 1;
    double slash_fraction = 0.0125;
    if (argc >= 3 && !strcmp(argv[1], "--slash-fraction")) {
        slash_fraction = atof(argv[2]);
        CHECK(slash_fraction > 0 && slash_fraction < 0.5, "%s: --slash-fraction '%s' (expected a number in (0, 0.5))",
              argv[0], argv[2]);
        first = 3;
    }
    CHECK(argc > first, "usage: %s [--slash-fraction F] N... (sequence lengths)", argv[0]);
    cudaEvent_t ev[5];
    for (int i = 0; i < 5; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));
    // Keep freed stream-ordered scratch (the kernels' chunk views) in the pool
    // between calls, as a training process would.
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    double dense_ref_ms = 0, dense_ref_n = 0;
    for (int a = first; a < argc; a++) {
        const int64_t n = strtoll(argv[a], NULL, 10);
        CHECK(n >= 2 * BLOCK + LAST_Q, "%s: length '%s' is not an integer >= %d", argv[0], argv[a],
              2 * BLOCK + LAST_Q);
        const int nslash = (int)(slash_fraction * (double)n / BLOCK) - 1 > 1 ? (int)(slash_fraction * (double)n / BLOCK) - 1 : 1;
        int64_t *offsets = planted_offsets(n, nslash);
        uint16_t *hq = make_queries(n, 1, S_QNOISE), *hdout = make_queries(n, 0, S_DOUT);
        uint16_t *hk = make_keys(n, 1, S_KNOISE, offsets, nslash), *hv = make_keys(n, 0, S_V, offsets, nslash);
        const int64_t nq = n * HQ * HEAD_DIM, nk = n * HKV * HEAD_DIM;
        uint16_t *q = to_device(hq, (size_t)nq * 2), *dout = to_device(hdout, (size_t)nq * 2);
        uint16_t *k = to_device(hk, (size_t)nk * 2), *v = to_device(hv, (size_t)nk * 2);
        free(hq); free(hdout); free(hk); free(hv); free(offsets);
        int64_t *hpos = xmalloc((size_t)n * sizeof(int64_t));
        for (int64_t t = 0; t < n; t++) hpos[t] = t;
        int64_t *pos = to_device(hpos, (size_t)n * sizeof(int64_t));
        const int64_t nqb = (n + BLOCK - 1) / BLOCK;
        int64_t *hqb = xmalloc((size_t)nqb * sizeof(int64_t));
        for (int64_t i = 0; i < nqb; i++) hqb[i] = i;
        int64_t *q_blocks = to_device(hqb, (size_t)nqb * sizeof(int64_t));
        float *lse_init = xmalloc(HQ * LAST_Q * sizeof(float));
        for (int i = 0; i < HQ * LAST_Q; i++) lse_init[i] = -INFINITY;
        float *d_lse_init = to_device(lse_init, HQ * LAST_Q * sizeof(float));
        float *o_acc = device_alloc((size_t)nq * 4), *lse = device_alloc((size_t)(n * HQ) * 4);
        float *delta = device_alloc((size_t)(n * HQ) * 4), *dq = device_alloc((size_t)nq * 4);
        float *dk = device_alloc((size_t)nk * 4), *dv = device_alloc((size_t)nk * 4);
        uint16_t *o = device_alloc((size_t)nq * 2);
        float *lse_est = device_alloc(HQ * LAST_Q * 4), *vertical = device_alloc((size_t)(HQ * n) * 4);
        float *slash = device_alloc((size_t)(HQ * n) * 4);
        const AttnShape s = {n, n, HQ, HKV, HEAD_DIM, BLOCK, 0.08838834764831845f, NULL, 0, NULL};   // 1/sqrt(128)
        const AttnShape se = {LAST_Q, n, HQ, HKV, HEAD_DIM, BLOCK, 0.08838834764831845f, NULL, 0, NULL};
        AttentionConfig cfg = {.top_p = 0.9, .max_vertical = VERTICAL, .max_slash = nslash, .sink = 64,
                               .local = 128, .vertical = VERTICAL, .slash = nslash};
        cfg.budget = BUDGET_FIXED;

        float dense[REPS], sparse[REPS], est[REPS];
        double density = 0;
        const int measure_dense = n <= DENSE_MAX;
        // Pattern and index reused across the repetitions, as the attention op reuses them.
        SparsePatternCuda pattern = {0};
        SparseIndexCuda index = {0};
        for (int r = -1; r < REPS; r++) {                  // r = -1: warm-up
            if (measure_dense) {
                CUDA_CHECK(cudaEventRecord(ev[0], 0));
                attn_forward_init_cuda(&s, o_acc, lse, 0);
                attn_dense_forward_cuda(&s, q, pos, k, v, pos, o_acc, lse, 0);
                attn_output_bf16_cuda(&s, o_acc, o, 0);
                backward_start(&s, o, dout, delta, dq, dk, dv);
                attn_dense_backward_cuda(&s, q, pos, k, v, pos, lse, delta, dout, dq, dk, dv, 0);
                CUDA_CHECK(cudaEventRecord(ev[1], 0));
            }
            // Estimation, selection, index.
            CUDA_CHECK(cudaEventRecord(ev[2], 0));
            CUDA_CHECK(cudaMemcpyAsync(lse_est, d_lse_init, HQ * LAST_Q * 4, cudaMemcpyDeviceToDevice, 0));
            CUDA_CHECK(cudaMemsetAsync(vertical, 0, (size_t)(HQ * n) * 4, 0));
            CUDA_CHECK(cudaMemsetAsync(slash, 0, (size_t)(HQ * n) * 4, 0));
            const uint16_t *qe = q + (n - LAST_Q) * HQ * HEAD_DIM;
            sparse_estimate_lse_cuda(&se, qe, pos + n - LAST_Q, k, pos, lse_est, 0);
            sparse_estimate_scores_cuda(&se, qe, pos + n - LAST_Q, k, pos, lse_est, n, vertical, slash, 0);
            sparse_select_cuda(&cfg, vertical, slash, HQ, n, NULL, NULL, &pattern, 0);
            sparse_index_build_cuda(&pattern, BLOCK, q_blocks, nqb, NULL, 0, 0, &index, 0);
            CUDA_CHECK(cudaEventRecord(ev[3], 0));
            attn_forward_init_cuda(&s, o_acc, lse, 0);
            attn_sparse_forward_cuda(&s, &index, q, pos, k, v, pos, o_acc, lse, 0);
            attn_output_bf16_cuda(&s, o_acc, o, 0);
            backward_start(&s, o, dout, delta, dq, dk, dv);
            attn_sparse_backward_cuda(&s, &index, q, pos, k, v, pos, lse, delta, dout, dq, dk, dv, 0);
            CUDA_CHECK(cudaEventRecord(ev[4], 0));
            CUDA_CHECK(cudaEventSynchronize(ev[4]));
            if (r >= 0) {
                if (measure_dense) CUDA_CHECK(cudaEventElapsedTime(&dense[r], ev[0], ev[1]));
                CUDA_CHECK(cudaEventElapsedTime(&est[r], ev[2], ev[3]));
                CUDA_CHECK(cudaEventElapsedTime(&sparse[r], ev[3], ev[4]));
            }
            if (r == REPS - 1) {
                // Computed elements ~ blocks * B^2 (diagonal blocks half) + columns * B.
                const int64_t rows = HQ * nqb;
                int64_t nb, nc;
                CUDA_CHECK(cudaMemcpy(&nb, index.block_start + rows, sizeof nb, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(&nc, index.column_start + rows, sizeof nc, cudaMemcpyDeviceToHost));
                const double computed = ((double)nb - rows / 2.0) * BLOCK * BLOCK + (double)nc * BLOCK;
                density = computed / ((double)HQ * n * (n + 1) / 2.0);
            }
        }
        sparse_index_free_cuda(&index);
        sparse_pattern_free_cuda(&pattern);
        double dense_ms;
        if (measure_dense) {
            dense_ms = median(dense, REPS);
            dense_ref_ms = dense_ms;
            dense_ref_n = (double)n;
        } else {
            CHECK(dense_ref_n > 0, "%s: give a length <= %d first (the dense time at %lld is estimated from it)",
                  argv[0], DENSE_MAX, (long long)n);
            dense_ms = dense_ref_ms * ((double)n / dense_ref_n) * ((double)n / dense_ref_n);
        }
        printf("sparse %lld %.3f %.3f %.3f %.4f %d\n", (long long)n, dense_ms, median(sparse, REPS),
               median(est, REPS), density, measure_dense);
        fflush(stdout);
        CUDA_CHECK(cudaFree(q)); CUDA_CHECK(cudaFree(dout)); CUDA_CHECK(cudaFree(k)); CUDA_CHECK(cudaFree(v));
        CUDA_CHECK(cudaFree(pos)); CUDA_CHECK(cudaFree(q_blocks)); CUDA_CHECK(cudaFree(d_lse_init));
        CUDA_CHECK(cudaFree(o_acc)); CUDA_CHECK(cudaFree(lse)); CUDA_CHECK(cudaFree(delta));
        CUDA_CHECK(cudaFree(dq)); CUDA_CHECK(cudaFree(dk)); CUDA_CHECK(cudaFree(dv)); CUDA_CHECK(cudaFree(o));
        CUDA_CHECK(cudaFree(lse_est)); CUDA_CHECK(cudaFree(vertical)); CUDA_CHECK(cudaFree(slash));
        free(hpos); free(hqb); free(lse_init);
    }
    return 0;
}
