// backend.h: the table of operations the model graph runs on. One model
// (model.c) calls these; each backend fills the table (the CPU's in
// ops_cpu.c, the CUDA one's in backend_cuda.c). Pointers are backend memory.
// Conventions:
//   - activations are token-major: x[T, C];
//   - weights are Hugging Face layout: W[out, in] row-major;
//   - every backward op ACCUMULATES (+=) into its parameter gradients and
//     into the input gradients it does not own: rmsnorm_backward's dinp,
//     attention_backward's dq, dk, dv (callers zero them where nothing was
//     there); rope's join, swiglu_backward and matmul_backward's dinp WRITE
//     theirs (the first op to fill a buffer writes it: nothing zeroed, no
//     extra rounding).
// Element types (the compiler keeps them apart):
//   - float: master weights, parameter gradients, AdamW moments (the arenas
//     the optimizer, checkpoints and the dp/cp reduction see) and the per-row
//     statistics (rmsnorm rstd [T], attention lse [Hq, T]);
//   - Act: activations, activation gradients and the LM-head logits chunk,
//     act_bytes per element (CPU: fp32; CUDA: bf16);
//   - Weight: the compute copy of the weights that matmul, rmsnorm and the
//     embedding read, weight_bytes per element (CPU: the fp32 master itself;
//     CUDA: a bf16 copy), made by weights_new and refreshed from the master by
//     weights_refresh after every change of the master; under ZeRO-1 a
//     sharding backend's master is one shard, each rank refreshes its block
//     and weights_allgather completes the copy.
// Arithmetic inside every op is fp32 (bf16 is storage only); a backward op
// with Act outputs reads, adds and writes once.
#ifndef MTRAIN_BACKEND_H
#define MTRAIN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../attention/attention_api.h"

// A backend's activation tensor and its compute copy of the weights: opaque,
// addressed in elements of act_bytes / weight_bytes (model.c).
typedef struct Act Act;
typedef struct Weight Weight;

// One tensor of an AdamW step (Backend.adamw): its elements [offset, offset +
// n) of the run the step updates, and its weight decay.
typedef struct {
    int64_t offset, n;
    float weight_decay;
} AdamWTensor;

// The hyperparameters of one AdamW step; every gradient is multiplied by
// grad_scale first (clipping; 1 without).
typedef struct {
    float lr, beta1, beta2, eps, grad_scale;
    int64_t step;
} AdamWStep;

// The per-op profile's categories and phases (log.profile, model/profile.h).
typedef enum {
    PROFILE_GEMM, PROFILE_ATTENTION, PROFILE_NORM, PROFILE_ROPE, PROFILE_SWIGLU, PROFILE_CROSS_ENTROPY,
    PROFILE_EMBEDDING, PROFILE_OPTIMIZER, PROFILE_COMMUNICATION, PROFILE_MEMORY, PROFILE_OTHER, PROFILE_CATEGORIES
} ProfileCategory;
typedef enum {
    PHASE_FORWARD, PHASE_RECOMPUTE, PHASE_BACKWARD, PHASE_LOSS, PHASE_UPDATE, PROFILE_PHASES
} ProfilePhase;

// train.gemm_choice: how a GEMM problem gets its algorithm (Backend.gemm_choice).
typedef enum { GEMM_CHOICE_TIMED, GEMM_CHOICE_HEURISTIC } GemmChoice;
// train.dw_stream: the dW GEMMs on a second stream or not (Backend.dw_stream); auto = off.
typedef enum { DW_STREAM_AUTO, DW_STREAM_ON, DW_STREAM_OFF } DwStream;

typedef struct {
    size_t act_bytes;     // bytes of one Act element
    size_t weight_bytes;  // bytes of one Weight element
    bool on_gpu;          // memory and ops on a GPU (the run's memory plan is the GPU's)

    // memory
    void *(*alloc)(size_t bytes);                 // zero-filled
    void (*free)(void *ptr);
    void (*zero)(void *ptr, size_t bytes);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);

    // Whether the fp32 master may hold one shard of the parameters only
    // (ZeRO-1, model_shard_optimizer): true when the compute copy is memory of
    // its own (CUDA), false when the compute copy is the master (CPU).
    bool shards_masters;
    // The compute copy [n] of an fp32 arena of n floats whose range [begin,
    // begin + count) master [count] holds (backend memory; the whole arena:
    // begin 0, count n), that range filled from it, the rest zero.
    Weight *(*weights_new)(float *master, int64_t begin, int64_t count, int64_t n);
    void (*weights_free)(Weight *w, float *master);
    // w[begin, begin + count) = master[count] in the compute type (after every
    // change of the master).
    void (*weights_refresh)(Weight *w, const float *master, int64_t begin, int64_t count);
    // ZeRO-1, in place on the compute copy w [c->size * count]: block r of
    // rank r to every rank, after each rank refreshed its block (CPU: the fp32
    // master itself; CUDA: bf16, half the bytes of the fp32 master's).
    void (*weights_allgather)(const struct Comm *c, Weight *w, int64_t count);
    // host[n] = src[n] as fp32 (host memory).
    void (*act_to_host)(float *host, const Act *src, int64_t n);

    // out[T, H] = table[tokens[t], :]
    void (*embedding_forward)(Act *out, const int32_t *tokens, const Weight *table, int64_t T, int H);
    // dtable[tokens[t], :] += dout[t, :]
    void (*embedding_backward)(float *dtable, const int32_t *tokens, const Act *dout, int64_t T, int H);

    // out[T, OC] = inp[T, IC] @ weight[OC, IC]^T (+ bias[OC] when not NULL)
    void (*matmul_forward)(Act *out, const Act *inp, const Weight *weight, const Weight *bias, int64_t T, int IC,
                           int OC);
    // dinp = dout @ weight (written); dweight += dout^T @ inp. NULL skips.
    void (*matmul_backward)(Act *dinp, float *dweight, const Act *dout, const Act *inp,
                            const Weight *weight, int64_t T, int IC, int OC);
    // dbias[OC] += colsum(dout[T, OC]) (the fused q|k|v bias).
    void (*bias_backward)(float *dbias, const Act *dout, int OC, int64_t T);

    // out = inp * rstd * weight, rstd[T] = 1/sqrt(mean(inp^2) + eps)
    void (*rmsnorm_forward)(Act *out, float *rstd, const Act *inp, const Weight *weight, int64_t T, int H,
                            float eps);
    void (*rmsnorm_backward)(Act *dinp, float *dweight, const Act *dout, const Act *inp, const Weight *weight,
                             const float *rstd, int64_t T, int H);
    // The residual add and the norm after it in one pass: x[T, H] += delta
    // (one rounding to the Act type), then out = rmsnorm(x) as
    // rmsnorm_forward of that x. Its backward is rmsnorm_backward alone: it
    // accumulates into d(x), which already holds the residual's gradient.
    void (*residual_rmsnorm_forward)(Act *out, float *rstd, Act *x, const Act *delta, const Weight *weight,
                                     int64_t T, int H, float eps);

    // RoPE and the split (or join) of the fused q|k|v projection in one pass:
    // qkv [T, (q_heads + 2 k_heads) D] holds each token's q [q_heads, D], then
    // k [k_heads, D], then v [k_heads, D]; q [T, q_heads, D], k and v [T,
    // k_heads, D] are apart (attention's layout). inverse = 0 (forward): q, k,
    // v = split(qkv), q and k rotated by +angle; inverse = 1 (backward, the
    // transpose): qkv = join(q, k, v), q and k rotated by -angle; v copied.
    // Rotate-half RoPE at positions pos[T], angle_i = pos · inv_freq[i] in
    // double (inv_freq [D/2], backend memory, from model/rope.c), cos and sin
    // multiplied by attention_factor (YaRN; else 1).
    void (*rope)(Act *qkv, Act *q, Act *k, Act *v, int q_heads, int k_heads, const int64_t *pos, int64_t T, int D,
                 const double *inv_freq, double attention_factor, int inverse);

    // On the fused gate|up projection gate_up [rows, 2 width] (each row: gate [width],
    // then up [width]): out [rows, width] = silu(gate) * up; the backward writes
    // dgate_up [rows, 2 width] from dout [rows, width].
    void (*swiglu_forward)(Act *out, const Act *gate_up, int64_t rows, int width);
    void (*swiglu_backward)(Act *dgate_up, const Act *dout, const Act *gate_up, int64_t rows, int width);

    // sum of x[n]^2 in double (gradients)
    double (*sum_squares)(const float *x, int64_t n);

    // In place: logits[C, V] -> dlogits = (softmax - onehot(target)) * grad_scale for
    // rows whose target >= 0 (others zero); *loss (one double, backend memory)
    // += the summed cross entropy, so that the chunks of a sequence add up
    // where they run and the host reads the sum once.
    void (*cross_entropy)(Act *logits, const int32_t *targets, int64_t C, int V, float grad_scale, double *loss);

    // Attention: one op, dense or sparse (attention.type), over the cp ring
    // (one rank: a ring of one), behind an opaque state per model.
    // q, o, dq, dout [T, Hq, D]; k, v, dk, dv [T, Hkv, D] (after RoPE); lse
    // [Hq, T] fp32; pos [T] this rank's global positions (backend memory).
    AttnState *(*attention_new)(const AttentionConfig *cfg, int num_layers, int num_heads);
    void (*attention_free)(AttnState *st);
    // Over the ring of cp (inner ranks per inner ring) from now on, the
    // backend building the ring and handing it to its op; a new state needs
    // one before its first sequence (cp NULL: a ring of one). Returns
    // whether attention runs over a ring (false for cp NULL or one rank).
    bool (*attention_set_ring)(AttnState *st, const struct Comm *cp, int inner);
    // A new sequence: pos [tokens] this rank's global positions (host).
    // Collective over cp on a ring (every later call of the sequence is too).
    void (*attention_sequence)(AttnState *st, const int64_t *pos, int64_t tokens);
    // Layer `layer`: o, lse from q, k, v. Sparse: plan = estimate the layer's
    // pattern (a sequence's first forward); else reuse the last one (a
    // recomputation). stats: NULL, or the pattern's density and recall added.
    void (*attention_forward)(AttnState *st, int layer, bool plan, const AttnShape *shape, const Act *q,
                              const Act *k, const Act *v, const int64_t *pos, Act *o, float *lse,
                              SparseStats *stats);
    // From the forward's o, lse and dout: accumulates (+=) dq, dk, dv.
    void (*attention_backward)(AttnState *st, int layer, const AttnShape *shape, const Act *q, const Act *k,
                               const Act *v, const int64_t *pos, const Act *o, const float *lse, const Act *dout,
                               Act *dq, Act *dk, Act *dv);
    // Decoding with a KV cache (model/decode.h): o [Tq, Hq, D] and lse [Hq,
    // Tq] of the queries q [Tq, Hq, D] at positions q_pos [Tq] against the
    // cached keys and values k, v [Tk, Hkv, D] at positions k_pos [Tk]
    // (shape->q_tokens Tq, shape->k_tokens Tk; causal mask; dense whatever
    // attention.type; on this rank alone): the attention kernels' one key
    // chunk merged into a fresh running (o, lse).
    void (*attention_cached)(AttnState *st, const AttnShape *shape, const Act *q, const int64_t *q_pos,
                             const Act *k, const Act *v, const int64_t *k_pos, Act *o, float *lse);
    // Bytes this rank sent over the ring for the last sequence's attention
    // (K/V and dK/dV hops; sparse: also the gathered columns); 0 on one rank.
    double (*attention_ring_bytes)(const AttnState *st);

    // In place, the sum over the ranks of c of every rank's buf [n] (fp32,
    // backend memory): the gradient reduction. CPU: MPI; CUDA: the device
    // communicator (dist/comm_device.h: NCCL, or staged through the host).
    void (*allreduce_sum)(const struct Comm *c, float *buf, int64_t n);
    // The same in buckets: allreduce_sum_start begins the sum of buf [n]
    // behind the work queued so far and returns (CPU: MPI non-blocking; CUDA:
    // NCCL on the communication stream, which waits for the compute stream by
    // an event); allreduce_sum_finish waits for every sum started on c, so
    // that later work sees them. Between the two the started buffers must not
    // change.
    void (*allreduce_sum_start)(const struct Comm *c, float *buf, int64_t n);
    void (*allreduce_sum_finish)(const struct Comm *c);
    // ZeRO-1, in place on arena [c->size * count] (fp32, backend memory):
    // block r of the sum over c into block r on rank r (the other blocks are
    // undefined afterwards).
    void (*reduce_scatter_sum)(const struct Comm *c, float *arena, int64_t count);

    // One AdamW step on every tensor of tensors [count] in one pass: over
    // a run of fp32 master parameters param (grad, m, v alike), tensor i its
    // elements [offset, offset + n) with its weight decay; g = grad *
    // grad_scale (clipping), m, v updated, param -= lr * (mhat/(sqrt(vhat)+eps)
    // + wd*param), and the compute copy weight of the same run (weight [offset]
    // the compute weight of param [offset]; CPU: param itself) written from it.
    void (*adamw)(float *param, Weight *weight, const float *grad, float *m, float *v, const AdamWTensor *tensors,
                  int count, const AdamWStep *hp);

    // What a run reports of its device (a backend on_gpu; NULL on the CPU's).
    // Under the CPU execution model of CUDA (tests/sim/cudasim/) only: the
    // peak of the device memory this process has held (cudaMalloc and the
    // stream-ordered pool at its high-water mark), true; false on a real GPU
    // (no such figure).
    bool (*memory_peak)(double *bytes);
    // MTRAIN_SYNC_REPORT=1: sync_begin begins counting the host
    // synchronisations (the host waiting for the device) at the start of a
    // step; after it, sync_print prints "host syncs per step: N", then one
    // line per call site (file:line (function): call: count), then "device
    // launches per step: N (K kernels, M cuBLASLt matmuls, S memsets)", then the
    // priority of the streams NCCL ran on. Counted by the CPU execution model
    // of CUDA (build/sim/mtrain); a native build says it cannot.
    void (*sync_begin)(void);
    void (*sync_print)(void);

    // The per-op profile (model/profile.h). profile_phase: the phase of the
    // ops that follow (model.c marks them; NULL but in the profile's table).
    // profile_mark: a mark of the work enqueued so far, returned as its index
    // (CUDA: an event recorded on the stream; CPU: the wall clock); after the
    // step profile_ms: milliseconds from mark a to mark b (CUDA: waits for
    // b); profile_clear: the marks forgotten. profile_launches: the device
    // launches enqueued so far, as the CPU execution model of CUDA counts
    // them (-1 elsewhere).
    void (*profile_phase)(ProfilePhase phase);
    int (*profile_mark)(void);
    double (*profile_ms)(int a, int b);
    void (*profile_clear)(void);
    long (*profile_launches)(void);

    // The GEMMs' algorithms (NULL on the CPU's). gemm_choice: from now on each
    // new GEMM problem takes the cuBLASLt heuristic's first answer
    // (GEMM_CHOICE_HEURISTIC, as from the start), or the fastest of up to 8
    // of its answers timed at the problem's first use, each choice printed
    // as one line "gemm choice: ..." (GEMM_CHOICE_TIMED; MTRAIN_TEST_GEMM_ANSWER
    // keeps another, dist/test_hooks.h; under the CPU execution model of
    // CUDA, whose timings are the CPU's, only when that hook is set).
    // gemm_choice_print: one line of what the timed choices cost so far
    // (problems, answers, launches, seconds), when they timed any.
    void (*gemm_choice)(GemmChoice choice);
    void (*gemm_choice_print)(void);

    // The dW GEMMs on a second stream (NULL on the CPU's: one stream). From
    // dw_stream(true) on, matmul_backward's dweight and bias_backward run on
    // it, each after the main stream's work so far, beside the main stream's
    // dinp and what follows; weight_grads_join makes the main stream's later
    // work wait for them. The graph joins before it writes a buffer they read
    // and before a layer's gradients are final (model.c).
    void (*dw_stream)(bool on);
    void (*weight_grads_join)(void);
} Backend;

// train.backend: cpu, cuda, or auto (cuda when this build has it and a GPU
// is visible, else cpu).
typedef enum { BACKEND_CPU, BACKEND_CUDA, BACKEND_AUTO } BackendKind;

// The CPU backend (fp32, OpenMP, OpenBLAS).
const Backend *backend_cpu(void);
#ifdef MTRAIN_CUDA
// The CUDA backend (bf16 compute, fp32 master; model/backend_cuda.c): its
// stream and cuBLASLt context are made on the first call, which fails with
// one line when no GPU is visible.
const Backend *backend_cuda(void);
// Whether a GPU is visible; else why not (one line into why[why_size]).
bool backend_cuda_visible(char *why, size_t why_size);
#endif
// The backend of train.backend; one line and exit 1 when this build or this
// machine lacks it.
const Backend *backend_select(BackendKind kind);
struct Dist;
// Before a run's first backend_select: when train.backend `kind` selects the
// CUDA backend (cuda, or auto with a GPU visible), each rank of d to its GPU
// with the device communicators (NCCL when nccl, else staged through the
// host: dist/comm_device.h); nothing otherwise. A collective over d's world.
void backend_join_devices(BackendKind kind, struct Dist *d, bool nccl);

#endif
