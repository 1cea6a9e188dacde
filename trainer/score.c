// score.c: `mtrain score --model DIR --tokens FILE`: the mean next-token cross
// entropy of a Hugging Face Qwen2 folder on one token sequence, and optionally
// the gradient of that loss for every parameter (--grads) and the logits
// (--logits), both as F32 safetensors; with --docs FILE (ascending document
// start positions), attention masked by document (data.doc_mask=true) and/or
// RoPE positions restarting at each document (data.reset_positions=true).
// The reference tests drive it.
// Under mpirun/srun the ranks form one context-parallel group (dp must be 1):
// each scores its tokens of the layout (attention.layout) with attention over
// the ring; rank 0 prints the one loss and writes the summed gradients.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/comm.h"
#include "../model/hf_config.h"
#include "../model/hf_io.h"
#include "args.h"
#include "checkpoint.h"
#include "commands.h"
#include "run.h"

static const char *score_usage = "usage: mtrain score --model DIR --tokens FILE [--docs FILE] "
                                 "[--grads OUT.safetensors] [--logits OUT.safetensors] [section.key=value ...]";

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_path = NULL, *docs_path = NULL, *grads_path = NULL, *logits_path = NULL;
    Config cfg;
    config_defaults(&cfg);
    const ArgOption options[] = {{"--model", ARG_VALUE, &model_dir}, {"--tokens", ARG_VALUE, &tokens_path},
                                 {"--docs", ARG_VALUE, &docs_path}, {"--grads", ARG_VALUE, &grads_path},
                                 {"--logits", ARG_VALUE, &logits_path}};
    ArgsResult args = args_parse(options, (int)(sizeof(options) / sizeof(options[0])), argc, argv, 0);
    if (args_refused(args, score_usage)) return 2;
    if (!model_dir || !tokens_path) return args_usage_error(score_usage, "score: --model and --tokens are required");
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    hf_config_read(path, &cfg.model);
    for (int i = args.rest; i < argc; i++) config_override(&cfg, argv[i]);
    config_validate(&cfg, path);
    Dist dist;
    run_start(&cfg, &dist, "mtrain score");
    if (dist.dp.size > 1)
        comm_fail_all(&dist.world, "mtrain score: parallel.dp %d: score splits one sequence over its ranks "
                      "(expected parallel.dp 1)", dist.dp.size);
    if (logits_path && dist.world_size > 1)
        comm_fail_all(&dist.world, "mtrain score: --logits with %d ranks: logits are written by a single "
                      "process only (expected no --logits, or one rank)", dist.world_size);
    apply_threads(&cfg, &dist);

    bool documents = cfg.data.doc_mask || cfg.data.reset_positions;
    if (documents != (docs_path != NULL))
        comm_fail_all(&dist.world, "mtrain score: %s (expected data.doc_mask=true and/or data.reset_positions=true "
                      "with --docs FILE, or neither)", docs_path ? "--docs without data.doc_mask=true or "
                      "data.reset_positions=true" : cfg.data.doc_mask ? "data.doc_mask=true without --docs FILE" :
                      "data.reset_positions=true without --docs FILE");
    int64_t T;
    int64_t *ids = read_int_file(tokens_path, "token", cfg.model.vocab_size, "the model's vocabulary", false, &T);
    if (T < 2) fail("%s: %lld tokens (expected at least 2 to predict one)", tokens_path, (long long)T);
    int32_t *tokens = xmalloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) tokens[t] = (int32_t)ids[t];
    free(ids);
    Model m;
    model_from_config(&m, &cfg, cfg.train.recompute, 0);
    model_join_ring(&m, &cfg, &dist);
    model_load_hf_folder(&m, model_dir);
    if (docs_path) {
        int64_t count;
        int64_t *starts = read_int_file(docs_path, "document start", T, "the token positions", true, &count);
        if (cfg.data.doc_mask) model_set_documents(&m, starts, count);
        if (cfg.data.reset_positions) model_set_rope_documents(&m, starts, count);
        free(starts);
    }

    // This rank's tokens in the layout (all of them on one rank) and their targets.
    LayoutKind layout = cfg.attention.layout;
    int B = cfg.attention.block_size;
    int64_t n = layout_rank_positions(layout, T, B, dist.cp.size, dist.cp.rank, NULL);
    int64_t *pos = xmalloc(sizeof(int64_t) * (size_t)n);
    layout_rank_positions(layout, T, B, dist.cp.size, dist.cp.rank, pos);
    int32_t *local = xmalloc(sizeof(int32_t) * (size_t)n);
    int32_t *targets = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        local[i] = tokens[pos[i]];
        targets[i] = pos[i] + 1 < T ? tokens[pos[i] + 1] : -1;
    }
    Progress progress;
    char what[64];
    snprintf(what, sizeof(what), "scoring %lld tokens", (long long)T);
    progress_begin(&progress, what, 2 * (int64_t)m.cfg.num_layers, "layers", 1);
    m.progress = &progress;
    double loss = model_forward_backward(&m, local, targets, pos, n, (float)(1.0 / (double)(T - 1)));
    m.progress = NULL;
    progress_end(&progress);
    comm_allreduce(&dist.cp, &loss, 1, DT_DOUBLE, REDUCE_SUM);
    loss /= (double)(T - 1);
    if (grads_path) {
        model_set_grad_reduce(&m, &dist.cp, 0);
        model_reduce_grads(&m);
    }
    if (dist.world_rank == 0) {
        printf("loss %.9g\ntokens %lld\n", loss, (long long)T);
        if (grads_path) model_write_grads(&m, grads_path);
    }
    if (logits_path) {
        int64_t V = cfg.model.vocab_size;
        float *logits = xmalloc(sizeof(float) * (size_t)(T * V));
        model_logits(&m, tokens, NULL, T, logits);
        StWriteTensor t = {.name = "logits", .ndim = 2, .shape = {T, V}, .data = logits};
        st_write(logits_path, &t, 1, ST_F32);
        free(logits);
    }
    free(targets);
    free(local);
    free(pos);
    free(tokens);
    model_free(&m);
    dist_finalize(&dist);
    return 0;
}
