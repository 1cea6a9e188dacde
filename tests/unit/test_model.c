// test_model.c: the model and optimizer on the CPU backend: parameter table,
// seeded initialisation (the counter-based normal's moments and tails, the
// weights of a seed the same on one thread and on two), the recompute policies (bitwise identical
// gradients), gradient accumulation, LR schedules, AdamW against a hand
// computation, clipping, overfitting one fixed batch, and document masking
// (one document's tokens do not reach the others' loss and gradients), and
// the element-type contract of the backend table: a backend whose compute
// weights are a copy of their own (the CPU ops on a separate fp32 buffer, as
// a GPU's bf16 copy would be) trains, loads an HF folder and scores bit for
// bit like the CPU backend, which fails if any writer of param_mem leaves the
// copy stale; the activation arena counts its statistics in fp32 whatever
// act_bytes; and packed documents with RoPE positions restarting at each
// equal to each alone.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../data/synthetic.h"
#include "../../model/hf_io.h"
#include "../../model/model.h"
#include "../../model/optimizer.h"
#include "../lib/check.h"

static ModelConfig tiny_config(void) {
    ModelConfig c = {.vocab_size = 64, .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                     .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .rope_theta = 10000.0,
                     .rms_norm_eps = 1e-6, .tie_word_embeddings = false, .init_std = 0.1,
                     .max_position_embeddings = 4096};
    return c;
}

static float *download_arena(const Model *m, float *arena) {
    float *host = malloc(sizeof(float) * (size_t)m->total_params);
    m->be->download(host, arena, sizeof(float) * (size_t)m->total_params);
    return host;
}

static void grads_of(Model *m, const int32_t *seq, int64_t T, float scale) {
    m->be->zero(m->grad_mem, sizeof(float) * (size_t)m->total_params);
    model_forward_backward(m, seq, seq + 1, NULL, T, scale);
}

static void test_param_table(void) {
    ModelConfig c = tiny_config();
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    EXPECT(m.num_params == 1 + 12 * 2 + 2, "table has embed + 12 per layer + norm + untied head");
    int q = model_layer_param(&m, 1, LAYER_Q_WEIGHT);
    EXPECT(!strcmp(m.params[q].name, "model.layers.1.self_attn.q_proj.weight") && m.params[q].shape[0] == 32 &&
           m.params[q].shape[1] == 32, "q_proj name and shape [Hq*D, H]");
    int k = model_layer_param(&m, 0, LAYER_K_BIAS);
    EXPECT(!strcmp(m.params[k].name, "model.layers.0.self_attn.k_proj.bias") && m.params[k].shape[0] == 16,
           "k_proj bias shape [Hkv*D]");
    int bad_decay = 0;
    for (int i = 0; i < m.num_params; i++) {
        const char *n = m.params[i].name;
        bool vector = m.params[i].ndim == 1;
        if (m.params[i].decay == vector) bad_decay++;
        if (vector != (strstr(n, "bias") || strstr(n, "norm"))) bad_decay++;
    }
    EXPECT(bad_decay == 0, "weight decay on matrices only (not norms or biases)");
    EXPECT(!strcmp(m.params[model_head_param(&m)].name, "lm_head.weight"), "untied head is lm_head.weight");
    // The arena: every tensor once, no gaps; per layer q, k, v weights adjacent, then their biases, and gate then
    // up (the fused GEMMs), the input norm first (the layer's part of the arena starts there).
    char *covered = calloc((size_t)m.total_params, 1);
    int overlaps = 0, apart = 0;
    for (int i = 0; i < m.num_params; i++)
        for (int64_t j = 0; j < m.params[i].numel; j++) overlaps += covered[m.params[i].offset + j]++ != 0;
    for (int64_t j = 0; j < m.total_params; j++) overlaps += covered[j] != 1;
    free(covered);
    for (int l = 0; l < c.num_layers; l++) {
        const LayerTensor follows[][2] = {{LAYER_Q_WEIGHT, LAYER_K_WEIGHT}, {LAYER_K_WEIGHT, LAYER_V_WEIGHT},
                                          {LAYER_Q_BIAS, LAYER_K_BIAS}, {LAYER_K_BIAS, LAYER_V_BIAS},
                                          {LAYER_GATE_WEIGHT, LAYER_UP_WEIGHT}};
        for (size_t f = 0; f < sizeof(follows) / sizeof(follows[0]); f++) {
            const ParamInfo *x = &m.params[model_layer_param(&m, l, follows[f][0])];
            apart += x->offset + x->numel != m.params[model_layer_param(&m, l, follows[f][1])].offset;
        }
        for (int t = 0; t < LAYER_TENSORS; t++)
            apart += m.params[model_layer_param(&m, l, (LayerTensor)t)].offset <
                     m.params[model_layer_param(&m, l, LAYER_INPUT_NORM)].offset;
    }
    EXPECT(overlaps == 0 && apart == 0, "arena: each element once (%d wrong), q|k|v, their biases and gate|up "
           "adjacent, the input norm first (%d wrong)", overlaps, apart);
    model_free(&m);
    c.tie_word_embeddings = true;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    EXPECT(model_head_param(&m) == model_embedding_param() && model_param_index(&m, "lm_head.weight") < 0,
           "tied head is the embedding");
    model_free(&m);
}

static void test_init(void) {
    ModelConfig c = tiny_config();
    Model a, b;
    model_init(&a, &c, backend_cpu(), NULL, 1024);
    model_init(&b, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&a, 7);
    model_init_weights(&b, 7);
    float *wa = download_arena(&a, a.param_mem), *wb = download_arena(&b, b.param_mem);
    EXPECT(!memcmp(wa, wb, sizeof(float) * (size_t)a.total_params), "same seed, same weights");
    model_init_weights(&b, 8);
    free(wb);
    wb = download_arena(&b, b.param_mem);
    EXPECT(memcmp(wa, wb, sizeof(float) * (size_t)a.total_params) != 0, "other seed, other weights");
    const ParamInfo *norm = &a.params[model_layer_param(&a, 0, LAYER_POST_NORM)];
    const ParamInfo *bias = &a.params[model_layer_param(&a, 1, LAYER_V_BIAS)];
    const ParamInfo *emb = &a.params[model_embedding_param()];
    int ok_norm = 1, ok_bias = 1;
    for (int64_t i = 0; i < norm->numel; i++) ok_norm &= wa[norm->offset + i] == 1.0f;
    for (int64_t i = 0; i < bias->numel; i++) ok_bias &= wa[bias->offset + i] == 0.0f;
    double ss = 0;
    for (int64_t i = 0; i < emb->numel; i++) ss += (double)wa[emb->offset + i] * wa[emb->offset + i];
    double std = sqrt(ss / (double)emb->numel);
    EXPECT(ok_norm && ok_bias, "norms start at 1, biases at 0");
    EXPECT(fabs(std - 0.1) < 0.01, "matrix std %.4f matches init_std 0.1", std);
    free(wa);
    free(wb);
    model_free(&a);
    model_free(&b);
}

// rng_normal_at over 4M indices of one key: mean 0, variance 1, kurtosis 3,
// and each one-sided tail beyond 1, 2, 3 and 4 (0.15866, 0.022750,
// 1.3499e-3, 3.1671e-5) within 5 standard errors; another key draws other
// values.
static void test_normal_at(void) {
    const int64_t n = (int64_t)1 << 22;
    const double limits[4] = {1, 2, 3, 4}, tails[4] = {0.15866, 0.022750, 1.3499e-3, 3.1671e-5};
    double sum = 0, sum2 = 0, sum4 = 0, above[4] = {0}, below[4] = {0};
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) {
        double z = rng_normal_at(42, (uint64_t)i);
        sum += z, sum2 += z * z, sum4 += z * z * z * z;
        for (int k = 0; k < 4; k++) above[k] += z > limits[k], below[k] += z < -limits[k];
        same += i < 1000 && z == rng_normal_at(43, (uint64_t)i);
    }
    double mean = sum / n, var = sum2 / n - mean * mean, kurt = sum4 / n / (var * var);
    EXPECT(fabs(mean) < 5 / sqrt((double)n) && fabs(var - 1) < 5 * sqrt(2.0 / n) && fabs(kurt - 3) < 5 * sqrt(24.0 / n),
           "normal_at: mean %.5f, variance %.5f, kurtosis %.4f (0, 1, 3)", mean, var, kurt);
    for (int k = 0; k < 4; k++) {
        double hi = above[k] / n, lo = below[k] / n, se = sqrt(tails[k] * (1 - tails[k]) / n);
        EXPECT(fabs(hi - tails[k]) < 5 * se && fabs(lo - tails[k]) < 5 * se,
               "normal_at: P(z > %.0f) = %.3e, P(z < -%.0f) = %.3e (%.3e)", limits[k], hi, limits[k], lo, tails[k]);
    }
    EXPECT(same == 0, "normal_at: another key, other values");
}

// The initial weights of a seed: element j of tensor i is init_std *
// rng_normal_at(rng_hash(seed, i), j) (so byte-identical on one thread and
// on two), each normal tensor with mean 0 and std init_std.
static void test_init_threads(void) {
    ModelConfig c = tiny_config();
    c.hidden_size = 256, c.intermediate_size = 512, c.num_heads = 8, c.head_dim = 32, c.vocab_size = 1000;
    c.init_std = 0.02;
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    model_init_weights(&m, 99);
    float *one = download_arena(&m, m.param_mem);
    omp_set_num_threads(2);
    model_init_weights(&m, 99);
    float *two = download_arena(&m, m.param_mem);
    omp_set_num_threads(threads);
    EXPECT(!memcmp(one, two, sizeof(float) * (size_t)m.total_params), "initial weights: one thread and two the same");
    int bad_moments = 0, bad_elements = 0;
    for (int i = 0; i < m.num_params; i++) {
        const ParamInfo *p = &m.params[i];
        if (p->init != INIT_NORMAL) continue;
        double sum = 0, sum2 = 0;
        for (int64_t j = 0; j < p->numel; j++) sum += one[p->offset + j], sum2 += (double)one[p->offset + j] * one[p->offset + j];
        double mean = sum / p->numel, std = sqrt(sum2 / p->numel - mean * mean);
        // five standard errors of the mean and of the std (0.02 / sqrt(2 n))
        if (fabs(mean) > 5 * 0.02 / sqrt((double)p->numel) || fabs(std - 0.02) > 5 * 0.02 / sqrt(2.0 * p->numel))
            bad_moments++, printf("# %s: mean %.3g std %.5g\n", p->name, mean, std);
        for (int64_t j = 0; j < p->numel; j += 997)
            bad_elements += one[p->offset + j] != (float)(0.02 * rng_normal_at(rng_hash(99, (uint64_t)i), (uint64_t)j));
    }
    EXPECT(bad_moments == 0, "every normal tensor: mean 0, std init_std (%d off)", bad_moments);
    EXPECT(bad_elements == 0, "element j of tensor i is init_std * normal_at(hash(seed, i), j) (%d differ)",
           bad_elements);
    free(one);
    free(two);
    model_free(&m);
}

// The recompute policies: selective and full give the loss and every
// gradient bitwise equal to none's, each in less activation memory than the
// one before it.
static void test_recompute_policies(void) {
    static const char *const names[] = {"none", "selective", "full"};
    ModelConfig c = tiny_config();
    int64_t T = 77;
    int32_t seq[78];
    synthetic_sequence(3, 0, c.vocab_size, seq, T + 1);
    float *grads[3];
    double loss[3];
    for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
        Model m;
        model_init(&m, &c, backend_cpu(), NULL, 1024);
        model_init_weights(&m, 11);
        m.attention.block_size = 16;
        m.loss_chunk = 10;
        model_set_activations(&m, (RecomputePolicy)r, 0, T);
        model_zero_grads(&m);
        loss[r] = model_forward_backward(&m, seq, seq + 1, NULL, T, 1.0f / (float)T);
        grads[r] = download_arena(&m, m.grad_mem);
        if (r > RECOMPUTE_NONE)
            EXPECT(loss[r] == loss[0] && !memcmp(grads[0], grads[r], sizeof(float) * (size_t)m.total_params),
                   "recompute %s gives the loss and gradients of none bitwise (loss %.17g vs %.17g)", names[r],
                   loss[r], loss[0]);
        model_free(&m);
    }
    size_t bytes[3];
    for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
        Model deep = {.cfg = c, .be = backend_cpu(), .loss_chunk = 10, .recompute = (RecomputePolicy)r};
        deep.cfg.num_layers = 16;
        bytes[r] = model_activation_bytes(&deep, 4096);
        free(grads[r]);
    }
    EXPECT(bytes[RECOMPUTE_FULL] < bytes[RECOMPUTE_SELECTIVE] && bytes[RECOMPUTE_SELECTIVE] < bytes[RECOMPUTE_NONE] &&
           bytes[RECOMPUTE_FULL] < 0.5 * (double)bytes[RECOMPUTE_NONE],
           "a 16-layer model's activations: none %zu > selective %zu > full %zu bytes, full under half of none",
           bytes[RECOMPUTE_NONE], bytes[RECOMPUTE_SELECTIVE], bytes[RECOMPUTE_FULL]);
}

// The MLP in token chunks (model_mlp_chunk_rows). Under checkpointing a
// chunk covering the sequence (the chunked code path: gate, up and act
// recomputed chunk by chunk in the backward) gives the loss and every
// gradient bitwise equal to the MLP whole; chunks of 16 of 77 tokens, with
// and without checkpointing, equal up to rounding (the weight gradients
// summed chunk by chunk) in less activation memory.
typedef struct {
    double loss;
    float *grads;
    int64_t count;
    size_t bytes;
} MlpRun;

static MlpRun mlp_run(const int32_t *seq, int64_t T, int mlp_chunk, bool ckpt) {
    ModelConfig c = tiny_config();
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 11);
    m.attention.block_size = 16;
    m.loss_chunk = 10;
    model_set_activations(&m, ckpt ? RECOMPUTE_FULL : RECOMPUTE_NONE, mlp_chunk, T);
    m.be->zero(m.grad_mem, sizeof(float) * (size_t)m.total_params);
    MlpRun r = {.loss = model_forward_backward(&m, seq, seq + 1, NULL, T, 1.0f / (float)T), .count = m.total_params,
                .bytes = model_activation_bytes(&m, T)};
    r.grads = download_arena(&m, m.grad_mem);
    model_free(&m);
    return r;
}

// Largest |a - b| over the largest |a| of two gradient arenas.
static double relative_diff(const MlpRun *a, const MlpRun *b) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < a->count; i++) {
        diff = fmax(diff, fabs((double)a->grads[i] - b->grads[i]));
        scale = fmax(scale, fabs((double)a->grads[i]));
    }
    return diff / scale;
}

static void test_mlp_chunks(void) {
    const int64_t T = 77;
    int32_t seq[78];
    synthetic_sequence(5, 0, tiny_config().vocab_size, seq, T + 1);
    MlpRun whole = mlp_run(seq, T, 0, true), one = mlp_run(seq, T, (int)T, true);
    EXPECT(whole.loss == one.loss && !memcmp(whole.grads, one.grads, sizeof(float) * (size_t)whole.count),
           "mlp_chunk_covering_sequence_bitwise (checkpointed: loss %.17g vs %.17g)", whole.loss, one.loss);
    for (int ckpt = 0; ckpt <= 1; ckpt++) {
        MlpRun full = mlp_run(seq, T, 0, ckpt), chunks = mlp_run(seq, T, 16, ckpt);
        double d = relative_diff(&full, &chunks);
        // The loss sums 77 tokens' fp32 losses near 4.3 (an ulp is 5e-7): the GEMMs of 16 rows round apart
        // from those of 77 by a few ulps; a wrong row or chunk is off by whole units.
        EXPECT(fabs(full.loss - chunks.loss) < 1e-5 && d < 1e-5 && chunks.bytes < full.bytes,
               "mlp_chunks_of_16%s (loss %.9g vs %.9g, gradients %.2g apart, activations %zu vs %zu bytes)",
               ckpt ? "_checkpointed" : "", full.loss, chunks.loss, d, chunks.bytes, full.bytes);
        free(full.grads);
        free(chunks.grads);
    }
    free(whole.grads);
    free(one.grads);
}

static void test_accumulation(void) {
    ModelConfig c = tiny_config();
    int64_t T = 40;
    int32_t a[41], b[41];
    synthetic_sequence(5, 0, c.vocab_size, a, T + 1);
    synthetic_sequence(5, 1, c.vocab_size, b, T + 1);
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 2);
    grads_of(&m, a, T, 0.5f / (float)T);
    float *ga = download_arena(&m, m.grad_mem);
    grads_of(&m, b, T, 0.5f / (float)T);
    float *gb = download_arena(&m, m.grad_mem);
    grads_of(&m, a, T, 0.5f / (float)T);
    model_forward_backward(&m, b, b + 1, NULL, T, 0.5f / (float)T);
    float *gab = download_arena(&m, m.grad_mem);
    for (int64_t i = 0; i < m.total_params; i++) ga[i] += gb[i];
    EXPECT(max_rel_diff(gab, ga, m.total_params) < 1e-6, "two accumulated micro-batches equal the sum of their gradients");
    free(ga);
    free(gb);
    free(gab);
    model_free(&m);
}

// Steps 1, W (warmup end), W + 1 and T of each schedule against the formula
// lr_s = min + (lr - min) * f((s - W - 1) / (T - W)) after warmup.
static void test_schedule(void) {
    OptimizerConfig oc = {.lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110, .schedule = LR_COSINE};
    EXPECT(fabs(lr_at(&oc, 1) - 0.1) < 1e-12, "warmup step 1 is lr / W, not 0");
    EXPECT(fabs(lr_at(&oc, 5) - 0.5) < 1e-12, "warmup is linear from 0");
    EXPECT(fabs(lr_at(&oc, 10) - 1.0) < 1e-12, "warmup ends at the peak");
    EXPECT(fabs(lr_at(&oc, 11) - 1.0) < 1e-12, "cosine: the first step after warmup is at the peak");
    EXPECT(fabs(lr_at(&oc, 61) - 0.55) < 1e-12, "cosine midpoint is halfway to the floor");
    double last = 0.1 + 0.9 * 0.5 * (1.0 + cos(M_PI * 99.0 / 100.0));
    EXPECT(fabs(lr_at(&oc, 110) - last) < 1e-12 && lr_at(&oc, 110) > 0.1, "cosine: the last step is above the floor");
    oc.schedule = LR_LINEAR;
    EXPECT(fabs(lr_at(&oc, 11) - 1.0) < 1e-12, "linear: the first step after warmup is at the peak");
    EXPECT(fabs(lr_at(&oc, 36) - 0.775) < 1e-12, "linear decay a quarter of the way");
    EXPECT(fabs(lr_at(&oc, 110) - 0.109) < 1e-12, "linear: the last step is one decay step above the floor");
    oc.schedule = LR_CONSTANT;
    EXPECT(fabs(lr_at(&oc, 1) - 0.1) < 1e-12 && fabs(lr_at(&oc, 110) - 1.0) < 1e-12,
           "constant: warmup, then lr to the last step");
    OptimizerConfig none = {.lr = 2e-3, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4, .schedule = LR_COSINE};
    EXPECT(fabs(lr_at(&none, 1) - 2e-3) < 1e-15, "warmup 0, cosine: step 1 at the peak");
    EXPECT(fabs(lr_at(&none, 4) - 1e-3 * (1.0 + cos(M_PI * 0.75))) < 1e-15 && lr_at(&none, 4) > 0,
           "warmup 0, cosine: the last step above min_lr 0");
    none.schedule = LR_LINEAR;
    EXPECT(fabs(lr_at(&none, 1) - 2e-3) < 1e-15 && fabs(lr_at(&none, 4) - 5e-4) < 1e-15,
           "warmup 0, linear: step 1 at the peak, step 4 at a quarter");
    none.total_steps = 1;
    none.schedule = LR_COSINE;
    EXPECT(fabs(lr_at(&none, 1) - 2e-3) < 1e-15, "one step: at the peak");
}

// One AdamW step on every tensor against the formula, with clipping.
static void test_adamw(void) {
    ModelConfig c = tiny_config();
    int64_t T = 30;
    int32_t seq[31];
    synthetic_sequence(9, 0, c.vocab_size, seq, T + 1);
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 4);
    grads_of(&m, seq, T, 1.0f / (float)T);
    float *w0 = download_arena(&m, m.param_mem), *g = download_arena(&m, m.grad_mem);
    double ss = 0;
    for (int64_t i = 0; i < m.total_params; i++) ss += (double)g[i] * g[i];
    double norm = sqrt(ss);
    OptimizerConfig oc = {.lr = 0.01, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 10, .schedule = LR_CONSTANT,
                          .weight_decay = 0.5, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = norm / 4};
    double lr;
    double reported = optimizer_step(&m, &oc, 1, &lr);
    float *w1 = download_arena(&m, m.param_mem);
    EXPECT(fabs(reported - norm) < 1e-6 * norm, "reported grad norm is the norm before clipping");
    double worst = 0;
    for (int i = 0; i < m.num_params; i++) {
        const ParamInfo *p = &m.params[i];
        for (int64_t j = 0; j < p->numel; j++) {
            int64_t k = p->offset + j;
            double gc = g[k] * 0.25, mh = gc, vh = gc * gc;  // step 1: bias-corrected moments
            double expect = w0[k] - 0.01 * (mh / (sqrt(vh) + 1e-8) + (p->decay ? 0.5 * w0[k] : 0.0));
            double err = fabs(expect - w1[k]);
            if (err > worst) worst = err;
        }
    }
    EXPECT(worst < 1e-6, "AdamW step with clipping and decoupled decay matches the formula (max err %.2e)", worst);
    free(w0);
    free(g);
    free(w1);
    model_free(&m);
}

static void test_overfit(void) {
    ModelConfig c = tiny_config();
    int64_t T = 48;
    int32_t seq[49];
    Rng rng;
    rng_seed(&rng, 99);
    for (int i = 0; i <= T; i++) seq[i] = (int32_t)rng_below(&rng, (uint64_t)c.vocab_size);
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 1);
    OptimizerConfig oc = {.lr = 1e-2, .min_lr = 0.0, .warmup_steps = 10, .total_steps = 300, .schedule = LR_CONSTANT,
                          .weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .grad_clip = 1.0};
    double first = 0, loss = 0;
    for (int step = 1; step <= 300; step++) {
        m.be->zero(m.grad_mem, sizeof(float) * (size_t)m.total_params);
        loss = model_forward_backward(&m, seq, seq + 1, NULL, T, 1.0f / (float)T) / (double)T;
        if (step == 1) first = loss;
        optimizer_step(&m, &oc, step, NULL);
        if (loss < 0.05) break;
    }
    EXPECT(first > 3.5 && loss < 0.05, "overfits one fixed batch: loss %.3f -> %.4f", first, loss);
    model_free(&m);
}

// Loss and gradients of the targets outside document A = positions [31, 70)
// (and outside 30, whose target is A's first token), with A's tokens as
// given, dense or sparse attention (block 16, documents crossing blocks, a
// one-token document at 30; sparse: a pattern estimated from the last 16
// queries, top_p 0.5, sink 4, local 8); documents masked when `docs`.
static double loss_outside_a(const int32_t *seq, bool docs, AttnType type, float **grads) {
    static const int64_t starts[] = {0, 30, 31, 70};
    const int64_t T = 96;
    ModelConfig c = tiny_config();
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 12);
    const AttentionConfig attention = {.type = type, .block_size = 16, .last_q = 16, .top_p = 0.5,
                                       .max_vertical = 8, .max_slash = 4, .sink = 4, .local = 8};
    model_set_attention(&m, &attention);
    m.loss_chunk = 10;
    model_set_documents(&m, docs ? starts : NULL, 4);
    int32_t targets[96];
    for (int64_t t = 0; t < T; t++) targets[t] = t >= 30 && t < 70 ? -1 : seq[t + 1];
    m.be->zero(m.grad_mem, sizeof(float) * (size_t)m.total_params);
    const double loss = model_forward_backward(&m, seq, targets, NULL, T, 1.0f / (float)T);
    *grads = download_arena(&m, m.grad_mem);
    model_free(&m);
    return loss;
}

static void test_documents(void) {
    int32_t seq[97], changed[97];
    synthetic_sequence(5, 0, tiny_config().vocab_size, seq, 97);
    memcpy(changed, seq, sizeof(seq));
    for (int t = 31; t < 70; t++) changed[t] = (seq[t] + 7 + t) % tiny_config().vocab_size;
    Model shape;
    ModelConfig c = tiny_config();
    model_init(&shape, &c, backend_cpu(), NULL, 1024);
    const long n = (long)shape.total_params;
    model_free(&shape);
    for (int docs = 1; docs >= 0; docs--)
        for (int sparse = 0; sparse < 2; sparse++) {
            const AttnType type = sparse ? ATTN_SPARSE : ATTN_DENSE;
            const char *name = sparse ? "sparse" : "dense";
            float *g0, *g1;
            const double l0 = loss_outside_a(seq, docs, type, &g0);
            const double l1 = loss_outside_a(changed, docs, type, &g1);
            const double dg = max_rel_diff(g1, g0, n), dl = fabs(l1 - l0) / l0;
            if (docs)
                EXPECT(dl < 1e-7 && dg < 1e-6, "%s, documents masked: changing document A leaves the others' "
                       "loss (%.1e) and gradients (%.1e) unchanged", name, dl, dg);
            else
                EXPECT(dl > 1e-4 && dg > 1e-3, "%s, documents not masked: changing document A changes the "
                       "others' loss (%.1e) and gradients (%.1e)", name, dl, dg);
            free(g0); free(g1);
        }
}

// The CPU backend with compute weights of its own: a separate fp32 buffer,
// filled only by weights_new and weights_refresh.
static int64_t refreshes;

static Weight *copy_weights_new(float *master, int64_t begin, int64_t count, int64_t n) {
    float *w = xcalloc((size_t)n, sizeof(float));
    memcpy(w + begin, master, sizeof(float) * (size_t)count);
    return (Weight *)w;
}

static void copy_weights_free(Weight *w, float *master) {
    (void)master;
    free(w);
}

static void copy_weights_refresh(Weight *w, const float *master, int64_t begin, int64_t count) {
    memcpy((float *)w + begin, master, sizeof(float) * (size_t)count);
    refreshes++;
}

// The CPU's AdamW, then the copy of the run it updated written from it (as
// the CUDA backend's AdamW writes its bf16 copy in the same pass).
static void copy_adamw(float *param, Weight *weight, const float *grad, float *m, float *v,
                       const AdamWTensor *tensors, int count, const AdamWStep *hp) {
    backend_cpu()->adamw(param, (Weight *)param, grad, m, v, tensors, count, hp);
    for (int t = 0; t < count; t++)
        memcpy((float *)weight + tensors[t].offset, param + tensors[t].offset, sizeof(float) * (size_t)tensors[t].n);
    refreshes++;
}

static Backend copying_backend(void) {
    Backend be = *backend_cpu();
    be.weights_new = copy_weights_new;
    be.weights_free = copy_weights_free;
    be.weights_refresh = copy_weights_refresh;
    be.adamw = copy_adamw;
    return be;
}

static const OptimizerConfig adam = {.lr = 1e-2, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 10,
                                     .schedule = LR_CONSTANT, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.99,
                                     .eps = 1e-8, .grad_clip = 1.0};

// Losses of `steps` training steps on seq from seed-7 weights, then the loss
// after the last step, into losses [steps + 1].
static void train_losses(const Backend *be, const int32_t *seq, int64_t T, int steps, double *losses) {
    ModelConfig c = tiny_config();
    Model m;
    model_init(&m, &c, be, NULL, 1024);
    model_init_weights(&m, 7);
    for (int s = 1; s <= steps; s++) {
        m.be->zero(m.grad_mem, sizeof(float) * (size_t)m.total_params);
        losses[s - 1] = model_forward_backward(&m, seq, seq + 1, NULL, T, 1.0f / (float)T);
        optimizer_step(&m, &adam, s, NULL);
    }
    losses[steps] = model_loss(&m, seq, seq + 1, NULL, T);
    model_free(&m);
}

static void test_training_refreshes(void) {
    enum { T = 40, STEPS = 3 };
    int32_t seq[T + 1];
    synthetic_sequence(4, 0, tiny_config().vocab_size, seq, T + 1);
    Backend copying = copying_backend();
    double cpu[STEPS + 1], copy[STEPS + 1];
    train_losses(backend_cpu(), seq, T, STEPS, cpu);
    refreshes = 0;
    train_losses(&copying, seq, T, STEPS, copy);
    EXPECT(!memcmp(cpu, copy, sizeof(cpu)) && cpu[STEPS] < cpu[0],
           "a backend with its own weight copy trains bit for bit like the CPU backend (loss %.6f -> %.6f)",
           cpu[0] / T, cpu[STEPS] / T);
    EXPECT(refreshes == 1 + STEPS, "the copy is refreshed by the initialisation and written by each optimizer "
           "step's AdamW (%lld refreshes)", (long long)refreshes);
}

// The copy is really separate (so the test above can fail): a change of
// param_mem is seen by the ops only after model_weights_changed.
static void test_stale_copy_detected(void) {
    enum { T = 24 };
    int32_t seq[T + 1];
    synthetic_sequence(6, 0, tiny_config().vocab_size, seq, T + 1);
    ModelConfig c = tiny_config();
    Backend copying = copying_backend();
    Model m;
    model_init(&m, &c, &copying, NULL, 1024);
    model_init_weights(&m, 3);
    double before = model_loss(&m, seq, seq + 1, NULL, T);
    int head = model_head_param(&m);
    float *w = model_tensor(&m, m.param_mem, head);
    for (int64_t i = 0; i < m.params[head].numel; i++) w[i] *= 3.0f;
    double stale = model_loss(&m, seq, seq + 1, NULL, T);
    model_weights_changed(&m);
    double fresh = model_loss(&m, seq, seq + 1, NULL, T);
    EXPECT(stale == before && fresh != before,
           "the ops read the compute copy: unchanged until model_weights_changed (%.6f, %.6f, then %.6f)",
           before / T, stale / T, fresh / T);
    model_free(&m);
}

// Weights written to an HF folder by one model load into a model on the
// copying backend: the same loss (loading refreshes the copy).
static void test_loading_refreshes(void) {
    enum { T = 24 };
    int32_t seq[T + 1];
    synthetic_sequence(8, 0, tiny_config().vocab_size, seq, T + 1);
    char dir[] = "/tmp/test_model_XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp %s", dir);
    char path[64];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    ModelConfig c = tiny_config();
    Model source, loaded;
    model_init(&source, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&source, 21);
    double want = model_loss(&source, seq, seq + 1, NULL, T);
    model_write_safetensors(&source, source.param_mem, path, ST_F32);
    Backend copying = copying_backend();
    model_init(&loaded, &c, &copying, NULL, 1024);
    model_init_weights(&loaded, 22);
    double other = model_loss(&loaded, seq, seq + 1, NULL, T);
    model_load_hf_weights(&loaded, dir, NULL);
    double got = model_loss(&loaded, seq, seq + 1, NULL, T);
    EXPECT(got == want && other != want, "loading an HF folder refreshes the copy: loss %.6f as saved (%.6f before)",
           got / T, other / T);
    model_free(&source);
    model_free(&loaded);
    unlink(path);
    rmdir(dir);
}

// Statistics (rstd per norm, lse per layer, the final rstd) stay fp32:
// the arena with 2-byte activations is half the 4-byte one's activations plus
// all of its statistics.
static void test_arena_bytes(void) {
    ModelConfig c = tiny_config();
    const int64_t T = 37, L = c.num_layers, Hq = c.num_heads;
    static const char *const names[] = {"none", "selective", "full"};
    for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
        size_t fp32 = model_activation_arena_bytes(&c, (RecomputePolicy)r, 10, 0, T, 4);
        size_t bf16 = model_activation_arena_bytes(&c, (RecomputePolicy)r, 10, 0, T, 2);
        // rstd twice and lse per kept layer (selective: the rstd of one, every layer's lse), the final rstd
        int64_t rstd_layers = r == RECOMPUTE_NONE ? L : 1, lse_layers = r == RECOMPUTE_FULL ? 1 : L;
        int64_t stats = (rstd_layers * 2 * T + lse_layers * Hq * T + T + 63) / 64 * 64;  // padded to 64 elements
        size_t acts16 = fp32 - bf16;  // the Act elements x 2 bytes
        EXPECT(bf16 == acts16 + 4 * (size_t)stats, "%s: %lld statistics fp32 in the bf16 arena (%zu vs %zu bytes)",
               names[r], (long long)stats, bf16, fp32);
    }
    Model cpu = {.cfg = c, .be = backend_cpu(), .loss_chunk = 10};
    EXPECT(model_activation_bytes(&cpu, T) == model_activation_arena_bytes(&c, RECOMPUTE_NONE, 10, 0, T, 4),
           "the CPU backend's arena uses 4-byte activations");
}

// data.reset_positions with data.doc_mask: a sequence packing documents
// [0, 40) and [40, 72) has the loss and gradients of the two documents run
// alone (each at positions 0.., with the same next-token targets). RoPE is
// relative, so this holds up to rounding with the global positions too; the
// positions themselves are checked in test_rope, and the unmasked case, where
// they change the result, against the reference in test_reference.py.
static double packed_or_alone(const int32_t *seq, bool packed, float **grads) {
    static const int64_t starts[] = {0, 40};
    const int64_t T = 72;
    ModelConfig c = tiny_config();
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 21);
    m.loss_chunk = 16;
    m.be->zero(m.grad_mem, sizeof(float) * (size_t)m.total_params);
    double loss = 0;
    if (packed) {
        model_set_documents(&m, starts, 2);
        model_set_rope_documents(&m, starts, 2);
        loss = model_forward_backward(&m, seq, seq + 1, NULL, T, 1.0f);
    } else {
        loss = model_forward_backward(&m, seq, seq + 1, NULL, starts[1], 1.0f) +
               model_forward_backward(&m, seq + starts[1], seq + starts[1] + 1, NULL, T - starts[1], 1.0f);
    }
    *grads = download_arena(&m, m.grad_mem);
    model_free(&m);
    return loss;
}

static void test_reset_positions(void) {
    int32_t seq[73];
    synthetic_sequence(9, 0, tiny_config().vocab_size, seq, 73);
    float *gp, *ga;
    const double packed = packed_or_alone(seq, true, &gp), alone = packed_or_alone(seq, false, &ga);
    Model shape;
    ModelConfig c = tiny_config();
    model_init(&shape, &c, backend_cpu(), NULL, 1024);
    const double dg = max_rel_diff(gp, ga, (long)shape.total_params), dl = fabs(packed - alone) / alone;
    model_free(&shape);
    EXPECT(dl < 1e-6 && dg < 1e-5, "reset positions, documents masked: two packed documents have the loss (%.1e) "
           "and gradients (%.1e) of the two run alone", dl, dg);
    free(gp); free(ga);
}

int main(void) {
    test_param_table();
    test_init();
    test_normal_at();
    test_init_threads();
    test_recompute_policies();
    test_mlp_chunks();
    test_accumulation();
    test_schedule();
    test_adamw();
    test_overfit();
    test_documents();
    test_training_refreshes();
    test_stale_copy_detected();
    test_loading_refreshes();
    test_arena_bytes();
    test_reset_positions();
    return check_exit();
}
