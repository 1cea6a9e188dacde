// ops_cpu.c: the CPU backend: fp32 ops with OpenMP, matmuls through OpenBLAS
// (cblas_sgemm). Every reduction runs in a fixed order, so results are
// bitwise reproducible for a given thread count (resume relies on it).
// Act and Weight are fp32 here, and the compute weights are the master
// itself: each op casts its table-typed arguments to float on entry. Here
// too, as every build has this file: backend_select and backend_join_devices.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../dist/comm.h"
#include "../dist/util.h"
#include "../attention/attention_api.h"
#include "backend.h"
#ifdef MTRAIN_CUDA
#include "../dist/comm_device.h"
#endif

// Buffers of 2 MiB or more on transparent huge pages where the kernel
// offers them on request (THP "madvise"): a 2 GiB arena then faults in 1K
// times, not 512K. Advice only: where the kernel has no THP it fails and
// changes nothing.
static void *cpu_alloc(size_t bytes) {
    void *ptr = xcalloc(1, bytes);
    const uintptr_t page = 4096, begin = ((uintptr_t)ptr + page - 1) & ~(page - 1), end = (uintptr_t)ptr + bytes;
    if (bytes >= (1 << 21) && end > begin) (void)madvise((void *)begin, end - begin, MADV_HUGEPAGE);
    return ptr;
}
static void cpu_free(void *ptr) { free(ptr); }

// Large zeroing and copies (the gradient arena every step, the first touch
// of an arena) in pieces of 1 MiB on every thread.
#define CPU_PIECE ((size_t)1 << 20)
static void cpu_zero(void *ptr, size_t bytes) {
    #pragma omp parallel for schedule(static) if (bytes >= 8 * CPU_PIECE)
    for (size_t at = 0; at < bytes; at += CPU_PIECE)
        memset((char *)ptr + at, 0, bytes - at < CPU_PIECE ? bytes - at : CPU_PIECE);
}
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    #pragma omp parallel for schedule(static) if (bytes >= 8 * CPU_PIECE)
    for (size_t at = 0; at < bytes; at += CPU_PIECE)
        memcpy((char *)dst + at, (const char *)src + at, bytes - at < CPU_PIECE ? bytes - at : CPU_PIECE);
}

// The compute weights are the fp32 master, always whole: nothing to copy or refresh.
static Weight *weights_new(float *master, int64_t begin, int64_t count, int64_t n) {
    CHECK(begin == 0 && count == n, "CPU backend: the master holds the whole arena (its compute weights)");
    return (Weight *)master;
}
static void weights_free(Weight *w, float *master) { CHECK((float *)w == master, "CPU weights are the master"); }
static void weights_refresh(Weight *w, const float *master, int64_t begin, int64_t count) {
    (void)w; (void)master; (void)begin; (void)count;
}
static void act_to_host(float *host, const Act *src, int64_t n) { memcpy(host, src, sizeof(float) * (size_t)n); }

static void embedding_forward(Act *out_act, const int32_t *tokens, const Weight *table_w, int64_t T, int H) {
    float *out = (float *)out_act;
    const float *table = (const float *)table_w;
    #pragma omp parallel for
    for (int64_t t = 0; t < T; t++) memcpy(out + t * H, table + (int64_t)tokens[t] * H, (size_t)H * sizeof(float));
}

// Parallel over columns so that repeated tokens never race.
static void embedding_backward(float *dtable, const int32_t *tokens, const Act *dout_act, int64_t T, int H) {
    const float *dout = (const float *)dout_act;
    #pragma omp parallel for
    for (int c0 = 0; c0 < H; c0 += 16) {
        int c1 = c0 + 16 < H ? c0 + 16 : H;
        for (int64_t t = 0; t < T; t++) {
            float *row = dtable + (int64_t)tokens[t] * H;
            const float *g = dout + t * H;
            for (int c = c0; c < c1; c++) row[c] += g[c];
        }
    }
}

static void matmul_forward(Act *out_act, const Act *inp_act, const Weight *weight_w, const Weight *bias_w, int64_t T,
                           int IC, int OC) {
    float *out = (float *)out_act;
    const float *inp = (const float *)inp_act, *weight = (const float *)weight_w, *bias = (const float *)bias_w;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, OC, IC, 1.0f, inp, IC, weight, IC,
                0.0f, out, OC);
    if (!bias) return;
    #pragma omp parallel for
    for (int64_t t = 0; t < T; t++) {
        float *row = out + t * OC;
        for (int o = 0; o < OC; o++) row[o] += bias[o];
    }
}

static void matmul_backward(Act *dinp_act, float *dweight, const Act *dout_act, const Act *inp_act,
                            const Weight *weight_w, int64_t T, int IC, int OC) {
    float *dinp = (float *)dinp_act;
    const float *dout = (const float *)dout_act, *inp = (const float *)inp_act, *weight = (const float *)weight_w;
    // dinp[T, IC] = dout[T, OC] @ weight[OC, IC], written (beta 0)
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, IC, OC, 1.0f, dout, OC, weight, IC,
                    0.0f, dinp, IC);
    // dweight[OC, IC] += dout^T[OC, T] @ inp[T, IC], in blocks of DWEIGHT_ROWS output rows: threaded
    // OpenBLAS packs dout^T's panel whole ([min(T, its K block), OC] fp32 across its threads' buffers), which
    // for the LM head (OC = vocabulary) is as large as the logits chunk; a block bounds it.
    enum { DWEIGHT_ROWS = 4096 };
    for (int o0 = 0; dweight && o0 < OC; o0 += DWEIGHT_ROWS) {
        int rows = OC - o0 < DWEIGHT_ROWS ? OC - o0 : DWEIGHT_ROWS;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, IC, (int)T, 1.0f, dout + o0, OC, inp, IC,
                    1.0f, dweight + (int64_t)o0 * IC, IC);
    }
}

// The columns in tiles of 16, the tokens in order.
static void bias_backward(float *dbias, const Act *dout_act, int OC, int64_t T) {
    const float *dout = (const float *)dout_act;
    #pragma omp parallel for
    for (int o0 = 0; o0 < OC; o0 += 16) {
        int o1 = o0 + 16 < OC ? o0 + 16 : OC;
        float acc[16] = {0};
        for (int64_t t = 0; t < T; t++)
            for (int o = o0; o < o1; o++) acc[o - o0] += dout[t * OC + o];
        for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
}

// One row: y[H] = x * r * weight, *rstd = r = 1/sqrt(mean(x^2) + eps).
static void rmsnorm_row(float *y, float *rstd, const float *x, const float *weight, int H, float eps) {
    double ss = 0;
    for (int i = 0; i < H; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / H + eps));
    *rstd = r;
    for (int i = 0; i < H; i++) y[i] = x[i] * r * weight[i];
}

static void rmsnorm_forward(Act *out_act, float *rstd, const Act *inp_act, const Weight *weight_w, int64_t T, int H,
                            float eps) {
    float *out = (float *)out_act;
    const float *inp = (const float *)inp_act, *weight = (const float *)weight_w;
    #pragma omp parallel for
    for (int64_t t = 0; t < T; t++) rmsnorm_row(out + t * H, rstd + t, inp + t * H, weight, H, eps);
}

static void residual_rmsnorm_forward(Act *out_act, float *rstd, Act *x_act, const Act *delta_act,
                                     const Weight *weight_w, int64_t T, int H, float eps) {
    float *out = (float *)out_act, *x = (float *)x_act;
    const float *delta = (const float *)delta_act, *weight = (const float *)weight_w;
    #pragma omp parallel for
    for (int64_t t = 0; t < T; t++) {
        float *row = x + t * H;
        const float *d = delta + t * H;
        for (int i = 0; i < H; i++) row[i] += d[i];
        rmsnorm_row(out + t * H, rstd + t, row, weight, H, eps);
    }
}

// y = x r w with r = (mean(x^2) + eps)^-1/2:
// dx = r (w dy) - x r^3 mean(w dy x);  dw += sum_t dy x r.
static void rmsnorm_backward(Act *dinp_act, float *dweight, const Act *dout_act, const Act *inp_act,
                             const Weight *weight_w, const float *rstd, int64_t T, int H) {
    float *dinp = (float *)dinp_act;
    const float *dout = (const float *)dout_act, *inp = (const float *)inp_act, *weight = (const float *)weight_w;
    #pragma omp parallel for
    for (int64_t t = 0; t < T; t++) {
        const float *x = inp + t * H, *dy = dout + t * H;
        float r = rstd[t];
        double dot = 0;
        for (int i = 0; i < H; i++) dot += (double)weight[i] * dy[i] * x[i];
        float coef = (float)(dot / H) * r * r * r;
        float *dx = dinp + t * H;
        for (int i = 0; i < H; i++) dx[i] += r * weight[i] * dy[i] - coef * x[i];
    }
    #pragma omp parallel for
    for (int c0 = 0; c0 < H; c0 += 16) {
        int c1 = c0 + 16 < H ? c0 + 16 : H;
        float acc[16] = {0};
        for (int64_t t = 0; t < T; t++)
            for (int c = c0; c < c1; c++) acc[c - c0] += dout[t * H + c] * inp[t * H + c] * rstd[t];
        for (int c = c0; c < c1; c++) dweight[c] += acc[c - c0];
    }
}

// Angles in double: at 512K positions an fp32 angle is off by ~0.03 rad.
// dst[heads, D] = src[heads, D] rotated by the angles whose cos and sin are in cs [D].
static void rope_heads(float *dst, const float *src, int heads, int D, const float *cs) {
    int half = D / 2;
    for (int h = 0; h < heads; h++) {
        const float *x = src + (int64_t)h * D;
        float *y = dst + (int64_t)h * D;
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[half + i], c = cs[i], s = cs[half + i];
            y[i] = x1 * c - x2 * s;
            y[half + i] = x2 * c + x1 * s;
        }
    }
}

static void rope(Act *qkv_act, Act *q_act, Act *k_act, Act *v_act, int q_heads, int k_heads, const int64_t *pos,
                 int64_t T, int D, const double *inv_freq, double attention_factor, int inverse) {
    int half = D / 2;
    const int64_t QD = (int64_t)q_heads * D, KD = (int64_t)k_heads * D;
    float *qkv = (float *)qkv_act, *q = (float *)q_act, *k = (float *)k_act, *v = (float *)v_act;
    #pragma omp parallel
    {
        float *cs = xmalloc(sizeof(float) * (size_t)D);
        #pragma omp for
        for (int64_t t = 0; t < T; t++) {
            for (int i = 0; i < half; i++) {
                double angle = (double)pos[t] * inv_freq[i];
                cs[i] = (float)(attention_factor * cos(angle));
                cs[half + i] = (float)(attention_factor * (inverse ? -sin(angle) : sin(angle)));
            }
            float *row = qkv + t * (QD + 2 * KD), *qt = q + t * QD, *kt = k + t * KD, *vt = v + t * KD;
            if (inverse) {
                rope_heads(row, qt, q_heads, D, cs);
                rope_heads(row + QD, kt, k_heads, D, cs);
                memcpy(row + QD + KD, vt, sizeof(float) * (size_t)KD);
            } else {
                rope_heads(qt, row, q_heads, D, cs);
                rope_heads(kt, row + QD, k_heads, D, cs);
                memcpy(vt, row + QD + KD, sizeof(float) * (size_t)KD);
            }
        }
        free(cs);
    }
}

// Element e of the MLP's [rows, width] activations: its gate's index in
// gate_up [rows, 2 width] (its up's is width further on).
static int64_t gate_index(int64_t e, int width) { return e / width * 2 * width + e % width; }

static void swiglu_forward(Act *out_act, const Act *gate_up_act, int64_t rows, int width) {
    float *out = (float *)out_act;
    const float *gate_up = (const float *)gate_up_act;
    #pragma omp parallel for
    for (int64_t e = 0; e < rows * width; e++) {
        const float *gu = gate_up + gate_index(e, width);
        float g = gu[0];
        out[e] = g / (1.0f + expf(-g)) * gu[width];
    }
}

static void swiglu_backward(Act *dgate_up_act, const Act *dout_act, const Act *gate_up_act, int64_t rows, int width) {
    float *dgate_up = (float *)dgate_up_act;
    const float *dout = (const float *)dout_act, *gate_up = (const float *)gate_up_act;
    #pragma omp parallel for
    for (int64_t e = 0; e < rows * width; e++) {
        const int64_t at = gate_index(e, width);
        float g = gate_up[at], u = gate_up[at + width], s = 1.0f / (1.0f + expf(-g));
        dgate_up[at] = dout[e] * u * s * (1.0f + g * (1.0f - s));
        dgate_up[at + width] = dout[e] * g * s;
    }
}

// Fixed-size chunks summed in order: the same result for any thread count.
static double sum_squares(const float *x, int64_t n) {
    const int64_t chunk = 1 << 14;
    int64_t chunks = (n + chunk - 1) / chunk;
    double *partial = xmalloc(sizeof(double) * (size_t)(chunks ? chunks : 1));
    #pragma omp parallel for
    for (int64_t c = 0; c < chunks; c++) {
        double acc = 0;
        int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (int64_t i = c * chunk; i < end; i++) acc += (double)x[i] * x[i];
        partial[c] = acc;
    }
    double total = 0;
    for (int64_t c = 0; c < chunks; c++) total += partial[c];
    free(partial);
    return total;
}

static void cross_entropy(Act *logits_act, const int32_t *targets, int64_t C, int V, float grad_scale,
                          double *loss) {
    float *logits = (float *)logits_act;
    double *row_loss = xmalloc(sizeof(double) * (size_t)(C ? C : 1));
    #pragma omp parallel for
    for (int64_t t = 0; t < C; t++) {
        float *row = logits + t * V;
        if (targets[t] < 0) {
            memset(row, 0, sizeof(float) * (size_t)V);
            row_loss[t] = 0;
            continue;
        }
        float maxv = row[0];
        for (int i = 1; i < V; i++) maxv = row[i] > maxv ? row[i] : maxv;
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - maxv);
        double lse = maxv + log(sum);
        row_loss[t] = lse - row[targets[t]];
        for (int i = 0; i < V; i++) row[i] = (float)exp((double)row[i] - lse) * grad_scale;
        row[targets[t]] -= grad_scale;
    }
    double total = 0;
    for (int64_t t = 0; t < C; t++) total += row_loss[t];
    free(row_loss);
    *loss += total;
}

// The profile's marks: the wall clock when each was made (ops run to the
// end before they return); no device launches.
static struct {
    double *seconds;
    int count, capacity;
} marks;

static int profile_mark(void) {
    if (marks.count == marks.capacity) {
        marks.capacity = marks.capacity ? 2 * marks.capacity : 1024;
        marks.seconds = xrealloc(marks.seconds, sizeof(double) * (size_t)marks.capacity);
    }
    marks.seconds[marks.count] = now_seconds();
    return marks.count++;
}
static double profile_ms(int a, int b) { return 1e3 * (marks.seconds[b] - marks.seconds[a]); }
static void profile_clear(void) { marks.count = 0; }
static long profile_launches(void) { return -1; }

// The compute weights are the master itself: weight is param.
static void adamw(float *param, Weight *weight, const float *grad, float *m, float *v, const AdamWTensor *tensors,
                  int count, const AdamWStep *hp) {
    (void)weight;
    const float beta1 = hp->beta1, beta2 = hp->beta2;
    const float c1 = 1.0f - powf(beta1, (float)hp->step), c2 = 1.0f - powf(beta2, (float)hp->step);
    for (int t = 0; t < count; t++) {
        const int64_t begin = tensors[t].offset, end = begin + tensors[t].n;
        const float weight_decay = tensors[t].weight_decay;
        #pragma omp parallel for
        for (int64_t i = begin; i < end; i++) {
            float g = grad[i] * hp->grad_scale;
            m[i] = beta1 * m[i] + (1.0f - beta1) * g;
            v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
            float mhat = m[i] / c1, vhat = v[i] / c2;
            param[i] -= hp->lr * (mhat / (sqrtf(vhat) + hp->eps) + weight_decay * param[i]);
        }
    }
}

static void allreduce_sum(const Comm *c, float *buf, int64_t n) { comm_allreduce(c, buf, n, DT_FLOAT, REDUCE_SUM); }

// The sums started and not yet finished: [started_count] of [started_capacity].
static MPI_Request *started;
static int started_count, started_capacity;

static void allreduce_sum_start(const Comm *c, float *buf, int64_t n) {
    if (started_count == started_capacity) {
        started_capacity = started_capacity ? 2 * started_capacity : 16;
        started = xrealloc(started, sizeof(MPI_Request) * (size_t)started_capacity);
    }
    comm_iallreduce_sum(c, buf, n, DT_FLOAT, &started[started_count++]);
}

static void allreduce_sum_finish(const Comm *c) {
    comm_wait(c, started, started_count, "all-reduce (sum)");
    started_count = 0;
}

// MPI's reduce-scatter may not write inside its input: the block is summed
// into a scratch copy first.
static void reduce_scatter_sum(const Comm *c, float *arena, int64_t count) {
    float *sum = xmalloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
    comm_reduce_scatter(c, arena, sum, count, DT_FLOAT);
    memcpy(arena + (int64_t)c->rank * count, sum, sizeof(float) * (size_t)count);
    free(sum);
}

static void weights_allgather(const Comm *c, Weight *w, int64_t count) {
    comm_allgather(c, NULL, (float *)w, count, DT_FLOAT);
}

// The attention op's entries: the CPU's Act is fp32 (attention_api.h).
static void attention_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const Act *q,
                              const Act *k, const Act *v, const int64_t *pos, Act *o, float *lse,
                              SparseStats *stats) {
    attention_cpu_forward(st, layer, plan, shape, (const float *)q, (const float *)k, (const float *)v, pos,
                          (float *)o, lse, stats);
}
static void attention_backward(AttnState *st, int layer, const AttnShape *shape, const Act *q, const Act *k,
                               const Act *v, const int64_t *pos, const Act *o, const float *lse, const Act *dout,
                               Act *dq, Act *dk, Act *dv) {
    attention_cpu_backward(st, layer, shape, (const float *)q, (const float *)k, (const float *)v, pos,
                           (const float *)o, lse, (const float *)dout, (float *)dq, (float *)dk, (float *)dv);
}
static void attention_cached(AttnState *st, const AttnShape *shape, const Act *q, const int64_t *q_pos,
                             const Act *k, const Act *v, const int64_t *k_pos, Act *o, float *lse) {
    attention_cpu_cached(st, shape, (const float *)q, q_pos, (const float *)k, (const float *)v, k_pos, (float *)o,
                         lse);
}

static const Backend cpu_backend = {
    .act_bytes = sizeof(float),
    .weight_bytes = sizeof(float),
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .shards_masters = false,
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
    .attention_new = attention_cpu_new,
    .attention_free = attention_cpu_free,
    .attention_set_ring = attention_cpu_set_ring,
    .attention_sequence = attention_cpu_sequence,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .attention_cached = attention_cached,
    .attention_ring_bytes = attention_cpu_ring_bytes,
    .allreduce_sum = allreduce_sum,
    .allreduce_sum_start = allreduce_sum_start,
    .allreduce_sum_finish = allreduce_sum_finish,
    .reduce_scatter_sum = reduce_scatter_sum,
    .adamw = adamw,
    .profile_mark = profile_mark,
    .profile_ms = profile_ms,
    .profile_clear = profile_clear,
    .profile_launches = profile_launches,
};

const Backend *backend_cpu(void) { return &cpu_backend; }

#ifdef MTRAIN_CUDA
const Backend *backend_select(BackendKind kind) {
    char why[160];
    if (kind == BACKEND_AUTO) return backend_cuda_visible(why, sizeof(why)) ? backend_cuda() : &cpu_backend;
    if (kind == BACKEND_CUDA) {
        if (!backend_cuda_visible(why, sizeof(why))) fail("train.backend: cuda: %s", why);
        return backend_cuda();
    }
    return &cpu_backend;
}

void backend_join_devices(BackendKind kind, Dist *d, bool nccl) {
    char why[160];
    if (kind != BACKEND_CPU && backend_cuda_visible(why, sizeof(why))) comm_device_join(d, nccl);
}
#else
const Backend *backend_select(BackendKind kind) {
    if (kind == BACKEND_CUDA) fail("train.backend: cuda: this build has no CUDA backend (build/mtrain is the CPU build; `make build/cuda/mtrain` with nvcc has it)");
    return &cpu_backend;
}

void backend_join_devices(BackendKind kind, Dist *d, bool nccl) {
    (void)kind;
    (void)d;
    (void)nccl;
}
#endif
