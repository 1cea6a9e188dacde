// train.c: `mtrain train RUN.yaml`: the training loop, on one rank or on a
// grid of dp × cp ranks (dist/comm.h). Per step: zero the gradients, run
// micro_batches sequences forward+backward (dp rank d takes sequence
// cursor + mb * dp + d, or under data.packing: balanced sequence mb * dp + d
// of those re-dealt by attention work; a cp rank its slice of it in the
// layout, attention over the ring), the all-reduce of the gradient arena over
// the world (summed over cp, averaged over dp), in buckets started during the
// last micro-batch's backward (ZeRO-1: one reduce-scatter after it, each rank
// receiving its shard of the sum), clip, AdamW (ZeRO-1: on this rank's shard
// of the world, dp × cp ranks holding the same parameters, then all-gather
// the compute weights: bf16 on CUDA, whose fp32 master is the shard), then
// rank 0 prints one line and appends one JSON line to log.dir/metrics.jsonl. The loader's cursor
// (sequences consumed) is saved in every checkpoint, so a resumed run reads
// exactly the next sequence. SIGINT, SIGTERM or SIGUSR1 on any rank: every
// rank finishes the step, a checkpoint is written and the run exits 0.
#define _GNU_SOURCE  // memmem
#include "run.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../data/packing.h"
#include "../dist/progress.h"
#include "../dist/test_hooks.h"
#include "../model/optimizer.h"
#include "../model/profile.h"
#include "checkpoint.h"
#include "commands.h"
#include "plan.h"
#include "tensorboard.h"

// cfg with the grid the ranks formed (what the plans of this run take).
static Config grid_config(const Config *cfg, const Dist *dist) {
    Config grid = *cfg;
    grid.parallel.dp = dist->dp.size;
    grid.parallel.cp = dist->cp.size;
    grid.parallel.cp_inner = dist->grid.cp_inner;
    return grid;
}

// On the CUDA backend under the CPU execution model of CUDA: the peak of
// device memory it measured beside the plan's (the CUDA context and NCCL's
// buffers, which no allocation holds, left out).
static void print_device_memory(const Config *cfg, const Dist *dist) {
    const Backend *be = backend_select(cfg->train.backend);
    double peak;
    if (!be->on_gpu || !be->memory_peak(&peak)) return;
    Plan p;
    const Config grid = grid_config(cfg, dist);
    plan_build_gpu_memory(&p, &grid);
    printf("device memory: peak %.1f MiB measured by the sim (cudaMalloc and the pool's high-water mark) | planned "
           "%.1f MiB (%.1f with the CUDA context and NCCL buffers)\n", peak / (1 << 20),
           (p.total_bytes - p.runtime_bytes) / (1 << 20), p.total_bytes / (1 << 20));
}

static OptimizerConfig optimizer_config(const Config *cfg) {
    const TrainConfig *t = &cfg->train;
    int64_t warmup = t->warmup_steps < t->steps ? t->warmup_steps : t->steps;  // clamped (clamp_and_warn)
    OptimizerConfig oc = {t->lr, t->min_lr, warmup, t->steps, t->lr_schedule,
                          t->weight_decay, t->beta1, t->beta2, t->eps, t->grad_clip};
    return oc;
}

// What this rank allocated for the model: the fp32 master weights (under
// ZeRO-1 on a backend that shards masters, its shard only), the compute copy
// when it is not the master, gradients and moments; with the host memory a
// checkpoint write adds on rank 0: a copy of the parameters (and, when the
// master is sharded, the gather's receive buffer of the same size), and the
// moments streamed in pieces of a few MiB.
static void print_memory(const Model *m, int64_t T, bool recompute_auto) {
    double mib = 1.0 / (1 << 20), p = (double)m->total_params * sizeof(float) * mib;
    ModelMemory mem = model_memory(m);
    double write = (model_master_sharded(m) ? 2 * p : p) + checkpoint_stream_bytes() * mib;
    printf("model: %lld parameters, fp32 master of %lld floats on this rank | memory MiB: master %.1f, compute copy "
           "%.1f, grads %.1f, adam %.1f, activations %.1f (T=%lld, recompute %s%s), checkpoint write %.1f more on the "
           "host\n", (long long)m->total_params, (long long)m->master_count, mem.master * mib, mem.compute * mib,
           mem.grads * mib, mem.adam * mib, (double)model_activation_bytes(m, T) * mib, (long long)T,
           plan_recompute_name(m->recompute), recompute_auto ? ": auto's pick, mtrain plan compares" : "", write);
}

// Where the run starts: a checkpoint (checkpoint.resume), a Hugging Face
// folder (train.init_from), or the seeded initialisation. Rank 0 first takes
// the locks of checkpoint.dir and log.dir, cleans up after writers that died
// (checkpoint_recover_dir) and repairs `latest`. With `auto`, rank 0 picks
// the latest checkpoint of the run that wrote last (checkpoint_find_latest),
// refuses one of another configuration, and every rank loads that one; with
// `never`, a folder of another run's checkpoints is refused unless
// checkpoint.overwrite. A fresh start makes a new run id; a resume keeps the
// checkpoint's, except an explicit checkpoint.resume of a folder other than
// the latest (a roll-back), which starts a new run from it, so that pruning
// and `latest` leave the old run's checkpoints alone. rolled_back_from
// [4096] gets the folder an explicit checkpoint.resume loaded (kept from
// pruning: a roll-back must not delete its own start), or "", and
// branched_from the run id a roll-back branched off, or 0. (Only rank 0's
// run id counts: it alone writes.)
static void start_state(const Config *cfg, const Dist *dist, Model *m, TrainState *state, char *rolled_back_from,
                        uint64_t *branched_from) {
    char path[4096], latest[4096] = "", diff[2048];
    const CheckpointConfig *c = &cfg->checkpoint;
    bool found = false;
    if (dist->world_rank == 0) {
        checkpoint_lock_dirs(cfg);
        checkpoint_recover_dir(c->dir, true);
        if (!checkpoint_repair_latest(c->dir, latest, sizeof(latest))) latest[0] = '\0';
        test_fault("start", 0, cfg->parallel.timeout_s);
    }
    if (c->resume == RESUME_AUTO) {
        int64_t step = -1;
        if (latest[0]) {
            if (!checkpoint_same_run(latest, cfg, diff, sizeof(diff)))
                fail("%s: a checkpoint of another run (%s); checkpoint.resume auto continues only the same run: use "
                     "another checkpoint.dir, or checkpoint.resume=never checkpoint.overwrite=true to start afresh",
                     latest, diff);
            step = strtoll(strrchr(latest, '_') + 1, NULL, 10);
        }
        comm_broadcast(&dist->world, &step, 1, DT_INT64, 0);
        found = step >= 0 && snprintf(path, sizeof(path), "%s/step_%08lld", c->dir, (long long)step) > 0;
    } else if (c->resume == RESUME_NEVER) {
        if (dist->world_rank == 0) checkpoint_clear_other_runs(cfg);
    } else {
        found = snprintf(path, sizeof(path), "%s", c->resume_path) > 0;
        if (dist->world_rank == 0 && !checkpoint_same_run(path, cfg, diff, sizeof(diff)))
            fprintf(stderr, "warning: %s: resuming a checkpoint of another run, as checkpoint.resume asks (%s)\n",
                    path, diff);
    }
    snprintf(rolled_back_from, 4096, "%s", found && c->resume == RESUME_PATH ? path : "");
    *branched_from = 0;
    if (found) {
        checkpoint_load(path, m, state);
        if (state->step > cfg->train.steps)
            fail("%s: the checkpoint is at step %lld, beyond train.steps = %lld (raise train.steps, or resume an "
                 "earlier checkpoint)", path, (long long)state->step, (long long)cfg->train.steps);
        uint64_t resumed_run = state->run_id;
        bool roll_back = c->resume == RESUME_PATH && !same_file(path, latest);
        if (roll_back) {
            if (dist->world_rank == 0) checkpoint_check_roll_back(cfg, path, state->step);
            state->run_id = checkpoint_new_run_id();
            *branched_from = resumed_run;
        }
        printf("resumed from %s: step %lld, %lld tokens seen, run %016" PRIx64, path, (long long)state->step,
               (long long)state->tokens_seen, state->run_id);
        if (roll_back) printf(" (a roll-back: a new run, branched off run %016" PRIx64 ")", resumed_run);
        printf("\n");
        return;
    }
    state->run_id = checkpoint_new_run_id();
    printf("run %016" PRIx64 ": a fresh start\n", state->run_id);
    if (cfg->train.init_from == INIT_FOLDER) {
        model_load_hf_folder(m, cfg->train.init_from_path);
        printf("initialised from %s\n", cfg->train.init_from_path);
    } else {
        model_init_weights(m, cfg->train.seed);
    }
}

// The run id of the last whole line of metrics.jsonl text [bytes] (its
// "run_id" field; a line cut short by a kill has no '\n'), 0 when there is
// none.
static uint64_t metrics_last_run(const char *text, size_t bytes) {
    static const char key[] = "\"run_id\": \"";
    size_t end = bytes;
    while (end > 0 && text[end - 1] != '\n') end--;  // drop a cut line
    if (end == 0) return 0;
    size_t start = end - 1;
    while (start > 0 && text[start - 1] != '\n') start--;
    const char *at = memmem(text + start, end - start, key, sizeof(key) - 1);
    return at ? strtoull(at + sizeof(key) - 1, NULL, 16) : 0;
}

// log.dir/metrics.jsonl (path) holds the lines of one run and, after a
// roll-back, the lines up to its start of the run it branched off
// (branched_from, or 0). A run that finds another run's file there (the run
// id of its last line is neither the run's nor branched_from) moves it aside
// to log.dir/metrics.RUN.jsonl, and a resumed run (step > 0) takes its own
// metrics.RUN.jsonl back, each with one line; a roll-back keeps a copy of the
// run it branched off whole as metrics.RUN.jsonl, and takes that run's lines
// from there when another run wrote last. Of the file's lines, those
// of later steps (written before the run stopped without a checkpoint of
// them) are dropped, so that no step appears twice; a fresh run (step 0)
// starts an empty file. Rewritten under a temporary name, then renamed.
// Returns the file, open for appending.
static FILE *open_metrics(const char *dir, const char *path, int64_t step, uint64_t run, uint64_t branched_from) {
    size_t bytes = 0;
    char *text = access(path, F_OK) == 0 ? read_file(path, &bytes) : NULL;
    uint64_t theirs = metrics_last_run(text, bytes);
    char aside[CONFIG_STR + 64];
    if (bytes > 0 && branched_from != 0 && theirs == branched_from) {
        snprintf(aside, sizeof(aside), "%s/metrics.%016" PRIx64 ".jsonl", dir, theirs);
        if (access(aside, F_OK) != 0) {
            write_file_atomic(aside, text, bytes);
            printf("metrics: run %016" PRIx64 "'s metrics, which this roll-back branches off, copied to %s\n", theirs,
                   aside);
        }
    } else if (bytes > 0 && theirs != run) {
        snprintf(aside, sizeof(aside), "%s/metrics.%016" PRIx64 ".jsonl", dir, theirs);
        if (access(aside, F_OK) == 0)
            fail("%s: holds run %016" PRIx64 "'s metrics, and %s exists: move one of them away", path, theirs, aside);
        rename_into_place(path, aside);
        printf("metrics: %s held run %016" PRIx64 "'s metrics: moved to %s\n", path, theirs, aside);
        free(text);
        text = NULL;
        bytes = 0;
    }
    snprintf(aside, sizeof(aside), "%s/metrics.%016" PRIx64 ".jsonl", dir, branched_from ? branched_from : run);
    if (step > 0 && !text && access(aside, F_OK) == 0 && branched_from) {
        text = read_file(aside, &bytes);
        printf("metrics: %s starts with the lines up to step %lld of %s, the run this roll-back branches off\n", path,
               (long long)step, aside);
    } else if (step > 0 && !text && access(aside, F_OK) == 0) {
        rename_into_place(aside, path);
        printf("metrics: %s of this run moved back to %s\n", aside, path);
        text = read_file(path, &bytes);
    }
    char *kept = xmalloc(bytes + 1);
    size_t used = 0;
    for (char *line = text; step > 0 && line && line < text + bytes;) {
        char *end = memchr(line, '\n', (size_t)(text + bytes - line));
        size_t len = end ? (size_t)(end - line) + 1 : (size_t)(text + bytes - line);
        long long line_step = -1;
        // Lines are written whole with '\n' last; one cut short by a kill is dropped.
        if (end && sscanf(line, "{\"step\": %lld", &line_step) == 1 && line_step <= step) {
            memcpy(kept + used, line, len);
            used += len;
        }
        line += len;
    }
    write_file_atomic(path, kept, used);
    free(kept);
    free(text);
    return xfopen(path, "a");
}

// The data of a run: the loader, one packed sequence and this rank's slice of
// it (cp rank `cp_rank` of `cp` in the layout); under data.packing: balanced
// the step's sequences (data/packing.h).
typedef struct {
    Loader loader;
    bool balanced;             // data.packing: balanced
    PackedStep step;           // the step's documents and plan (balanced only)
    PackedSequence seq;
    RankSlice slice;
    LayoutKind layout;
    int block_size;
    int cp, cp_rank;
    bool doc_mask;             // data.doc_mask: attention masked by the sequence's documents
    bool reset_positions;      // data.reset_positions: RoPE positions restart at each document
} RunData;

static void run_data_open(RunData *d, const Config *cfg, const Dist *dist) {
    d->cp = dist->cp.size;
    d->cp_rank = dist->cp.rank;
    d->doc_mask = cfg->data.doc_mask;
    d->reset_positions = cfg->data.reset_positions;
    loader_from_config(&d->loader, cfg, cfg->log.val_every > 0);
    packed_sequence_alloc(&d->seq, cfg->train.seq_len);
    rank_slice_alloc(&d->slice, cfg->train.seq_len);
    d->balanced = cfg->data.packing == PACKING_BALANCED;
    if (d->balanced)
        packed_step_alloc(&d->step, cfg->train.seq_len, cfg->train.micro_batches, dist->dp.size);
    d->layout = cfg->attention.layout;
    d->block_size = cfg->attention.block_size;
    if (!d->loader.cfg.synthetic) loader_print_summary(&d->loader, stdout);
}

static void run_data_close(RunData *d) {
    loader_close(&d->loader);
    packed_sequence_free(&d->seq);
    rank_slice_free(&d->slice);
    if (d->balanced) packed_step_free(&d->step);
}

// d->seq = training sequence `index` of the step that begins at `cursor`
// (micro-batch index / dp on dp rank index mod dp); under balanced packing
// from the step read by packed_step_read.
static void step_sequence(RunData *d, int64_t cursor, int64_t index) {
    if (d->balanced) packed_step_sequence(&d->step, (int)index, &d->seq);
    else loader_train_sequence(&d->loader, cursor + index, &d->seq);
}

// d->slice = this rank's part of d->seq; m masks attention by d->seq's
// documents under data.doc_mask and restarts RoPE at them under
// data.reset_positions.
static void slice_sequence(RunData *d, Model *m) {
    loader_rank_slice(&d->seq, d->layout, d->block_size, d->cp, d->cp_rank, &d->slice);
    if (d->doc_mask) model_set_documents(m, d->seq.doc_starts, d->seq.doc_start_count);
    if (d->reset_positions) model_set_rope_documents(m, d->seq.doc_starts, d->seq.doc_start_count);
}

// The targets of the step's sequences over the world, padding excluded: the
// loss and its gradient are their mean (every position under sequential and
// balanced packing, which use each token once).
static int64_t step_targets(RunData *d, int64_t cursor, int64_t sequences) {
    int64_t targets = 0;
    for (int64_t i = 0; i < sequences; i++) targets += loader_train_targets(&d->loader, cursor + i);
    return targets;
}

// Mean next-token loss over the validation stream: dp rank d scores
// sequences d, d + dp, ...; the sums meet in one all-reduce.
static double validation_loss(Model *m, const Config *cfg, const Dist *dist, RunData *d) {
    double total = 0;
    for (int i = dist->dp.rank; i < cfg->data.val_sequences; i += dist->dp.size) {
        loader_val_sequence(&d->loader, i, &d->seq);
        slice_sequence(d, m);
        total += model_loss(m, d->slice.tokens, d->slice.targets, d->slice.positions, d->slice.count);
    }
    comm_allreduce(&dist->world, &total, 1, DT_DOUBLE, REDUCE_SUM);
    return total / ((double)cfg->train.seq_len * cfg->data.val_sequences);
}

// metrics == NULL on every rank but 0 (which alone prints and writes); tb
// NULL without log.tensorboard. Returns the loss.
static double log_validation(Model *m, const Config *cfg, const Dist *dist, RunData *d, int64_t step, FILE *metrics,
                           const char *path, uint64_t run, TbWriter *tb) {
    double loss = validation_loss(m, cfg, dist, d);
    printf("validation | step %lld | loss %.4f\n", (long long)step, loss);
    if (!metrics) return loss;
    fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.9g, \"run_id\": \"%016" PRIx64 "\"}\n", (long long)step, loss,
            run);
    if (fflush(metrics) != 0) fail("%s: write failed", path);
    if (tb) tb_scalars(tb, step, (const char *const[]){"val/loss"}, &loss, 1);
    return loss;
}

// Start (or not) collecting the sparse pattern's density and recall per layer
// for this step's forward passes.
static void begin_attention_stats(Model *m, const Config *cfg, int64_t step) {
    if (cfg->attention.type == ATTN_SPARSE && cfg->log.attention_every > 0 && step % cfg->log.attention_every == 0)
        model_attention_stats_begin(m);
}

// Appends `, "name": [v0, ..]` of values [L] at json + *used; returns their mean.
static double json_layer_list(char *json, size_t json_size, size_t *used, const char *name, const double *values,
                              int L) {
    double sum = 0;
    *used += (size_t)snprintf(json + *used, json_size - *used, ", \"%s\": [", name);
    for (int l = 0; l < L; l++) {
        sum += values[l];
        *used += (size_t)snprintf(json + *used, json_size - *used, "%s%.6g", l ? ", " : "", values[l]);
    }
    *used += (size_t)snprintf(json + *used, json_size - *used, "]");
    return sum / L;
}

// A warning line on rank 0 for each layer whose sampled recall [L] is under
// log.min_recall, naming the setting that widens the pattern.
static void warn_low_recall(const Config *cfg, const Dist *dist, int64_t step, const double *recall, int L) {
    if (dist->world_rank != 0) return;
    const AttentionConfig *a = &cfg->attention;
    char raise[160];
    if (a->budget == BUDGET_FIXED)
        snprintf(raise, sizeof(raise), "attention.vertical %d / attention.slash %d%s", a->vertical, a->slash,
                 a->budget_file == BUDGET_FILE_PATH ? " (or the layer's lines of attention.budget_file)" : "");
    else
        snprintf(raise, sizeof(raise), "attention.top_p %g, or attention.max_vertical %d / max_slash %d if the "
                 "lines reach them", a->top_p, a->max_vertical, a->max_slash);
    for (int l = 0; l < L; l++)
        if (recall[l] < cfg->log.min_recall)
            fprintf(stderr, "warning: step %lld: layer %d: sparse attention recall %.3f is under log.min_recall "
                    "%g: the pattern misses attention mass; raise %s\n", (long long)step, l, recall[l],
                    cfg->log.min_recall, raise);
}

// The collected statistics as " | attn density D recall R est E" (means
// over layers: the recall of the recall sample, then of the estimation
// rows) for the step line and as JSON fields (per layer lists) for
// metrics.jsonl, and as numbers: scalars [4] = the mean density, the two
// mean recalls and the ring's MiB (TensorBoard); empty and NaN when none
// were collected. A layer under log.min_recall gets a warning. Stops
// collecting. A plan's counts cover its whole sequence (one rank, or the cp
// totals of the ring plan, identical on every cp rank), so they are summed
// over dp only.
static void end_attention_stats(Model *m, const Config *cfg, const Dist *dist, int64_t step, char *line,
                                size_t line_size, char *json, size_t json_size, double scalars[4]) {
    line[0] = json[0] = '\0';
    scalars[0] = scalars[1] = scalars[2] = scalars[3] = NAN;
    SparseStats *stats = model_attention_stats_end(m);
    if (!stats) return;
    int L = m->cfg.num_layers;
    _Static_assert(sizeof(SparseStats) == 6 * sizeof(double), "SparseStats is reduced as doubles");
    comm_allreduce(&dist->dp, stats, 6 * (int64_t)L, DT_DOUBLE, REDUCE_SUM);
    double *per_layer = xmalloc(sizeof(double) * 3 * (size_t)L);   // density, recall, estimation rows' recall [L]
    for (int l = 0; l < L; l++) {
        const SparseStats *x = &stats[l];
        per_layer[l] = x->computed / x->causal;
        per_layer[L + l] = x->sampled_mass / x->sampled_rows;
        per_layer[2 * L + l] = x->covered_mass / x->estimation_rows;
    }
    size_t used = 0;
    scalars[0] = json_layer_list(json, json_size, &used, "attention_density", per_layer, L);
    scalars[1] = json_layer_list(json, json_size, &used, "attention_recall", per_layer + L, L);
    scalars[2] = json_layer_list(json, json_size, &used, "attention_estimation_recall", per_layer + 2 * L, L);
    int n = snprintf(line, line_size, " | attn density %.3f recall %.3f est %.3f", scalars[0], scalars[1],
                     scalars[2]);
    warn_low_recall(cfg, dist, step, per_layer + L, L);
    free(per_layer);
    if (!m->cp || m->attention.type != ATTN_SPARSE) return;
    // Bytes the sparse ring sent for the last sequence (all ranks, all
    // layers, forward and backward): K/V and dK/dV hops and gathered columns.
    double bytes = model_attention_ring_bytes(m);
    comm_allreduce(&dist->world, &bytes, 1, DT_DOUBLE, REDUCE_SUM);
    snprintf(json + used, json_size - used, ", \"ring_bytes\": %.0f", bytes);
    scalars[3] = bytes / (1 << 20);
    snprintf(line + n, line_size - (size_t)n, " | ring %.2f MiB (%s)", bytes / (1 << 20),
             m->attention.ring_send == RING_SEND_SELECTED ? "selected" : "full");
}

// How long the ranks wait for rank 0's checkpoint write beyond
// parallel.timeout_s: at least CHECKPOINT_WAIT_MIN_S, or the checkpoint's
// bytes (fp32 weights and two moments) at CHECKPOINT_MIN_MIB_PER_S.
#define CHECKPOINT_WAIT_MIN_S 60.0
#define CHECKPOINT_MIN_MIB_PER_S 50.0

// The checkpoint of state->step. Rank 0 writes the HF weights from the
// whole master weights (gathered first when a backend shards them under
// ZeRO-1, a collective) and the rest; under ZeRO-1 every rank writes its
// own shard of the moments in parallel, else rank 0 streams them from its
// optimizer. Every wait for the write (the shards' checksums, then the end
// of rank 0's rename) is a collective whose limit adds the write's own (a
// write may take longer than parallel.timeout_s: a 7B checkpoint is ~90 GB).
static void save_checkpoint(const Config *cfg, const Dist *dist, bool zero, const Model *m, const TrainState *state,
                            const char *rolled_back_from) {
    const char *protect = rolled_back_from[0] ? rolled_back_from : NULL;
    Comm written = dist->world;
    double write_s = 3.0 * sizeof(float) * (double)m->total_params / (CHECKPOINT_MIN_MIB_PER_S * (1 << 20));
    written.timeout_s += fmax(CHECKPOINT_WAIT_MIN_S, write_s);
    float *params = dist->world_rank == 0 ? xmalloc(sizeof(float) * (size_t)m->total_params) : NULL;
    if (params || model_master_sharded(m)) model_gather_params(m, params);
    if (zero || dist->world_rank == 0) checkpoint_save(cfg, m, state, params, zero ? &written : NULL, protect);
    free(params);
    int64_t done = 1;
    comm_allreduce(&written, &done, 1, DT_INT64, REDUCE_MAX);
    printf("checkpoint: %s/step_%08lld\n", cfg->checkpoint.dir, (long long)state->step);
}

// After the local forward and backward passes of a step: the lowest world
// rank whose loss or (grads_local: before any reduction) gradient is not
// finite, or world_size when every rank's are (collective over the world).
// With bucketed reduction the gradient is already being summed: a rank whose
// loss is finite and gradient is not shows in the summed gradient's norm.
static int first_bad_rank(const Dist *dist, const Model *m, double local_loss, bool grads_local) {
    bool bad = !isfinite(local_loss) || (grads_local && !model_grads_finite(m));
    int64_t rank = bad ? dist->world_rank : dist->world_size;
    comm_allreduce(&dist->world, &rank, 1, DT_INT64, REDUCE_MIN);
    return (int)rank;
}

// The step line and the metrics.jsonl line (metrics == NULL: none) of a
// skipped step of run `run`; rank = the first rank whose loss or gradient was
// not finite, -1 when only their sum overflowed.
static void log_bad_step(int64_t step, int64_t steps, double loss, double grad_norm, int rank, double lr,
                         int in_a_row, int max_bad_steps, FILE *metrics, const char *metrics_path, uint64_t run) {
    char where[48] = "in the summed gradient";
    if (rank >= 0) snprintf(where, sizeof(where), "first on rank %d", rank);
    printf("step %6lld/%lld | bad step: loss %g, grad norm %g (non-finite %s): skipped, %d in a row "
           "(train.max_bad_steps %d)\n", (long long)step, (long long)steps, loss, grad_norm, where, in_a_row,
           max_bad_steps);
    fflush(stdout);
    if (!metrics) return;
    fprintf(metrics, "{\"step\": %lld, \"bad_step\": true, \"rank\": %d, \"lr\": %.9g, \"run_id\": \"%016" PRIx64 "\"}\n",
            (long long)step, rank, lr, run);
    if (fflush(metrics) != 0) fail("%s: write failed", metrics_path);
}

// The signal that asked the run to stop (SIGINT, SIGTERM or SIGUSR1), 0 = none.
// Atomic (lock-free, so safe in a handler): two signals may be handled at
// once on two threads (OpenMP's), and exactly one of them must see the other.
static atomic_int stop_signal;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the stop signal's exchange must be lock-free in a signal handler");

// A first signal is remembered: the step in progress finishes, then a
// checkpoint is written. A second exits at once: a checkpoint being written
// is still a .tmp folder that is never read, so none is damaged.
static void on_stop_signal(int sig) {
    if (atomic_exchange(&stop_signal, sig) != 0) {
        static const char msg[] = "mtrain: second signal: exiting now without a checkpoint of this step\n";
        ssize_t written = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)written;
        _exit(128 + sig);
    }
}

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    const int signals[] = {SIGINT, SIGTERM, SIGUSR1};
    for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
        if (sigaction(signals[i], &sa, NULL) != 0) fail("sigaction(%d): %s", signals[i], strerror(errno));
}

// After a step, on every rank: the signal any rank got (0 = none), so that
// all of them stop after the same step.
static int agreed_stop_signal(const Dist *dist) {
    int64_t sig = atomic_load(&stop_signal);
    comm_allreduce(&dist->world, &sig, 1, DT_INT64, REDUCE_MAX);
    return (int)sig;
}

// The plan's check before anything large is allocated: the host memory of
// the ranks on rank 0's node against its MemAvailable; every rank takes
// rank 0's verdict (as a config error, each says so). Fills plan, whose FLOPs
// and peak give the MFU of the step lines. On the CUDA backend the plan is
// the GPU's (the hardware section's GPU: its peak; none named: no MFU), rank
// 0 prints its memory plan, and the host, which holds little of the run, is
// not checked.
static void check_memory(const Config *cfg, const Dist *dist, Plan *plan) {
    const Config grid = grid_config(cfg, dist);
    if (backend_select(cfg->train.backend)->on_gpu) {
        plan_build_gpu_memory(plan, &grid);
        if (dist->world_rank == 0) plan_print_gpu_memory(&grid, stdout);
        return;
    }
    bool measured;
    double peak = plan_cpu_peak(cfg, &measured);
    plan_build(plan, &grid, NULL, peak, measured, 0);
    double figures[2] = {plan->total_bytes * dist->local_size, plan_mem_available()};
    comm_broadcast(&dist->world, figures, 2, DT_DOUBLE, 0);
    double need = figures[0], available = figures[1];
    if (!cfg->train.memory_check || available <= 0 || need <= available) return;
    char line[1024];
    plan_breakdown(plan, line, sizeof(line));
    fail("train: the run does not fit: %d rank%s x (%s) = %.2f GiB > MemAvailable %.2f GiB (mtrain plan "
         "suggests changes; train.memory_check=false starts anyway)", dist->local_size, dist->local_size == 1 ? "" :
         "s", line, need / (1 << 30), available / (1 << 30));
}

// Settings that train but are likely not what was meant: a warmup longer
// than the run is clamped to it (by optimizer_config, so that the run's keys
// keep the value set and a longer run resumes it), with a note; a sequence
// longer than the model's declared context gets a warning. Rank 0 prints
// each once.
static void clamp_and_warn(const Config *cfg, const Dist *dist) {
    const TrainConfig *t = &cfg->train;
    bool print = dist->world_rank == 0;
    if (print && t->warmup_steps > t->steps)
        fprintf(stderr, "note: train.warmup_steps %lld is more than train.steps %lld: warmup clamped to %lld "
                "steps\n", (long long)t->warmup_steps, (long long)t->steps, (long long)t->steps);
    if (print && t->seq_len > cfg->model.max_position_embeddings)
        fprintf(stderr, "warning: train.seq_len %lld is beyond model.max_position_embeddings %d: the model is "
                "declared for shorter contexts (raise max_position_embeddings, with rope_scaling to extend it)\n",
                (long long)t->seq_len, cfg->model.max_position_embeddings);
}

// state->grid = how this run makes its steps; a resumed checkpoint made
// them otherwise (another global batch, grid or layout): a note on rank 0.
static void note_grid(TrainState *state, const Config *cfg, const Dist *dist) {
    char grid[sizeof(state->grid)];
    int64_t sequences = (int64_t)cfg->train.micro_batches * dist->dp.size;
    snprintf(grid, sizeof(grid), "dp %d x cp %d, layout %s, %lld sequence%s a step", dist->dp.size, dist->cp.size,
             config_enum_name(cfg, &cfg->attention.layout), (long long)sequences, sequences == 1 ? "" : "s");
    if (dist->world_rank == 0 && state->step > 0 && state->grid[0] && strcmp(state->grid, grid))
        printf("note: the checkpoint's steps were made on %s; this run's are on %s\n", state->grid, grid);
    snprintf(state->grid, sizeof(state->grid), "%s", grid);
}

// A training run between its steps: what the steps share.
typedef struct {
    Config cfg;
    Dist dist;
    RunData data;
    Model m;
    TrainState state;
    Plan plan;                 // FLOPs and peak for the MFU, the planned memory
    OptimizerConfig oc;
    bool zero;                 // ZeRO-1
    int64_t step_tokens;       // tokens per step over the world
    int64_t first_step;        // the first step this process trains
    char rolled_back_from[4096];
    char metrics_path[CONFIG_STR + 32];
    FILE *metrics;             // rank 0 only, else NULL
    TbWriter tb_writer;
    TbWriter *tb;              // NULL without log.tensorboard (and on ranks other than 0)
    char attention_line[128];  // the step's attention statistics (end_attention_stats)
    char *attention_json;
    size_t attention_json_size;
    double attention_scalars[4];
    double train_start, best_val;
    bool sync_report;          // MTRAIN_SYNC_REPORT on the CUDA backend
    int launcher;              // under mpirun or srun: the launcher's process (this rank's parent at start), else 0
} Trainer;

// One step's figures.
typedef struct {
    double loss, grad_norm, lr, ms;
    int bad_rank;              // the first rank whose loss or gradient was not finite; world_size: none
} StepResult;

// The start-up's phases, timed: "start-up: S s (configuration and ranks S,
// ...)", printed once the run has started (its one-line refusals stay one
// line); a long phase shows its own progress meanwhile.
typedef struct {
    double start, last;
    char line[256];
    size_t used;
} StartupClock;

static void startup_phase(StartupClock *clock, const char *what) {
    double now = now_seconds();
    if (clock->used < sizeof(clock->line))
        clock->used += (size_t)snprintf(clock->line + clock->used, sizeof(clock->line) - clock->used, "%s%s %.2f",
                                        clock->used ? ", " : "", what, now - clock->last);
    clock->last = now;
}

// The ranks, the data, the memory check, the model with its optimizer and
// gradient reduction, the start (checkpoint, folder or seed). False: usage
// printed.
static bool train_setup(Trainer *t, int argc, char **argv) {
    StartupClock clock = {.start = now_seconds(), .last = now_seconds()};
    if (!run_start_file(argc, argv, "usage: mtrain train RUN.yaml [section.key=value ...]", false, &t->cfg, &t->dist))
        return false;
    Config *cfg = &t->cfg;
    Dist *dist = &t->dist;
    startup_phase(&clock, "configuration and ranks");
    t->zero = cfg->parallel.zero == 1;
    run_data_open(&t->data, cfg, dist);
    clamp_and_warn(cfg, dist);
    cfg->data.content_hash = t->data.loader.content_hash;
    int threads = apply_threads(cfg, dist);
    startup_phase(&clock, "data loader");
    check_memory(cfg, dist, &t->plan);
    startup_phase(&clock, t->plan.gpu || !t->plan.peak_measured ? "memory plan" : "memory plan and CPU peak");
    const RunData *d = &t->data;
    const int64_t T = layout_rank_positions(d->layout, cfg->train.seq_len, d->block_size, d->cp, d->cp_rank, NULL);
    model_from_config(&t->m, cfg, t->plan.recompute, T);
    if (t->m.be->gemm_choice) t->m.be->gemm_choice(cfg->train.gemm_choice);
    if (t->m.be->dw_stream) t->m.be->dw_stream(config_dw_stream_on(cfg));
    model_join_ring(&t->m, cfg, dist);
    if (t->zero) model_shard_optimizer(&t->m, &dist->world);
    model_alloc_optimizer(&t->m);
    startup_phase(&clock, "allocation");
    rng_seed(&t->state.rng, cfg->train.seed);
    catch_stop_signals();
    test_hooks_read();
    uint64_t branched_from;
    start_state(cfg, dist, &t->m, &t->state, t->rolled_back_from, &branched_from);
    startup_phase(&clock, t->state.step > 0 ? "checkpoint" : "weights");
    int64_t bucket = (int64_t)(cfg->parallel.bucket_mb * (1 << 20) / sizeof(float));
    model_set_grad_reduce(&t->m, &dist->world, cfg->parallel.bucket_mb > 0 && bucket < 1 ? 1 : bucket);
    t->oc = optimizer_config(cfg);
    t->step_tokens = cfg->train.seq_len * cfg->train.micro_batches * dist->dp.size;
    note_grid(&t->state, cfg, dist);
    t->launcher = strcmp(dist->launcher, "none") ? (int)getppid() : 0;
    if (dist->world_size > 1)
        printf("ranks: %d = dp %d x cp %d (ring %s, cp_inner %d, layout %s)%s%s, %d thread%s per rank, launcher %s\n",
               dist->world_size, dist->dp.size, dist->cp.size, config_enum_name(cfg, &cfg->attention.ring),
               dist->grid.cp_inner, config_enum_name(cfg, &cfg->attention.layout), t->zero ? ", ZeRO-1" : "",
               dist->world.nccl ? ", gradients over NCCL" : "", threads, threads == 1 ? "" : "s", dist->launcher);
    print_memory(&t->m, T, cfg->train.recompute == RECOMPUTE_AUTO);
    snprintf(t->metrics_path, sizeof(t->metrics_path), "%s/metrics.jsonl", cfg->log.dir);
    if (dist->world_rank == 0) {
        checkpoint_recover_dir(cfg->log.dir, false);
        t->metrics = open_metrics(cfg->log.dir, t->metrics_path, t->state.step, t->state.run_id, branched_from);
        if (cfg->log.tensorboard) tb_open(&t->tb_writer, cfg->log.dir, t->state.step);
    }
    t->tb = t->tb_writer.f ? &t->tb_writer : NULL;
    t->attention_json_size = 160 + 48 * (size_t)cfg->model.num_layers;
    t->attention_json = xmalloc(t->attention_json_size);
    startup_phase(&clock, "logs");
    printf("start-up: %.2f s (%s)\n", clock.last - clock.start, clock.line);
    fflush(stdout);
    return true;
}

// Before the first step: the run's clock, the note that a finished run has
// nothing to train, or the validation of step 0; the sync report's choice.
static void train_begin(Trainer *t) {
    t->train_start = now_seconds();
    t->first_step = t->state.step + 1;
    t->best_val = INFINITY;
    if (t->state.step > 0 && t->state.step >= t->cfg.train.steps)
        printf("the run is finished: step %lld of train.steps = %lld, nothing to train (raise train.steps to go on)\n",
               (long long)t->state.step, (long long)t->cfg.train.steps);
    else if (t->cfg.log.val_every > 0 && t->first_step == 1)
        t->best_val = log_validation(&t->m, &t->cfg, &t->dist, &t->data, 0, t->metrics, t->metrics_path,
                                     t->state.run_id, t->tb);
    t->sync_report = test_sync_report() && backend_select(t->cfg.train.backend)->on_gpu;
    if (test_sync_report() && !t->sync_report)
        printf("host syncs per step: not counted (train.backend cpu has no device)\n");
}

// MTRAIN_SYNC_REPORT on the CUDA backend: the host synchronisations of the
// last step, counted from its start (after = false) and printed after it.
static void sync_report(const Trainer *t, int64_t step, bool after) {
    if (!t->sync_report || step != t->cfg.train.steps) return;
    if (after) t->m.be->sync_print();
    else t->m.be->sync_begin();
}

// One step: the micro-batches forward and backward, the gradient sum over
// the world, the loss, the optimizer (skipped when a loss or the gradient is
// not finite).
static StepResult train_step(Trainer *t, int64_t step) {
    Model *m = &t->m;
    const Dist *dist = &t->dist;
    int micro = t->cfg.train.micro_batches, D = dist->dp.size;
    StepResult r = {0};
    double t0 = now_seconds();
    model_zero_grads(m);
    begin_attention_stats(m, &t->cfg, step);
    if (t->data.balanced) packed_step_read(&t->data.loader, t->state.data_cursor, &t->data.step);
    double targets = (double)step_targets(&t->data, t->state.data_cursor, (int64_t)micro * D);
    for (int mb = 0; mb < micro; mb++) {
        if (mb == micro - 1) model_grads_start(m);
        step_sequence(&t->data, t->state.data_cursor, (int64_t)mb * D + dist->dp.rank);
        slice_sequence(&t->data, m);
        r.loss += model_forward_backward(m, t->data.slice.tokens, t->data.slice.targets, t->data.slice.positions,
                                         t->data.slice.count, (float)(1.0 / targets));
    }
    t->state.data_cursor += (int64_t)micro * D;
    if (test_nan_step(step, dist->world_rank)) {
        r.loss = NAN;
        model_poison_grads(m);
    }
    r.bad_rank = first_bad_rank(dist, m, r.loss, !model_grads_bucketed(m));
    if (step == t->first_step) test_fault("reduce", dist->world_rank, dist->world.timeout_s);
    model_reduce_grads(m);
    comm_allreduce(&dist->world, &r.loss, 1, DT_DOUBLE, REDUCE_SUM);
    r.loss /= targets;
    end_attention_stats(m, &t->cfg, dist, step, t->attention_line, sizeof(t->attention_line), t->attention_json,
                        t->attention_json_size, t->attention_scalars);
    r.lr = lr_at(&t->oc, step);
    r.grad_norm = r.bad_rank < dist->world_size ? NAN : optimizer_step(m, &t->oc, step, &r.lr);
    if (!isfinite(r.grad_norm)) {
        // optimizer_step changes nothing on a non-finite norm; the step's sequences stay consumed.
        t->state.bad_in_a_row++;
        log_bad_step(step, t->cfg.train.steps, r.loss, r.grad_norm, r.bad_rank < dist->world_size ? r.bad_rank : -1,
                     r.lr, (int)t->state.bad_in_a_row, t->cfg.train.max_bad_steps, t->metrics, t->metrics_path,
                     t->state.run_id);
        if (t->state.bad_in_a_row >= t->cfg.train.max_bad_steps)
            fail("step %lld: %d bad steps in a row (train.max_bad_steps): training diverged; the checkpoints in "
                 "%s are kept", (long long)step, (int)t->state.bad_in_a_row, t->cfg.checkpoint.dir);
    } else {
        t->state.bad_in_a_row = 0;
    }
    test_fault("step", dist->world_rank, dist->world.timeout_s);
    r.ms = 1e3 * (now_seconds() - t0);
    return r;
}

// MFU is never above 100%: a step whose FLOPs (with the recomputation) ran
// faster than the peak (measured while the machine was busy, or stated too
// low) proves the peak at least that rate, which the peak becomes (a note
// the first time).
static void raise_peak(Plan *plan, int64_t step, double ms) {
    static bool noted;
    const double achieved = plan->hardware_flops / (ms * 1e-3);
    if (!(plan->peak_flops > 0) || achieved <= plan->peak_flops) return;
    if (!noted)
        printf("note: step %lld ran at %.1f GFLOP/s, above the peak of %.1f GFLOP/s (%s): MFU from now on against the "
               "fastest step's rate\n", (long long)step, achieved * 1e-9, plan->peak_flops * 1e-9,
               plan->gpu ? "the GPU's" : plan->peak_measured ? "the sgemm measured at start" : "hardware.peak_tflops");
    noted = true;
    plan->peak_flops = achieved;
}

// A good step's line (every log.every steps and the last) and its
// metrics.jsonl and TensorBoard values.
static void log_step(Trainer *t, int64_t step, const StepResult *r) {
    const Config *cfg = &t->cfg;
    double tokens_per_s = (double)t->step_tokens / (r->ms * 1e-3);
    raise_peak(&t->plan, step, r->ms);
    double mfu = t->plan.peak_flops > 0 ? t->plan.model_flops / (r->ms * 1e-3 * t->plan.peak_flops) : 0;
    double rss_mib = plan_rss_now() / (1 << 20);
    if (t->state.bad_in_a_row == 0 && (step % cfg->log.every == 0 || step == cfg->train.steps)) {
        char eta[32];
        double elapsed = now_seconds() - t->train_start;
        format_duration(elapsed / (double)(step - t->first_step + 1) * (double)(cfg->train.steps - step), eta,
                        sizeof(eta));
        printf("step %6lld/%lld | loss %.4f | grad norm %.3f | lr %.2e | %.0f tok/s | MFU %.1f%% | RSS %.0f MiB | "
               "%.1f ms | eta %s%s\n", (long long)step, (long long)cfg->train.steps, r->loss, r->grad_norm, r->lr,
               tokens_per_s, 100 * mfu, rss_mib, r->ms, eta, t->attention_line);
        fflush(stdout);
    }
    sync_report(t, step, true);
    if (!t->metrics || t->state.bad_in_a_row != 0) return;
    fprintf(t->metrics, "{\"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.1f, "
            "\"mfu\": %.9g, \"rss_mib\": %.1f, \"ms\": %.3f%s, \"run_id\": \"%016" PRIx64 "\"}\n", (long long)step,
            r->loss, r->grad_norm, r->lr, tokens_per_s, mfu, rss_mib, r->ms, t->attention_json, t->state.run_id);
    if (fflush(t->metrics) != 0) fail("%s: write failed", t->metrics_path);
    static const char *const tags[] = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
                                       "train/mfu", "attention/density", "attention/recall",
                                       "attention/estimation_recall", "ring/mib"};
    const double values[] = {r->loss, r->lr, r->grad_norm, tokens_per_s, mfu, t->attention_scalars[0],
                             t->attention_scalars[1], t->attention_scalars[2], t->attention_scalars[3]};
    if (t->tb) tb_scalars(t->tb, step, tags, values, (int)(sizeof(values) / sizeof(values[0])));
}

// Under a launcher, stop (every rank, with one line) when it is gone on any
// rank (a rank's parent process changed: the launcher was killed and the
// rank orphaned), before another checkpoint is written.
static void stop_when_launcher_gone(const Trainer *t, int64_t step) {
    if (!t->launcher) return;
    int64_t gone = getppid() != t->launcher;
    comm_allreduce(&t->dist.world, &gone, 1, DT_INT64, REDUCE_MAX);
    if (gone)
        fail("step %lld: the launcher (%s, process %d) is gone: stopping without writing another checkpoint; the "
             "same command resumes from the last one", (long long)step, t->dist.launcher, t->launcher);
}

// After step `step`: validation and a checkpoint when due; a stop signal on
// any rank: a checkpoint (when none was just written) and true.
static bool after_step(Trainer *t, int64_t step) {
    const Config *cfg = &t->cfg;
    stop_when_launcher_gone(t, step);
    t->state.step = step;
    if (cfg->log.val_every > 0 && (step % cfg->log.val_every == 0 || step == cfg->train.steps))
        t->best_val = fmin(t->best_val, log_validation(&t->m, cfg, &t->dist, &t->data, step, t->metrics,
                                                       t->metrics_path, t->state.run_id, t->tb));
    t->state.tokens_seen += t->step_tokens;
    bool saved = (cfg->checkpoint.every > 0 && step % cfg->checkpoint.every == 0) ||
                 (step == cfg->train.steps && cfg->checkpoint.final);
    if (saved) save_checkpoint(cfg, &t->dist, t->zero, &t->m, &t->state, t->rolled_back_from);
    int sig = agreed_stop_signal(&t->dist);
    if (!sig || step >= cfg->train.steps) return false;
    if (!saved) save_checkpoint(cfg, &t->dist, t->zero, &t->m, &t->state, t->rolled_back_from);
    // checkpoint.resume: never (or a folder) would start the same command over.
    const char *how = cfg->checkpoint.resume == RESUME_AUTO
                    ? "the same command resumes"
                    : "the same command with checkpoint.resume=auto resumes (as it is, it starts over)";
    printf("stopped by %s after step %lld of %lld: checkpoint %s/step_%08lld written; %s\n",
           sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1", (long long)step,
           (long long)cfg->train.steps, cfg->checkpoint.dir, (long long)step, how);
    return true;
}

// The run summary when this process trained a step.
static void print_summary(const Trainer *t) {
    if (t->state.step < t->first_step) return;
    double seconds = now_seconds() - t->train_start;
    double tokens = (double)(t->state.step - t->first_step + 1) * (double)t->step_tokens;
    char val[48] = "";
    if (isfinite(t->best_val)) snprintf(val, sizeof(val), " | best val loss %.4f", t->best_val);
    // The host plan's figure on the CPU backend; on the CUDA backend the plan is the GPU's (not the host's).
    char planned[48] = "";
    if (!t->plan.gpu) snprintf(planned, sizeof(planned), " (planned %.1f)", t->plan.total_bytes / (1 << 20));
    printf("run summary: steps %lld-%lld | %.0f tokens | %.1f s | %.0f tok/s%s | peak RSS %.1f MiB%s\n",
           (long long)t->first_step, (long long)t->state.step, tokens, seconds, tokens / seconds, val,
           plan_rss_peak() / (1 << 20), planned);
    print_device_memory(&t->cfg, &t->dist);
}

static void train_close(Trainer *t) {
    if (t->metrics) fclose(t->metrics);
    if (t->tb) tb_close(t->tb);
    free(t->attention_json);
    run_data_close(&t->data);
    model_free(&t->m);
    dist_finalize(&t->dist);
}

// log.profile: the per-op profile of the run's second step (its first when
// it runs one), printed and written to log.dir/profile.json by rank 0.
static bool profiled_step(const Trainer *t, int64_t step) {
    const int64_t second = t->first_step + 1 <= t->cfg.train.steps ? t->first_step + 1 : t->first_step;
    return t->cfg.log.profile && step == second;
}

static void write_profile(Trainer *t, int64_t step) {
    Profile profile;
    model_profile_end(&t->m, &profile);
    if (t->dist.world_rank != 0) return;
    profile_print(&profile, step, stdout);
    char path[CONFIG_STR + 16];
    snprintf(path, sizeof(path), "%s/profile.json", t->cfg.log.dir);
    profile_write_json(&profile, step, path);
}

int cmd_train(int argc, char **argv) {
    Trainer t = {0};
    if (!train_setup(&t, argc, argv)) return 2;
    train_begin(&t);
    for (int64_t step = t.first_step; step <= t.cfg.train.steps; step++) {
        sync_report(&t, step, false);
        if (profiled_step(&t, step)) model_profile_begin(&t.m);
        StepResult r = train_step(&t, step);
        if (profiled_step(&t, step)) write_profile(&t, step);
        log_step(&t, step, &r);
        if (step == t.first_step && t.m.be->gemm_choice_print) t.m.be->gemm_choice_print();
        if (after_step(&t, step)) break;
    }
    print_summary(&t);
    train_close(&t);
    return 0;
}
