// eval.c: `mtrain eval RUN.yaml [overrides]`: evaluates a checkpoint or a
// Hugging Face folder: perplexity by context length on eval.text, and
// exact-match accuracy of passkey, NIAH and RULER-style tasks (data/tasks.h)
// over a grid of lengths × depths. Prints one table per task, writes
// eval.out/results.json and PNG plots (gnuplot): perplexity vs length and one
// accuracy heatmap (length × depth) per task. Every forward pass goes through
// model_loss / model_logits_range, the calls training uses. Under mpirun the
// ranks form one context-parallel group (dp must be 1): every sequence is
// split over them in attention.layout, attention runs over the ring, losses
// are summed and answer verdicts ANDed over the ranks; rank 0 alone prints
// and writes results.json and the plots.
// Documents: perplexity on the held-out stream (eval.text: heldout) packs
// several documents into each sequence, so data.doc_mask and
// data.reset_positions apply to it as in training's validation; a task
// sample is one prompt and a text file one document, so they have none.
#include "eval.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../dist/progress.h"
#include "args.h"
#include "checkpoint.h"
#include "commands.h"
#include "run.h"

bool answer_exact_match(const float *logits, int64_t V, const int32_t *answer, int64_t A) {
    for (int64_t r = 0; r < A; r++) {
        const float *row = logits + r * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        if (best != answer[r]) return false;
    }
    return true;
}

// slice = this rank's part of the sequence tokens [T + 1] (inputs and targets).
static void split_sequence(const EvalSplit *split, int32_t *tokens, int64_t T, RankSlice *slice) {
    PackedSequence seq = {.seq_len = T, .tokens = tokens, .targets = tokens + 1};
    loader_rank_slice(&seq, split->layout, split->block_size, split->comm ? split->comm->size : 1,
                      split->comm ? split->comm->rank : 0, slice);
}

bool eval_sample_correct(Model *m, const TaskSample *s, const EvalSplit *split, float *logits) {
    // Rows at global positions [length - 1, T) predict the answer; on this
    // rank (positions ascending) they are the local rows [first, first + count).
    int64_t T = s->length + s->answer_len - 1;
    RankSlice slice;
    rank_slice_alloc(&slice, T);
    split_sequence(split, s->tokens, T, &slice);
    int64_t first = 0;
    while (first < slice.count && slice.positions[first] < s->length - 1) first++;
    int64_t count = slice.count - first;
    model_logits_range(m, slice.tokens, slice.positions, slice.count, first, count, logits);
    int64_t correct = answer_exact_match(logits, m->cfg.vocab_size, slice.targets + first, count);
    if (split->comm) comm_allreduce(split->comm, &correct, 1, DT_INT64, REDUCE_MIN);
    rank_slice_free(&slice);
    return correct;
}

// What one `mtrain eval` does, parsed from the config.
typedef struct {
    const Config *cfg;
    EvalSplit split;                   // over the cp ranks (cmd_eval sets it)
    unsigned tasks;                    // EVAL_* bits
    int64_t lengths[EVAL_MAX_LIST];
    int length_count;
    double depths[EVAL_MAX_LIST];
    int depth_count;
    TaskKind grid[TASK_COUNT];         // the task kinds of the grid, in run order
    int grid_count;
    char model_path[CONFIG_STR + 32];  // eval.model resolved ("" when there is none yet)
    char tokenizer[CONFIG_STR + 32];   // eval.tokenizer resolved: bytes, or a tokenizer.json / its folder
    Tokenizer *tok;                    // opened when a task or eval.text needs it, else NULL
    int32_t *text;                     // eval.text as tokens (NULL when no task reads it)
    int64_t text_len;
    int64_t *text_doc_starts;          // [text_doc_count] where documents of the held-out text begin, ascending
    int64_t text_doc_count;            // (0 for a text file: one document)
} EvalPlan;

// The validation stream of the run's loader: its sequences joined, and where
// its documents begin (doc_starts [S * N], *doc_count of them). With shards
// that is the packed stream itself (a sequence starts with the previous
// one's last target); synthetic sequences (one document each) lose their
// first token, so a document begins at their second.
static int32_t *heldout_tokens(const Config *cfg, int64_t *len, int64_t **doc_starts, int64_t *doc_count) {
    Loader l;
    loader_from_config(&l, cfg, true);
    int64_t N = cfg->train.seq_len, S = cfg->data.val_sequences;
    int32_t *text = xmalloc(sizeof(int32_t) * (size_t)(S * N + 1));
    *doc_starts = xmalloc(sizeof(int64_t) * (size_t)(S * N));
    *doc_count = 0;
    PackedSequence seq;
    packed_sequence_alloc(&seq, N);
    for (int64_t i = 0; i < S; i++) {
        loader_val_sequence(&l, i, &seq);
        int64_t skip = i > 0;
        memcpy(text + i * N + skip, seq.tokens + skip, sizeof(int32_t) * (size_t)(N + 1 - skip));
        for (int64_t k = 0; k < seq.doc_start_count; k++)
            (*doc_starts)[(*doc_count)++] = i * N + (l.cfg.synthetic && k == 0 ? skip : seq.doc_starts[k]);
    }
    packed_sequence_free(&seq);
    loader_close(&l);
    *len = S * N + 1;
    return text;
}

static int32_t *text_file_tokens(const char *path, const EvalPlan *p, int64_t *len) {
    const Config *cfg = p->cfg;
    Tokenizer *tok = p->tok;
    size_t bytes;
    char *raw = read_file(path, &bytes);
    TokenIds ids = {0};
    int64_t bad = tok->encode(tok, (const uint8_t *)raw, (int64_t)bytes, &ids);
    if (bad >= 0) fail("%s: byte %lld of the text is not valid UTF-8 (expected UTF-8 text for eval.text)", path, (long long)bad);
    free(raw);
    *len = ids.count;
    int32_t *text = xmalloc(sizeof(int32_t) * (size_t)(ids.count + 1));
    for (int64_t i = 0; i < ids.count; i++) text[i] = (int32_t)ids.ids[i];
    free(ids.ids);
    if (*len < 2) fail("%s: %lld tokens (expected a text of at least 2 tokens for eval.text)", path, (long long)*len);
    for (int64_t i = 0; i < *len; i++)
        if (text[i] >= cfg->model.vocab_size)
            fail("%s: token %lld has id %d, outside the model's vocabulary [0, %d) (eval.tokenizer: %s)", path,
                 (long long)i, text[i], cfg->model.vocab_size, p->tokenizer);
    return text;
}

// The seed of sample s of depth di. Independent of the length, so one
// (depth, sample) shows the same needles at every length.
static uint64_t sample_seed(uint64_t seed, int depth_index, int sample) {
    uint64_t h = seed;
    h = (h ^ (uint64_t)depth_index) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (uint64_t)sample) * 0x94d049bb133111ebULL;
    return h;
}

// eval.model: `latest` = the newest complete checkpoint in checkpoint.dir
// (path = "" when there is none yet), or the folder it names.
static void resolve_model_path(const Config *cfg, char *path, size_t n) {
    if (cfg->eval.model == EVAL_MODEL_FOLDER) snprintf(path, n, "%s", cfg->eval.model_path);
    else if (!checkpoint_find_latest(cfg->checkpoint.dir, path, n)) path[0] = 0;
}

// eval.tokenizer as a tokenizer spec (data/tokenizer.h): `model` = the model
// folder's tokenizer.json when it has one, else bytes; `bytes`; or the path.
static void eval_tokenizer_spec(const EvalConfig *e, const char *model_path, char *spec, size_t n) {
    char json[CONFIG_STR + 64];
    snprintf(json, sizeof(json), "%s/tokenizer.json", model_path);
    bool model_json = e->tokenizer == TOKENIZER_MODEL && model_path[0] && access(json, R_OK) == 0;
    snprintf(spec, n, "%s", e->tokenizer == TOKENIZER_FILE ? e->tokenizer_path : model_json ? model_path : "bytes");
}

// Parse the lists, read eval.text if a task needs it, and check everything
// that can fail (text long enough, task prompts fit their lengths, token ids
// inside the vocabulary) before the model is loaded.
static void plan_eval(EvalPlan *p, const Config *cfg, const char *run_file) {
    memset(p, 0, sizeof(*p));
    p->cfg = cfg;
    p->tasks = eval_task_set(&cfg->eval, run_file);
    p->length_count = eval_length_list(&cfg->eval, run_file, p->lengths);
    p->depth_count = eval_depth_list(&cfg->eval, run_file, p->depths);
    if (p->tasks & EVAL_PASSKEY) p->grid[p->grid_count++] = TASK_PASSKEY;
    if (p->tasks & EVAL_NIAH) p->grid[p->grid_count++] = TASK_NIAH;
    if (p->tasks & EVAL_RULER)
        for (TaskKind k = TASK_RULER_SINGLE; k <= TASK_RULER_VT; k++) p->grid[p->grid_count++] = k;

    resolve_model_path(cfg, p->model_path, sizeof(p->model_path));
    eval_tokenizer_spec(&cfg->eval, p->model_path, p->tokenizer, sizeof(p->tokenizer));
    bool niah_text = (p->tasks & EVAL_NIAH) && cfg->eval.haystack == HAYSTACK_TEXT;
    bool text_file = cfg->eval.text == TEXT_FILE && ((p->tasks & EVAL_PERPLEXITY) || niah_text);
    // Perplexity on the held-out stream reads token ids: no tokenizer.
    if (p->grid_count || text_file) p->tok = tokenizer_open(p->tokenizer);
    if ((p->tasks & EVAL_PERPLEXITY) || niah_text)
        p->text = text_file ? text_file_tokens(cfg->eval.text_path, p, &p->text_len)
                            : heldout_tokens(cfg, &p->text_len, &p->text_doc_starts, &p->text_doc_count);
    for (int i = 0; (p->tasks & EVAL_PERPLEXITY) && i < p->length_count; i++) {
        if (p->lengths[i] + 1 > p->text_len)
            fail("%s: eval.text '%s' has %lld tokens, fewer than one sequence of length %lld needs (%lld; expected a "
                 "longer text, more data.val_sequences, or shorter eval.lengths)", run_file, config_enum_name(cfg, &cfg->eval.text),
                 (long long)p->text_len, (long long)p->lengths[i], (long long)p->lengths[i] + 1);
    }
    int64_t shortest = p->lengths[0];
    for (int i = 1; i < p->length_count; i++)
        if (p->lengths[i] < shortest) shortest = p->lengths[i];
    Haystack hay = {niah_text ? p->text : NULL, p->text_len};
    for (int g = 0; g < p->grid_count; g++) {
        int64_t need = 0;
        for (int di = 0; di < p->depth_count; di++)
            for (int s = 0; s < cfg->eval.samples; s++) {
                TaskSpec spec = {p->grid[g], shortest, p->depths[di], sample_seed(cfg->eval.seed, di, s),
                                 cfg->eval.passkey_digits};
                int64_t n = task_min_length(&spec, p->tok);
                if (n > need) need = n;
            }
        if (shortest < need)
            fail("%s: eval.lengths: %lld is too short for task %s, whose needles and question take up to %lld "
                 "tokens (expected lengths of at least %lld)", run_file, (long long)shortest, task_name(p->grid[g]),
                 (long long)need - 1, (long long)need);
        TaskSpec spec = {p->grid[g], shortest, p->depths[0], sample_seed(cfg->eval.seed, 0, 0),
                         cfg->eval.passkey_digits};
        TaskSample s;
        task_generate(&spec, &hay, p->tok, &s);
        for (int64_t t = 0; t < s.length + s.answer_len; t++)
            if (s.tokens[t] >= cfg->model.vocab_size)
                fail("%s: eval.tokenizer %s gives task %s the token id %d, outside the model's vocabulary [0, %d) "
                     "(expected a tokenizer that matches the model)", run_file, p->tokenizer,
                     task_name(s.kind), s.tokens[t], cfg->model.vocab_size);
        task_sample_free(&s);
    }
}

// ----------------------------------------------------------------------------
// Perplexity by length

// The documents of eval.text that begin in [first, first + L), relative to
// first, for the model under data.doc_mask / data.reset_positions; starts
// [L] is scratch.
static void set_text_documents(const EvalPlan *p, Model *m, int64_t first, int64_t L, int64_t *starts) {
    const DataConfig *d = &p->cfg->data;
    if (!d->doc_mask && !d->reset_positions) return;
    int64_t count = 0;
    for (int64_t k = 0; k < p->text_doc_count; k++)
        if (p->text_doc_starts[k] >= first && p->text_doc_starts[k] < first + L)
            starts[count++] = p->text_doc_starts[k] - first;
    if (d->doc_mask) model_set_documents(m, starts, count);
    if (d->reset_positions) model_set_rope_documents(m, starts, count);
}

// Sequence s of length L is eval.text tokens [s·L, s·L + L] (inputs and
// targets); as many as fit, at most eval.samples: seqs[i] of them. Leaves
// the model without documents.
static void eval_perplexity(const EvalPlan *p, Model *m, double *loss, int *seqs) {
    const Config *cfg = p->cfg;
    printf("\nperplexity on %s (%lld tokens), up to %d sequences per length\n",
           config_enum_name(cfg, &cfg->eval.text), (long long)p->text_len, cfg->eval.samples);
    // Documents are held out of data.train only when the run validates.
    if (cfg->eval.text == TEXT_HELDOUT && cfg->data.train != DATA_SYNTHETIC && cfg->data.val == VAL_HOLDOUT &&
        cfg->log.val_every == 0)
        printf("not held out: log.val_every is 0, so training held no documents out of data.train and this text was "
               "trained on (for held-out text: log.val_every > 0 in training, data.val shards, or eval.text: FILE)\n");
    printf("%10s %6s %10s %12s %8s\n", "length", "seqs", "loss", "perplexity", "s");
    for (int i = 0; i < p->length_count; i++) {
        int64_t L = p->lengths[i], fit = (p->text_len - 1) / L;
        seqs[i] = fit < p->cfg->eval.samples ? (int)fit : p->cfg->eval.samples;
        double t0 = now_seconds(), total = 0;
        RankSlice slice;
        rank_slice_alloc(&slice, L);
        int64_t *starts = xmalloc(sizeof(int64_t) * (size_t)L);
        Progress progress;
        char what[64];
        snprintf(what, sizeof(what), "perplexity at length %lld", (long long)L);
        progress_begin(&progress, what, seqs[i], "sequences", 1);
        for (int s = 0; s < seqs[i]; s++) {
            split_sequence(&p->split, p->text + s * L, L, &slice);
            set_text_documents(p, m, s * L, L, starts);
            total += model_loss(m, slice.tokens, slice.targets, slice.positions, slice.count);
            progress_add(&progress, 1);
        }
        progress_end(&progress);
        free(starts);
        rank_slice_free(&slice);
        if (p->split.comm) comm_allreduce(p->split.comm, &total, 1, DT_DOUBLE, REDUCE_SUM);
        loss[i] = total / ((double)L * seqs[i]);
        printf("%10lld %6d %10.4f %12.3f %8.2f\n", (long long)L, seqs[i], loss[i], exp(loss[i]), now_seconds() - t0);
        fflush(stdout);
    }
    model_set_documents(m, NULL, 0);
    model_set_rope_documents(m, NULL, 0);
}

// ----------------------------------------------------------------------------
// Task grids

// correct[li * depth_count + di]: correct samples of the cell.
static void eval_grid(const EvalPlan *p, Model *m, TaskKind kind, int *correct) {
    int samples = p->cfg->eval.samples;
    Haystack hay = {kind == TASK_NIAH && p->cfg->eval.haystack == HAYSTACK_TEXT ? p->text : NULL, p->text_len};
    float *logits = NULL;
    double t0 = now_seconds();
    printf("\n%s: exact-match accuracy, %d samples per cell (rows: length, columns: depth)\n%10s", task_name(kind),
           samples, "length");
    for (int di = 0; di < p->depth_count; di++) printf(" %6.2f", p->depths[di]);
    printf("\n");
    // Rows are printed whole, so that progress lines fall between them.
    Progress progress;
    progress_begin(&progress, task_name(kind), (int64_t)p->length_count * p->depth_count * samples, "samples", 1);
    for (int li = 0; li < p->length_count; li++) {
        char row[32 + 8 * EVAL_MAX_LIST];
        int used = snprintf(row, sizeof(row), "%10lld", (long long)p->lengths[li]);
        for (int di = 0; di < p->depth_count; di++) {
            int *c = &correct[li * p->depth_count + di];
            *c = 0;
            for (int s = 0; s < samples; s++) {
                TaskSpec spec = {kind, p->lengths[li], p->depths[di], sample_seed(p->cfg->eval.seed, di, s),
                                 p->cfg->eval.passkey_digits};
                TaskSample sample;
                task_generate(&spec, &hay, p->tok, &sample);
                logits = xrealloc(logits, sizeof(float) * (size_t)(sample.answer_len * m->cfg.vocab_size));
                *c += eval_sample_correct(m, &sample, &p->split, logits);
                task_sample_free(&sample);
                progress_add(&progress, 1);
            }
            used += snprintf(row + used, sizeof(row) - (size_t)used, " %6.2f", (double)*c / samples);
        }
        progress_clear(&progress);
        printf("%s\n", row);
        fflush(stdout);
    }
    progress_end(&progress);
    printf("%s: %.2f s\n", task_name(kind), now_seconds() - t0);
    free(logits);
}

// ----------------------------------------------------------------------------
// results.json

static void write_results(const EvalPlan *p, const char *model_path, const double *loss, const int *seqs,
                          int *const *correct, const char *path) {
    const EvalConfig *e = &p->cfg->eval;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model_path);
    cJSON_AddStringToObject(root, "tokenizer", p->tokenizer);
    cJSON_AddStringToObject(root, "text", config_enum_name(p->cfg, &e->text));
    cJSON_AddStringToObject(root, "haystack", config_enum_name(p->cfg, &e->haystack));
    char seed[24];  // exact: a double would round seeds above 2^53
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)e->seed);
    cJSON_AddRawToObject(root, "seed", seed);
    cJSON *ppl = cJSON_AddArrayToObject(root, "perplexity");
    for (int i = 0; loss && i < p->length_count; i++) {
        cJSON *row = cJSON_CreateObject();
        cJSON_AddNumberToObject(row, "length", (double)p->lengths[i]);
        cJSON_AddNumberToObject(row, "samples", seqs[i]);
        cJSON_AddNumberToObject(row, "loss", loss[i]);
        cJSON_AddNumberToObject(row, "perplexity", exp(loss[i]));
        cJSON_AddItemToArray(ppl, row);
    }
    cJSON *cells = cJSON_AddArrayToObject(root, "tasks");
    for (int g = 0; g < p->grid_count; g++)
        for (int li = 0; li < p->length_count; li++)
            for (int di = 0; di < p->depth_count; di++) {
                int c = correct[g][li * p->depth_count + di];
                cJSON *cell = cJSON_CreateObject();
                cJSON_AddStringToObject(cell, "task", task_name(p->grid[g]));
                cJSON_AddNumberToObject(cell, "length", (double)p->lengths[li]);
                cJSON_AddNumberToObject(cell, "depth", p->depths[di]);
                cJSON_AddNumberToObject(cell, "samples", e->samples);
                cJSON_AddNumberToObject(cell, "correct", c);
                cJSON_AddNumberToObject(cell, "accuracy", (double)c / e->samples);
                cJSON_AddItemToArray(cells, cell);
            }
    char *text = cJSON_Print(root);
    CHECK(text, "cJSON_Print: out of memory");
    char tmp[CONFIG_STR + 64];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = xfopen(tmp, "w");
    xfwrite(text, strlen(text), f, tmp);
    xfwrite("\n", 1, f, tmp);
    xfclose_sync(f, tmp);
    rename_into_place(tmp, path);
    free(text);
    cJSON_Delete(root);
}

// ----------------------------------------------------------------------------
// PNG plots (gnuplot)

void gp_string(FILE *gp, const char *s) {
    fputc('\'', gp);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', gp);
        fputc(*s, gp);
    }
    fputc('\'', gp);
}

void gp_output(FILE *gp, const char *out_dir, const char *name) {
    char path[CONFIG_STR + 96];
    snprintf(path, sizeof(path), "%s/%s.tmp", out_dir, name);
    fputs("set output ", gp);
    gp_string(gp, path);
    fputc('\n', gp);
}

static void gp_perplexity(FILE *gp, const EvalPlan *p, const double *loss) {
    gp_output(gp, p->cfg->eval.out, "perplexity.png");
    fprintf(gp, "$ppl << EOD\n");
    for (int i = 0; i < p->length_count; i++) fprintf(gp, "%lld %.9g\n", (long long)p->lengths[i], exp(loss[i]));
    // Explicit ranges: gnuplot warns about a single length or equal values.
    double x0 = (double)p->lengths[0], x1 = x0, y0 = exp(loss[0]), y1 = y0;
    for (int i = 1; i < p->length_count; i++) {
        x0 = fmin(x0, (double)p->lengths[i]), x1 = fmax(x1, (double)p->lengths[i]);
        y0 = fmin(y0, exp(loss[i])), y1 = fmax(y1, exp(loss[i]));
    }
    double pad = 0.1 * (y1 - y0) + 0.01 * y1;
    fprintf(gp, "EOD\nset title 'perplexity by context length'\nset xlabel 'context length (tokens)'\n"
                "set ylabel 'perplexity'\nset logscale x 2\nset xrange [%.9g:%.9g]\nset yrange [%.9g:%.9g]\n"
                "set grid\nset key off\nplot $ppl using 1:2 with linespoints lw 2 pt 7\nunset logscale x\n"
                "unset grid\n", x0 / 1.25, x1 * 1.25, y0 - pad, y1 + pad);
}

// Cells as boxes at (length index, depth index), coloured by accuracy.
static void gp_heatmap(FILE *gp, const EvalPlan *p, TaskKind kind, const int *correct) {
    char name[64];
    snprintf(name, sizeof(name), "heatmap_%s.png", task_name(kind));
    gp_output(gp, p->cfg->eval.out, name);
    fprintf(gp, "$grid << EOD\n");
    for (int li = 0; li < p->length_count; li++)
        for (int di = 0; di < p->depth_count; di++)
            fprintf(gp, "%d %d %.6g\n", li, di, (double)correct[li * p->depth_count + di] / p->cfg->eval.samples);
    fprintf(gp, "EOD\nset title '%s: exact-match accuracy (%d samples per cell)'\n", task_name(kind),
            p->cfg->eval.samples);
    fprintf(gp, "set xlabel 'context length (tokens)'\nset ylabel 'needle depth'\nset xtics (");
    for (int li = 0; li < p->length_count; li++) fprintf(gp, "%s'%lld' %d", li ? ", " : "", (long long)p->lengths[li], li);
    fprintf(gp, ")\nset ytics (");
    for (int di = 0; di < p->depth_count; di++) fprintf(gp, "%s'%g' %d", di ? ", " : "", p->depths[di], di);
    fprintf(gp, ")\nset xrange [-0.5:%g]\nset yrange [-0.5:%g]\n", p->length_count - 0.5, p->depth_count - 0.5);
    fprintf(gp, "plot $grid using 1:2:(0.5):(0.5):3 with boxxyerror fillstyle solid 1.0 noborder "
                "fillcolor palette notitle, $grid using 1:2:(sprintf('%%.2f', $3)) with labels notitle\n");
}

static void rename_plot(const EvalPlan *p, const char *name) {
    char tmp[CONFIG_STR + 96], path[CONFIG_STR + 96];
    snprintf(path, sizeof(path), "%s/%s", p->cfg->eval.out, name);
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", p->cfg->eval.out, name);
    rename_into_place(tmp, path);
}

// The plots are a convenience next to results.json: when gnuplot is missing
// or fails, say so on stderr and carry on.
static void write_plots(const EvalPlan *p, const double *loss, int *const *correct) {
    void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
    FILE *gp = popen("gnuplot", "w");
    if (!gp) {
        fprintf(stderr, "mtrain: eval: cannot run gnuplot; no PNG plots written\n");
        signal(SIGPIPE, old_pipe);
        return;
    }
    fprintf(gp, "set terminal pngcairo size 900,600\n"
                "set palette defined (0 '#c0392b', 0.5 '#f1c40f', 1 '#27ae60')\nset cbrange [0:1]\n"
                "set cblabel 'accuracy'\n");
    if (loss) gp_perplexity(gp, p, loss);
    for (int g = 0; g < p->grid_count; g++) gp_heatmap(gp, p, p->grid[g], correct[g]);
    fprintf(gp, "set output\n");
    int status = pclose(gp);
    signal(SIGPIPE, old_pipe);
    if (status != 0) {
        fprintf(stderr, "mtrain: eval: gnuplot failed (status %d); no PNG plots written\n", status);
        return;
    }
    if (loss) rename_plot(p, "perplexity.png");
    for (int g = 0; g < p->grid_count; g++) {
        char name[64];
        snprintf(name, sizeof(name), "heatmap_%s.png", task_name(p->grid[g]));
        rename_plot(p, name);
    }
}

// ----------------------------------------------------------------------------
// mtrain eval RUN.yaml [section.key=value ...]

// ----------------------------------------------------------------------------
// `mtrain tasks`: task samples as training text

// Sample i: the grid's task kinds and eval.lengths in turn, a depth drawn
// uniformly between the least and the greatest of eval.depths (the default
// list: [0, 1]; `eval.depths=0`: every key at the start), and a seed from a stream eval never uses (depth index
// -1), so a model trained on these text documents is never scored on one of
// them. Each line of the JSONL output is {"text": prompt + answer}.
int cmd_tasks(int argc, char **argv) {
    const char *count_text = NULL, *output = NULL;
    const ArgOption options[] = {{"--count", ARG_VALUE, &count_text}, {"--output", ARG_VALUE, &output}};
    ArgsResult args = args_parse(options, (int)(sizeof(options) / sizeof(options[0])), argc, argv, argc);
    int64_t count = count_text ? atoll(count_text) : 0;
    int kept = args.kept;
    const char *usage = "usage: mtrain tasks RUN.yaml --count N --output OUT.jsonl [section.key=value ...]";
    if (args_refused(args, usage)) return 2;
    if (count < 1 || !output) {
        fprintf(stderr, "%s\n", usage);
        return 2;
    }
    Config cfg;
    Dist dist;
    if (!run_start_file(kept, argv, usage, true, &cfg, &dist)) return 2;
    EvalPlan plan;
    plan_eval(&plan, &cfg, argv[0]);
    if (!plan.grid_count) fail("%s: eval.tasks '%s' has no task to generate (expected passkey, niah or ruler)", argv[0], cfg.eval.tasks);
    Rng rng;
    rng_seed(&rng, cfg.eval.seed);
    double depth_lo = plan.depths[0], depth_hi = plan.depths[0];
    for (int i = 1; i < plan.depth_count; i++) {
        if (plan.depths[i] < depth_lo) depth_lo = plan.depths[i];
        if (plan.depths[i] > depth_hi) depth_hi = plan.depths[i];
    }
    Haystack hay = {NULL, 0};
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", output, (int)getpid());
    FILE *out = xfopen(tmp, "w");
    for (int64_t i = 0; i < count; i++) {
        TaskSpec spec = {plan.grid[i % plan.grid_count], plan.lengths[(i / plan.grid_count) % plan.length_count],
                         depth_lo + (depth_hi - depth_lo) * rng_uniform(&rng), sample_seed(cfg.eval.seed, -1, (int)i),
                         cfg.eval.passkey_digits};
        TaskSample sample;
        task_generate(&spec, &hay, plan.tok, &sample);
        char *text = NULL;
        size_t used = 0;
        FILE *text_file = open_memstream(&text, &used);
        CHECK(text_file, "tasks: open_memstream failed");
        TextDecoder decoder = {0};
        tokenizer_write(plan.tok, &decoder, (const uint32_t *)sample.tokens, sample.length + sample.answer_len,
                        text_file);
        text_decoder_finish(&decoder, text_file);
        CHECK(fclose(text_file) == 0, "tasks: writing a sample's text failed");
        cJSON *line = cJSON_CreateObject();
        cJSON_AddStringToObject(line, "text", text);
        char *json = cJSON_PrintUnformatted(line);
        if (fprintf(out, "%s\n", json) < 0) fail("%s: write failed", tmp);
        free(json);
        cJSON_Delete(line);
        free(text);
        task_sample_free(&sample);
    }
    xfclose_sync(out, tmp);
    rename_into_place(tmp, output);
    printf("tasks: %lld samples of %s at lengths %s -> %s\n", (long long)count, cfg.eval.tasks, cfg.eval.lengths, output);
    free(plan.text);
    free(plan.text_doc_starts);
    tokenizer_close(plan.tok);
    dist_finalize(&dist);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    Config cfg;
    Dist dist;
    if (!run_start_file(argc, argv, "usage: mtrain eval RUN.yaml [section.key=value ...]", true, &cfg, &dist)) return 2;
    if (dist.dp.size > 1)
        comm_fail_all(&dist.world, "%s: parallel.dp %d: eval splits each sequence over its ranks (expected "
                      "parallel.dp 1)", argv[0], dist.dp.size);
    EvalPlan plan;
    plan_eval(&plan, &cfg, argv[0]);
    plan.split = (EvalSplit){dist.cp.size > 1 ? &dist.cp : NULL, cfg.attention.layout,
                             cfg.attention.block_size};
    apply_threads(&cfg, &dist);
    Model m;
    model_from_config(&m, &cfg, cfg.train.recompute, 0);
    model_join_ring(&m, &cfg, &dist);
    if (!plan.model_path[0])
        fail("checkpoint.dir: %s: no complete checkpoint to evaluate (eval.model: latest; expected a step_XXXXXXXX "
             "folder here, or eval.model set to a checkpoint or Hugging Face folder)", cfg.checkpoint.dir);
    model_load_hf_folder(&m, plan.model_path);
    printf("eval: %s | tasks %s | lengths %s | depths %s | %d samples | tokenizer %s\n", plan.model_path,
           cfg.eval.tasks, cfg.eval.lengths, cfg.eval.depths, cfg.eval.samples, plan.tok ? plan.tokenizer : "none");
    if (dist.world_rank == 0) make_dirs(cfg.eval.out);

    double t0 = now_seconds();
    double *loss = NULL;
    int seqs[EVAL_MAX_LIST];
    if (plan.tasks & EVAL_PERPLEXITY) {
        loss = xmalloc(sizeof(double) * (size_t)plan.length_count);
        eval_perplexity(&plan, &m, loss, seqs);
    }
    int *correct[TASK_COUNT];
    for (int g = 0; g < plan.grid_count; g++) {
        correct[g] = xmalloc(sizeof(int) * (size_t)(plan.length_count * plan.depth_count));
        eval_grid(&plan, &m, plan.grid[g], correct[g]);
    }
    char results[CONFIG_STR + 32];
    snprintf(results, sizeof(results), "%s/results.json", cfg.eval.out);
    if (dist.world_rank == 0) {
        write_results(&plan, plan.model_path, loss, seqs, correct, results);
        write_plots(&plan, loss, correct);
    }
    printf("\neval: %.1f s | results: %s | plots: %s/*.png\n", now_seconds() - t0, results, cfg.eval.out);

    for (int g = 0; g < plan.grid_count; g++) free(correct[g]);
    free(loss);
    free(plan.text);
    free(plan.text_doc_starts);
    tokenizer_close(plan.tok);
    model_free(&m);
    dist_finalize(&dist);
    return 0;
}
