// attn_variants.h: the registry of the CUDA attention kernels' variants
// (attn_variants.cu) and the one choice of what runs. A variant is one
// template instance of a kernel (tile shape, warps, pipeline stages; the
// mma.sync kernels or the Hopper ones) with a launch function of one
// signature for every kind, so that gpu_sweep_attention (tests/sim/) can
// time each one on the same inputs and compare it with its kind's reference
// (the first variant of that kind and head dim), and every launch of the
// CUDA op and its ring goes through the variant chosen per GPU architecture
// and head dim (attn_variant_launch).
#ifndef MTRAIN_ATTN_VARIANTS_H
#define MTRAIN_ATTN_VARIANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "sparse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ATTN_DENSE_FORWARD, ATTN_DENSE_BACKWARD, ATTN_SPARSE_FORWARD, ATTN_SPARSE_BACKWARD } AttnVariantKind;

// One call of any variant: device tensors as attention_cuda.h and
// sparse_cuda.h; a kind reads what its entry point takes (the forward q, k,
// v and merges into o_acc, lse; the backward reads q, k, v, dout, the
// forward's lse_final and delta and adds into dq, dk, dv; the sparse kinds
// also read index, and compute its `part`: SPARSE_ALL, zero, unless the
// ring's steps split blocks from gathered columns).
typedef struct {
    const AttnShape *shape;
    const SparseIndexCuda *index;
    const uint16_t *q, *k, *v, *dout;
    const int64_t *q_pos, *k_pos;
    float *o_acc, *lse;
    const float *lse_final, *delta;
    float *dq, *dk, *dv;
    SparsePart part;
} AttnVariantCall;

// A variant's instruction set: the mma.sync kernels run on every GPU of the
// build (sm_80 and later) and the cost model (kernel_cost.h) predicts them;
// the Hopper kernels (sm_90a code) run on compute capability 9.0 only and
// are chosen by a sweep's row or attention.kernels: sm90, never by the model.
typedef enum { ATTN_ISA_MMA_SYNC, ATTN_ISA_SM90 } AttnVariantIsa;

typedef struct {
    const char *name;          // kind, head dim and shape, e.g. dense_fwd_d128_q128_k64_w4_s2
    AttnVariantKind kind;
    AttnVariantIsa isa;
    int head_dim;
    int tile_q, tile_k;        // queries and keys of a tile pair
    int warps, stages;         // warps per block (at most); K/V (forward) or Q/dO (backward) buffers
    void (*launch)(const AttnVariantCall *call, cudaStream_t stream);
    // The kernel (without documents) for cudaFuncGetAttributes; NULL where its file does not expose it.
    const void *(*kernel)(void);
} AttnVariant;

extern const AttnVariant attn_variants[];
extern const int attn_variant_count;

// What cudaFuncGetAttributes and the occupancy API report for a variant's
// kernel after it ran once (its launch sets the dynamic shared memory):
// registers per thread, static, dynamic and local (spilled) bytes, blocks
// per SM at warps x 32 threads. -1 everywhere when the kernel is not exposed.
typedef struct {
    int registers, blocks_per_sm;
    long static_smem, dynamic_smem, local_bytes;
} AttnVariantResources;
AttnVariantResources attn_variant_resources(const AttnVariant *v);

// Whether a GPU of compute capability `arch` (major x 10 + minor) runs v.
bool attn_variant_runs_on(const AttnVariant *v, int arch);

// A sweep's measured choice: the variant of `kind` to run at head_dim on
// compute capability arch, and its TFLOP/s on the sweep's device and date.
// attn_choice_rows: attn_choice.h's, ended by a row whose variant is NULL.
typedef struct {
    int arch, head_dim;
    AttnVariantKind kind;
    const char *variant;
    double tflops;
    const char *sweep;
} AttnChoiceRow;
extern const AttnChoiceRow attn_choice_rows[];

// How a variant was chosen: a sweep's measured row (attn_choice.h), the cost
// model's prediction, or attention.kernels alone (sm90 without a sweep row).
typedef enum { ATTN_CHOSEN_MEASURED, ATTN_CHOSEN_PREDICTED, ATTN_CHOSEN_BY_CONFIG } AttnChosenBy;
typedef struct {
    const AttnVariant *variant;   // NULL: no variant of that kind and head dim runs there
    AttnChosenBy by;
    double tflops;                // the figure behind the choice (0 when chosen by attention.kernels)
} AttnChoice;

// The variant of `kind` at head_dim to run on a GPU of compute capability
// `arch` under attention.kernels `kernels`. The candidates are the variants
// of that kind and head dim the GPU runs: under sm80 the mma.sync ones;
// under sm90 the Hopper ones where the kind has any there (else the
// mma.sync ones); under auto all. Of them: the sweep's measured choice for
// that architecture (`rows`, attn_choice_rows but in tests); else the most TFLOP/s the cost model
// predicts (kernel_cost.h, a causal pass of 16K tokens, 16 q heads; sparse
// at 5 % of the key blocks of 128) among the mma.sync candidates; else the
// first candidate. So under auto the Hopper kernels run only where a sweep
// row chose them.
AttnChoice attn_variant_choose(const AttnChoiceRow *rows, AttnVariantKind kind, int head_dim, int arch,
                               AttnKernels kernels);

// The process's attention.kernels, set by each CUDA op's creation for the
// current GPU: sm90 on a GPU without compute capability 9.0 stops with one
// line. A change forgets the choices made under the previous one.
void attn_variants_constrain(AttnKernels kernels);

// call on the variant of `kind` chosen for call->shape->head_dim on the
// current GPU under the process's attention.kernels (attn_variant_choose,
// once per kind and head dim, then kept). A head dim no variant covers
// stops with one line.
void attn_variant_launch(AttnVariantKind kind, const AttnVariantCall *call, cudaStream_t stream);

// Once per process, on stderr: the variants chosen for the dense or sparse
// kinds at head_dim on the current GPU and how, e.g. "attention kernels on
// sm_80, head_dim 64: dense_fwd_... (cost model: 180 TFLOP/s), dense_bwd_...
// (cost model: 130 TFLOP/s); no sweep for sm_80 yet".
void attn_variants_report(int head_dim, int sparse);

// The dense kernels of flash_cuda.cu without documents, for head dim 64 or
// 128: the forward (backward = 0) or the backward.
const void *attn_dense_kernel(int head_dim, int backward);

#ifdef __cplusplus
}
#endif

#endif
