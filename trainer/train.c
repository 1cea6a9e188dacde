// train.c: `mtrain train RUN.yaml`: the training loop. Per step: zero the
// gradients, run micro_batches sequences from the loader forward+backward,
// clip, AdamW, then one line on stdout and one JSON line in
// log.dir/metrics.jsonl. The loader's cursor (sequences consumed) is saved in
// every checkpoint, so a resumed run reads exactly the next sequence.
#include "train.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "commands.h"

void apply_threads(const Config *cfg) {
    if (cfg->parallel.threads > 0) omp_set_num_threads(cfg->parallel.threads);
}

void model_from_config(Model *m, const Config *cfg) {
    model_init(m, &cfg->model, backend_select(cfg->train.backend));
    model_set_attention(m, &cfg->attention);
    m->loss_chunk = cfg->train.loss_chunk;
    m->checkpoint_activations = cfg->train.checkpoint_activations;
}

OptimizerConfig optimizer_config(const Config *cfg) {
    const TrainConfig *t = &cfg->train;
    OptimizerConfig oc = {t->lr, t->min_lr, t->warmup_steps, t->steps, lr_schedule_from_name(t->lr_schedule),
                          t->weight_decay, t->beta1, t->beta2, t->eps, t->grad_clip};
    return oc;
}

static void print_memory(const Model *m, int64_t T) {
    double mib = 1.0 / (1 << 20), p = (double)m->total_params * sizeof(float) * mib;
    printf("model: %lld parameters | memory MiB: params %.1f, grads %.1f, adam %.1f, activations %.1f (T=%lld%s)\n",
           (long long)m->total_params, p, p, 2 * p, (double)model_activation_bytes(m, T) * mib, (long long)T,
           m->checkpoint_activations ? ", checkpointed" : "");
}

// Where the run starts: a checkpoint (checkpoint.resume), a Hugging Face
// folder (train.init_from), or the seeded initialisation.
static void start_state(const Config *cfg, Model *m, TrainState *state) {
    char path[4096];
    const char *resume = cfg->checkpoint.resume;
    int found = strcmp(resume, "auto") ? strcmp(resume, "never") && snprintf(path, sizeof(path), "%s", resume) > 0
                                       : checkpoint_find_latest(cfg->checkpoint.dir, path, sizeof(path));
    if (found) {
        checkpoint_load(path, m, state);
        printf("resumed from %s: step %lld, %lld tokens seen\n", path, (long long)state->step,
               (long long)state->tokens_seen);
    } else if (strcmp(cfg->train.init_from, "none")) {
        model_load_hf_folder(m, cfg->train.init_from);
        printf("initialised from %s\n", cfg->train.init_from);
    } else {
        model_init_weights(m, cfg->train.seed);
    }
}

// The data of a run: the loader, one packed sequence and this rank's slice of
// it (a single rank until dist/ exists: world 1, rank 0).
typedef struct {
    Loader loader;
    PackedSequence seq;
    RankSlice slice;
    LayoutKind layout;
    int block_size;
} RunData;

void loader_from_config(Loader *l, const Config *cfg) {
    LoaderConfig lc = {cfg->data.train, cfg->data.val, cfg->model.vocab_size, cfg->train.seq_len,
                       cfg->data.val_sequences, cfg->train.seed};
    loader_open(l, &lc);
}

bool run_start(int argc, char **argv, const char *usage, Config *cfg, Dist *dist) {
    if (argc < 1 || argv[0][0] == '-') {
        fprintf(stderr, "%s\n", usage);
        return false;
    }
    config_from_args(cfg, argv[0], argc - 1, argv + 1);
    dist_init(dist, NULL, NULL, cfg->parallel.timeout_s);
    dist_setup(dist, cfg->parallel.dp, cfg->parallel.cp, cfg->parallel.cp_inner, argv[0]);
    return true;
}

static void run_data_open(RunData *d, const Config *cfg) {
    loader_from_config(&d->loader, cfg);
    packed_sequence_alloc(&d->seq, cfg->train.seq_len);
    rank_slice_alloc(&d->slice, cfg->train.seq_len);
    d->layout = (LayoutKind)layout_parse(cfg->attention.layout);
    d->block_size = cfg->attention.block_size;
    if (!d->loader.synthetic) loader_print_summary(&d->loader, stdout);
}

static void run_data_close(RunData *d) {
    loader_close(&d->loader);
    packed_sequence_free(&d->seq);
    rank_slice_free(&d->slice);
}

// d->slice = this rank's part of d->seq.
static void slice_sequence(RunData *d) {
    loader_rank_slice(&d->seq, d->layout, d->block_size, 1, 0, &d->slice);
}

// Mean next-token loss over the validation stream.
static double validation_loss(Model *m, const Config *cfg, RunData *d) {
    double total = 0;
    for (int i = 0; i < cfg->data.val_sequences; i++) {
        loader_val_sequence(&d->loader, i, &d->seq);
        slice_sequence(d);
        total += model_loss(m, d->slice.tokens, d->slice.targets, d->slice.count);
    }
    return total / ((double)cfg->train.seq_len * cfg->data.val_sequences);
}

static void log_validation(Model *m, const Config *cfg, RunData *d, int64_t step, FILE *metrics, const char *path) {
    double loss = validation_loss(m, cfg, d);
    printf("validation | step %lld | loss %.4f\n", (long long)step, loss);
    fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.9g}\n", (long long)step, loss);
    if (fflush(metrics) != 0) fail("%s: write failed", path);
}

static void format_eta(double seconds, char *out, size_t n) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, n, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(out, n, "%ldm%02lds", s / 60, s % 60);
}

// Start (or not) collecting the sparse pattern's density and recall per layer
// for this step's forward passes.
static void begin_attention_stats(Model *m, const Config *cfg, int64_t step) {
    m->collect_attention_stats = !strcmp(cfg->attention.type, "sparse") && cfg->log.attention_every > 0 &&
                                 step % cfg->log.attention_every == 0;
    if (m->collect_attention_stats)
        memset(m->attention_stats, 0, sizeof(SparseStats) * (size_t)m->cfg.num_layers);
}

// The collected statistics as " | attn density D recall R" (means over
// layers) for the step line and as JSON fields (per layer lists) for
// metrics.jsonl; both empty when none were collected. Stops collecting.
static void end_attention_stats(Model *m, char *line, size_t line_size, char *json, size_t json_size) {
    line[0] = json[0] = '\0';
    if (!m->collect_attention_stats) return;
    m->collect_attention_stats = false;
    int L = m->cfg.num_layers;
    double density_sum = 0, recall_sum = 0;
    size_t used = (size_t)snprintf(json, json_size, ", \"attention_density\": [");
    for (int l = 0; l < L; l++) {
        double density = m->attention_stats[l].computed / m->attention_stats[l].causal;
        density_sum += density;
        used += (size_t)snprintf(json + used, json_size - used, "%s%.6g", l ? ", " : "", density);
    }
    used += (size_t)snprintf(json + used, json_size - used, "], \"attention_recall\": [");
    for (int l = 0; l < L; l++) {
        double recall = m->attention_stats[l].covered_mass / m->attention_stats[l].estimation_rows;
        recall_sum += recall;
        used += (size_t)snprintf(json + used, json_size - used, "%s%.6g", l ? ", " : "", recall);
    }
    snprintf(json + used, json_size - used, "]");
    snprintf(line, line_size, " | attn density %.3f recall %.3f", density_sum / L, recall_sum / L);
}

int cmd_train(int argc, char **argv) {
    Config cfg;
    Dist dist;
    if (!run_start(argc, argv, "usage: mtrain train RUN.yaml [section.key=value ...]", &cfg, &dist)) return 2;
    // The rank grid is validated now; the loop itself is still single-rank, so
    // several ranks would train copies of the model into one checkpoint folder.
    if (dist.world_size > 1)
        comm_fail_all(&dist.world, "%s: %d ranks: training over several ranks is not wired into the trainer yet "
                      "(expected a single process)", argv[0], dist.world_size);
    RunData data;
    run_data_open(&data, &cfg);
    apply_threads(&cfg);
    Model m;
    model_from_config(&m, &cfg);
    model_alloc_optimizer(&m);
    TrainState state = {0};
    rng_seed(&state.rng, cfg.train.seed);
    start_state(&cfg, &m, &state);
    OptimizerConfig oc = optimizer_config(&cfg);
    int64_t T = cfg.train.seq_len;
    int micro = cfg.train.micro_batches;
    print_memory(&m, T);

    make_dirs(cfg.log.dir);
    char metrics_path[CONFIG_STR + 32];
    snprintf(metrics_path, sizeof(metrics_path), "%s/metrics.jsonl", cfg.log.dir);
    FILE *metrics = xfopen(metrics_path, "a");

    char attention_line[64];
    size_t attention_json_size = 64 + 32 * (size_t)cfg.model.num_layers;
    char *attention_json = xmalloc(attention_json_size);
    double train_start = now_seconds();
    int64_t first_step = state.step + 1;
    bool validate = cfg.log.val_every > 0;
    if (validate && first_step == 1) log_validation(&m, &cfg, &data, 0, metrics, metrics_path);
    for (int64_t step = first_step; step <= cfg.train.steps; step++) {
        double t0 = now_seconds();
        m.be->zero(m.grad_mem, sizeof(float) * (size_t)m.total_params);
        double loss = 0;
        begin_attention_stats(&m, &cfg, step);
        for (int mb = 0; mb < micro; mb++) {
            loader_train_sequence(&data.loader, state.data_cursor++, &data.seq);
            slice_sequence(&data);
            loss += model_forward_backward(&m, data.slice.tokens, data.slice.targets, data.slice.count,
                                           (float)(1.0 / ((double)T * micro)));
        }
        loss /= (double)T * micro;
        end_attention_stats(&m, attention_line, sizeof(attention_line), attention_json, attention_json_size);
        double lr;
        double grad_norm = optimizer_step(&m, &oc, step, &lr);
        double ms = 1e3 * (now_seconds() - t0);
        double tokens_per_s = (double)T * micro / (ms * 1e-3);
        if (!isfinite(loss)) fail("step %lld: loss is %f: training diverged", (long long)step, loss);
        if (step % cfg.log.every == 0 || step == cfg.train.steps) {
            char eta[32];
            double elapsed = now_seconds() - train_start;
            format_eta(elapsed / (double)(step - first_step + 1) * (double)(cfg.train.steps - step), eta, sizeof(eta));
            printf("step %6lld/%lld | loss %.4f | grad norm %.3f | lr %.2e | %.0f tok/s | %.1f ms | eta %s%s\n",
                   (long long)step, (long long)cfg.train.steps, loss, grad_norm, lr, tokens_per_s, ms, eta,
                   attention_line);
            fflush(stdout);
        }
        fprintf(metrics, "{\"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.1f, \"ms\": %.3f%s}\n",
                (long long)step, loss, grad_norm, lr, tokens_per_s, ms, attention_json);
        if (fflush(metrics) != 0) fail("%s: write failed", metrics_path);
        state.step = step;
        if (validate && (step % cfg.log.val_every == 0 || step == cfg.train.steps))
            log_validation(&m, &cfg, &data, step, metrics, metrics_path);
        state.tokens_seen += T * micro;
        if ((cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || step == cfg.train.steps) {
            checkpoint_save(&cfg, &m, &state);
            printf("checkpoint: %s/step_%08lld\n", cfg.checkpoint.dir, (long long)step);
        }
    }
    fclose(metrics);
    free(attention_json);
    run_data_close(&data);
    model_free(&m);
    dist_finalize(&dist);
    return 0;
}
