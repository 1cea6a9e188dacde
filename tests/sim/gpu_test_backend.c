// gpu_test_backend.c: the whole model on the CUDA backend (model/backend_cuda.c)
// against the CPU backend: the same weights (made on the CPU, uploaded to
// both), the same synthetic sequence; one forward and backward, then one
// AdamW step and the loss again. Cases: GQA ratios 2:1 and 4:1 and plain
// multi-head (2:2), head_dim 64 and 128, tied and untied embeddings, YaRN,
// dense attention, sparse with top_p = 1 (whose loss and gradients must equal
// dense's on the same model), sparse with a fixed budget of one vertical and
// one slash line per head (its density, as the CPU model counts it, below
// DENSITY_MAX), the same with activation checkpointing (equal to it), lengths
// that are not a multiple of the 64-token tile (T = 37, 130, 320).
// Needs a GPU (`make test-gpu`), or the sim (tests/sim/test_sim.sh).
//   build/tests/gpu_test_backend         every case
//   build/tests/gpu_test_backend small   the first five cases (each of the above once)
//
// Tolerances: the loss within 1e-2 relative (bf16 activations: 2^-9 per
// rounding, a few dozen roundings along the two layers, errors that average
// out over the tokens' mean); every parameter's gradient within 2e-2 relative
// Frobenius error (the backward runs through bf16 activation gradients and
// bf16 compute weights, each product summed in fp32: a few 2^-9 roundings per
// layer, compounded over both layers and the head); the loss after one AdamW
// step within 1e-2 and below the first (the step went through the bf16 copy
// of the updated master, which the second forward reads). A case that equals
// the previous one holds its CUDA gradients to it within the tolerance its
// row states (main), and its CUDA loss within that or EQUAL_LOSS_TOL,
// whichever is tighter (the same tiles, summed in another order).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../model/model.h"
#include "../../model/optimizer.h"
#include "../lib/check.h"

// The attention of a case: dense, sparse keeping every line (top_p = 1), or
// sparse with a fixed budget of vertical and slash lines per head.
typedef enum { CASE_DENSE, CASE_SPARSE_TOPP1, CASE_SPARSE_FIXED } CaseAttention;

typedef struct {
    const char *name;
    int heads, kv_heads, head_dim;
    bool tied, yarn;
    CaseAttention attention;
    int64_t T;
    bool checkpoint;       // activation checkpointing: the backward recomputes each layer
    bool equals_previous;  // the CUDA loss and gradients equal the previous case's...
    double equal_tol;      // ...within this relative (Frobenius) error
} Case;

// The CUDA backend's first loss and gradients of a case (host, caller frees).
typedef struct {
    double loss;
    float *grad;
} CudaStep;

static ModelConfig case_model(const Case *k) {
    ModelConfig c = {.vocab_size = 256, .hidden_size = k->heads * k->head_dim, .intermediate_size = 256,
                     .num_layers = 2, .num_heads = k->heads, .num_kv_heads = k->kv_heads,
                     .head_dim = k->head_dim, .rope_theta = 10000.0, .rms_norm_eps = 1e-6,
                     .tie_word_embeddings = k->tied, .init_std = 0.05, .max_position_embeddings = 4096};
    if (k->yarn)
        c.rope_scaling = (RopeScaling){.type = ROPE_YARN, .factor = 4.0, .original_max_position_embeddings = 1024,
                                       .beta_fast = 32, .beta_slow = 1, .truncate = true};
    return c;
}

static AttentionConfig case_attention(const Case *k) {
    AttentionConfig a = {.type = k->attention == CASE_DENSE ? ATTN_DENSE : ATTN_SPARSE, .block_size = 64,
                         .last_q = 64, .top_p = 1.0, .max_vertical = 4096, .max_slash = 4096, .sink = 0,
                         .local = 1, .budget = BUDGET_TOPP};
    if (k->attention == CASE_SPARSE_FIXED) {
        a.budget = BUDGET_FIXED;
        a.vertical = 1;
        a.slash = 1;
    }
    return a;
}

static float *download_arena(const Model *m, const float *arena) {
    float *host = malloc(sizeof(float) * (size_t)m->total_params);
    m->be->download(host, arena, sizeof(float) * (size_t)m->total_params);
    return host;
}

// sqrt(sum (a-b)^2 / sum b^2) in double.
static double rel_frobenius(const float *a, const float *b, int64_t n) {
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        diff += d * d;
        ref += (double)b[i] * b[i];
    }
    return sqrt(diff / (ref + 1e-300));
}

// One forward/backward and one AdamW step: the losses before and after, the
// gradients of the first step (host, caller frees).
static void train_step(Model *m, const float *weights, const int32_t *seq, int64_t T, double loss[2],
                       float **grads) {
    model_set_params(m, 0, weights, m->total_params);
    model_weights_changed(m);
    float scale = 1.0f / (float)T;
    loss[0] = model_forward_backward(m, seq, seq + 1, NULL, T, scale) / (double)T;
    *grads = download_arena(m, m->grad_mem);
    OptimizerConfig oc = {.lr = 1e-3, .min_lr = 1e-3, .total_steps = 1, .schedule = LR_CONSTANT,
                          .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0};
    optimizer_step(m, &oc, 1, NULL);
    loss[1] = model_loss(m, seq, seq + 1, NULL, T) / (double)T;
}

// The fixed budget's attention density at most (computed / causal score
// elements, both layers): 1+1 lines at T = 320 measure 0.48 and 0.51 (the diagonal
// blocks alone are 0.2); a budget that fills the blocks (16+16 at T = 130)
// measures 0.99.
#define DENSITY_MAX 0.6
#define EQUAL_LOSS_TOL 1e-5

// The largest relative Frobenius error of a parameter's gradient in a against b.
static double worst_gradient(const Model *m, const float *a, const float *b, const char **name) {
    double worst = 0;
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        double e = rel_frobenius(a + p->offset, b + p->offset, p->numel);
        if (!(e <= worst)) { worst = e; *name = p->name; }
    }
    return worst;
}

// One step of case k on both backends; prev: the previous case's CUDA step.
static CudaStep run_case(const Case *k, const Case *prev_case, const CudaStep *prev) {
    ModelConfig c = case_model(k);
    AttentionConfig a = case_attention(k);
    Model cpu, gpu;
    model_init(&cpu, &c, backend_cpu(), NULL, 1024);
    model_init(&gpu, &c, backend_cuda(), NULL, 1024);
    model_set_attention(&cpu, &a);
    model_set_attention(&gpu, &a);
    model_set_activations(&cpu, k->checkpoint ? RECOMPUTE_FULL : RECOMPUTE_NONE, 0, k->T);
    model_set_activations(&gpu, k->checkpoint ? RECOMPUTE_FULL : RECOMPUTE_NONE, 0, k->T);
    if (k->attention == CASE_SPARSE_FIXED) model_attention_stats_begin(&cpu);
    model_init_weights(&cpu, 7);
    float *weights = download_arena(&cpu, cpu.param_mem);

    // A sequence with structure (repeats) so the step has a direction to learn.
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(k->T + 1));
    uint64_t s = 12345;
    for (int64_t t = 0; t <= k->T; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        seq[t] = t >= 16 && (s >> 60) < 8 ? seq[t - 16] : (int32_t)((s >> 33) % (uint64_t)c.vocab_size);
    }

    double loss_cpu[2], loss_gpu[2];
    float *grad_cpu, *grad_gpu;
    train_step(&cpu, weights, seq, k->T, loss_cpu, &grad_cpu);
    train_step(&gpu, weights, seq, k->T, loss_gpu, &grad_gpu);

    double rel = fabs(loss_gpu[0] - loss_cpu[0]) / loss_cpu[0];
    EXPECT(rel <= 1e-2, "%s: loss %.6f (cuda) vs %.6f (cpu): relative %.2e <= 1e-2", k->name, loss_gpu[0],
           loss_cpu[0], rel);
    const char *worst_name = "";
    double worst = worst_gradient(&cpu, grad_gpu, grad_cpu, &worst_name);
    EXPECT(worst <= 2e-2, "%s: every gradient within 2e-2 relative Frobenius error (worst %.2e, %s)", k->name,
           worst, worst_name);
    double rel_after = fabs(loss_gpu[1] - loss_cpu[1]) / loss_cpu[1];
    EXPECT(rel_after <= 1e-2 && loss_gpu[1] < loss_gpu[0],
           "%s: after one AdamW step loss %.6f (cuda) vs %.6f (cpu): relative %.2e <= 1e-2, below %.6f", k->name,
           loss_gpu[1], loss_cpu[1], rel_after, loss_gpu[0]);
    const SparseStats *stats = model_attention_stats_end(&cpu);
    if (stats) {
        double computed = 0, causal = 0;
        for (int l = 0; l < c.num_layers; l++) {
            computed += stats[l].computed;
            causal += stats[l].causal;
        }
        EXPECT(computed / causal <= DENSITY_MAX, "%s: attention density %.3f <= %.1f (the budget is sparse)",
               k->name, computed / causal, DENSITY_MAX);
    }
    if (k->equals_previous) {
        double rel_prev = fabs(loss_gpu[0] - prev->loss) / prev->loss, loss_tol = fmin(k->equal_tol, EQUAL_LOSS_TOL);
        double worst_prev = worst_gradient(&cpu, grad_gpu, prev->grad, &worst_name);
        EXPECT(rel_prev <= loss_tol && worst_prev <= k->equal_tol,
               "%s equals %s on the CUDA backend: loss %.6f vs %.6f (relative %.2e <= %.0e), every gradient "
               "(worst %.2e, %s) within %.0e", k->name, prev_case->name, loss_gpu[0], prev->loss, rel_prev,
               loss_tol, worst_prev, worst_name, k->equal_tol);
    }

    free(seq);
    free(weights);
    free(grad_cpu);
    model_free(&cpu);
    model_free(&gpu);
    return (CudaStep){loss_gpu[0], grad_gpu};
}

int main(int argc, char **argv) {
    bool small = argc > 1 && !strcmp(argv[1], "small");
    // Each row: name, heads, kv_heads, head_dim, tied, yarn, attention, T, checkpoint, equals_previous,
    // equal_tol. Sparse with top_p = 1 keeps every line: the tiles of dense attention (the sparse forward
    // runs the dense forward's tiles, so the same roundings; the sparse backward's blocks the dense
    // backward's warp tiles over key blocks of 64: measured under seeds 1-3, loss and gradients equal).
    // Checkpointing recomputes each layer from the same bf16 inputs and sparse index; the sparse
    // backward adds dq with fp32 atomics whose order follows the blocks' (measured under seeds 1-3, one
    // thread: 9.2e-4, 9.2e-4 and 0, the worst k_proj.bias, a sum that nearly cancels, after dq values near a bf16
    // rounding boundary round the other way; with dq one writer per row: 0, hence the old 5e-5), so
    // 2e-3, below what a recomputation with another pattern or other inputs gives, ~1e-2.
    const Case cases[] = {
        {"GQA 2:1 hd64 untied dense T=130", 2, 1, 64, false, false, CASE_DENSE, 130, false, false, 0},
        {"GQA 2:1 hd64 untied sparse top_p=1 T=130", 2, 1, 64, false, false, CASE_SPARSE_TOPP1, 130, false, true,
         1e-4},
        {"GQA 4:1 hd64 tied YaRN dense T=37", 4, 1, 64, true, true, CASE_DENSE, 37, false, false, 0},
        {"MHA 2:2 hd128 untied sparse fixed 1+1 T=320", 2, 2, 128, false, false, CASE_SPARSE_FIXED, 320, false,
         false, 0},
        {"MHA 2:2 hd128 untied sparse fixed 1+1 T=320 checkpointed", 2, 2, 128, false, false, CASE_SPARSE_FIXED,
         320, true, true, 2e-3},
        {"GQA 2:1 hd64 tied sparse top_p=1 T=128", 2, 1, 64, true, false, CASE_SPARSE_TOPP1, 128, false, false, 0},
        {"GQA 2:1 hd128 tied YaRN sparse fixed 1+1 T=320", 2, 1, 128, true, true, CASE_SPARSE_FIXED, 320, false,
         false, 0},
    };
    int n = small ? 5 : (int)(sizeof(cases) / sizeof(cases[0]));
    CudaStep step[sizeof(cases) / sizeof(cases[0])];
    for (int i = 0; i < n; i++)
        step[i] = run_case(&cases[i], i > 0 ? &cases[i - 1] : NULL, i > 0 ? &step[i - 1] : NULL);
    for (int i = 0; i < n; i++) free(step[i].grad);
    return check_exit();
}
