// plan.h: the memory and time plan of a run (`mtrain plan`, and the check
// `mtrain train` makes before it allocates). Two targets: the CPU backend as
// built (fp32 everywhere; host memory of one rank, validated against the
// measured peak RSS: docs/PERFORMANCE.md) and the CUDA backend as designed
// (bf16 compute weights and activations, fp32 master weights, gradients and
// AdamW moments, ZeRO-1 over dp x cp, chunked LM head) on a GPU profile.
#ifndef MTRAIN_PLAN_H
#define MTRAIN_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

// One GPU of a cluster: the datasheet figures the plan needs.
typedef struct {
    char name[32];
    double peak_tflops;      // dense bf16 tensor-core TFLOP/s
    double hbm_gib;          // memory per GPU
    double hbm_gbs;          // memory bandwidth, GB/s
    double nvlink_gbs;       // GPU-to-GPU inside a node, GB/s per direction
    double internode_gbs;    // per GPU across nodes (its share of the node's NICs), GB/s per direction
    int gpus_per_node;
    double fp32_tflops;      // CUDA-core fp32 TFLOP/s (the sparse estimation); 0: unknown
    int sms;                 // streaming multiprocessors; 0: unknown (a GPU described in full by the hardware section)
    double clock_ghz;        // the boost clock the peak is given at
    int l2_slices;           // L2 slices of 512 KiB (the atomics' units)
} GpuProfile;

// The GPU of cfg's hardware section: the profile hardware.gpu names with
// every figure the section sets in its place, or a GPU the section describes
// in full; false when it names none (plan the CPU backend). A partial
// description without a profile stops with one line.
bool plan_gpu(const Config *cfg, GpuProfile *out);
// FLOP/s of one rank of the CPU backend: hardware.peak_tflops when set, else
// the best of 1024^3 sgemm on this rank's threads over 0.2 s, measured once
// per process (*measured says which).
double plan_cpu_peak(const Config *cfg, bool *measured);

#define PLAN_MAX_ITEMS 16
// The recompute policies a plan compares: none, selective, full.
#define PLAN_POLICIES 3

typedef struct {
    const char *name;
    double bytes;
} PlanItem;

typedef struct {
    bool gpu;                    // false: the CPU backend (fp32, host memory)
    GpuProfile hw;               // gpu only
    double peak_flops;           // FLOP/s of one rank: the GPU's bf16 peak, or the CPU's (plan_cpu_peak)
    bool peak_measured;          // CPU: peak_flops is a measured sgemm rate (not hardware.peak_tflops)
    int dp, cp, cp_inner, cp_outer;
    int64_t tokens;              // tokens of the longest cp rank's slice of one sequence
    int64_t params;              // parameters
    double density;              // fraction of the causal attention computed (1 = dense)
    bool density_assumed;        // sparse top_p: the caps' bound or --density, not a configured budget
    PlanItem items[PLAN_MAX_ITEMS];
    int num_items;
    double total_bytes;          // peak memory of one rank
    double runtime_bytes;        // GPU: of the total, the CUDA context and NCCL's buffers (not allocations)
    double capacity_bytes;       // GPU: HBM; CPU: 0 (the caller compares with MemAvailable)
    RecomputePolicy recompute;   // the policy planned: train.recompute, or auto's pick (plan_build)
    bool recompute_auto;         // train.recompute was auto
    double policy_bytes[PLAN_POLICIES];   // per policy (none, selective, full): total_bytes,
    double policy_step_s[PLAN_POLICIES];  // step_s (0: no rates)
    bool policy_fits[PLAN_POLICIES];      // and plan_fits
    double model_flops;          // per rank per optimizer step, at the density (no recomputation)
    double dense_model_flops;    // the same with dense attention
    double hardware_flops;       // with the recomputation of train.recompute
    double ring_fwd_bytes, ring_bwd_bytes;  // one ring step of one layer: K/V; K/V + dK/dV
    double inner_gbs, outer_gbs;            // GB/s per direction per GPU of a hop on the inner and outer ring
    double ring_inner_s, ring_outer_s;      // time of those on the inner (NVLink) and outer (network) links
    double attention_efficiency; // the attention forward's FLOPs over the peak times its derived time (kernel_cost.h)
    double attention_fwd_step_s; // one forward pass of one ring step of one layer, mean over ranks and steps
    double attention_step_s;     // attention compute of one ring step of one layer (forward + backward)
    double attention_backward_ratio; // attention backward time over forward time (derived; CPU: ATTN_BACKWARD_FLOPS)
    double launches, host_syncs; // GPU: kernel launches and host synchronisations per step
    double launch_s, host_sync_s;// their time per step (assumed costs: plan.c)
    double sparse_combine_s;     // the sparse plan's combine of the estimation over cp, per step (not overlapped)
    double compute_s, ring_exposed_s, reduce_s, step_s;   // GPU: compute_s is the kernels' derived bounds
    double tokens_per_s, mfu;
} Plan;

// The plan of cfg under its train.recompute (auto: the first of none,
// selective, full that fits), with each policy's memory, step and fit: on gpu (NULL = the CPU backend, whose FLOP/s is
// cpu_peak_flops, measured or configured; 0 = unknown, no times).
// density_override in (0, 1] replaces the expected density of sparse
// attention; 0 = none.
void plan_build(Plan *p, const Config *cfg, const GpuProfile *gpu, double cpu_peak_flops, bool peak_measured,
                double density_override);
// train.recompute's name of a policy.
const char *plan_recompute_name(RecomputePolicy r);
// Slash lines per head that make a sparse pattern of cfg's vertical, sink
// and local lines reach density over seq_len tokens (the inverse of the
// plan's expected density); at least 0.
double plan_slash_lines(const AttentionConfig *a, int64_t seq_len, double density);
// The full report: memory table, FLOPs, ring, times, verdict and advice.
void plan_print(const Plan *p, const Config *cfg, FILE *out);
// GPU: the plan within the usable HBM; CPU: every rank (one node) within
// MemAvailable.
bool plan_fits(const Plan *p);
// `mtrain plan`'s exit status when the run does not fit (0 when it does).
#define PLAN_EXIT_NO_FIT 3
// The `fits: yes|NO (...)` line, and when it does not fit what to change.
void plan_print_verdict(const Plan *p, const Config *cfg, FILE *out);
// The CUDA backend's kernels over one optimizer step of one GPU (`mtrain plan
// --kernels`): per kernel its calls, FLOPs and DRAM bytes, its derived time
// bound on the A100-80GB and H100 profiles and the resource that binds; the
// attention kernels' counted work (kernel_counts.h) and the rates behind the
// bounds; then the step's time and MFU on both, as markdown.
void plan_print_kernels(const Plan *p, const Config *cfg, FILE *out);
// "params 0.10 + grads 0.10 + ... = 0.45 GiB" on one line.
void plan_breakdown(const Plan *p, char *line, size_t size);
// The memory plan of one GPU on the CUDA backend (bf16 activations and
// compute weights, fp32 master, gradients and moments) for cfg, one line into
// out: each item and the total in GiB, and the usable HBM of the GPU that the
// hardware section names (none named: the items only).
void plan_print_gpu_memory(const Config *cfg, FILE *out);
// That plan into p (the hardware section's GPU: its peak for times and MFU,
// its HBM; none named: no figures, no times, no capacity, peak 0); whether
// the hardware section names a GPU.
bool plan_build_gpu_memory(Plan *p, const Config *cfg);
// `mtrain plan RUN.yaml --ring` (plan_ring.c): per layer and ring step, on
// gpu, flat and hierarchical, attention compute dense and at density (0 =
// the run's), K/V and dK/dV bytes with ring_send full and selected, their
// transfer time on the inner and outer links and whether compute hides it.
void plan_ring_print(const Config *cfg, const GpuProfile *gpu, double density, FILE *out);
// Bytes /proc/meminfo calls MemAvailable (0 if unreadable).
double plan_mem_available(void);
// Resident set of this process now, and its peak so far (bytes).
double plan_rss_now(void);
double plan_rss_peak(void);

#endif
