// gpu_bench_attention.c: times the CUDA dense causal flash attention
// (attention/kernels/flash_cuda.cu) on one GPU: 16 q heads, 2 kv heads, head dim 128
// (or D: 64 or 128), bf16, one key chunk holding the whole sequence, for each
// length given.
//   build/tests/gpu_bench_attention [--head-dim D] N...
// Prints one line per length, read by scripts/bench_attention.py:
//   mtrain N fwd_ms bwd_ms
// fwd: init + forward + cast to bf16; bwd: zeroing dq, dk, dv + delta +
// backward (the fp32 gradients are not cast). Median of CUDA-event timings
// after one warm-up; inputs are uniform random bf16 (never zeros).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/attention_cuda.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"

#define HQ 16
#define HKV 2

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// n uniform values in [-2, 2) as bf16 on the device.
static uint16_t *random_device_bf16(Rng *rng, int64_t n) {
    uint16_t *host = xmalloc((size_t)n * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++)
        host[i] = f32_to_bf16((float)(rng_next(rng) >> 40) * 0x1p-24f * 4.0f - 2.0f);
    uint16_t *dev;
    CUDA_CHECK(cudaMalloc((void **)&dev, (size_t)n * sizeof(uint16_t)));
    CUDA_CHECK(cudaMemcpy(dev, host, (size_t)n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    free(host);
    return dev;
}

int main(int argc, char **argv) {
    int first = 1, head_dim = 128;
    if (argc >= 3 && !strcmp(argv[1], "--head-dim")) {
        head_dim = atoi(argv[2]);
        CHECK(head_dim == 64 || head_dim == 128, "%s: --head-dim '%s' (expected 64 or 128)", argv[0], argv[2]);
        first = 3;
    }
    CHECK(argc > first, "usage: %s [--head-dim 64|128] N... (sequence lengths)", argv[0]);
    int64_t max_n = 0;
    for (int i = first; i < argc; i++) {
        const int64_t n = strtoll(argv[i], NULL, 10);
        CHECK(n >= 1, "%s: length '%s' is not a positive integer", argv[0], argv[i]);
        if (n > max_n) max_n = n;
    }
    // Buffers for the longest sequence; a shorter one uses their first tokens
    // (token-major layout).
    Rng rng;
    rng_seed(&rng, 42);
    const int64_t nq = max_n * HQ * head_dim, nk = max_n * HKV * head_dim;
    uint16_t *q = random_device_bf16(&rng, nq), *dout = random_device_bf16(&rng, nq);
    uint16_t *k = random_device_bf16(&rng, nk), *v = random_device_bf16(&rng, nk);
    int64_t *pos_host = xmalloc((size_t)max_n * sizeof(int64_t)), *pos;
    for (int64_t t = 0; t < max_n; t++) pos_host[t] = t;
    CUDA_CHECK(cudaMalloc((void **)&pos, (size_t)max_n * sizeof(int64_t)));
    CUDA_CHECK(cudaMemcpy(pos, pos_host, (size_t)max_n * sizeof(int64_t), cudaMemcpyHostToDevice));
    float *o_acc, *lse, *delta, *dq, *dk, *dv;
    uint16_t *o;
    CUDA_CHECK(cudaMalloc((void **)&o_acc, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&o, (size_t)nq * sizeof(uint16_t)));
    CUDA_CHECK(cudaMalloc((void **)&lse, (size_t)(max_n * HQ) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&delta, (size_t)(max_n * HQ) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&dq, (size_t)nq * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&dk, (size_t)nk * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&dv, (size_t)nk * sizeof(float)));
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));

    for (int a = first; a < argc; a++) {
        const int64_t n = strtoll(argv[a], NULL, 10);
        const AttnShape s = {n, n, HQ, HKV, head_dim, 64, 1.0f / sqrtf((float)head_dim), NULL, 0, NULL};
        const int reps = n >= 65536 ? 3 : 10;
        float fwd[10], bwd[10];
        for (int r = -1; r < reps; r++) {                  // r = -1: warm-up
            CUDA_CHECK(cudaEventRecord(ev[0], 0));
            attn_forward_init_cuda(&s, o_acc, lse, 0);
            attn_dense_forward_cuda(&s, q, pos, k, v, pos, o_acc, lse, 0);
            attn_output_bf16_cuda(&s, o_acc, o, 0);
            CUDA_CHECK(cudaEventRecord(ev[1], 0));
            CUDA_CHECK(cudaMemsetAsync(dq, 0, (size_t)(n * HQ * head_dim) * sizeof(float), 0));
            CUDA_CHECK(cudaMemsetAsync(dk, 0, (size_t)(n * HKV * head_dim) * sizeof(float), 0));
            CUDA_CHECK(cudaMemsetAsync(dv, 0, (size_t)(n * HKV * head_dim) * sizeof(float), 0));
            attn_backward_delta_cuda(&s, o, dout, delta, 0);
            attn_dense_backward_cuda(&s, q, pos, k, v, pos, lse, delta, dout, dq, dk, dv, 0);
            CUDA_CHECK(cudaEventRecord(ev[2], 0));
            CUDA_CHECK(cudaEventSynchronize(ev[2]));
            if (r < 0) continue;
            CUDA_CHECK(cudaEventElapsedTime(&fwd[r], ev[0], ev[1]));
            CUDA_CHECK(cudaEventElapsedTime(&bwd[r], ev[1], ev[2]));
        }
        qsort(fwd, (size_t)reps, sizeof(float), compare_floats);
        qsort(bwd, (size_t)reps, sizeof(float), compare_floats);
        printf("mtrain %lld %.3f %.3f\n", (long long)n, fwd[reps / 2], bwd[reps / 2]);
        fflush(stdout);
    }
    CUDA_CHECK(cudaFree(q)); CUDA_CHECK(cudaFree(dout)); CUDA_CHECK(cudaFree(k)); CUDA_CHECK(cudaFree(v));
    CUDA_CHECK(cudaFree(pos)); CUDA_CHECK(cudaFree(o_acc)); CUDA_CHECK(cudaFree(o));
    CUDA_CHECK(cudaFree(lse)); CUDA_CHECK(cudaFree(delta));
    CUDA_CHECK(cudaFree(dq)); CUDA_CHECK(cudaFree(dk)); CUDA_CHECK(cudaFree(dv));
    free(pos_host);
    return 0;
}
