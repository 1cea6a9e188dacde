// run.c: the set-up of a run that every verb shares (run.h): the start of
// the ranks on a config or a run file, threads, the model, loader and ring from the
// run config, integer files.
#include "run.h"

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../attention/attention_api.h"
#include "../dist/progress.h"
#include "args.h"

int apply_threads(const Config *cfg, const Dist *dist) {
    int share = dist->node_cpus / dist->local_size;
    if (share > dist->rank_cpus) share = dist->rank_cpus;
    if (share < 1) share = 1;
    int threads = cfg->parallel.threads > 0 ? cfg->parallel.threads : share;
    int64_t node_threads = (int64_t)threads * dist->local_size;
    if (cfg->parallel.threads > 0 && dist->world_rank == 0 &&
        (node_threads > dist->node_cpus || threads > dist->rank_cpus))
        fprintf(stderr, "warning: parallel.threads %d x %d ranks on this node = %lld threads on %d CPUs (%d for "
                "this rank): oversubscribed, every step waits for descheduled threads (parallel.threads: 0 gives %d)\n",
                threads, dist->local_size, (long long)node_threads, dist->node_cpus, dist->rank_cpus, share);
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    return threads;
}

void model_from_config(Model *m, const Config *cfg, RecomputePolicy recompute, int64_t tokens) {
    model_init(m, &cfg->model, backend_select(cfg->train.backend), &cfg->attention, cfg->train.loss_chunk);
    model_set_activations(m, recompute == RECOMPUTE_AUTO ? RECOMPUTE_NONE : recompute, cfg->train.mlp_chunk, tokens);
}

void loader_from_config(Loader *l, const Config *cfg, bool validation) {
    const DataConfig *d = &cfg->data;
    LoaderConfig lc = {.synthetic = d->train == DATA_SYNTHETIC,
                       .train = d->train_path,
                       .val_held_out = d->val == VAL_HOLDOUT,
                       .val = d->val_path,
                       .vocab_size = cfg->model.vocab_size,
                       .seq_len = cfg->train.seq_len,
                       .val_sequences = validation ? d->val_sequences : 0,
                       .padded = d->packing == PACKING_PADDED,
                       .seed = cfg->train.seed,
                       .tokenizer = {SHARD_TOKENIZER_UNKNOWN, 0}};
    // The model's tokenizer: train.init_from's tokenizer.json, when it has one.
    char tokenizer[CONFIG_STR + 32], source[CONFIG_STR + 32];
    snprintf(tokenizer, sizeof(tokenizer), "%s/tokenizer.json", cfg->train.init_from_path);
    snprintf(source, sizeof(source), "train.init_from %s", cfg->train.init_from_path);
    if (d->check_tokenizer && cfg->train.init_from == INIT_FOLDER && access(tokenizer, R_OK) == 0) {
        lc.tokenizer = shard_tokenizer_of(tokenizer);
        lc.tokenizer_source = source;
    }
    loader_open(l, &lc);
}

// Ranks other than 0 write stdout to /dev/null: rank 0 alone speaks (errors
// still reach stderr from any rank).
static void quiet_other_ranks(const Dist *dist) {
    if (dist->world_rank == 0) return;
    if (!freopen("/dev/null", "w", stdout)) fail("/dev/null: cannot open for writing");
    progress_quiet();
}

void run_start(const Config *cfg, Dist *dist, const char *source) {
    dist_init(dist, NULL, NULL, cfg->parallel.timeout_s);
    dist_setup(dist, cfg->parallel.dp, cfg->parallel.cp, cfg->parallel.cp_inner, source);
    quiet_other_ranks(dist);
    backend_join_devices(cfg->train.backend, dist, cfg->parallel.comm == COMM_NCCL);
}

bool run_start_file(int argc, char **argv, const char *usage, bool eval_model, Config *cfg, Dist *dist) {
    if (argc < 1 || argv[0][0] == '-') {
        fprintf(stderr, "%s\n", usage);
        return false;
    }
    if (args_refused(args_parse(NULL, 0, argc - 1, argv + 1, argc), usage)) return false;
    config_from_args(cfg, argv[0], argc - 1, argv + 1, eval_model);
    run_start(cfg, dist, argv[0]);
    return true;
}

void model_join_ring(Model *m, const Config *cfg, const Dist *dist) {
    if (dist->cp.size == 1) return;
    model_set_ring(m, &dist->cp, ring_inner_size(cfg->attention.ring, dist->cp.size, dist->grid.cp_inner));
}

int64_t *read_int_file(const char *path, const char *what, int64_t limit, const char *range,
                              bool ascending, int64_t *count) {
    char *text = read_file(path, NULL);
    int64_t n = 0, cap = 1024;
    int64_t *values = xmalloc(sizeof(int64_t) * (size_t)cap);
    char *s = text;
    for (;;) {
        while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || (*end && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r'))
            fail("%s: %s %lld is not an integer", path, what, (long long)n);
        if (v < 0 || v >= limit)
            fail("%s: %s %lld is %lld, outside %s [0, %lld)", path, what, (long long)n, v, range, (long long)limit);
        if (ascending && n > 0 && v <= values[n - 1])
            fail("%s: %s %lld is %lld, not after the previous %lld (expected ascending)", path, what,
                 (long long)n, v, (long long)values[n - 1]);
        if (n == cap) values = xrealloc(values, sizeof(int64_t) * (size_t)(cap *= 2));
        values[n++] = v;
        s = end;
    }
    free(text);
    *count = n;
    return values;
}
