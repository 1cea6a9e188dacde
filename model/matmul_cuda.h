// matmul_cuda.h: the GEMMs of the CUDA backend through cuBLASLt (matmul_cuda.cu),
// callable from C. Same semantics as the CPU backend's matmul_forward/backward
// (model/backend.h): weights in the Hugging Face layout W[OC, IC] row-major,
// activations token-major, backward ops accumulating (+=), NULL skips.
//
// Element types (the CUDA backend's mixed precision): activations, their
// gradients and the compute weights and bias are bf16 (uint16_t here: the bits
// of a bf16), the weight and bias gradients fp32; every product is summed in
// fp32 (CUBLAS_COMPUTE_32F) and a bf16 output is rounded once (twice when
// the op adds to it or adds a bias: cuBLASLt may round the product first).
//   inp, dinp   : [T, IC] bf16        out, dout : [T, OC] bf16
//   weight      : [OC, IC] bf16       bias      : [OC] bf16
//   dweight     : [OC, IC] fp32       dbias     : [OC] fp32
// Every pointer is device memory, 16-byte aligned. Every call is enqueued on
// `stream` (asynchronous; errors through CUDA_CHECK / CUBLAS_CHECK). One
// context serves two streams at a time: calls on the second stream
// (matmul_cuda_second_stream) use a workspace of their own, every other
// call the first workspace.
#ifndef MTRAIN_MATMUL_CUDA_H
#define MTRAIN_MATMUL_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// The cuBLASLt handle, the workspace (MATMUL_CUDA_WORKSPACE_BYTES of device
// memory, then MATMUL_CUDA_TIMING_BYTES for the timed runs' outputs) and the
// cache of the chosen algorithms per problem.
typedef struct MatmulCuda MatmulCuda;

#define MATMUL_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)
#define MATMUL_CUDA_TIMING_BYTES ((size_t)32 << 20)
#define MATMUL_CUDA_ANSWERS 8       // the heuristic's answers timed per problem, at most
#define MATMUL_CUDA_TIMED_RUNS 2    // timed runs of each answer, after one to warm up

MatmulCuda *matmul_cuda_create(void);
// Waits for the device (the workspace may be in use), then frees everything.
void matmul_cuda_destroy(MatmulCuda *mm);

// From now on calls on `stream` use the second workspace (MATMUL_CUDA_WORKSPACE_BYTES of device memory,
// made at the first call), so that they may run beside calls on another stream.
void matmul_cuda_second_stream(MatmulCuda *mm, cudaStream_t stream);

// How each new problem (shape, transposes, output type, epilogue, beta 0 or
// not, alignments) gets its algorithm from this call on (the cache emptied).
// timed false (as matmul_cuda_create leaves it): the heuristic's answer
// `keep` (0: its first; its last when it gives fewer). timed true: at the
// problem's first use, up to MATMUL_CUDA_ANSWERS answers each run once and
// then MATMUL_CUDA_TIMED_RUNS times between two events on the stream (one
// host wait per problem), the fastest kept (keep < 0) or answer `keep`
// (where timings are no device's: the CPU execution model of CUDA, tests);
// one line per problem on `report` (NULL: none). The timed runs write the
// output in place when beta is 0 (the call itself then writes it), else
// into the MATMUL_CUDA_TIMING_BYTES of their own, so the call's result is
// the chosen answer's alone; a larger output with beta != 0 takes answer
// `keep` (the first for keep < 0) untimed.
void matmul_cuda_choose(MatmulCuda *mm, bool timed, int keep, FILE *report);

// What the timed choices have cost since matmul_cuda_create: problems
// timed, answers timed, the launches of their runs (the warm-ups included),
// the host's seconds in them (heuristic queries and waits included).
typedef struct {
    int64_t problems, answers, launches;
    double seconds;
} MatmulChoiceCost;
MatmulChoiceCost matmul_cuda_choice_cost(const MatmulCuda *mm);

// out[T, OC] = inp[T, IC] @ weight[OC, IC]^T (+ bias[OC] when not NULL).
void matmul_forward_cuda(MatmulCuda *mm, uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                         const uint16_t *bias, int64_t T, int IC, int OC, cudaStream_t stream);

// dinp[T, IC] = dout @ weight, written (beta 0: one rounding);
// dweight[OC, IC] += dout^T @ inp. NULL dinp or dweight skips that output.
void matmul_backward_cuda(MatmulCuda *mm, uint16_t *dinp, float *dweight, const uint16_t *dout, const uint16_t *inp,
                          const uint16_t *weight, int64_t T, int IC, int OC, cudaStream_t stream);

// dbias[OC] fp32 += colsum(dout[T, OC] bf16) in two launches; summed in a
// fixed order (no atomics): the same inputs give the same bits.
void bias_grad_cuda(MatmulCuda *mm, float *dbias, const uint16_t *dout, int OC, int64_t T, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
