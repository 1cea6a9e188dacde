// ops_cuda.h: the element-wise, normalisation, embedding, loss and optimizer
// kernels of the CUDA backend (ops_cuda.cu), callable from C. Each one has the
// semantics of the CPU op of the same name in model/ops_cpu.c (model/backend.h
// documents them); the element types are the CUDA backend's: activations and
// compute weights bf16, passed as uint16_t (the bits of a bf16; dist/util.h
// converts on the host), master weights, gradients, moments and per-row
// statistics fp32. Arithmetic is fp32 inside the kernels, reductions fp32 or
// double where the CPU op uses double.
//
// Every pointer is device memory; every call is enqueued on `stream` and
// returns at once (errors through CUDA_CHECK). Backward ops ACCUMULATE (+=)
// into their gradient outputs; a bf16 output is read, added to in fp32 and
// rounded once. Every reduction runs in an order fixed by the shapes (no
// atomics), so results are bitwise reproducible.
#ifndef MTRAIN_OPS_CUDA_H
#define MTRAIN_OPS_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// out[T, H] bf16 = table[tokens[t], :] (table [V, H] bf16, tokens in [0, V)).
void embedding_forward_cuda(uint16_t *out, const int32_t *tokens, const uint16_t *table, int64_t T, int H,
                            cudaStream_t stream);
// dtable[tokens[t], :] += dout[t, :] (dtable [V, H] fp32, dout [T, H] bf16),
// each row's additions in increasing t, as on the CPU.
void embedding_backward_cuda(float *dtable, const int32_t *tokens, const uint16_t *dout, int64_t T, int H,
                             cudaStream_t stream);

// out[T, H] bf16 = inp * rstd * weight, rstd[T] fp32 = 1/sqrt(mean(inp^2) + eps)
// (mean square in double).
void rmsnorm_forward_cuda(uint16_t *out, float *rstd, const uint16_t *inp, const uint16_t *weight, int64_t T,
                          int H, float eps, cudaStream_t stream);
// The residual add fused with the norm after it: x[T, H] bf16 += delta, rounded
// once, then rmsnorm_forward_cuda of the rounded x (bitwise the two calls
// accumulate_cuda(x, delta), rmsnorm_forward_cuda(out, rstd, x), in one pass).
void residual_rmsnorm_forward_cuda(uint16_t *out, float *rstd, uint16_t *x, const uint16_t *delta,
                                   const uint16_t *weight, int64_t T, int H, float eps, cudaStream_t stream);
// dinp[T, H] bf16 += r (w dy) - x r^3 mean(w dy x); dweight[H] fp32 += sum_t dy x r.
// H at most 8192 (dweight's per-block partial sums live in shared memory).
void rmsnorm_backward_cuda(uint16_t *dinp, float *dweight, const uint16_t *dout, const uint16_t *inp,
                           const uint16_t *weight, const float *rstd, int64_t T, int H, cudaStream_t stream);

// RoPE with the split or join of the fused q|k|v projection, one launch, all
// bf16: qkv [T, (q_heads + 2 k_heads) D] (each token's q, k, v heads in
// turn), q [T, q_heads, D], k and v [T, k_heads, D]. inverse = 0: q, k, v =
// split(qkv), q and k rotated; inverse = 1 (the backward): qkv = join(q, k,
// v), q and k rotated by -angle. Rotate-half RoPE at positions pos[T],
// angle_i = pos * inv_freq[i] in double (inv_freq [D/2] from model/rope.c),
// cos and sin in double times attention_factor, rounded to fp32.
void rope_cuda(uint16_t *qkv, uint16_t *q, uint16_t *k, uint16_t *v, int q_heads, int k_heads, const int64_t *pos,
               int64_t T, int D, const double *inv_freq, double attention_factor, int inverse, cudaStream_t stream);

// On the fused gate|up projection gate_up [rows, 2 width] (each row gate [width], up
// [width]), all bf16: out [rows, width] = silu(gate) * up.
void swiglu_forward_cuda(uint16_t *out, const uint16_t *gate_up, int64_t rows, int width, cudaStream_t stream);
// dgate = dout up s (1 + g (1 - s)), dup = dout g s with s = sigmoid(g), into
// dgate_up [rows, 2 width] as gate_up is laid out (written, not added to).
void swiglu_backward_cuda(uint16_t *dgate_up, const uint16_t *dout, const uint16_t *gate_up, int64_t rows, int width,
                          cudaStream_t stream);

// y[n] += x[n], bf16.
void accumulate_cuda(uint16_t *y, const uint16_t *x, int64_t n, cudaStream_t stream);
// *total += sum of x[n]^2 (fp32 x, double sums); total is one device double,
// so the squares of many tensors add up on the GPU and are read once.
void sum_squares_cuda(const float *x, int64_t n, double *total, cudaStream_t stream);

// In place: logits[C, V] bf16 -> dlogits = (softmax - onehot(target)) * grad_scale
// for rows with target >= 0, zero rows otherwise; *loss (one device double) +=
// the summed cross entropy of the rows (each row's in fp32, summed in double).
void cross_entropy_cuda(uint16_t *logits, const int32_t *targets, int64_t C, int V, float grad_scale,
                        double *loss, cudaStream_t stream);

// One run of AdamW's table: elements [offset, offset + n) of the arrays, with
// its weight decay; a tensor is cut into runs of at most ADAMW_RUN elements,
// one block's work at a time.
#define ADAMW_RUN 65536
typedef struct {
    int64_t offset, n;
    float weight_decay;
} AdamWRun;

// AdamW in one launch over the runs [count] (a device table) of the fp32
// parameters param (grad, m, v alike): g = grad * grad_scale, m, v updated
// (the CPU op's formula) and the bf16 compute copy param_bf16 of the same
// elements written from the updated parameters.
void adamw_cuda(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v, const AdamWRun *runs,
                int count, float lr, float beta1, float beta2, float eps, float grad_scale, int64_t step,
                cudaStream_t stream);

// out[n] bf16 = in[n] rounded to nearest even: also the refresh of the bf16
// compute weights from the fp32 master.
void f32_to_bf16_cuda(uint16_t *out, const float *in, int64_t n, cudaStream_t stream);
// out[n] fp32 = in[n] bf16 (exact).
void bf16_to_f32_cuda(float *out, const uint16_t *in, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
