// generate.c: `mtrain generate --model DIR`: text from a Hugging Face folder
// (a checkpoint's step folder is one) with a KV cache (model/decode.h) on the
// run's backend (train.backend=cpu|cuda as an override). The prompt comes as
// text (--prompt, encoded with the folder's tokenizer.json, else the bytes
// tokenizer; --tokenizer chooses another) or as token ids (--tokens FILE);
// the new tokens stream to stdout as text (always valid UTF-8: an invalid or
// unfinished byte sequence shows as U+FFFD), or as ids on one line (--ids).
// Sampling: greedy at --temperature 0, else softmax(logits / T) restricted to
// the --top-k most likely tokens (0: all), then to the fewest most likely
// whose mass reaches --top-p, drawn with the seeded RNG (--seed). Generation
// stops after --max-new tokens (capped so that the prompt and the new tokens
// fit model.max_position_embeddings) or at the tokenizer's end of text (its
// id the last of --ids; no text for it).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../data/tokenizer.h"
#include "../model/decode.h"
#include "../model/hf_config.h"
#include "../model/hf_io.h"
#include "args.h"
#include "checkpoint.h"
#include "commands.h"
#include "run.h"

static const char *generate_usage =
    "usage: mtrain generate --model DIR (--prompt TEXT | --tokens FILE) [--max-new N] [--temperature T] "
    "[--top-p P] [--top-k K] [--seed S] [--ids] [--tokenizer T] [section.key=value ...]";

typedef struct {
    double temperature;  // 0: greedy
    double top_p;        // (0, 1]
    int64_t top_k;       // 0: every token
} Sampling;

// The number in value for flag, in [lo, hi]; else one line and exit 2.
static double parse_number(const char *flag, const char *value, double lo, double hi, bool whole) {
    char *end;
    errno = 0;
    double x = strtod(value, &end);
    if (errno || end == value || *end || !(x >= lo && x <= hi) || (whole && x != floor(x))) {
        fprintf(stderr, "mtrain generate: %s '%s': expected a %s in [%g, %g]\n", flag, value,
                whole ? "whole number" : "number", lo, hi);
        exit(2);
    }
    return x;
}

// The most likely token (the first of equal ones).
static int32_t argmax(const float *logits, int64_t V) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

static const float *sort_logits;
// Descending logit, ties to the smaller id.
static int by_logit(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (sort_logits[i] != sort_logits[j]) return sort_logits[i] > sort_logits[j] ? -1 : 1;
    return (i > j) - (i < j);
}

// One token from logits [V] (order [V], probs [V]: scratch).
static int32_t sample(const float *logits, int64_t V, const Sampling *s, Rng *rng, int32_t *order, double *probs) {
    if (s->temperature == 0) return argmax(logits, V);
    for (int64_t i = 0; i < V; i++) order[i] = (int32_t)i;
    sort_logits = logits;
    qsort(order, (size_t)V, sizeof(int32_t), by_logit);
    int64_t keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double total = 0, top = logits[order[0]];
    for (int64_t i = 0; i < keep; i++) total += probs[i] = exp(((double)logits[order[i]] - top) / s->temperature);
    if (s->top_p < 1) {
        double mass = 0;
        int64_t n = 0;
        while (n < keep && mass < s->top_p * total) mass += probs[n++];
        keep = n, total = mass;
    }
    double u = rng_uniform(rng) * total, run = 0;
    for (int64_t i = 0; i < keep; i++)
        if ((run += probs[i]) > u) return order[i];
    return order[keep - 1];
}

// The prompt's ids: --tokens FILE, or --prompt TEXT encoded.
static int32_t *prompt_ids(const char *tokens_path, const char *prompt, Tokenizer *tok, int64_t vocab,
                           int64_t *count) {
    int64_t n = 0;
    int32_t *ids;
    if (tokens_path) {
        int64_t *values = read_int_file(tokens_path, "token", vocab, "the model's vocabulary", false, &n);
        if (n == 0) fail("%s: no token ids (expected whitespace-separated ids of the prompt)", tokens_path);
        ids = xmalloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)values[i];
        free(values);
    } else {
        if (!prompt[0]) fail("generate: --prompt is empty (expected the text to continue)");
        TokenIds t = {0};
        int64_t bad = tok->encode(tok, (const uint8_t *)prompt, (int64_t)strlen(prompt), &t);
        if (bad >= 0) fail("generate: --prompt: byte %lld is not UTF-8 (tokenizer %s)", (long long)bad, tok->name);
        n = t.count;
        ids = xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) {
            if (t.ids[i] >= vocab)
                fail("generate: --prompt: tokenizer %s gives id %u, outside the model's vocabulary [0, %lld) "
                     "(expected the model's own tokenizer)", tok->name, t.ids[i], (long long)vocab);
            ids[i] = (int32_t)t.ids[i];
        }
        free(t.ids);
    }
    *count = n;
    return ids;
}

int cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_path = NULL, *prompt = NULL, *tokenizer = NULL;
    int64_t max_new = 64;
    uint64_t seed = 0;
    bool print_ids = false;
    Sampling s = {1.0, 1.0, 0};
    Config cfg;
    config_defaults(&cfg);
    const char *max_new_text = NULL, *temperature = NULL, *top_p = NULL, *top_k = NULL, *seed_text = NULL;
    const ArgOption options[] = {
        {"--ids", ARG_FLAG, &print_ids}, {"--model", ARG_VALUE, &model_dir}, {"--prompt", ARG_VALUE, &prompt},
        {"--tokens", ARG_VALUE, &tokens_path}, {"--tokenizer", ARG_VALUE, &tokenizer},
        {"--max-new", ARG_VALUE, &max_new_text}, {"--temperature", ARG_VALUE, &temperature},
        {"--top-p", ARG_VALUE, &top_p}, {"--top-k", ARG_VALUE, &top_k}, {"--seed", ARG_VALUE, &seed_text}};
    ArgsResult args = args_parse(options, (int)(sizeof(options) / sizeof(options[0])), argc, argv, 0);
    if (args_refused(args, generate_usage)) return 2;
    if (max_new_text) max_new = (int64_t)parse_number("--max-new", max_new_text, 1, 1e9, true);
    if (temperature) s.temperature = parse_number("--temperature", temperature, 0, 1e6, false);
    if (top_p) s.top_p = parse_number("--top-p", top_p, 1e-9, 1, false);
    if (top_k) s.top_k = (int64_t)parse_number("--top-k", top_k, 0, 1e9, true);
    if (seed_text) seed = (uint64_t)parse_number("--seed", seed_text, 0, 9007199254740992.0, true);
    if (!model_dir || !prompt == !tokens_path) {
        fprintf(stderr, "%s\n(expected --model and one of --prompt, --tokens)\n", generate_usage);
        return 2;
    }
    char *config_path = path_join(model_dir, "config.json");
    if (access(config_path, R_OK) != 0)
        fail("%s: %s (expected a Hugging Face model folder or a checkpoint's step folder)", config_path,
             strerror(errno));
    hf_config_read(config_path, &cfg.model);
    for (int i = args.rest; i < argc; i++) config_override(&cfg, argv[i]);
    config_validate(&cfg, config_path);
    char *json = path_join(model_dir, "tokenizer.json");
    Tokenizer *tok = tokenizer_open(tokenizer ? tokenizer : access(json, R_OK) == 0 ? model_dir : "bytes");
    free(json);
    int64_t n;
    int32_t *ids = prompt_ids(tokens_path, prompt, tok, cfg.model.vocab_size, &n);
    if (n == 0) fail("generate: --prompt gives no tokens (tokenizer %s)", tok->name);
    int64_t context = cfg.model.max_position_embeddings;
    if (n >= context)
        fail("generate: the prompt has %lld tokens, the model's context is %lld (model.max_position_embeddings; "
             "expected a shorter prompt, or the key raised as an override)", (long long)n, (long long)context);
    if (n + max_new > context) {
        fprintf(stderr, "note: generate: --max-new %lld capped to %lld: the prompt's %lld tokens and the new ones "
                "fill the model's context of %lld (model.max_position_embeddings)\n", (long long)max_new,
                (long long)(context - n), (long long)n, (long long)context);
        max_new = context - n;
    }

    Dist dist;
    run_start(&cfg, &dist, "mtrain generate");
    if (dist.world_size > 1)
        comm_fail_all(&dist.world, "mtrain generate: %d ranks: generation runs in one process (expected no mpirun "
                      "or srun)", dist.world_size);
    apply_threads(&cfg, &dist);
    Model m;
    model_from_config(&m, &cfg, cfg.train.recompute, 0);
    model_load_hf_folder(&m, model_dir);
    Decoder d;
    decoder_init(&d, &m, n + max_new, 256);
    int64_t V = cfg.model.vocab_size;
    float *logits = xmalloc(sizeof(float) * (size_t)V);
    int32_t *order = xmalloc(sizeof(int32_t) * (size_t)V);
    double *probs = xmalloc(sizeof(double) * (size_t)V);
    Rng rng;
    rng_seed(&rng, seed);
    decoder_append(&d, ids, n, logits);
    bool unknown_warned = false;
    TextDecoder text = {0};
    for (int64_t i = 0; i < max_new; i++) {
        int32_t next = sample(logits, V, &s, &rng, order, probs);
        if (print_ids) printf(i ? " %d" : "%d", next);
        else if (next == tok->end_of_text) break;
        else if (tokenizer_write(tok, &text, (const uint32_t *)&next, 1, stdout) >= 0 && !unknown_warned) {
            fprintf(stderr, "warning: generate: token %d has no text in tokenizer %s; such tokens are left out\n",
                    next, tok->name);
            unknown_warned = true;
        }
        fflush(stdout);
        if (next == tok->end_of_text) break;
        if (i + 1 < max_new) decoder_append(&d, &next, 1, logits);
    }
    text_decoder_finish(&text, stdout);
    printf("\n");
    free(probs);
    free(order);
    free(logits);
    decoder_free(&d);
    model_free(&m);
    free(ids);
    tokenizer_close(tok);
    free(config_path);
    dist_finalize(&dist);
    return 0;
}
