// gpu_test_backend.c: the whole model on the CUDA backend (model/backend_cuda.c)
// against the CPU backend: the same weights (made on the CPU, uploaded to
// both), the same synthetic sequence; one forward and backward, then one
// AdamW step and the loss again. Cases: GQA (2 query heads on 1 KV head),
// head_dim 64, tied and untied embeddings, dense attention and sparse with
// top_p = 1, a length that is not a multiple of the 64-token tile (T = 130).
// Needs a GPU (`make test-gpu`), or the sim (tests/test_sim.sh).
//   build/tests/gpu_test_backend         every case
//   build/tests/gpu_test_backend small   the untied dense and the tied sparse case
//
// Tolerances: the loss within 1e-2 relative (bf16 activations: 2^-9 per
// rounding, a few dozen roundings along the two layers, errors that average
// out over the tokens' mean); every parameter's gradient within 2e-2 relative
// Frobenius error (the backward runs through bf16 activation gradients and
// bf16 compute weights, each product summed in fp32: a few 2^-9 roundings per
// layer, compounded over both layers and the head); the loss after one AdamW
// step within 1e-2 and below the first (the step went through the bf16 copy
// of the updated master, which the second forward reads).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/model.h"
#include "../model/optimizer.h"
#include "check.h"

typedef struct {
    const char *name;
    bool tied, sparse;
    int64_t T;
} Case;

static ModelConfig case_model(const Case *k) {
    ModelConfig c = {.vocab_size = 256, .hidden_size = 128, .intermediate_size = 256, .num_layers = 2,
                     .num_heads = 2, .num_kv_heads = 1, .head_dim = 64, .rope_theta = 10000.0,
                     .rms_norm_eps = 1e-6, .tie_word_embeddings = k->tied, .init_std = 0.05,
                     .max_position_embeddings = 4096};
    return c;
}

static AttentionConfig case_attention(const Case *k) {
    AttentionConfig a = {.type = k->sparse ? ATTN_SPARSE : ATTN_DENSE, .block_size = 64, .last_q = 64,
                         .top_p = 1.0, .max_vertical = 4096, .max_slash = 4096, .sink = 0, .local = 1,
                         .budget = BUDGET_TOPP};
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
    m->be->upload(m->param_mem, weights, sizeof(float) * (size_t)m->total_params);
    model_weights_changed(m);
    float scale = 1.0f / (float)T;
    loss[0] = model_forward_backward(m, seq, seq + 1, NULL, T, scale) / (double)T;
    *grads = download_arena(m, m->grad_mem);
    OptimizerConfig oc = {.lr = 1e-3, .min_lr = 1e-3, .total_steps = 1, .schedule = LR_CONSTANT,
                          .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0};
    optimizer_step(m, &oc, 1, NULL);
    loss[1] = model_loss(m, seq, seq + 1, NULL, T) / (double)T;
}

static void run_case(const Case *k) {
    ModelConfig c = case_model(k);
    AttentionConfig a = case_attention(k);
    Model cpu, gpu;
    model_init(&cpu, &c, backend_cpu());
    model_init(&gpu, &c, backend_cuda());
    model_set_attention(&cpu, &a);
    model_set_attention(&gpu, &a);
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
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < cpu.num_params; i++) {
        const ParamInfo *p = &cpu.params[i];
        double e = rel_frobenius(grad_gpu + p->offset, grad_cpu + p->offset, p->numel);
        if (!(e <= worst)) { worst = e; worst_name = p->name; }
    }
    EXPECT(worst <= 2e-2, "%s: every gradient within 2e-2 relative Frobenius error (worst %.2e, %s)", k->name,
           worst, worst_name);
    double rel_after = fabs(loss_gpu[1] - loss_cpu[1]) / loss_cpu[1];
    EXPECT(rel_after <= 1e-2 && loss_gpu[1] < loss_gpu[0],
           "%s: after one AdamW step loss %.6f (cuda) vs %.6f (cpu): relative %.2e <= 1e-2, below %.6f", k->name,
           loss_gpu[1], loss_cpu[1], rel_after, loss_gpu[0]);

    free(seq);
    free(weights);
    free(grad_cpu);
    free(grad_gpu);
    model_free(&cpu);
    model_free(&gpu);
}

int main(int argc, char **argv) {
    bool small = argc > 1 && !strcmp(argv[1], "small");
    const Case cases[] = {
        {"untied dense T=130", false, false, 130},
        {"tied sparse top_p=1 T=128", true, true, 128},
        {"tied dense T=37", true, false, 37},
        {"untied sparse top_p=1 T=130", false, true, 130},
    };
    int n = small ? 2 : (int)(sizeof(cases) / sizeof(cases[0]));
    for (int i = 0; i < n; i++) run_case(&cases[i]);
    return check_exit();
}
