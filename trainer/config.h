// config.h: the run configuration. A YAML run file (libyaml) with sections
// model, attention, parallel, train, data, checkpoint, log, eval; command-line
// overrides `section.key=value`; every key has a default, a type, a range and
// a one-line meaning in one schema table (config.c), which also generates
// docs/CONFIG.md (`mtrain config --doc`).
#ifndef MTRAIN_CONFIG_H
#define MTRAIN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../attention/attention.h"
#include "../model/backend.h"
#include "../model/model_config.h"
#include "../model/optimizer.h"

// eval.haystack: what the needle of `niah` hides in.
typedef enum { HAYSTACK_FILLER, HAYSTACK_TEXT } HaystackKind;

typedef struct {
    int threads;               // OpenMP threads per rank; 0 = the node's CPUs / its ranks
    int dp, cp, cp_inner;      // rank grid (dist/comm.h); 0 = default
    int zero;                  // 1 = AdamW moments sharded over dp (ZeRO-1)
    double timeout_s;          // a collective that takes longer ends the job
} ParallelConfig;

typedef struct {
    BackendKind backend;       // cpu
    int64_t steps;             // total optimizer steps
    int seq_len;               // tokens per sequence
    int micro_batches;         // sequences per optimizer step (gradient accumulation)
    double lr;                 // peak learning rate
    double min_lr;             // floor of the decay
    int64_t warmup_steps;      // linear warmup steps
    LrSchedule lr_schedule;    // constant | cosine | linear
    double weight_decay;       // AdamW decoupled weight decay
    double beta1, beta2, eps;  // AdamW moments
    double grad_clip;          // global-norm clip; 0 = off
    uint64_t seed;             // initialisation and data order
    bool checkpoint_activations; // recompute each layer in backward
    int loss_chunk;            // tokens per fused LM-head + cross-entropy chunk
    char init_from[CONFIG_STR]; // "none" or a Hugging Face folder to start from
    bool memory_check;         // refuse a run whose planned memory exceeds what the node has
} TrainConfig;

typedef struct {
    char train[CONFIG_STR];    // "synthetic" or shard glob[,glob...]
    int val_sequences;         // held-out sequences per validation pass
    char val[CONFIG_STR];      // "holdout" or shard glob
    bool check_tokenizer;      // shards must come from train.init_from's tokenizer.json
} DataConfig;

typedef struct {
    char dir[CONFIG_STR];      // checkpoint folder
    int64_t every;             // write a checkpoint every N steps (0 = only at the end)
    int keep;                  // keep the newest K checkpoints
    int64_t keep_every;        // and permanently every M-th step (0 = none)
    char resume[CONFIG_STR];   // auto | never | a checkpoint folder
} CheckpointConfig;

typedef struct {
    char dir[CONFIG_STR];      // metrics.jsonl goes here
    int every;                 // print a step line every N steps
    int64_t val_every;         // validation loss every N steps (0 = off)
    int64_t attention_every;   // sparse attention density/recall every N steps (0 = off)
} LogConfig;

typedef struct {
    char model[CONFIG_STR];    // "latest" (newest checkpoint in checkpoint.dir) or a checkpoint / HF folder
    char tasks[CONFIG_STR];    // comma list of perplexity, passkey, niah, ruler
    char lengths[CONFIG_STR];  // comma list of context lengths in tokens
    char depths[CONFIG_STR];   // comma list of needle depths in [0, 1]
    int samples;               // samples per cell (and per perplexity length)
    char text[CONFIG_STR];     // "heldout" (the loader's validation stream) or a text file
    HaystackKind haystack;     // filler | text: what NIAH hides its needle in
    char tokenizer[CONFIG_STR]; // bytes
    char out[CONFIG_STR];      // results.json and the PNG plots go here
    uint64_t seed;             // task generation
} EvalConfig;

// hardware.gpu: the planner's GPU profiles (trainer/plan.c).
typedef enum { GPU_NONE, GPU_A100_40G, GPU_A100_80G, GPU_H100, GPU_H200 } GpuKind;

typedef struct {
    GpuKind gpu;               // none | a100-40g | a100-80g | h100 | h200
    double peak_tflops;        // dense bf16 peak (CPU backend: the FLOP/s MFU is measured against); 0 = the profile's / measured
    double hbm_gib;            // memory per GPU; 0 = the profile's
    double hbm_gbs;            // memory bandwidth GB/s; 0 = the profile's
    double nvlink_gbs;         // GPU to GPU inside a node, GB/s per direction; 0 = the profile's
    double network_gbs;        // per GPU across nodes, GB/s per direction; 0 = the profile's
    int gpus_per_node;         // 0 = the profile's
} HardwareConfig;

typedef struct {
    ModelConfig model;
    AttentionConfig attention;
    ParallelConfig parallel;
    TrainConfig train;
    DataConfig data;
    CheckpointConfig checkpoint;
    LogConfig log;
    EvalConfig eval;
    HardwareConfig hardware;
} Config;

// The eval lists, parsed. config_validate checks them; these parse them
// again for `mtrain eval`. Bad lists fail with one line naming source and key.
#define EVAL_MAX_LIST 32
enum { EVAL_PERPLEXITY = 1, EVAL_PASSKEY = 2, EVAL_NIAH = 4, EVAL_RULER = 8 };
unsigned eval_task_set(const EvalConfig *e, const char *source);            // EVAL_* bits
int eval_length_list(const EvalConfig *e, const char *source, int64_t *out); // [EVAL_MAX_LIST]; returns count
int eval_depth_list(const EvalConfig *e, const char *source, double *out);   // [EVAL_MAX_LIST]; returns count

// Fill every field with its default.
void config_defaults(Config *cfg);
// Read a YAML run file on top of the current values. Errors exit with
// "mtrain: FILE:LINE: key 'section.key': problem (expected ...)".
void config_load_yaml(Config *cfg, const char *path);
// Apply one "section.key=value" override. Errors name the override.
void config_override(Config *cfg, const char *assignment);
// The resolved run config of `mtrain train|config RUN.yaml [overrides]`:
// defaults; when train.init_from names a Hugging Face folder, its config.json
// in place of the model section's defaults; the run file; the overrides
// (argv); then validation. Keys that the run file or an override sets win
// over the folder's config.json (model.rope_theta, model.rope_scaling, ...).
// eval_model (`mtrain eval`, `tasks`): an eval.model folder (not `latest`)
// gives the model section in place of train.init_from. A folder without a
// config.json fails naming its key.
void config_from_args(Config *cfg, const char *path, int argc, char **argv, bool eval_model);
// Cross-field checks (e.g. heads divisible by kv heads) after loading.
void config_validate(const Config *cfg, const char *source);
// The name of an enum value of cfg, as the run file spells it: field points
// into cfg (e.g. &cfg->attention.layout).
const char *config_enum_name(const Config *cfg, const void *field);
// Print the fully resolved config as YAML.
void config_print(const Config *cfg, FILE *out);
// Print docs/CONFIG.md (markdown table of every key).
void config_print_doc(FILE *out);

#endif
