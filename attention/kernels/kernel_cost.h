// kernel_cost.h: the per-phase cost model of the attention kernels. From a
// kernel's counted work (kernel_counts.h: mma.sync, shared-memory bytes,
// barriers, atomics; exp2 and co-resident blocks added here) and a GPU's
// per-SM rates it predicts the kernel's time: each phase's time on its own
// unit, overlapped as far as the blocks an SM holds at once allow, plus the
// barriers' latency. The rates are measured, sourced or calibrated (each
// says which in kernel_cost.c); calibrated on the H200's measured kernels
// (docs/PLANNER.md, "The cost model"). `mtrain plan` takes attention's time
// from it; gpu_sweep_attention measures what it predicts.
#ifndef MTRAIN_KERNEL_COST_H
#define MTRAIN_KERNEL_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "kernel_counts.h"

// One GPU's rates for the model (per SM per clock unless said).
typedef struct {
    const char *name;           // a plan.c GPU profile name
    const char *arch;           // sm_80, sm_90
    int sms;
    double clock_ghz;           // SM clock the kernels run at
    double mma_per_clock;       // mma.sync.m16n8k16 bf16 per SM per clock
    double smem_bytes_per_clock;// shared memory, conflict-free (ldmatrix + cp.async)
    double exp2_per_clock;      // ex2.approx results (SFU) per SM per clock
    double atomics_per_clock;   // fp32 atomics in L2, the whole GPU per clock
    double barrier_clocks;      // a block's barrier with its pipeline drained
    double overlap;             // fraction of the non-binding phases one block hides
} AttnGpuRates;

// The rates of GPU profile `name` (trainer/plan.c's names), NULL when the model has none.
const AttnGpuRates *attn_gpu_rates(const char *name);

// exp2 (ex2.approx) per thread: one per score the kernel computes. The
// forward's two products (S = Q K^T, O += P V) and the backward's five (S,
// dP, dV, dK, dQ) each take D / 16 x 2 mma.sync per 16 x 8 scores
// (mma.m16n8k16 over head dim D), so scores = mma x 2048 / (D x products).
double attn_exp2_count(const KernelCounts *c, int head_dim, bool backward);

// Blocks an SM holds at once of today's kernels (registers and shared memory
// from ptxas, docs/PERFORMANCE.md "CUDA kernels: static resources"): the
// dense forward 2, the dense backward 1, the sparse forward 2 with blocks of
// 128 and 4 with blocks of 64 (its launch bounds; the A100 fits 3 at head
// dim 128), the sparse backward (its blocks' key-major kernel) 1 with
// blocks of 128 and 2 with blocks of 64 (about 100 KB of shared memory: the
// H100's; the A100 fits 1).
int attn_blocks_per_sm(bool sparse, bool backward, int head_dim, int block_size);

// The counted work (kernel_counts.h) of one causal pass over n tokens, heads q
// heads, head dim d: the dense kernels at density 1, else the sparse ones
// (query blocks of block_size, 64 or 128) over that share of the causal key
// tiles.
void attn_pass_counts(int d, int64_t n, double heads, double density, int block_size, KernelCounts *fwd,
                      KernelCounts *bwd);

// Seconds of each phase on its unit, and the prediction.
typedef struct {
    double mma, smem, exp2, atomics, barriers, seconds;
    const char *binds;          // the phase with the largest time
} AttnCost;

// The predicted time of one kernel's work c (summed over its launches) with
// exp2 results and blocks_per_sm co-resident blocks on g.
AttnCost attn_cost(const KernelCounts *c, double exp2, int blocks_per_sm, const AttnGpuRates *g);

#endif
