// backend_cuda.c: the CUDA backend's table (model/backend.h): memory through
// the CUDA runtime, and the ops of model/ops_cuda.h, model/matmul_cuda.h and
// attention/attention_api.h bound with the backend's compute stream and its
// cuBLASLt context. Activations and compute weights are bf16 (the ops'
// uint16_t), master weights, gradients, moments and statistics fp32.
// Everything is enqueued on the compute stream; download, act_to_host and
// sum_squares (it returns a double) wait for it, and upload
// waits too, so the host buffer is free again when it returns (both through
// a page-locked staging buffer); allreduce_sum
// (dist/comm_device.h: NCCL or host-staged) returns with the sum in place.
// The bucketed reduction runs on a second stream, the communication stream
// (at the device's greatest priority), each bucket after an event of the
// compute stream. With train.dw_stream the dW GEMMs and the bias gradient
// run on a third, the dW stream, each after an event of the compute stream
// (fork), until weight_grads_join makes the compute stream wait for an event
// of it (join).
// Built only with MTRAIN_CUDA (the sim build, and the nvcc build of mtrain).
#ifdef MTRAIN_CUDA

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attention/attention_api.h"
#include "../dist/comm.h"
#include "../dist/comm_device.h"
#include "../dist/cuda_check.h"
#include "../dist/test_hooks.h"
#include "../dist/util.h"
#include "backend.h"
#include "matmul_cuda.h"
#include "ops_cuda.h"

static struct {
    bool ready;
    cudaStream_t stream;
    cudaStream_t comm_stream;  // the bucketed gradient reduction (allreduce_sum_start)
    cudaStream_t dw_stream;    // the dW GEMMs (Backend.dw_stream): dw_made, or NULL (on `stream`)
    cudaStream_t dw_made;
    cudaEvent_t forked, joined;  // the fork to the dW stream and its join back
    bool dw_pending;           // work on the dW stream since the last join
    MatmulCuda *mm;
    double *total;  // one device double: sum_squares' result
    void *staging;  // [STAGING_BYTES] page-locked: the host side of every upload and download
    // AdamW's table of runs on the device, made from the tensors of the last
    // step that differed (the same every step of a run: uploaded once).
    AdamWTensor *adamw_tensors;  // host [adamw_tensor_count]: the tensors it was made from
    int adamw_tensor_count;
    AdamWRun *adamw_runs;        // device [adamw_run_count]
    int adamw_run_count;
} cuda;

// Uploads and downloads go through a page-locked buffer made once with the
// backend, in pieces of this size: an async copy with pageable memory makes
// the driver stage it and behaves synchronously (docs/SIM.md).
#define STAGING_BYTES ((size_t)4 << 20)

static void *cuda_alloc(size_t bytes) {
    void *ptr = NULL;
    CUDA_CHECK(cudaMalloc(&ptr, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, cuda.stream));
    return ptr;
}
static void cuda_free(void *ptr) { CUDA_CHECK(cudaFree(ptr)); }
static void cuda_zero(void *ptr, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, cuda.stream)); }
static void cuda_upload(void *dst, const void *host_src, size_t bytes) {
    comm_device_settle();
    for (size_t at = 0; at < bytes; at += STAGING_BYTES) {
        size_t n = bytes - at < STAGING_BYTES ? bytes - at : STAGING_BYTES;
        memcpy(cuda.staging, (const char *)host_src + at, n);
        CUDA_CHECK(cudaMemcpyAsync((char *)dst + at, cuda.staging, n, cudaMemcpyHostToDevice, cuda.stream));
        CUDA_CHECK(cudaStreamSynchronize(cuda.stream));
    }
}
static void cuda_download(void *host_dst, const void *src, size_t bytes) {
    comm_device_settle();
    for (size_t at = 0; at < bytes; at += STAGING_BYTES) {
        size_t n = bytes - at < STAGING_BYTES ? bytes - at : STAGING_BYTES;
        CUDA_CHECK(cudaMemcpyAsync(cuda.staging, (const char *)src + at, n, cudaMemcpyDeviceToHost, cuda.stream));
        CUDA_CHECK(cudaStreamSynchronize(cuda.stream));
        memcpy((char *)host_dst + at, cuda.staging, n);
    }
}
static void cuda_copy(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda.stream));
}

static Weight *weights_new(float *master, int64_t begin, int64_t count, int64_t n) {
    CHECK(begin >= 0 && count >= 0 && begin + count <= n,
          "CUDA backend: master range [%lld, %lld) outside the %lld weights", (long long)begin,
          (long long)(begin + count), (long long)n);
    uint16_t *bf16 = cuda_alloc(sizeof(uint16_t) * (size_t)n);
    f32_to_bf16_cuda(bf16 + begin, master, count, cuda.stream);
    return (Weight *)bf16;
}
// The bf16 copy is memory of its own, whatever the master.
static void weights_free(Weight *w, float *master) {
    (void)master;
    cuda_free(w);
}
static void weights_refresh(Weight *w, const float *master, int64_t begin, int64_t count) {
    f32_to_bf16_cuda((uint16_t *)w + begin, master, count, cuda.stream);
}
static void weights_allgather(const struct Comm *c, Weight *w, int64_t count) {
    comm_device_allgather_bf16(c, (uint16_t *)w, count, cuda.stream);
}
// Widened to fp32 on the device, then downloaded.
static void act_to_host(float *host, const Act *src, int64_t n) {
    float *wide = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&wide, sizeof(float) * (size_t)(n ? n : 1), cuda.stream));
    bf16_to_f32_cuda(wide, (const uint16_t *)src, n, cuda.stream);
    cuda_download(host, wide, sizeof(float) * (size_t)n);
    CUDA_CHECK(cudaFreeAsync(wide, cuda.stream));
}

static void embedding_forward(Act *out, const int32_t *tokens, const Weight *table, int64_t T, int H) {
    embedding_forward_cuda((uint16_t *)out, tokens, (const uint16_t *)table, T, H, cuda.stream);
}
static void embedding_backward(float *dtable, const int32_t *tokens, const Act *dout, int64_t T, int H) {
    embedding_backward_cuda(dtable, tokens, (const uint16_t *)dout, T, H, cuda.stream);
}

static void matmul_forward(Act *out, const Act *inp, const Weight *weight, const Weight *bias, int64_t T, int IC,
                           int OC) {
    matmul_forward_cuda(cuda.mm, (uint16_t *)out, (const uint16_t *)inp, (const uint16_t *)weight,
                        (const uint16_t *)bias, T, IC, OC, cuda.stream);
}

// The stream of the dW GEMMs: the dW stream, ordered after the compute stream's work so far, or the
// compute stream itself.
static cudaStream_t weight_grads_stream(void) {
    if (!cuda.dw_stream) return cuda.stream;
    CUDA_CHECK(cudaEventRecord(cuda.forked, cuda.stream));
    CUDA_CHECK(cudaStreamWaitEvent(cuda.dw_stream, cuda.forked, 0));
    cuda.dw_pending = true;
    return cuda.dw_stream;
}
static void weight_grads_join(void) {
    if (!cuda.dw_pending) return;
    CUDA_CHECK(cudaEventRecord(cuda.joined, cuda.dw_stream));
    CUDA_CHECK(cudaStreamWaitEvent(cuda.stream, cuda.joined, 0));
    cuda.dw_pending = false;
}
// The dW stream made at the first `on`; `off` joins what runs there and keeps it for a later `on`.
static void dw_stream(bool on) {
    weight_grads_join();
    if (on && !cuda.dw_made) {
        CUDA_CHECK(cudaStreamCreate(&cuda.dw_made));
        CUDA_CHECK(cudaEventCreateWithFlags(&cuda.forked, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&cuda.joined, cudaEventDisableTiming));
        matmul_cuda_second_stream(cuda.mm, cuda.dw_made);
    }
    cuda.dw_stream = on ? cuda.dw_made : NULL;
}

// dinp on the compute stream; dweight on the dW stream when there is one (forked first: beside dinp).
static void matmul_backward(Act *dinp, float *dweight, const Act *dout, const Act *inp, const Weight *weight,
                            int64_t T, int IC, int OC) {
    const cudaStream_t dw = dweight ? weight_grads_stream() : cuda.stream;
    matmul_backward_cuda(cuda.mm, (uint16_t *)dinp, NULL, (const uint16_t *)dout, (const uint16_t *)inp,
                         (const uint16_t *)weight, T, IC, OC, cuda.stream);
    if (dweight)
        matmul_backward_cuda(cuda.mm, NULL, dweight, (const uint16_t *)dout, (const uint16_t *)inp,
                             (const uint16_t *)weight, T, IC, OC, dw);
}
static void bias_backward(float *dbias, const Act *dout, int OC, int64_t T) {
    bias_grad_cuda(cuda.mm, dbias, (const uint16_t *)dout, OC, T, weight_grads_stream());
}

static void rmsnorm_forward(Act *out, float *rstd, const Act *inp, const Weight *weight, int64_t T, int H,
                            float eps) {
    rmsnorm_forward_cuda((uint16_t *)out, rstd, (const uint16_t *)inp, (const uint16_t *)weight, T, H, eps,
                         cuda.stream);
}
static void rmsnorm_backward(Act *dinp, float *dweight, const Act *dout, const Act *inp, const Weight *weight,
                             const float *rstd, int64_t T, int H) {
    rmsnorm_backward_cuda((uint16_t *)dinp, dweight, (const uint16_t *)dout, (const uint16_t *)inp,
                          (const uint16_t *)weight, rstd, T, H, cuda.stream);
}

static void residual_rmsnorm_forward(Act *out, float *rstd, Act *x, const Act *delta, const Weight *weight,
                                     int64_t T, int H, float eps) {
    residual_rmsnorm_forward_cuda((uint16_t *)out, rstd, (uint16_t *)x, (const uint16_t *)delta,
                                  (const uint16_t *)weight, T, H, eps, cuda.stream);
}
static void rope(Act *qkv, Act *q, Act *k, Act *v, int q_heads, int k_heads, const int64_t *pos, int64_t T, int D,
                 const double *inv_freq, double attention_factor, int inverse) {
    rope_cuda((uint16_t *)qkv, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, q_heads, k_heads, pos, T, D, inv_freq,
              attention_factor, inverse, cuda.stream);
}

static void swiglu_forward(Act *out, const Act *gate_up, int64_t rows, int width) {
    swiglu_forward_cuda((uint16_t *)out, (const uint16_t *)gate_up, rows, width, cuda.stream);
}
static void swiglu_backward(Act *dgate_up, const Act *dout, const Act *gate_up, int64_t rows, int width) {
    swiglu_backward_cuda((uint16_t *)dgate_up, (const uint16_t *)dout, (const uint16_t *)gate_up, rows, width,
                         cuda.stream);
}

// cuda.total on the host, once the stream's work before it is done.
static double read_total(void) {
    double total;
    cuda_download(&total, cuda.total, sizeof(total));
    return total;
}
static double sum_squares(const float *x, int64_t n) {
    cuda_zero(cuda.total, sizeof(double));
    sum_squares_cuda(x, n, cuda.total, cuda.stream);
    return read_total();
}
static void cross_entropy(Act *logits, const int32_t *targets, int64_t C, int V, float grad_scale, double *loss) {
    cross_entropy_cuda((uint16_t *)logits, targets, C, V, grad_scale, loss, cuda.stream);
}

static void attention_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const Act *q,
                              const Act *k, const Act *v, const int64_t *pos, Act *o, float *lse,
                              SparseStats *stats) {
    attention_cuda_forward(st, layer, plan, shape, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v,
                           pos, (uint16_t *)o, lse, stats, cuda.stream);
}
static void attention_backward(AttnState *st, int layer, const AttnShape *shape, const Act *q, const Act *k,
                               const Act *v, const int64_t *pos, const Act *o, const float *lse, const Act *dout,
                               Act *dq, Act *dk, Act *dv) {
    attention_cuda_backward(st, layer, shape, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, pos,
                            (const uint16_t *)o, lse, (const uint16_t *)dout, (uint16_t *)dq, (uint16_t *)dk,
                            (uint16_t *)dv, cuda.stream);
}

static void attention_cached(AttnState *st, const AttnShape *shape, const Act *q, const int64_t *q_pos,
                             const Act *k, const Act *v, const int64_t *k_pos, Act *o, float *lse) {
    attention_cuda_cached(st, shape, (const uint16_t *)q, q_pos, (const uint16_t *)k, (const uint16_t *)v, k_pos,
                          (uint16_t *)o, lse, cuda.stream);
}

static void allreduce_sum(const struct Comm *c, float *buf, int64_t n) {
    comm_device_allreduce(c, buf, n, cuda.stream);
}
static void allreduce_sum_start(const struct Comm *c, float *buf, int64_t n) {
    comm_device_allreduce_start(c, buf, n, cuda.stream, cuda.comm_stream);
}
static void allreduce_sum_finish(const struct Comm *c) { comm_device_allreduce_finish(c, cuda.comm_stream); }
static void reduce_scatter_sum(const struct Comm *c, float *arena, int64_t count) {
    comm_device_reduce_scatter(c, arena, count, cuda.stream);
}

// Whether tensors [count] are the ones the table was made from (field by
// field: a struct's padding bytes are unspecified).
static bool adamw_table_of(const AdamWTensor *tensors, int count) {
    if (!cuda.adamw_runs || count != cuda.adamw_tensor_count) return false;
    for (int t = 0; t < count; t++) {
        const AdamWTensor *a = &tensors[t], *b = &cuda.adamw_tensors[t];
        if (a->offset != b->offset || a->n != b->n || a->weight_decay != b->weight_decay) return false;
    }
    return true;
}

// The device table of runs for tensors [count]: the one made last when the
// tensors are the same, else made now (cut into runs of ADAMW_RUN, uploaded).
static const AdamWRun *adamw_runs(const AdamWTensor *tensors, int count) {
    const size_t bytes = sizeof(AdamWTensor) * (size_t)count;
    if (adamw_table_of(tensors, count)) return cuda.adamw_runs;
    int runs = 0;
    for (int t = 0; t < count; t++) runs += (int)((tensors[t].n + ADAMW_RUN - 1) / ADAMW_RUN);
    AdamWRun *host = xmalloc(sizeof(AdamWRun) * (size_t)(runs ? runs : 1));
    int r = 0;
    for (int t = 0; t < count; t++)
        for (int64_t at = 0; at < tensors[t].n; at += ADAMW_RUN)
            host[r++] = (AdamWRun){tensors[t].offset + at,
                                   tensors[t].n - at < ADAMW_RUN ? tensors[t].n - at : ADAMW_RUN,
                                   tensors[t].weight_decay};
    if (cuda.adamw_runs) cuda_free(cuda.adamw_runs);
    cuda.adamw_runs = cuda_alloc(sizeof(AdamWRun) * (size_t)runs);
    cuda_upload(cuda.adamw_runs, host, sizeof(AdamWRun) * (size_t)runs);
    free(host);
    cuda.adamw_tensors = xrealloc(cuda.adamw_tensors, bytes ? bytes : 1);
    memcpy(cuda.adamw_tensors, tensors, bytes);
    cuda.adamw_tensor_count = count;
    cuda.adamw_run_count = runs;
    return cuda.adamw_runs;
}

static void adamw(float *param, Weight *weight, const float *grad, float *m, float *v, const AdamWTensor *tensors,
                  int count, const AdamWStep *hp) {
    const AdamWRun *runs = adamw_runs(tensors, count);
    adamw_cuda(param, (uint16_t *)weight, grad, m, v, runs, cuda.adamw_run_count, hp->lr, hp->beta1, hp->beta2,
               hp->eps, hp->grad_scale, hp->step, cuda.stream);
}

static void sync_begin(void) {
#ifdef CUDASIM_HOST_SYNCS
    cudasim_host_syncs_reset();
#endif
}

static void sync_print(void) {
#ifdef CUDASIM_HOST_SYNCS
    printf("host syncs per step: %ld\n", cudasim_host_syncs(NULL));
    cudasim_host_syncs(stdout);
    long kernels, matmuls, memsets;
    const long launches = cudasim_device_launches(&kernels, &matmuls, &memsets);
    printf("device launches per step: %ld (%ld kernels, %ld cuBLASLt matmuls, %ld memsets)\n", launches, kernels,
           matmuls, memsets);
    int least = 0, greatest = 0, device_least = 0, device_greatest = 0;
    long ops = cudasim_nccl_priorities(&least, &greatest);
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&device_least, &device_greatest));
    if (ops > 0)
        printf("NCCL operations per step: %ld, on streams of priority %d to %d (the device's: %d least, %d greatest)\n",
               ops, greatest, least, device_least, device_greatest);
#else
    printf("host syncs per step: not counted (only the CPU execution model of CUDA counts them: build/sim/mtrain)\n");
#endif
    fflush(stdout);
}

// The profile's marks: events recorded on the stream, kept for the next
// profiled step (made as the first one needs them).
static struct {
    cudaEvent_t *events;
    int count, capacity;
} marks;

static int profile_mark(void) {
    if (marks.count == marks.capacity) {
        int more = marks.capacity ? 2 * marks.capacity : 1024;
        marks.events = xrealloc(marks.events, sizeof(cudaEvent_t) * (size_t)more);
        for (int i = marks.capacity; i < more; i++) CUDA_CHECK(cudaEventCreate(&marks.events[i]));
        marks.capacity = more;
    }
    CUDA_CHECK(cudaEventRecord(marks.events[marks.count], cuda.stream));
    return marks.count++;
}
static double profile_ms(int a, int b) {
    float ms;
    CUDA_CHECK(cudaEventSynchronize(marks.events[b]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, marks.events[a], marks.events[b]));
    return ms;
}
static void profile_clear(void) { marks.count = 0; }
static long profile_launches(void) {
#ifdef CUDASIM_HOST_SYNCS
    long kernels, matmuls, memsets;
    return cudasim_device_launches(&kernels, &matmuls, &memsets);
#else
    return -1;
#endif
}

// Timed: the answer MTRAIN_TEST_GEMM_ANSWER names, else the fastest. Where the timings are the CPU's (the
// CPU execution model of CUDA) a choice by them would change from run to run: timed only when a test asks.
static void gemm_choice(GemmChoice choice) {
    const int told = test_gemm_answer();   // N >= 1, -1 (fastest) or 0 (unset)
    bool timed = choice == GEMM_CHOICE_TIMED;
#ifdef CUDASIM_CPU_TIMING
    timed = timed && told != 0;
#endif
    matmul_cuda_choose(cuda.mm, timed, !timed ? 0 : told > 0 ? told - 1 : -1, timed ? stdout : NULL);
}

static void gemm_choice_print(void) {
    const MatmulChoiceCost c = matmul_cuda_choice_cost(cuda.mm);
    if (c.problems == 0) return;
    printf("gemm choice: %lld problems timed, %lld answers in %lld launches, %.2f s\n", (long long)c.problems,
           (long long)c.answers, (long long)c.launches, c.seconds);
    fflush(stdout);
}

static bool memory_peak(double *bytes) {
#ifdef CUDASIM_MEMORY_PEAK
    size_t peak;
    CUDA_CHECK(cudasimMemoryPeak(&peak));
    *bytes = (double)peak;
    return true;
#else
    (void)bytes;
    return false;
#endif
}

static const Backend cuda_backend = {
    .act_bytes = sizeof(uint16_t),
    .weight_bytes = sizeof(uint16_t),
    .on_gpu = true,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .shards_masters = true,
    .weights_new = weights_new,
    .weights_free = weights_free,
    .weights_refresh = weights_refresh,
    .weights_allgather = weights_allgather,
    .act_to_host = act_to_host,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .bias_backward = bias_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .residual_rmsnorm_forward = residual_rmsnorm_forward,
    .rope = rope,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .sum_squares = sum_squares,
    .cross_entropy = cross_entropy,
    .attention_new = attention_cuda_new,
    .attention_free = attention_cuda_free,
    .attention_set_ring = attention_cuda_set_ring,
    .attention_sequence = attention_cuda_sequence,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .attention_cached = attention_cached,
    .attention_ring_bytes = attention_cuda_ring_bytes,
    .allreduce_sum = allreduce_sum,
    .allreduce_sum_start = allreduce_sum_start,
    .allreduce_sum_finish = allreduce_sum_finish,
    .reduce_scatter_sum = reduce_scatter_sum,
    .adamw = adamw,
    .memory_peak = memory_peak,
    .sync_begin = sync_begin,
    .sync_print = sync_print,
    .profile_mark = profile_mark,
    .profile_ms = profile_ms,
    .profile_clear = profile_clear,
    .profile_launches = profile_launches,
    .gemm_choice = gemm_choice,
    .gemm_choice_print = gemm_choice_print,
    .dw_stream = dw_stream,
    .weight_grads_join = weight_grads_join,
};

bool backend_cuda_visible(char *why, size_t why_size) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        snprintf(why, why_size, "no GPU visible (cudaGetDeviceCount: %s)", cudaGetErrorString(err));
        return false;
    }
    if (count == 0) {
        snprintf(why, why_size, "no GPU visible (cudaGetDeviceCount: 0 devices)");
        return false;
    }
    return true;
}

// The stream, the cuBLASLt context and the result double, made on first use.
// The ops' scratch comes from cudaMallocAsync: the default pool keeps what
// was freed instead of returning it to the device after every synchronisation.
const Backend *backend_cuda(void) {
    if (cuda.ready) return &cuda_backend;
    char why[160];
    CHECK(backend_cuda_visible(why, sizeof(why)), "train.backend: cuda: %s", why);
    CUDA_CHECK(cudaStreamCreate(&cuda.stream));
    cuda.comm_stream = comm_device_stream_new();
    cudaMemPool_t pool;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cuda.mm = matmul_cuda_create();
    CUDA_CHECK(cudaMalloc((void **)&cuda.total, sizeof(double)));
    CUDA_CHECK(cudaMallocHost(&cuda.staging, STAGING_BYTES));
    cuda.ready = true;
    return &cuda_backend;
}

#endif
