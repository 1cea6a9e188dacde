// plan.c: `mtrain plan RUN.yaml [--gpu NAME] [--density D] [--kernels] [overrides]`:
// memory per rank, FLOPs per step, ring traffic, predicted step time,
// tokens/s and MFU, whether the run fits and what to change when it does
// not; with --kernels the CUDA backend's kernels of one step, each with its
// FLOPs, bytes and derived time bound on the A100-80GB and H100 (the
// attention kernels from their counted work, kernel_counts.h). The CPU figures follow the allocations of the CPU backend (model.c,
// train.c, checkpoint.c); the GPU figures are those of the CUDA backend as
// designed (docs/PERFORMANCE.md: the planner against measured memory, and
// the derivation of its time model).
#include "plan.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../attention/attention_api.h"
#include "../model/model.h"
#include "args.h"
#include "checkpoint.h"
#include "commands.h"

// NVIDIA datasheets: A100 Tensor Core GPU (SXM4, 2021: 312 TFLOP/s dense
// bf16; 40 GB HBM2 1555 GB/s, 80 GB HBM2e 2039 GB/s; NVLink 600 GB/s total,
// 300 GB/s per direction), H100 (SXM5: 989 TFLOP/s dense bf16, 80 GB HBM3
// 3.35 TB/s, NVLink 900 GB/s total) and H200 (SXM: 989 TFLOP/s, 141 GB HBM3e
// 4.8 TB/s, NVLink 900 GB/s). Network per GPU as in DGX A100 (one 200 Gb/s
// HDR InfiniBand NIC per GPU: 25 GB/s) and DGX H100/H200 (one 400 Gb/s NDR
// NIC per GPU: 50 GB/s). Capacities are GB (1e9 bytes) in the datasheets.
// fp32 on CUDA cores (non-tensor): A100 19.5, H100 and H200 SXM 67 TFLOP/s.
// SMs and the boost clock of the tensor peak: A100 108 SMs at 1.41 GHz
// (NVIDIA A100 whitepaper: 108 x 2048 dense bf16 FLOPs per clock x 1.41 GHz
// = 312 T), H100/H200 SXM5 132 SMs at 1.83 GHz (H100 whitepaper: 132 x 4096
// x 1.83 GHz = 989 T). L2: A100 40 MB, H100/H200 50 MB, counted in slices of
// 512 KiB (80, 100: the atomics' assumed units, below).
static const GpuProfile gpu_profiles[] = {
    {"a100-40g", 312, 40e9 / (1 << 30), 1555, 300, 25, 8, 19.5, 108, 1.41, 80},
    {"a100-80g", 312, 80e9 / (1 << 30), 2039, 300, 25, 8, 19.5, 108, 1.41, 80},
    {"h100", 989, 80e9 / (1 << 30), 3350, 450, 50, 8, 67, 132, 1.83, 100},
    {"h200", 989, 141e9 / (1 << 30), 4800, 450, 50, 8, 67, 132, 1.83, 100},
};

// GPU: CUDA context and NCCL buffers (assumed; not allocations of the
// process), and the cuBLASLt workspace with the timed GEMM runs' output
// (MATMUL_CUDA_WORKSPACE_BYTES + MATMUL_CUDA_TIMING_BYTES, model/matmul_cuda.h).
#define GPU_RUNTIME_BYTES (1.25 * (1 << 30) - GPU_CUBLASLT_WORKSPACE_BYTES)
#define GPU_CUBLASLT_WORKSPACE_BYTES (64.0 * (1 << 20))
// With train.dw_stream: the second stream's cuBLASLt workspace (MATMUL_CUDA_WORKSPACE_BYTES).
#define GPU_CUBLASLT_DW_WORKSPACE_BYTES (32.0 * (1 << 20))
// CPU: the binary, its libraries, MPI and OpenBLAS (measured: the peak RSS
// of a 100K-parameter run minus what this plan counts for it).
#define CPU_RUNTIME_BYTES (12.0 * (1 << 20))
// GPU: the plan must leave this much of HBM to the allocator's fragmentation.
#define HBM_USABLE 0.92
// The CUDA backend's act_bytes and weight_bytes (model/backend.h): bf16.
#define GPU_ACT_BYTES 2
#define GPU_WEIGHT_BYTES 2

static const double GIB = 1.0 / (1 << 30);

// The CPU's peak: the best rate of 1024^3 sgemm on this rank's threads,
// repeated for at least 0.2 s (at least 3 runs; the first warms OpenBLAS's
// threads and buffers), measured once per process.
static double measure_cpu_flops(void) {
    static double best;
    if (best > 0) return best;
    enum { N = 1024 };
    float *a = xmalloc(sizeof(float) * 3 * N * N);
    for (int i = 0; i < 3 * N * N; i++) a[i] = (float)(i % 7) * 0.1f;
    const double start = now_seconds();
    for (int r = 0; r < 3 || (now_seconds() - start < 0.2 && r < 50); r++) {
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f,
                    a + 2 * N * N, N);
        double s = now_seconds() - t0;
        if (s > 0 && 2.0 * N * N * N / s > best) best = 2.0 * N * N * N / s;
    }
    free(a);
    return best;
}

// A figure of the hardware section in place of the profile's.
static void replace_figure(double *figure, double configured) {
    if (configured > 0) *figure = configured;
}

bool plan_gpu(const Config *cfg, GpuProfile *out) {
    const HardwareConfig *h = &cfg->hardware;
    const char *name = config_enum_name(cfg, &h->gpu);
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "custom");
    for (size_t i = 0; i < sizeof(gpu_profiles) / sizeof(gpu_profiles[0]); i++)
        if (!strcmp(gpu_profiles[i].name, name)) *out = gpu_profiles[i];
    if (h->gpu == GPU_NONE && h->hbm_gib <= 0) return false;
    replace_figure(&out->peak_tflops, h->peak_tflops);
    replace_figure(&out->hbm_gib, h->hbm_gib);
    replace_figure(&out->hbm_gbs, h->hbm_gbs);
    replace_figure(&out->nvlink_gbs, h->nvlink_gbs);
    replace_figure(&out->internode_gbs, h->network_gbs);
    if (h->gpus_per_node > 0) out->gpus_per_node = h->gpus_per_node;
    if (!(out->peak_tflops > 0 && out->hbm_gbs > 0 && out->nvlink_gbs > 0 && out->internode_gbs > 0 &&
          out->gpus_per_node > 0))
        fail("hardware: a GPU without a profile (hardware.gpu: none) needs every figure: peak_tflops, hbm_gib, hbm_gbs, "
             "nvlink_gbs, network_gbs and gpus_per_node (expected all > 0, or hardware.gpu naming a profile)");
    return true;
}

double plan_cpu_peak(const Config *cfg, bool *measured) {
    *measured = !(cfg->hardware.peak_tflops > 0);
    return *measured ? measure_cpu_flops() : cfg->hardware.peak_tflops * 1e12;
}

// Parameters of the Qwen2 model c (model.c's table).
static int64_t param_count(const ModelConfig *c) {
    int64_t H = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    int64_t layer = 2 * H + H * QD + QD + 2 * (H * KD + KD) + QD * H + 3 * H * F;
    return V * H * (c->tie_word_embeddings ? 1 : 2) + c->num_layers * layer + H;
}

// Multiply-add weights per token: every layer's projections and the LM head.
static int64_t matmul_weights(const ModelConfig *c) {
    int64_t H = c->hidden_size, F = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    return c->num_layers * (2 * H * QD + 2 * H * KD + 3 * H * F) + (int64_t)c->vocab_size * H;
}

// A sparse pattern's lines other than its chosen slash lines, counted as
// vertical lines (a vertical line covers on average half of the queries, a
// slash line nearly all of them: two): a fixed budget's or the top_p cap's
// vertical lines, the sink and the local diagonals.
static double other_lines(const AttentionConfig *a) {
    double vertical = a->budget == BUDGET_FIXED ? a->vertical : a->max_vertical;
    return vertical + a->sink + 2.0 * a->local;
}

// Fraction of the causal score matrix sparse attention computes: a fixed
// budget's lines, or the top_p caps (an upper bound).
static double expected_density(const AttentionConfig *a, int64_t seq_len) {
    if (a->type == ATTN_DENSE) return 1.0;
    double slash = a->budget == BUDGET_FIXED ? a->slash : a->max_slash;
    return fmin(1.0, (other_lines(a) + 2.0 * slash) / (double)seq_len);
}

double plan_slash_lines(const AttentionConfig *a, int64_t seq_len, double density) {
    return fmax(0.0, (density * (double)seq_len - other_lines(a)) / 2.0);
}

static void add_item(Plan *p, const char *name, double bytes) {
    CHECK(p->num_items < PLAN_MAX_ITEMS, "plan: too many items");
    p->items[p->num_items++] = (PlanItem){name, bytes};
    p->total_bytes += bytes;
}

// The longest slice of one sequence a cp rank holds.
static int64_t rank_tokens(const Config *cfg, int cp) {
    int64_t most = 0;
    for (int r = 0; r < cp; r++) {
        int64_t n = layout_rank_positions(cfg->attention.layout, cfg->train.seq_len, cfg->attention.block_size, cp, r,
                                          NULL);
        if (n > most) most = n;
    }
    return most;
}

// Host memory of world rank 0 on the CPU backend (fp32): the arenas as
// model.c allocates them (the moments one shard [shard] of shards,
// parameters and gradients padded to shards × shard), the activation arena,
// and the larger of the host copies made beside it: a checkpoint write's
// (trainer/train.c, print_memory) or, on several ranks, the gradient
// all-reduce's (the arena's host copy, and as much again inside MPI:
// measured). The initialisation draws into the master in place.
static void plan_cpu_memory(Plan *p, const Config *cfg, double acts, double lm_chunk, int64_t shard,
                            int64_t shards) {
    double P = 4.0 * (double)p->params, arena = 4.0 * (double)(shard * shards);
    const ModelConfig *c = &cfg->model;
    add_item(p, "parameters (fp32)", arena);
    add_item(p, "gradients (fp32)", arena);
    add_item(p, "AdamW moments (fp32)", 8.0 * (double)shard);
    add_item(p, "activations", acts - lm_chunk);
    add_item(p, "LM-head chunk", lm_chunk);
    if (p->cp > 1) add_item(p, "ring buffers (K/V, dK/dV)", 4.0 * 4.0 * (double)p->tokens * c->num_kv_heads * c->head_dim);
    if (cfg->data.packing == PACKING_BALANCED)  // data/packing.h: the step's inputs and targets (int32)
        add_item(p, "balanced packing (the step's tokens)",
                 8.0 * (double)cfg->train.seq_len * cfg->train.micro_batches * p->dp);
    double checkpoint_write = P + (double)checkpoint_stream_bytes();  // the moments stream, sharded or not
    double allreduce = p->dp * p->cp > 1 ? 2 * P : 0;  // the arena's host copy and MPI's reduction buffer
    add_item(p, "host copies (checkpoint write or all-reduce)", fmax(checkpoint_write, allreduce));
    add_item(p, "runtime (binary, libraries, MPI)", CPU_RUNTIME_BYTES);
}

// The sparse op's memory on one GPU: the estimation scores of one layer
// (fp32 [Hq, last_q, T]), every layer's pattern (int64: per q head its
// vertical and slash lists at their capacities, the budget's or the top_p
// cap's lines plus the sink and local ones), and one index (int64, rebuilt
// from a layer's pattern when a call needs it: attention_cuda_op.cu) held at
// the bound sparse_index_bound states (docs/DECISIONS.md): this rank's rows
// (Hq x its query blocks), each with room for its diagonal block and two
// key blocks per slash line (at most the sequence's blocks) and a column
// per vertical line (with documents also the sink), the rows' starts, and
// the sparse kernels' column keys, as many as the columns (from the
// stream-ordered pool, which keeps them).
static double sparse_index_bytes(const Config *cfg, int64_t T) {
    const ModelConfig *c = &cfg->model;
    const AttentionConfig *a = &cfg->attention;
    const bool fixed = a->budget == BUDGET_FIXED;
    const double B = a->block_size, N = (double)cfg->train.seq_len, blocks = ceil(N / B);
    const double rows = (double)c->num_heads * ceil((double)T / B);
    const double vcap = fmin(N, (fixed ? a->vertical : a->max_vertical) + a->sink);
    const double scap = fmin(N, (fixed ? a->slash : a->max_slash) + a->local);
    const double row_blocks = fmin(blocks, 1 + 2 * scap);
    const double row_columns = fmin(N, vcap + (cfg->data.doc_mask ? a->sink : 0));
    return 4.0 * c->num_heads * (double)a->last_q * (double)T +
           8.0 * c->num_layers * c->num_heads * (vcap + scap + 2) +
           8.0 * rows * (row_blocks + 2 * row_columns + 2);
}

// Memory of one GPU under the CUDA backend as model.c allocates it: bf16
// compute weights, activations and LM-head chunk, fp32 row statistics (inside
// the activation arena), fp32 master weights, gradients and moments; ZeRO-1
// over dp x cp keeps one shard [shard] of shards of the master weights and
// moments, and pads the compute weights and gradients to shards × shard.
// acts: the activation arena's bytes.
static void plan_gpu_memory(Plan *p, const Config *cfg, double acts, double lm_chunk, int64_t shard,
                            int64_t shards) {
    const ModelConfig *c = &cfg->model;
    const AttentionConfig *a = &cfg->attention;
    double arena = (double)(shard * shards);
    int64_t T = p->tokens, KD = (int64_t)c->num_kv_heads * c->head_dim;
    add_item(p, "weights bf16 (compute)", GPU_WEIGHT_BYTES * arena);
    add_item(p, "weights fp32 (master)", 4.0 * (double)shard);
    add_item(p, "gradients fp32", 4 * arena);
    add_item(p, "AdamW moments fp32", 8.0 * (double)shard);
    add_item(p, "activations bf16 (statistics fp32)", acts - lm_chunk);
    // The attention op's fp32 scratch: o and the dq, dk, dv sums of one layer.
    add_item(p, "attention scratch fp32 (o, dq, dk, dv)", 4.0 * (double)T * c->head_dim * 2 * (c->num_heads + c->num_kv_heads));
    const double N = cfg->train.seq_len, Hq = c->num_heads;
    if (a->type == ATTN_SPARSE) {
        add_item(p, "sparse estimation and index", sparse_index_bytes(cfg, T));
        // sparse_select_cuda.cu: per line kind and head (2 Hq segments) of N keys, the u64 keys and their
        // sorted copy, the radix sort's temporary (one more copy) and a byte mask, from the stream-ordered
        // pool, which keeps its high-water mark (release threshold UINT64_MAX: backend_cuda.c).
        add_item(p, "sparse selection scratch (kept by the pool)", 25.0 * 2 * Hq * N);
    }
    if (p->cp > 1 && a->type == ATTN_SPARSE) {
        // ring_cuda.c: the estimation's fp32 scores [2, Hq, N]; the gathered columns of every layer (the
        // union of the ranks' vertical lines and sinks: at most Hq x (V + sink) tokens), their K/V kept
        // for the backward (bf16), their dK/dV and the collective's message (fp32).
        const double V = a->budget == BUDGET_FIXED ? a->vertical : a->max_vertical;
        const double n = fmin(N, Hq * (V + a->sink));
        add_item(p, "ring estimation scores fp32", 8.0 * Hq * N);
        add_item(p, "sparse columns (K/V of every layer, dK/dV)", n * KD * (4.0 * c->num_layers + 8 + 8));
    }
    // ring.c's buffers (K/V chunks: 2 travelling on the outer ring, 2 on the inner, 2 packed hops with
    // ring_send selected; dK/dV: 3 going out, 3 coming in), ring_cuda.c's staging copy [2, T, KD] fp32,
    // delta [Hq, T] fp32 and the sequence's positions (int64).
    if (p->cp > 1)
        add_item(p, "ring buffers (K/V bf16, dK/dV fp32, staging)",
                 (double)T * KD * (2 * 2 * (a->ring_send == RING_SEND_SELECTED ? 6 : 4) + 2 * 4 * 6 + 2 * 4) +
                     4 * Hq * T + 8 * N);
    add_item(p, "LM-head chunk (bf16 logits)", lm_chunk);
    add_item(p, "cuBLASLt workspace", GPU_CUBLASLT_WORKSPACE_BYTES);
    if (config_dw_stream_on(cfg)) add_item(p, "cuBLASLt workspace of the dW stream", GPU_CUBLASLT_DW_WORKSPACE_BYTES);
    add_item(p, "CUDA context, NCCL buffers (assumed)", GPU_RUNTIME_BYTES);
    p->runtime_bytes = GPU_RUNTIME_BYTES;
}

// ---- the per-kernel table (`mtrain plan --kernels`) and the time model ----

// What bounds a kernel: cuBLASLt GEMMs (the tensor peak in whole waves of
// output tiles, or the bytes), our attention kernels (their counted work,
// kernel_counts.h, at the GPU's rates), fp32 on CUDA cores (the sparse
// estimation), the bytes alone (memory-bound kernels).
typedef enum { KERNEL_GEMM, KERNEL_ATTENTION, KERNEL_FP32, KERNEL_MEMORY } KernelKind;

// One cuBLASLt GEMM shape: m x n output over k, `count` calls per step.
typedef struct {
    double m, n, k, count;
} GemmShape;

#define MAX_ROW_GEMMS 21

typedef struct {
    const char *name;
    double calls, flops, bytes;   // per step; flops and bytes summed over the calls
    double shared_bytes;          // KERNEL_FP32: shared-memory wavefronts as bytes (plain accesses), summed
    KernelKind kind;
    KernelCounts counts;          // KERNEL_ATTENTION: the counted work summed over the calls
    double exp2;                  // KERNEL_ATTENTION: its exp2 results, and its blocks per SM (kernel_cost.h)
    int blocks_per_sm;
    GemmShape gemms[MAX_ROW_GEMMS];
    int num_gemms;
} KernelRow;

#define MAX_KERNEL_ROWS 24

static int add_kernel(KernelRow *rows, int n, const char *name, double calls, double flops, double bytes,
                      KernelKind kind) {
    CHECK(n < MAX_KERNEL_ROWS, "plan: too many kernel rows");
    rows[n] = (KernelRow){.name = name, .calls = calls, .flops = flops, .bytes = bytes, .kind = kind};
    return n + 1;
}

static void add_gemm(KernelRow *r, double m, double n, double k, double count) {
    CHECK(r->num_gemms < MAX_ROW_GEMMS, "plan: too many GEMM shapes in a row");
    r->gemms[r->num_gemms++] = (GemmShape){m, n, k, count};
}

static KernelCounts counts_times(KernelCounts c, double calls) {
    return (KernelCounts){c.launches * calls, c.blocks * calls, c.mma * calls, c.ldmatrix_bytes * calls,
                          c.cp_async_bytes * calls, c.shuffles * calls, c.barriers * calls, c.atomics * calls};
}

// The attention kernels' counted work over one layer's pass of the rank's
// queries against the whole sequence (N tokens, Hq heads, head dim D): the
// counts of one causal sequence (attn_pass_counts) over cp ranks (the striped
// and zigzag layouts deal the causal work evenly; every count is linear in
// the tiles and pairs); sparse, the sparse kernels over the density's share
// of the causal key tiles.
static void attention_counts(const Plan *p, const Config *cfg, KernelCounts *fwd, KernelCounts *bwd) {
    const ModelConfig *c = &cfg->model;
    const int D = c->head_dim ? c->head_dim : c->hidden_size / c->num_heads;
    attn_pass_counts(D, cfg->train.seq_len, c->num_heads, p->density, cfg->attention.block_size, fwd, bwd);
    *fwd = counts_times(*fwd, 1.0 / p->cp);
    *bwd = counts_times(*bwd, 1.0 / p->cp);
}

// What the cost model needs of an attention row besides its counts.
static void set_attention_cost(KernelRow *r, const Plan *p, const Config *cfg, bool backward) {
    const ModelConfig *c = &cfg->model;
    const int D = c->head_dim ? c->head_dim : c->hidden_size / c->num_heads;
    r->exp2 = attn_exp2_count(&r->counts, D, backward);
    r->blocks_per_sm = attn_blocks_per_sm(p->density < 1.0, backward, D, cfg->attention.block_size);
}

// The kernels of one optimizer step on one GPU as model.c calls them on the
// CUDA backend (bf16 activations and compute weights 2 bytes, fp32 gradients,
// master, moments and accumulators 4), with the plan's tokens per GPU. Bytes:
// every tensor moved between HBM and the chip once per call (a lower bound:
// perfect reuse in shared memory and L2); an accumulated output is read and
// written. Recomputation runs every layer's forward twice, attention's
// (recompute full) or all of it but attention (selective).
static int kernel_rows(const Plan *p, const Config *cfg, KernelRow *rows) {
    const ModelConfig *c = &cfg->model;
    const double T = (double)p->tokens * cfg->train.micro_batches, L = c->num_layers, H = c->hidden_size;
    const double F = c->intermediate_size, V = c->vocab_size, D = c->head_dim ? c->head_dim : H / c->num_heads;
    const double QD = c->num_heads * D, KD = c->num_kv_heads * D, P = (double)p->params;
    const double fwd = p->recompute != RECOMPUTE_NONE ? 2 : 1;       // forward passes of a layer (the plan's policy)
    const double attn_fwd = p->recompute == RECOMPUTE_FULL ? 2 : 1;  // forward passes of its attention
    const double micro = cfg->train.micro_batches, Tm = (double)p->tokens;
    const double chunks = ceil((double)p->tokens / cfg->train.loss_chunk) * cfg->train.micro_batches;
    const double chunk_rows = fmin((double)cfg->train.loss_chunk, Tm);
    const double shards = cfg->parallel.zero == 1 ? (double)p->dp * p->cp : 1.0;
    // A layer's GEMMs (in, out): q|k|v fused (its bias in the epilogue), o, gate|up fused, down; each
    // dX written (beta 0). Forward calls per layer: every pass runs all but down, which the
    // recomputation leaves out.
    const double gemm_io[4][2] = {{H, QD + 2 * KD}, {QD, H}, {H, 2 * F}, {F, H}};
    const double gemm_calls[4] = {fwd, fwd, fwd, 1};
    double gf = 0, gf_fwd = 0, gf_fwd_bytes = 0, gb_bytes = 0, fwd_calls = 0;
    for (int g = 0; g < 4; g++) {
        const double IC = gemm_io[g][0], OC = gemm_io[g][1];
        gf += 2 * T * IC * OC;
        gf_fwd += 2 * T * IC * OC * gemm_calls[g];
        gf_fwd_bytes += 2 * (T * IC + IC * OC + T * OC) * gemm_calls[g];
        gb_bytes += (2 * T * OC + 2 * IC * OC + 2 * T * IC) + (2 * T * OC + 2 * T * IC + 8 * IC * OC);
        fwd_calls += gemm_calls[g];
    }
    int n = 0;
    n = add_kernel(rows, n, "GEMMs of the layers, forward", fwd_calls * L, gf_fwd * L, gf_fwd_bytes * L, KERNEL_GEMM);
    for (int g = 0; g < 4; g++) add_gemm(&rows[n - 1], Tm, gemm_io[g][1], gemm_io[g][0], L * gemm_calls[g] * micro);
    n = add_kernel(rows, n, "GEMMs of the layers, dX and dW", 8 * L, 2 * gf * L, gb_bytes * L, KERNEL_GEMM);
    for (int g = 0; g < 4; g++) {
        add_gemm(&rows[n - 1], Tm, gemm_io[g][0], gemm_io[g][1], L * micro);               // dX = dY W
        add_gemm(&rows[n - 1], gemm_io[g][0], gemm_io[g][1], Tm, L * micro);               // dW = X^T dY
    }
    // The q|k|v bias gradient: a column sum of d(q|k|v) in two launches.
    n = add_kernel(rows, n, "bias gradients", 2 * L, 0, L * (2 * T * (QD + 2 * KD) + 8 * (QD + 2 * KD)),
                   KERNEL_MEMORY);
    n = add_kernel(rows, n, "LM head, forward (per chunk)", chunks, 2 * T * H * V,
                   chunks * 2 * V * H + 2 * T * H + 2 * T * V, KERNEL_GEMM);
    add_gemm(&rows[n - 1], chunk_rows, V, H, chunks);
    n = add_kernel(rows, n, "LM head, dX and dW (per chunk)", 2 * chunks, 4 * T * H * V,
                   chunks * 10 * V * H + 4 * T * V + 6 * T * H, KERNEL_GEMM);
    add_gemm(&rows[n - 1], chunk_rows, H, V, chunks);
    add_gemm(&rows[n - 1], V, H, chunk_rows, chunks);
    // Causal attention of the rank's queries against the sequence (plan_flops); the forward also
    // initialises, merges and converts the fp32 output, the backward zeroes, accumulates (atomics)
    // and adds the fp32 dq, dk, dv into their bf16 tensors.
    const double N = (double)cfg->train.seq_len;
    const double attn = 2.0 * N * N * c->num_heads * D / p->cp * p->density * cfg->train.micro_batches;
    KernelCounts fwd_counts, attn_bwd;
    attention_counts(p, cfg, &fwd_counts, &attn_bwd);
    n = add_kernel(rows, n, "attention forward", L * attn_fwd, attn * L * attn_fwd,
                   L * attn_fwd * (2 * T * (QD + 2 * KD) + 18 * T * QD), KERNEL_ATTENTION);
    rows[n - 1].counts = counts_times(fwd_counts, L * attn_fwd * micro);
    set_attention_cost(&rows[n - 1], p, cfg, false);
    n = add_kernel(rows, n, "attention backward", L, ATTN_BACKWARD_FLOPS * attn * L,
                   L * (2 * T * (5 * QD + 2 * KD) + 20 * T * (QD + 2 * KD)), KERNEL_ATTENTION);
    rows[n - 1].counts = counts_times(attn_bwd, L * micro);
    set_attention_cost(&rows[n - 1], p, cfg, true);
    if (cfg->attention.type == ATTN_SPARSE) {   // last_q queries against the rank's N / cp keys, both passes
        const int64_t Lq = cfg->attention.last_q < N ? cfg->attention.last_q : (int64_t)N;
        const EstimationCounts e = sparse_estimation_counts((int)D, c->num_heads, c->num_kv_heads, Lq,
                                                            (int64_t)ceil(N / p->cp));
        n = add_kernel(rows, n, "sparse estimation", L * micro, 2 * e.fma * L * micro, e.hbm_bytes * L * micro,
                       KERNEL_FP32);
        rows[n - 1].shared_bytes = e.shared_bytes * L * micro;
        // every rank selects on the whole sequence; its index covers its own query blocks and is built for the
        // forward, each recomputation and the backward. Lines per head: the budget's vertical (and sink) and
        // slash (and local) lines, scaled to density x N = vertical + sink + 2 (slash + local) where they exceed it
        const AttentionConfig *a = &cfg->attention;
        const double vertical = other_lines(a) - 2.0 * a->local;
        const double slash = plan_slash_lines(a, cfg->train.seq_len, p->density) + a->local;
        const double fit = fmin(1.0, p->density * N / (vertical + 2 * slash));
        const double index_rows = c->num_heads * ceil(Tm / a->block_size);
        n = add_kernel(rows, n, "sparse selection", L * micro, 0,
                       sparse_selection_bytes(c->num_heads, cfg->train.seq_len) * L * micro, KERNEL_MEMORY);
        n = add_kernel(rows, n, "sparse index", (attn_fwd + 1) * L * micro, 0,
                       sparse_index_build_bytes(index_rows, fit * vertical, fit * slash) * (attn_fwd + 1) * L * micro, KERNEL_MEMORY);
    }
    n = add_kernel(rows, n, "embedding forward", 1, 0, 4 * T * H, KERNEL_MEMORY);
    n = add_kernel(rows, n, "embedding backward", 1, 0, 10 * T * H, KERNEL_MEMORY);
    // Both residual adds of a layer fused with the norm after them; the input norm alone for the first
    // layer and in every recomputation.
    const double input_norms = 1 + L * (fwd - 1), fused_norms = 2 * L + L * (fwd - 1);
    n = add_kernel(rows, n, "rmsnorm forward (input)", input_norms, 0, input_norms * 4 * T * H, KERNEL_MEMORY);
    n = add_kernel(rows, n, "residual add + rmsnorm (fused)", fused_norms, 0, fused_norms * 8 * T * H,
                   KERNEL_MEMORY);
    n = add_kernel(rows, n, "rmsnorm backward", 2 * L + 1, 0, (2 * L + 1) * 8 * T * H, KERNEL_MEMORY);
    n = add_kernel(rows, n, "rope forward (q, k, v split)", L * fwd, 0, L * fwd * 4 * T * (QD + 2 * KD), KERNEL_MEMORY);
    n = add_kernel(rows, n, "rope backward (dq, dk, dv joined)", L, 0, L * 4 * T * (QD + 2 * KD), KERNEL_MEMORY);
    n = add_kernel(rows, n, "swiglu forward", L * fwd, 0, L * fwd * 6 * T * F, KERNEL_MEMORY);
    n = add_kernel(rows, n, "swiglu backward", L, 0, L * 10 * T * F, KERNEL_MEMORY);
    // dq, dk, dv (the attention backward adds into them) per layer, d(x_final) once; every other
    // activation gradient is written by its first op.
    n = add_kernel(rows, n, "zeroing activation gradients", L + 1, 0, L * 2 * T * (QD + 2 * KD) + 2 * T * H,
                   KERNEL_MEMORY);
    n = add_kernel(rows, n, "cross entropy (per chunk)", chunks, 0, 6 * T * V, KERNEL_MEMORY);
    n = add_kernel(rows, n, "zeroing gradients, norm", 2, 0, 8 * P, KERNEL_MEMORY);   // clipping inside AdamW
    n = add_kernel(rows, n, "adamw + bf16 copy", 1, 0, 30 * P / shards, KERNEL_MEMORY);
    return n;
}

// The rates a GPU's resources deliver (per second): mma.sync.m16n8k16 (4096
// FLOPs each) at the dense bf16 peak; shared memory 32 banks of 4 bytes per
// clock per SM (CUDA C++ Programming Guide, Shared Memory; compute capability
// 8.x and 9.0), read by ldmatrix and written by cp.async; HBM at the
// datasheet's bandwidth; warp shuffles 32 results per clock per SM, one warp
// instruction (Programming Guide, Arithmetic Instructions: throughput table);
// fp32 atomics in L2 assumed at one 32-byte sector per clock per L2 slice,
// with 4 of a warp's lanes per sector (the kernels' dq, dk, dv fragments:
// lanes t4 = 0..3 of a row add to 4 floats 8 bytes apart; no published rate).
// A GPU described in full by the hardware section has no SM count: only its
// tensor peak and HBM bound the kernels.
#define MMA_FLOPS 4096.0
#define SMEM_BYTES_PER_CLOCK 128.0
#define ATOMICS_PER_SECTOR 4.0
typedef struct {
    double mma, smem, hbm, atomics, shuffles;
} GpuRates;

static GpuRates gpu_rates(const GpuProfile *g) {
    const double clock = g->clock_ghz * 1e9;
    return (GpuRates){g->peak_tflops * 1e12 / MMA_FLOPS, g->sms * SMEM_BYTES_PER_CLOCK * clock, g->hbm_gbs * 1e9,
                      g->l2_slices * clock * ATOMICS_PER_SECTOR, g->sms * clock};
}

// cuBLASLt (not our kernels, nothing counted): a GEMM's m x n output in tiles
// of GEMM_TILE_M x GEMM_TILE_N, the tiles in whole waves over the SMs, each
// tile at one SM's share of the tensor peak (tile and wave quantisation; the
// tile is cuBLASLt's common large bf16 tile, an assumption).
#define GEMM_TILE_M 256.0
#define GEMM_TILE_N 128.0
static double gemm_seconds(const GemmShape *s, const GpuProfile *gpu) {
    const double peak = gpu->peak_tflops * 1e12;
    if (gpu->sms <= 0) return s->count * 2 * s->m * s->n * s->k / peak;
    const double tiles = ceil(s->m / GEMM_TILE_M) * ceil(s->n / GEMM_TILE_N);
    const double waves = ceil(tiles / gpu->sms);
    return s->count * waves * gpu->sms * 2 * GEMM_TILE_M * GEMM_TILE_N * s->k / peak;
}

// One resource's time, and the name of the one that binds so far.
static double bind(double t, double seconds, const char *name, const char **binds) {
    if (seconds > t) *binds = name;
    return fmax(t, seconds);
}

// The derived time of a row on gpu: the largest of its resources' times
// (bytes at the HBM bandwidth for every kind; the GEMMs' waves; the
// estimation's FLOPs at the fp32 peak); the attention kernels' time from the
// cost model where it has the GPU's rates (kernel_cost.h), else the largest of
// their counted mma, shared-memory bytes, atomics and shuffles at the peak
// rates; *binds names the resource.
static double kernel_seconds(const KernelRow *r, const GpuProfile *gpu, const char **binds) {
    const GpuRates rate = gpu_rates(gpu);
    *binds = "HBM";
    double t = r->bytes / rate.hbm;
    if (r->kind == KERNEL_FP32 && gpu->fp32_tflops > 0) t = bind(t, r->flops / (gpu->fp32_tflops * 1e12), "fp32", binds);
    if (r->kind == KERNEL_FP32 && rate.smem > 0) t = bind(t, r->shared_bytes / rate.smem, "shared memory", binds);
    if (r->kind == KERNEL_GEMM) {
        double waves = 0;
        for (int i = 0; i < r->num_gemms; i++) waves += gemm_seconds(&r->gemms[i], gpu);
        t = bind(t, waves, "tensor (waves)", binds);
    }
    const AttnGpuRates *model = attn_gpu_rates(gpu->name);
    if (r->kind == KERNEL_ATTENTION && model) {
        const AttnCost cost = attn_cost(&r->counts, r->exp2, r->blocks_per_sm, model);
        if (cost.seconds > t) *binds = cost.binds;
        t = fmax(t, cost.seconds);
    } else if (r->kind == KERNEL_ATTENTION) {
        const KernelCounts *c = &r->counts;
        t = bind(t, c->mma / rate.mma, "tensor", binds);
        if (rate.smem > 0) t = bind(t, (c->ldmatrix_bytes + c->cp_async_bytes) / rate.smem, "shared memory", binds);
        if (rate.atomics > 0) t = bind(t, c->atomics / rate.atomics, "L2 atomics", binds);
        if (rate.shuffles > 0) t = bind(t, c->shuffles / rate.shuffles, "shuffles", binds);
    }
    return t;
}

// The kernels of one step on gpu: the sum of their derived bounds, the
// attention rows' (forward, backward) and the launches.
static double kernels_seconds(const Plan *p, const Config *cfg, const GpuProfile *gpu, double *attn_fwd_s,
                              double *attn_bwd_s, double *launches) {
    KernelRow rows[MAX_KERNEL_ROWS];
    const int n = kernel_rows(p, cfg, rows);
    double total = 0;
    *launches = 0;
    for (int i = 0; i < n; i++) {
        const char *binds;
        const double t = kernel_seconds(&rows[i], gpu, &binds);
        total += t;
        *launches += rows[i].calls;
        if (!strcmp(rows[i].name, "attention forward")) *attn_fwd_s = t;
        if (!strcmp(rows[i].name, "attention backward")) *attn_bwd_s = t;
    }
    return total;
}

// Per launch and per host synchronisation, the time the device idles
// (assumed: a launch's overhead where kernels are short, a synchronisation's
// round trip through the host with the queue drained).
#define LAUNCH_S 3e-6
#define HOST_SYNC_S 20e-6
// Host synchronisations per step as the sim counts them (docs/SIM.md,
// MTRAIN_SYNC_REPORT): the one statement of that count, which plan prints
// ("(N syncs)") and tests/sim/test_sync_report.sh compares with counted runs
// of each case below.
static double host_syncs(const Plan *p, const Config *cfg) {
    const double L = cfg->model.num_layers * (double)cfg->train.micro_batches;  // layers of all micro batches
    const bool ring = p->cp > 1, sparse = cfg->attention.type == ATTN_SPARSE;
    double syncs = 7;                      // one rank, dense or sparse: the step's uploads and downloads
    if (ring) syncs += 2;                  // a ring, whatever its size and the layers
    if (ring && sparse)                    // a sparse ring's plan stays on the device; ring_send selected reads
        syncs += cfg->attention.ring_send == RING_SEND_SELECTED ? 1 + 3 * L : 2;  // the need rows back per layer
    if (cfg->data.doc_mask) syncs += cfg->train.micro_batches;  // the op's wait before it copies document starts
    return syncs;
}

// FLOPs of one optimizer step on one rank: the GEMMs of its tokens (6 per
// weight per token: forward, dX, dW) and the causal attention of its slice
// (forward 2 GEMMs, backward ATTN_BACKWARD_FLOPS x forward).
static void plan_flops(Plan *p, const Config *cfg) {
    const ModelConfig *c = &cfg->model;
    double N = (double)cfg->train.seq_len, micro = cfg->train.micro_batches;
    double tokens = (double)p->tokens * micro;
    double gemm = 6.0 * (double)matmul_weights(c) * tokens;
    double attn_fwd = 2.0 * N * N * c->num_heads * c->head_dim * c->num_layers * micro / p->cp;
    p->dense_model_flops = gemm + (1 + ATTN_BACKWARD_FLOPS) * attn_fwd;
    p->model_flops = gemm + (1 + ATTN_BACKWARD_FLOPS) * attn_fwd * p->density;
    // Recomputation runs every layer's GEMMs again but the down projection's (full: its attention too);
    // without it an MLP in chunks recomputes its gate and up.
    const RecomputePolicy policy = p->recompute;
    const double H = c->hidden_size, F = c->intermediate_size;
    const double recomputed_gemm = 2.0 * tokens * c->num_layers * H * (2.0 * c->num_heads * c->head_dim +
                                                                       2.0 * c->num_kv_heads * c->head_dim + 2 * F);
    double recompute = policy == RECOMPUTE_NONE ? 0.0
                       : recomputed_gemm + (policy == RECOMPUTE_FULL ? attn_fwd * p->density : 0);
    if (policy == RECOMPUTE_NONE && model_mlp_chunk_rows(cfg->train.mlp_chunk, policy, p->tokens))
        recompute += 4.0 * tokens * c->hidden_size * c->intermediate_size * c->num_layers;
    p->hardware_flops = p->model_flops + recompute;
    if (p->peak_flops <= 0) return;
    const double steps = micro * c->num_layers * p->cp, fwd_passes = policy == RECOMPUTE_FULL ? 2 : 1;
    if (!p->gpu) {   // the FLOPs at the rank's peak
        const double forward = attn_fwd * p->density / p->peak_flops;
        p->attention_efficiency = 1.0;
        p->compute_s = (gemm + recompute) / p->peak_flops + (1 + ATTN_BACKWARD_FLOPS) * forward;
        p->attention_fwd_step_s = forward / steps;
        p->attention_step_s = (fwd_passes + ATTN_BACKWARD_FLOPS) * p->attention_fwd_step_s;
        p->attention_backward_ratio = ATTN_BACKWARD_FLOPS;
        return;
    }
    // The kernels of the step (plan_print_kernels' rows) at their derived bounds.
    double fwd_s = 0, bwd_s = 0;
    p->compute_s = kernels_seconds(p, cfg, &p->hw, &fwd_s, &bwd_s, &p->launches);
    p->attention_fwd_step_s = fwd_s / fwd_passes / steps;
    p->attention_step_s = (fwd_s + bwd_s) / steps;
    p->attention_backward_ratio = bwd_s / (fwd_s / fwd_passes);
    p->attention_efficiency = attn_fwd * p->density / (p->peak_flops * fwd_s / fwd_passes);
    p->host_syncs = host_syncs(p, cfg);
    p->launch_s = p->launches * LAUNCH_S;
    p->host_sync_s = p->host_syncs * HOST_SYNC_S;
}

// Ring traffic of one layer per ring step (bf16 K/V forward; K/V and the
// fp32 dK/dV accumulators backward), the time of one hop inside and across
// nodes, and what of it attention compute does not hide: an inner hop
// overlaps one ring step's attention, an outer hop of the hierarchical ring
// the whole inner round (cp_inner steps); a flat ring that spans nodes waits
// for its slowest (network) hop at every step. Then the gradient reduction
// over dp x cp (reduce-scatter + bf16 all-gather under ZeRO, an all-reduce
// otherwise), counted as not overlapped; and, sparse on cp > 1, the plan
// forward's combine of the estimation's partial vertical and slash sums
// [2, Hq, N] fp32 over cp, once per layer (a reduce-scatter and an
// all-gather on device buffers, attention/ring/ring_cuda.c; the small lse and
// query all-gathers not counted), not overlapped either: the selection
// waits for it.
static void plan_communication(Plan *p, const Config *cfg) {
    const ModelConfig *c = &cfg->model;
    double KD = (double)c->num_kv_heads * c->head_dim, T = (double)p->tokens;
    double elem = p->gpu ? 2.0 : 4.0;
    p->ring_fwd_bytes = 2 * T * KD * elem;
    p->ring_bwd_bytes = 2 * T * KD * elem + 2 * T * KD * 4;
    if (!p->gpu) return;
    bool spans_nodes = p->cp > p->hw.gpus_per_node;
    p->inner_gbs = p->cp_outer == 1 && spans_nodes ? p->hw.internode_gbs : p->hw.nvlink_gbs;
    p->outer_gbs = spans_nodes ? p->hw.internode_gbs : p->hw.nvlink_gbs;
    p->ring_inner_s = (p->ring_fwd_bytes + p->ring_bwd_bytes) / (p->inner_gbs * 1e9);
    p->ring_outer_s = (p->ring_fwd_bytes + p->ring_bwd_bytes) / (p->outer_gbs * 1e9);
    double inner_hops = (double)(p->cp_inner - 1) * p->cp_outer, outer_hops = p->cp_outer - 1;
    double per_layer = inner_hops * fmax(0, p->ring_inner_s - p->attention_step_s) +
                       outer_hops * fmax(0, p->ring_outer_s - p->cp_inner * p->attention_step_s);
    p->ring_exposed_s = per_layer * c->num_layers * cfg->train.micro_batches;
    if (cfg->attention.type == ATTN_SPARSE) {
        double sums = 2.0 * c->num_heads * (double)cfg->train.seq_len * 4;
        p->sparse_combine_s = 2 * sums * (p->cp - 1) / p->cp / (p->outer_gbs * 1e9) * c->num_layers *
                              cfg->train.micro_batches;
    }
    int R = p->dp * p->cp;
    double nodes_bw = (R > p->hw.gpus_per_node ? p->hw.internode_gbs : p->hw.nvlink_gbs) * 1e9;
    double P = (double)p->params;
    double bytes = cfg->parallel.zero == 1 ? 4 * P + 2 * P : 2 * 4 * P;
    p->reduce_s = R > 1 ? bytes * (R - 1) / R / nodes_bw : 0;
}

// The plan of cfg under its recompute policy (not auto).
static void plan_policy(Plan *p, const Config *cfg, const GpuProfile *gpu, double cpu_peak_flops, bool peak_measured,
                        double density_override) {
    memset(p, 0, sizeof(*p));
    p->recompute = cfg->train.recompute;
    Config c = *cfg;
    ModelConfig *mc = &c.model;
    if (mc->head_dim == 0) mc->head_dim = mc->hidden_size / mc->num_heads;
    p->gpu = gpu != NULL;
    if (gpu) p->hw = *gpu;
    p->peak_flops = gpu ? gpu->peak_tflops * 1e12 : cpu_peak_flops;
    p->peak_measured = !gpu && peak_measured;
    p->dp = cfg->parallel.dp > 0 ? cfg->parallel.dp : 1;
    p->cp = cfg->parallel.cp > 0 ? cfg->parallel.cp : 1;
    int inner_default = gpu ? gpu->gpus_per_node : p->cp;
    int inner = cfg->parallel.cp_inner > 0 ? cfg->parallel.cp_inner : (p->cp % inner_default ? p->cp : inner_default);
    p->cp_inner = ring_inner_size(cfg->attention.ring, p->cp, inner);
    if (p->cp_inner < 1 || p->cp % p->cp_inner) p->cp_inner = p->cp;
    p->cp_outer = p->cp / p->cp_inner;
    p->tokens = rank_tokens(&c, p->cp);
    p->params = param_count(mc);
    p->density = density_override > 0 ? density_override : expected_density(&c.attention, c.train.seq_len);
    p->density_assumed = cfg->attention.type == ATTN_SPARSE &&
                         (density_override > 0 || cfg->attention.budget == BUDGET_TOPP);
    size_t act_bytes = gpu ? GPU_ACT_BYTES : sizeof(float);  // the CPU backend's act_bytes
    double lm_chunk = (double)act_bytes * (double)model_loss_chunk_rows(c.train.loss_chunk, p->tokens) * mc->vocab_size;
    double acts = (double)model_activation_arena_bytes(mc, c.train.recompute, c.train.loss_chunk, c.train.mlp_chunk,
                                                       p->tokens, act_bytes);
    int64_t shards = cfg->parallel.zero == 1 ? (int64_t)p->dp * p->cp : 1;  // ZeRO-1 over dp x cp
    int64_t shard = (p->params + shards - 1) / shards;                      // model_shard_size
    if (gpu) {
        plan_gpu_memory(p, &c, acts, lm_chunk, shard, shards);
        p->capacity_bytes = gpu->hbm_gib * (1 << 30) * HBM_USABLE;
    } else {
        plan_cpu_memory(p, &c, acts, lm_chunk, shard, shards);
    }
    plan_flops(p, &c);
    plan_communication(p, &c);
    if (p->compute_s > 0) {
        p->step_s = p->compute_s + p->launch_s + p->host_sync_s + p->ring_exposed_s + p->sparse_combine_s + p->reduce_s;
        p->tokens_per_s = (double)c.train.seq_len * c.train.micro_batches * p->dp / p->step_s;
        p->mfu = p->model_flops / (p->step_s * p->peak_flops);
    }
}

// The plans of the three policies; train.recompute auto takes the first of
// none, selective, full (each recomputes what the one before keeps: slower,
// smaller) that fits, the last when none does, none when there is nothing to
// fit into (a GPU without a profile, an unreadable MemAvailable).
void plan_build(Plan *p, const Config *cfg, const GpuProfile *gpu, double cpu_peak_flops, bool peak_measured,
                double density_override) {
    Plan each[PLAN_POLICIES];
    for (int r = 0; r < PLAN_POLICIES; r++) {
        Config c = *cfg;
        c.train.recompute = (RecomputePolicy)r;
        plan_policy(&each[r], &c, gpu, cpu_peak_flops, peak_measured, density_override);
    }
    RecomputePolicy pick = cfg->train.recompute;
    if (pick == RECOMPUTE_AUTO) {
        const bool capacity = gpu ? each[0].capacity_bytes > 0 : plan_mem_available() > 0;
        pick = capacity ? RECOMPUTE_FULL : RECOMPUTE_NONE;
        for (int r = PLAN_POLICIES - 1; r >= 0 && capacity; r--)
            if (plan_fits(&each[r])) pick = (RecomputePolicy)r;
    }
    *p = each[pick];
    p->recompute_auto = cfg->train.recompute == RECOMPUTE_AUTO;
    for (int r = 0; r < PLAN_POLICIES; r++) {
        p->policy_bytes[r] = each[r].total_bytes;
        p->policy_step_s[r] = each[r].step_s;
        p->policy_fits[r] = plan_fits(&each[r]);
    }
}

void plan_breakdown(const Plan *p, char *line, size_t size) {
    size_t used = 0;
    for (int i = 0; i < p->num_items && used < size; i++)
        used += (size_t)snprintf(line + used, size - used, "%s%s %.2f", i ? " + " : "", p->items[i].name,
                                 p->items[i].bytes * GIB);
    if (used < size) snprintf(line + used, size - used, " = %.2f GiB", p->total_bytes * GIB);
}

bool plan_build_gpu_memory(Plan *p, const Config *cfg) {
    GpuProfile hw;
    bool named = plan_gpu(cfg, &hw);
    if (!named) hw = (GpuProfile){.name = "unnamed", .gpus_per_node = 1};  // no figures: no time, no capacity
    plan_build(p, cfg, &hw, 0, false, 0);
    return named;
}

void plan_print_gpu_memory(const Config *cfg, FILE *out) {
    Plan p;
    bool named = plan_build_gpu_memory(&p, cfg);
    const GpuProfile hw = p.hw;
    char line[1024];
    plan_breakdown(&p, line, sizeof(line));
    fprintf(out, "memory plan (cuda backend, one GPU): %s", line);
    if (named) fprintf(out, " of %.2f GiB usable on %s", p.capacity_bytes * GIB, hw.name);
    fputc('\n', out);
}

static double read_status_kib(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    double kib = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, key, n)) kib = strtod(line + n, NULL);
    fclose(f);
    return kib * 1024;
}

double plan_mem_available(void) { return read_status_kib("/proc/meminfo", "MemAvailable:"); }
double plan_rss_now(void) { return read_status_kib("/proc/self/status", "VmRSS:"); }

double plan_rss_peak(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_maxrss * 1024;
}


bool plan_fits(const Plan *p) {
    if (p->gpu) return p->total_bytes <= p->capacity_bytes;
    return p->total_bytes * p->dp * p->cp <= plan_mem_available();
}

// What to change when the run does not fit: the first settings (recompute
// full, ZeRO-1, then cp doubled) under which it does.
static void print_advice(const Plan *p, const Config *cfg, FILE *out) {
    Config c = *cfg;
    c.train.recompute = p->recompute;
    GpuProfile hw = p->hw;
    const char *changes[2];
    int n = 0;
    for (int round = 0; round < 8; round++) {
        if (c.train.recompute != RECOMPUTE_FULL) {
            c.train.recompute = RECOMPUTE_FULL;
            changes[n++] = "train.recompute=full";
        } else if (c.parallel.zero == 0 && p->dp * p->cp > 1) {  // ZeRO-1's shards
            c.parallel.zero = 1;
            changes[n++] = "parallel.zero=1";
        } else {
            c.parallel.cp = (c.parallel.cp > 0 ? c.parallel.cp : 1) * 2;
        }
        Plan q;
        plan_build(&q, &c, p->gpu ? &hw : NULL, 0, false, p->density_assumed ? p->density : 0);
        if (plan_fits(&q)) {
            fprintf(out, "to fit:");
            for (int i = 0; i < n; i++) fprintf(out, " %s", changes[i]);
            if (c.parallel.cp != cfg->parallel.cp) fprintf(out, " parallel.cp=%d (%d ranks)", c.parallel.cp,
                                                           c.parallel.cp * p->dp);
            fprintf(out, " -> %.2f GiB per %s\n", q.total_bytes * GIB, p->gpu ? "GPU" : "rank");
            return;
        }
    }
    fprintf(out, "to fit: no setting of recompute, ZeRO-1 and cp up to %d fits (ZeRO-1 leaves %.2f GiB of "
            "weights and gradients on every %s); use %s\n", c.parallel.cp,
            (p->gpu ? 6.0 : 8.0) * (double)p->params * GIB, p->gpu ? "GPU" : "rank",
            p->gpu ? "GPUs with more memory" : "more nodes, or nodes with more memory");
}

// Sparse attention's budget for the run's length: the planned density (what
// the plan's FLOPs and times assume) and the pattern estimation's share of
// the attention's work in a step (the estimation, selection and index,
// attention forward and backward rows of kernel_rows: their FLOPs, and on a
// GPU their derived times).
static void print_sparse_budget(const Plan *p, const Config *cfg, FILE *out) {
    const AttentionConfig *a = &cfg->attention;
    KernelRow rows[MAX_KERNEL_ROWS];
    const int n = kernel_rows(p, cfg, rows);
    double flops[2] = {0, 0}, seconds[2] = {0, 0};   // estimation, attention forward + backward
    for (int i = 0; i < n; i++) {
        const int estimation = !strncmp(rows[i].name, "sparse ", 7);   // estimation; selection and index
        if (!estimation && strcmp(rows[i].name, "attention forward") && strcmp(rows[i].name, "attention backward"))
            continue;
        const char *binds;
        flops[!estimation] += rows[i].flops;
        if (p->gpu && p->hw.peak_tflops > 0) seconds[!estimation] += kernel_seconds(&rows[i], &p->hw, &binds);
    }
    char budget[192];
    if (p->density_assumed && a->budget == BUDGET_TOPP && p->density == expected_density(a, cfg->train.seq_len))
        snprintf(budget, sizeof(budget), "budget topp %g: at most the caps' %d vertical + %d slash lines per head, "
                 "an upper bound; --density D plans another", a->top_p, a->max_vertical, a->max_slash);
    else if (p->density_assumed)
        snprintf(budget, sizeof(budget), "--density");
    else
        snprintf(budget, sizeof(budget), "budget fixed: %d vertical + %d slash lines per head%s", a->vertical,
                 a->slash, a->budget_file == BUDGET_FILE_PATH ? " (budget_file: per head)" : "");
    fprintf(out, "sparse attention at %d tokens: planned density %.4f (%s; sink %d, local %d) | pattern "
            "estimation (last_q %d queries against the rank's keys, both passes), selection and index %.1f%% "
            "of the attention's FLOPs", cfg->train.seq_len, p->density, budget, a->sink, a->local, a->last_q,
            100 * flops[0] / (flops[0] + flops[1]));
    if (seconds[0] > 0) fprintf(out, ", %.1f%% of its derived time", 100 * seconds[0] / (seconds[0] + seconds[1]));
    fprintf(out, " | the recall it reaches: log.attention_every\n");
}

const char *plan_recompute_name(RecomputePolicy r) {
    Config c = {.train.recompute = r};
    return config_enum_name(&c, &c.train.recompute);
}

// One line per recompute policy: its memory, its step and whether it fits;
// the one planned marked (auto's pick, or train.recompute).
static void print_policies(const Plan *p, FILE *out) {
    for (int r = 0; r < PLAN_POLICIES; r++) {
        fprintf(out, "  recompute %-9s %9.3f GiB total", plan_recompute_name((RecomputePolicy)r), p->policy_bytes[r] * GIB);
        if (p->policy_step_s[r] > 0) fprintf(out, ", step %.3f s", p->policy_step_s[r]);
        const char *mark = r != (int)p->recompute ? "" : !p->recompute_auto ? "  <- train.recompute"
                           : p->policy_fits[r] ? "  <- auto picks this" : "  <- auto: none fits, the smallest planned";
        fprintf(out, ", %s%s\n", p->policy_fits[r] ? "fits" : "does not fit", mark);
    }
}

void plan_print(const Plan *p, const Config *cfg, FILE *out) {
    const ModelConfig *c = &cfg->model;
    if (p->gpu)
        fprintf(out, "plan: CUDA backend as designed (bf16 compute, fp32 master/gradients/moments) on %s: %.0f TFLOP/s "
                "bf16, %.0f GiB HBM at %.0f GB/s, NVLink %.0f GB/s, network %.0f GB/s per GPU\n", p->hw.name,
                p->hw.peak_tflops, p->hw.hbm_gib, p->hw.hbm_gbs, p->hw.nvlink_gbs, p->hw.internode_gbs);
    else
        fprintf(out, "plan: CPU backend (fp32), host memory of rank 0 (validated against the measured peak RSS: "
                "docs/PERFORMANCE.md)\n");
    fprintf(out, "model: %lld parameters (%d layers, hidden %d, heads %d/%d x %d, vocab %d) | seq_len %d x %d micro "
            "batches | dp %d x cp %d (ring %d x %d), %lld tokens per rank | ZeRO-1 %s | recompute %s%s\n",
            (long long)p->params, c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim ? c->head_dim
            : c->hidden_size / c->num_heads, c->vocab_size, cfg->train.seq_len, cfg->train.micro_batches, p->dp, p->cp,
            p->cp_inner, p->cp_outer, (long long)p->tokens, cfg->parallel.zero ? "on" : "off",
            plan_recompute_name(p->recompute), p->recompute_auto ? " (auto)" : "");
    fprintf(out, "memory per %s (GiB):\n", p->gpu ? "GPU" : "rank");
    for (int i = 0; i < p->num_items; i++) fprintf(out, "  %-44s %9.3f\n", p->items[i].name, p->items[i].bytes * GIB);
    fprintf(out, "  %-44s %9.3f\n", "total", p->total_bytes * GIB);
    print_policies(p, out);
    fprintf(out, "FLOPs per step per %s: %.4g dense, %.4g at attention density %.4f (%s), %.4g with recomputation\n",
            p->gpu ? "GPU" : "rank", p->dense_model_flops, p->model_flops, p->density,
            cfg->attention.type == ATTN_DENSE ? "dense" : p->density_assumed ? "expected: --density or the top_p caps"
            : "fixed budget", p->hardware_flops);
    if (cfg->attention.type == ATTN_SPARSE) print_sparse_budget(p, cfg, out);
    if (p->cp > 1)
        fprintf(out, "ring step of one layer: %.2f MiB forward (K/V), %.2f MiB backward (K/V + dK/dV)%s\n",
                p->ring_fwd_bytes / (1 << 20), p->ring_bwd_bytes / (1 << 20), p->gpu ? "" : " (fp32)");
    if (p->gpu && p->cp > 1)
        fprintf(out, "  transfer %.2f ms per inner hop, %.2f ms per outer hop (%s) vs %.2f ms attention compute per "
                "ring step: %s\n", 1e3 * p->ring_inner_s, 1e3 * p->ring_outer_s,
                p->cp > p->hw.gpus_per_node ? "network" : "NVLink", 1e3 * p->attention_step_s,
                p->ring_exposed_s > 0 ? "not hidden" : "hidden");
    if (p->step_s > 0)
        fprintf(out, "predicted step: %.3f s (%s %.3f, launches %.3f, host syncs %.3f (%.0f syncs), ring exposed %.3f, "
                "sparse plan combine %.3f, gradient reduction %.3f) | %.0f tokens/s per %s, %.0f tokens/s for the job "
                "(%d %ss) | MFU %.1f%%%s\n", p->step_s, p->gpu ? "kernels" : "compute", p->compute_s, p->launch_s,
                p->host_sync_s, p->host_syncs, p->ring_exposed_s, p->sparse_combine_s, p->reduce_s,
                p->tokens_per_s / (p->dp * p->cp), p->gpu ? "GPU" : "rank",
                p->tokens_per_s, p->dp * p->cp, p->gpu ? "GPU" : "rank", 100 * p->mfu,
                p->gpu ? "" : p->peak_measured ? " of the measured sgemm rate" : " of hardware.peak_tflops");
    plan_print_verdict(p, cfg, out);
}

void plan_print_verdict(const Plan *p, const Config *cfg, FILE *out) {
    bool fits = plan_fits(p);
    if (p->gpu)
        fprintf(out, "fits: %s (%.2f of %.2f GiB usable: %.0f%% of HBM)\n", fits ? "yes" : "NO", p->total_bytes * GIB,
                p->capacity_bytes * GIB, 100 * HBM_USABLE);
    else
        fprintf(out, "fits: %s (%.2f GiB x %d ranks on one node vs MemAvailable %.2f GiB)\n", fits ? "yes" : "NO",
                p->total_bytes * GIB, p->dp * p->cp, plan_mem_available() * GIB);
    if (!fits) print_advice(p, cfg, out);
}

static const GpuProfile *profile_named(const char *name) {
    for (size_t i = 0; i < sizeof(gpu_profiles) / sizeof(gpu_profiles[0]); i++)
        if (!strcmp(gpu_profiles[i].name, name)) return &gpu_profiles[i];
    FAIL("no GPU profile %s", name);
}

// The sparse pattern's kernels per call (one layer) on hw: the estimation's
// counted work (sparse_estimation_counts) and the selection's and index's
// bytes, their bounds, and their share of the pattern plus the sparse
// attention forward and backward (per call of each).
static void print_sparse_pattern_kernels(const KernelRow *rows, int n, const GpuProfile *hw, FILE *out) {
    const KernelRow *est = NULL, *sel = NULL, *index = NULL;
    double attention = 0, est_s = 0, sel_s = 0, index_s = 0;
    const char *binds, *est_binds = "";
    for (int i = 0; i < n; i++) {
        const double t = kernel_seconds(&rows[i], hw, &binds);
        if (!strcmp(rows[i].name, "sparse estimation")) est = &rows[i], est_s = t, est_binds = binds;
        if (!strcmp(rows[i].name, "sparse selection")) sel = &rows[i], sel_s = t;
        if (!strcmp(rows[i].name, "sparse index")) index = &rows[i], index_s = t / rows[i].calls;
        if (rows[i].kind == KERNEL_ATTENTION) attention += t / rows[i].calls;
    }
    if (!est || !sel || !index) return;
    const GpuRates rate = gpu_rates(hw);
    const double layers = est->calls;   // one estimation and selection per layer, an index per forward and backward
    const double pattern = (est_s + sel_s) / layers + 2 * index_s;
    fprintf(out, "\nsparse pattern per layer's forward + backward on %s: estimation, both passes (counted: "
            "attention/kernels/kernel_counts.c): %.4g fp32 FMA %.3f ms, shared memory %.4g GB %.3f ms, HBM %.4g GB %.3f ms: "
            "%.3f ms (%s) | selection %.4g GB HBM %.3f ms | index, 2 builds: %.4g GB HBM %.3f ms | the pattern "
            "%.1f%% of the pattern + sparse attention forward + backward (%.3f ms)\n", hw->name,
            est->flops / 2 / layers, 1e3 * est->flops / layers / (hw->fp32_tflops * 1e12),
            est->shared_bytes / layers / 1e9, 1e3 * est->shared_bytes / layers / rate.smem, est->bytes / layers / 1e9,
            1e3 * est->bytes / layers / rate.hbm, 1e3 * est_s / layers, est_binds, sel->bytes / layers / 1e9,
            1e3 * sel_s / layers, 2 * index->bytes / index->calls / 1e9, 2e3 * index_s,
            100 * pattern / (pattern + attention), 1e3 * attention);
}

void plan_print_kernels(const Plan *p, const Config *cfg, FILE *out) {
    const GpuProfile *gpus[2] = {profile_named("a100-80g"), profile_named("h100")};
    KernelRow rows[MAX_KERNEL_ROWS];
    const int n = kernel_rows(p, cfg, rows);
    fprintf(out, "\nkernels of one step on one GPU (%lld tokens, %s attention%s): bytes with every tensor moved "
            "once (a lower bound); bound = the largest of the kernel's resource times (derived, not measured: "
            "docs/PLANNER.md)\n\n", (long long)p->tokens * cfg->train.micro_batches,
            cfg->attention.type == ATTN_DENSE ? "dense" : "sparse",
            cfg->attention.type == ATTN_DENSE ? "" : " at the plan's density");
    fprintf(out, "| kernel | calls | GFLOP | GB | FLOP/byte | A100-80GB ms | H100 ms | binds (A100-80GB / H100) |\n"
            "|---|---:|---:|---:|---:|---:|---:|---|\n");
    double total[2] = {0, 0}, flops = 0;
    for (int i = 0; i < n; i++) {
        const KernelRow *r = &rows[i];
        flops += r->flops;
        double ms[2];
        const char *binds[2];
        for (int g = 0; g < 2; g++) {
            ms[g] = 1e3 * kernel_seconds(r, gpus[g], &binds[g]);
            total[g] += ms[g] / 1e3;
        }
        if (r->flops > 0)
            fprintf(out, "| %s | %.0f | %.4g | %.4g | %.0f | %.2f | %.2f | %s / %s |\n", r->name, r->calls,
                    r->flops / 1e9, r->bytes / 1e9, r->flops / r->bytes, ms[0], ms[1], binds[0], binds[1]);
        else
            fprintf(out, "| %s | %.0f | – | %.4g | – | %.2f | %.2f | %s / %s |\n", r->name, r->calls, r->bytes / 1e9,
                    ms[0], ms[1], binds[0], binds[1]);
    }
    fprintf(out, "| **step** | | %.4g | | | **%.1f** | **%.1f** | |\n\n", flops / 1e9, 1e3 * total[0],
            1e3 * total[1]);
    for (int g = 0; g < 2; g++)
        fprintf(out, "%s: the kernels' bounds add up to %.3f s, %.0f tokens/s per GPU, MFU %.1f%%\n", gpus[g]->name,
                total[g], (double)p->tokens * cfg->train.micro_batches / total[g],
                100 * p->model_flops / (total[g] * gpus[g]->peak_tflops * 1e12));
    // The attention kernels' cost model on the plan's GPU (the A100-80GB where it has no rates), per call.
    const AttnGpuRates *model = attn_gpu_rates(p->gpu ? p->hw.name : "");
    if (!model) model = attn_gpu_rates(gpus[0]->name);
    fprintf(out, "\nattention kernels per call (one layer's pass over the rank's queries) on %s (%s): counted work "
            "(attention/kernels/kernel_counts.c, equal to the sim's counts: gpu_test_counts) through the cost model "
            "(attention/kernels/kernel_cost.c; derived, calibrated on the H200's measured kernels): per SM per clock %.2f "
            "mma.sync, %.0f shared-memory bytes, %.0f exp2; %.0f L2 atomics per clock; %d SMs at %.2f GHz; "
            "barrier %.0f clocks; overlap %.2f per co-resident block\n\n", model->name, model->arch,
            model->mma_per_clock, model->smem_bytes_per_clock, model->exp2_per_clock, model->atomics_per_clock,
            model->sms, model->clock_ghz, model->barrier_clocks, model->overlap);
    fprintf(out, "| kernel | mma.sync | ldmatrix GB | cp.async GB | atomics | shuffles | barriers | mma.sync ms | "
            "shared memory ms | exp2 ms | atomics ms | barriers ms | predicted ms | binds | predicted TFLOP/s | "
            "blocks per SM | shared bytes per mma.sync |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const KernelRow *r = &rows[i];
        if (r->kind != KERNEL_ATTENTION) continue;
        const KernelCounts c = counts_times(r->counts, 1.0 / r->calls);
        const AttnCost cost = attn_cost(&c, r->exp2 / r->calls, r->blocks_per_sm, model);
        fprintf(out, "| %s | %.4g | %.4g | %.4g | %.4g | %.4g | %.4g | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s | "
                "%.0f | %d | %.0f |\n",
                r->name, c.mma, c.ldmatrix_bytes / 1e9, c.cp_async_bytes / 1e9, c.atomics, c.shuffles, c.barriers,
                1e3 * cost.mma, 1e3 * cost.smem, 1e3 * cost.exp2, 1e3 * cost.atomics, 1e3 * cost.barriers,
                1e3 * cost.seconds, cost.binds, r->flops / r->calls / cost.seconds / 1e12, r->blocks_per_sm,
                shared_bytes_per_mma(c));
    }
    print_sparse_pattern_kernels(rows, n, p->gpu && p->hw.sms > 0 ? &p->hw : gpus[0], out);
    if (p->gpu)
        fprintf(out, "\nthese are the kernels alone: the plan's step on %s adds their launches, the host "
                "synchronisations, the ring's exposed transfers, the sparse plan's combine and the gradient "
                "reduction: %.3f s + launches %.3f + host syncs %.3f + ring exposed %.3f + sparse plan combine %.3f "
                "+ gradient reduction %.3f = %.3f s\n", p->hw.name, p->compute_s, p->launch_s, p->host_sync_s,
                p->ring_exposed_s, p->sparse_combine_s, p->reduce_s, p->step_s);
}

int cmd_plan(int argc, char **argv) {
    const char *usage = "usage: mtrain plan RUN.yaml [--gpu a100-40g|a100-80g|h100|h200] [--density D] [--kernels] "
                        "[--ring] [section.key=value ...]";
    if (argc < 1 || argv[0][0] == '-') {
        fprintf(stderr, "%s\n", usage);
        return 2;
    }
    double density = 0;
    const char *gpu_name = NULL, *density_text = NULL;
    bool kernels = false, ring = false;
    const ArgOption options[] = {{"--kernels", ARG_FLAG, &kernels}, {"--ring", ARG_FLAG, &ring},
                                 {"--gpu", ARG_VALUE, &gpu_name}, {"--density", ARG_VALUE, &density_text}};
    // The run file, then the overrides: argv[1, 1 + n) after the parse.
    ArgsResult args = args_parse(options, (int)(sizeof(options) / sizeof(options[0])), argc - 1, argv + 1, argc);
    if (args_refused(args, usage)) return 2;
    if (density_text) {
        char *end;
        density = strtod(density_text, &end);
        if (*end || !(density > 0 && density <= 1))
            fail("plan: --density %s: expected a number in (0, 1]", density_text);
    }
    char **overrides = xmalloc(sizeof(char *) * (size_t)argc);
    char gpu_override[64];
    int n = args.kept;
    memcpy(overrides, argv + 1, sizeof(char *) * (size_t)n);
    if (gpu_name) {
        snprintf(gpu_override, sizeof(gpu_override), "hardware.gpu=%s", gpu_name);
        overrides[n++] = gpu_override;
    }
    Config cfg;
    const char *shapes = config_for_plan(&cfg, argv[0], n, overrides);
    free(overrides);
    printf("architecture: %s%s%s%s\n", shapes, cfg.model_preset != PRESET_NONE ? " (" : "",
           cfg.model_preset != PRESET_NONE ? config_enum_name(&cfg, &cfg.model_preset) : "",
           cfg.model_preset != PRESET_NONE ? ")" : "");
    GpuProfile gpu;
    bool on_gpu = plan_gpu(&cfg, &gpu), measured = false;
    if (ring) {
        if (!on_gpu) fail("plan: --ring needs a GPU (hardware.gpu or --gpu: the ring's links and kernels)");
        if (!(cfg.parallel.cp > 1)) fail("plan: --ring needs parallel.cp > 1 (no ring at cp %d)", cfg.parallel.cp);
    }
    Plan p;
    const double cpu_peak = on_gpu ? 0 : plan_cpu_peak(&cfg, &measured);
    plan_build(&p, &cfg, on_gpu ? &gpu : NULL, cpu_peak, measured, density);
    if (ring) {
        plan_ring_print(&cfg, &gpu, density, stdout);
        printf("\nthis view is attention and its ring transfers, per layer: it leaves out the GEMMs, the other kernels, "
               "the sparse plan's combine and the gradient reduction; the plan's step on %s is %.3f s (kernels %.3f, "
               "launches %.3f, host syncs %.3f, ring exposed %.3f, sparse plan combine %.3f, gradient reduction "
               "%.3f)\n", gpu.name, p.step_s, p.compute_s, p.launch_s, p.host_sync_s, p.ring_exposed_s,
               p.sparse_combine_s, p.reduce_s);
        plan_print_verdict(&p, &cfg, stdout);
    } else {
        plan_print(&p, &cfg, stdout);
        if (kernels) plan_print_kernels(&p, &cfg, stdout);
    }
    return plan_fits(&p) ? 0 : PLAN_EXIT_NO_FIT;
}
