// plan.c: `mtrain plan RUN.yaml [--gpu NAME] [--density D] [overrides]`:
// memory per rank, FLOPs per step, ring traffic, predicted step time,
// tokens/s and MFU, whether the run fits and what to change when it does
// not. The CPU figures follow the allocations of the CPU backend (model.c,
// train.c, checkpoint.c); the GPU figures are those of the CUDA backend as
// designed (docs/PERFORMANCE.md, section Planner).
#include "plan.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../attention/layout.h"
#include "../attention/ring.h"
#include "../model/model.h"
#include "checkpoint.h"
#include "commands.h"

// NVIDIA datasheets: A100 Tensor Core GPU (SXM4, 2021: 312 TFLOP/s dense
// bf16; 40 GB HBM2 1555 GB/s, 80 GB HBM2e 2039 GB/s; NVLink 600 GB/s total,
// 300 GB/s per direction), H100 (SXM5: 989 TFLOP/s dense bf16, 80 GB HBM3
// 3.35 TB/s, NVLink 900 GB/s total) and H200 (SXM: 989 TFLOP/s, 141 GB HBM3e
// 4.8 TB/s, NVLink 900 GB/s). Network per GPU as in DGX A100 (one 200 Gb/s
// HDR InfiniBand NIC per GPU: 25 GB/s) and DGX H100/H200 (one 400 Gb/s NDR
// NIC per GPU: 50 GB/s). Capacities are GB (1e9 bytes) in the datasheets.
static const GpuProfile gpu_profiles[] = {
    {"a100-40g", 312, 40e9 / (1 << 30), 1555, 300, 25, 8},
    {"a100-80g", 312, 80e9 / (1 << 30), 2039, 300, 25, 8},
    {"h100", 989, 80e9 / (1 << 30), 3350, 450, 50, 8},
    {"h200", 989, 141e9 / (1 << 30), 4800, 450, 50, 8},
};

// Assumed fractions of the peak that the kernels reach (docs/PERFORMANCE.md):
// cuBLASLt bf16 GEMMs at these shapes, FlashAttention-2-style dense
// attention (forward and backward together), the gathered sparse kernels.
#define GEMM_EFFICIENCY 0.70
#define DENSE_ATTENTION_EFFICIENCY 0.55
#define SPARSE_ATTENTION_EFFICIENCY 0.35
// GPU: CUDA context, NCCL buffers and the cuBLASLt workspace (assumed).
#define GPU_RUNTIME_BYTES (1.25 * (1 << 30))
// CPU: the binary, its libraries, MPI and OpenBLAS (measured: the peak RSS
// of a 100K-parameter run minus what this plan counts for it).
#define CPU_RUNTIME_BYTES (12.0 * (1 << 20))
// GPU: the plan must leave this much of HBM to the allocator's fragmentation.
#define HBM_USABLE 0.92
// The CUDA backend's act_bytes and weight_bytes (model/backend.h): bf16.
#define GPU_ACT_BYTES 2
#define GPU_WEIGHT_BYTES 2

static const double GIB = 1.0 / (1 << 30);

// The best rate of a few 512^3 sgemm on this rank's threads.
static double measure_cpu_flops(void) {
    enum { N = 512 };
    float *a = xmalloc(sizeof(float) * 3 * N * N);
    for (int i = 0; i < 3 * N * N; i++) a[i] = (float)(i % 7) * 0.1f;
    double best = 0;
    for (int r = 0; r < 4; r++) {
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

// Host memory of world rank 0 on the CPU backend (fp32): the arenas, the
// activation arena, and the larger of the host copies made beside it: a
// checkpoint write's (trainer/train.c, print_memory) or, on several ranks,
// the gradient all-reduce's (the arena's host copy, and as much again inside
// MPI: measured). The initialisation's copy and ZeRO's gathers are smaller.
static void plan_cpu_memory(Plan *p, const Config *cfg, double acts, double lm_chunk, int64_t opt_count) {
    double P = 4.0 * (double)p->params;
    const ModelConfig *c = &cfg->model;
    bool zero = cfg->parallel.zero == 1;
    add_item(p, "parameters (fp32)", P);
    add_item(p, "gradients (fp32)", P);
    add_item(p, "AdamW moments (fp32)", 8.0 * (double)opt_count);
    add_item(p, "activations", acts - lm_chunk);
    add_item(p, "LM-head chunk", lm_chunk);
    if (p->cp > 1) add_item(p, "ring buffers (K/V, dK/dV)", 4.0 * 4.0 * (double)p->tokens * c->num_kv_heads * c->head_dim);
    if (cfg->data.packing == PACKING_BALANCED)  // data/packing.h: the step's inputs and targets (int32)
        add_item(p, "balanced packing (the step's tokens)",
                 8.0 * (double)cfg->train.seq_len * cfg->train.micro_batches * p->dp);
    double checkpoint_write = P + (zero ? 3 * P : (double)checkpoint_stream_bytes());
    double allreduce = p->dp * p->cp > 1 ? 2 * P : 0;  // the arena's host copy and MPI's reduction buffer
    add_item(p, "host copies (checkpoint write or all-reduce)", fmax(checkpoint_write, allreduce));
    add_item(p, "runtime (binary, libraries, MPI)", CPU_RUNTIME_BYTES);
}

// Memory of one GPU under the CUDA backend as designed: bf16 compute weights,
// activations and LM-head chunk, fp32 row statistics (inside the activation
// arena), fp32 master weights, gradients and moments (ZeRO-1 shards master
// weights and moments over dp x cp). acts: the activation arena's bytes.
static void plan_gpu_memory(Plan *p, const Config *cfg, double acts, double lm_chunk) {
    const ModelConfig *c = &cfg->model;
    const AttentionConfig *a = &cfg->attention;
    double P = (double)p->params;
    double shards = cfg->parallel.zero == 1 ? (double)p->dp * p->cp : 1.0;
    int64_t T = p->tokens, KD = (int64_t)c->num_kv_heads * c->head_dim;
    add_item(p, "weights bf16 (compute)", GPU_WEIGHT_BYTES * P);
    add_item(p, "weights fp32 (master)", 4 * P / shards);
    add_item(p, "gradients fp32", 4 * P);
    add_item(p, "AdamW moments fp32", 8 * P / shards);
    add_item(p, "activations bf16 (statistics fp32)", acts - lm_chunk);
    if (a->type == ATTN_SPARSE)  // estimation scores of one layer, the index of every layer (int32)
        add_item(p, "attention index and scratch",
                 4.0 * c->num_heads * (double)a->last_q * (double)T +
                 4.0 * c->num_layers * c->num_heads * (double)(a->max_vertical + a->max_slash + a->sink + a->local));
    if (p->cp > 1) add_item(p, "ring buffers (2 x K/V bf16, 2 x dK/dV fp32)", 2.0 * (double)T * KD * (2 * 2 + 2 * 4));
    add_item(p, "LM-head chunk (bf16 logits)", lm_chunk);
    add_item(p, "workspaces (CUDA, NCCL, cuBLASLt)", GPU_RUNTIME_BYTES);
}

// FLOPs of one optimizer step on one rank: the GEMMs of its tokens (6 per
// weight per token: forward, dX, dW) and the causal attention of its slice
// (forward 2 GEMMs, backward PLAN_ATTENTION_BACKWARD x forward).
static void plan_flops(Plan *p, const Config *cfg) {
    const ModelConfig *c = &cfg->model;
    double N = (double)cfg->train.seq_len, micro = cfg->train.micro_batches;
    double tokens = (double)p->tokens * micro;
    double gemm = 6.0 * (double)matmul_weights(c) * tokens;
    double attn_fwd = 2.0 * N * N * c->num_heads * c->head_dim * c->num_layers * micro / p->cp;
    p->dense_model_flops = gemm + (1 + PLAN_ATTENTION_BACKWARD) * attn_fwd;
    p->model_flops = gemm + (1 + PLAN_ATTENTION_BACKWARD) * attn_fwd * p->density;
    double recompute = cfg->train.checkpoint_activations ? (gemm / 3.0 + attn_fwd * p->density) : 0.0;
    p->hardware_flops = p->model_flops + recompute;
    if (p->peak_flops <= 0) return;
    p->attention_efficiency = !p->gpu ? 1.0 : p->density < 1.0 ? SPARSE_ATTENTION_EFFICIENCY
                                                                : DENSE_ATTENTION_EFFICIENCY;
    double attn_passes = (cfg->train.checkpoint_activations ? 2 : 1) + PLAN_ATTENTION_BACKWARD;
    double forward = attn_fwd * p->density / (p->peak_flops * p->attention_efficiency);
    double gemm_s = (gemm + (cfg->train.checkpoint_activations ? gemm / 3.0 : 0)) /
                    (p->peak_flops * (p->gpu ? GEMM_EFFICIENCY : 1.0));
    p->compute_s = gemm_s + attn_passes * forward;
    p->attention_fwd_step_s = forward / (micro * c->num_layers * p->cp);
    p->attention_step_s = attn_passes * p->attention_fwd_step_s;
}

// Ring traffic of one layer per ring step (bf16 K/V forward; K/V and the
// fp32 dK/dV accumulators backward), the time of one hop inside and across
// nodes, and what of it attention compute does not hide: an inner hop
// overlaps one ring step's attention, an outer hop of the hierarchical ring
// the whole inner round (cp_inner steps); a flat ring that spans nodes waits
// for its slowest (network) hop at every step. Then the gradient reduction
// over dp x cp (reduce-scatter + bf16 all-gather under ZeRO, an all-reduce
// otherwise), counted as not overlapped.
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
    int R = p->dp * p->cp;
    double nodes_bw = (R > p->hw.gpus_per_node ? p->hw.internode_gbs : p->hw.nvlink_gbs) * 1e9;
    double P = (double)p->params;
    double bytes = cfg->parallel.zero == 1 ? 4 * P + 2 * P : 2 * 4 * P;
    p->reduce_s = R > 1 ? bytes * (R - 1) / R / nodes_bw : 0;
}

void plan_build(Plan *p, const Config *cfg, const GpuProfile *gpu, double cpu_peak_flops, bool peak_measured,
                double density_override) {
    memset(p, 0, sizeof(*p));
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
    double lm_chunk = (double)act_bytes * (double)c.train.loss_chunk * mc->vocab_size;
    p->activations_saved =
        (double)model_activation_arena_bytes(mc, false, c.train.loss_chunk, p->tokens, act_bytes) - lm_chunk;
    p->activations_checkpointed =
        (double)model_activation_arena_bytes(mc, true, c.train.loss_chunk, p->tokens, act_bytes) - lm_chunk;
    double acts = lm_chunk + (c.train.checkpoint_activations ? p->activations_checkpointed : p->activations_saved);
    if (gpu) {
        plan_gpu_memory(p, &c, acts, lm_chunk);
        p->capacity_bytes = gpu->hbm_gib * (1 << 30) * HBM_USABLE;
    } else {
        int64_t shards = cfg->parallel.zero == 1 ? p->dp : 1;
        int64_t opt_count = (p->params + shards - 1) / shards;
        plan_cpu_memory(p, &c, acts, lm_chunk, opt_count);
    }
    plan_flops(p, &c);
    plan_communication(p, &c);
    if (p->compute_s > 0) {
        p->step_s = p->compute_s + p->ring_exposed_s + p->reduce_s;
        p->tokens_per_s = (double)c.train.seq_len * c.train.micro_batches * p->dp / p->step_s;
        p->mfu = p->model_flops / (p->step_s * p->peak_flops);
    }
}

void plan_breakdown(const Plan *p, char *line, size_t size) {
    size_t used = 0;
    for (int i = 0; i < p->num_items && used < size; i++)
        used += (size_t)snprintf(line + used, size - used, "%s%s %.2f", i ? " + " : "", p->items[i].name,
                                 p->items[i].bytes * GIB);
    if (used < size) snprintf(line + used, size - used, " = %.2f GiB", p->total_bytes * GIB);
}

void plan_print_gpu_memory(const Config *cfg, FILE *out) {
    GpuProfile hw;
    bool named = plan_gpu(cfg, &hw);
    if (!named) hw = (GpuProfile){.name = "unnamed", .gpus_per_node = 1};  // no figures: no time, no capacity
    Plan p;
    plan_build(&p, cfg, &hw, 0, false, 0);
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


// GPU: the plan within the usable HBM; CPU: every rank (one node) within MemAvailable.
static bool plan_fits(const Plan *p) {
    if (p->gpu) return p->total_bytes <= p->capacity_bytes;
    return p->total_bytes * p->dp * p->cp <= plan_mem_available();
}

// What to change when the run does not fit: the first settings (activation
// checkpointing, ZeRO-1, then cp doubled) under which it does.
static void print_advice(const Plan *p, const Config *cfg, FILE *out) {
    Config c = *cfg;
    GpuProfile hw = p->hw;
    const char *changes[2];
    int n = 0;
    for (int round = 0; round < 8; round++) {
        if (!c.train.checkpoint_activations) {
            c.train.checkpoint_activations = true;
            changes[n++] = "train.checkpoint_activations=true";
        } else if (c.parallel.zero == 0 && (p->gpu ? p->dp * p->cp : p->dp) > 1) {  // ZeRO-1's shards
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
    fprintf(out, "to fit: no setting of checkpointing, ZeRO-1 and cp up to %d fits (ZeRO-1 leaves %.2f GiB of "
            "weights and gradients on every %s); use %s\n", c.parallel.cp,
            (p->gpu ? 6.0 : 8.0) * (double)p->params * GIB, p->gpu ? "GPU" : "rank",
            p->gpu ? "GPUs with more memory" : "more nodes, or nodes with more memory");
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
            "batches | dp %d x cp %d (ring %d x %d), %lld tokens per rank | ZeRO-1 %s | checkpointing %s\n",
            (long long)p->params, c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim ? c->head_dim
            : c->hidden_size / c->num_heads, c->vocab_size, cfg->train.seq_len, cfg->train.micro_batches, p->dp, p->cp,
            p->cp_inner, p->cp_outer, (long long)p->tokens, cfg->parallel.zero ? "on" : "off",
            cfg->train.checkpoint_activations ? "on" : "off");
    fprintf(out, "memory per %s (GiB):\n", p->gpu ? "GPU" : "rank");
    for (int i = 0; i < p->num_items; i++) fprintf(out, "  %-44s %9.3f\n", p->items[i].name, p->items[i].bytes * GIB);
    fprintf(out, "  %-44s %9.3f\n", "total", p->total_bytes * GIB);
    fprintf(out, "  activations saved for backward: %.3f without checkpointing, %.3f with\n",
            p->activations_saved * GIB, p->activations_checkpointed * GIB);
    fprintf(out, "FLOPs per step per %s: %.4g dense, %.4g at attention density %.4f (%s), %.4g with recomputation\n",
            p->gpu ? "GPU" : "rank", p->dense_model_flops, p->model_flops, p->density,
            cfg->attention.type == ATTN_DENSE ? "dense" : p->density_assumed ? "expected: --density or the top_p caps"
            : "fixed budget", p->hardware_flops);
    if (p->cp > 1)
        fprintf(out, "ring step of one layer: %.2f MiB forward (K/V), %.2f MiB backward (K/V + dK/dV)%s\n",
                p->ring_fwd_bytes / (1 << 20), p->ring_bwd_bytes / (1 << 20), p->gpu ? "" : " (fp32)");
    if (p->gpu && p->cp > 1)
        fprintf(out, "  transfer %.2f ms per inner hop, %.2f ms per outer hop (%s) vs %.2f ms attention compute per "
                "ring step: %s\n", 1e3 * p->ring_inner_s, 1e3 * p->ring_outer_s,
                p->cp > p->hw.gpus_per_node ? "network" : "NVLink", 1e3 * p->attention_step_s,
                p->ring_exposed_s > 0 ? "not hidden" : "hidden");
    if (p->step_s > 0)
        fprintf(out, "predicted step: %.3f s (compute %.3f, ring exposed %.3f, gradient reduction %.3f) | %.0f tokens/s "
                "| MFU %.1f%%%s\n", p->step_s, p->compute_s, p->ring_exposed_s, p->reduce_s, p->tokens_per_s,
                100 * p->mfu, p->gpu ? "" : p->peak_measured ? " of the measured sgemm rate" : " of hardware.peak_tflops");
    bool fits = plan_fits(p);
    if (p->gpu)
        fprintf(out, "fits: %s (%.2f of %.2f GiB usable: %.0f%% of HBM)\n", fits ? "yes" : "NO", p->total_bytes * GIB,
                p->capacity_bytes * GIB, 100 * HBM_USABLE);
    else
        fprintf(out, "fits: %s (%.2f GiB x %d ranks on one node vs MemAvailable %.2f GiB)\n", fits ? "yes" : "NO",
                p->total_bytes * GIB, p->dp * p->cp, plan_mem_available() * GIB);
    if (!fits) print_advice(p, cfg, out);
}

int cmd_plan(int argc, char **argv) {
    const char *usage = "usage: mtrain plan RUN.yaml [--gpu a100-40g|a100-80g|h100|h200] [--density D] [--ring] "
                        "[section.key=value ...]";
    if (argc < 1 || argv[0][0] == '-') {
        fprintf(stderr, "%s\n", usage);
        return 2;
    }
    double density = 0;
    char **overrides = xmalloc(sizeof(char *) * (size_t)argc);
    char gpu_override[64] = "";
    int n = 0;
    bool ring = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ring")) {
            ring = true;
            continue;
        }
        bool gpu = !strcmp(argv[i], "--gpu");
        if (!gpu && strcmp(argv[i], "--density")) {
            overrides[n++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) fail("plan: %s needs a value (%s)", argv[i], usage);
        const char *v = argv[++i];
        if (gpu) {
            snprintf(gpu_override, sizeof(gpu_override), "hardware.gpu=%s", v);
            continue;
        }
        char *end;
        density = strtod(v, &end);
        if (*end || !(density > 0 && density <= 1)) fail("plan: --density %s: expected a number in (0, 1]", v);
    }
    if (gpu_override[0]) overrides[n++] = gpu_override;
    Config cfg;
    config_from_args(&cfg, argv[0], n, overrides, false);
    free(overrides);
    GpuProfile gpu;
    bool on_gpu = plan_gpu(&cfg, &gpu), measured = false;
    if (ring) {
        if (!on_gpu) fail("plan: --ring needs a GPU (hardware.gpu or --gpu: the ring's links and kernels)");
        if (!(cfg.parallel.cp > 1)) fail("plan: --ring needs parallel.cp > 1 (no ring at cp %d)", cfg.parallel.cp);
        plan_ring_print(&cfg, &gpu, density, stdout);
        return 0;
    }
    Plan p;
    plan_build(&p, &cfg, on_gpu ? &gpu : NULL, on_gpu ? 0 : plan_cpu_peak(&cfg, &measured), measured, density);
    plan_print(&p, &cfg, stdout);
    return 0;
}
