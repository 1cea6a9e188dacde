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

#include "../attention/attention_api.h"
#include "../model/backend.h"
#include "../model/model_config.h"
#include "../model/optimizer.h"

// eval.haystack: what the needle of `niah` hides in.
typedef enum { HAYSTACK_FILLER, HAYSTACK_TEXT } HaystackKind;
// data.packing: how a step's documents become its sequences (data/packing.h).
typedef enum { PACKING_SEQUENTIAL, PACKING_BALANCED, PACKING_PADDED } PackingKind;

// Keys that hold a keyword or a path: the kind (the keywords first, the path
// last), and beside it the path itself (KEY_path, "" for a keyword).
typedef enum { INIT_NONE, INIT_FOLDER } InitFrom;                          // train.init_from
typedef enum { DATA_SYNTHETIC, DATA_SHARDS } DataTrain;                    // data.train
typedef enum { VAL_HOLDOUT, VAL_SHARDS } DataVal;                          // data.val
typedef enum { RESUME_AUTO, RESUME_NEVER, RESUME_PATH } ResumeFrom;        // checkpoint.resume
typedef enum { COMM_NCCL, COMM_MPI } CommKind;                           // parallel.comm
typedef enum { EVAL_MODEL_LATEST, EVAL_MODEL_FOLDER } EvalModel;           // eval.model
typedef enum { TEXT_HELDOUT, TEXT_FILE } EvalText;                         // eval.text
typedef enum { TOKENIZER_MODEL, TOKENIZER_BYTES, TOKENIZER_FILE } EvalTokenizer; // eval.tokenizer

typedef struct {
    int threads;               // OpenMP threads per rank; 0 = the node's CPUs / its ranks
    int dp, cp, cp_inner;      // rank grid (dist/comm.h); 0 = default
    int zero;                  // 1 = AdamW moments sharded over dp x cp (ZeRO-1)
    double bucket_mb;          // gradient all-reduce buckets (MiB; 0 = one all-reduce)
    CommKind comm;             // nccl | mpi: device buffers between ranks (the CUDA backend)
    double timeout_s;          // a collective that takes longer ends the job
} ParallelConfig;

typedef struct {
    BackendKind backend;       // cpu, cuda, auto
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
    RecomputePolicy recompute; // none | selective | full | auto (the plan's pick: plan_build)
    int loss_chunk;            // tokens per fused LM-head + cross-entropy chunk
    GemmChoice gemm_choice;    // timed | heuristic (Backend.gemm_choice)
    DwStream dw_stream;        // auto | on | off (config_dw_stream_on, Backend.dw_stream)
    int mlp_chunk;             // tokens per MLP chunk (model_mlp_chunk_rows); 0 = the MLP whole
    InitFrom init_from;        // none | a Hugging Face folder to start from (init_from_path)
    char init_from_path[CONFIG_STR];
    int max_bad_steps;         // non-finite steps in a row (each skipped) that stop the run
    bool memory_check;         // refuse a run whose planned memory exceeds what the node has
} TrainConfig;

typedef struct {
    DataTrain train;           // synthetic | shards (train_path: glob[,glob...])
    char train_path[CONFIG_STR];
    int val_sequences;         // held-out sequences per validation pass
    DataVal val;               // holdout | shards (val_path: glob[,glob...])
    char val_path[CONFIG_STR];
    bool check_tokenizer;      // shards must come from train.init_from's tokenizer.json
    bool doc_mask;             // a query attends only to keys of its own document
    bool reset_positions;      // RoPE positions restart at 0 at each document start
    PackingKind packing;       // sequential | balanced | padded
    uint64_t content_hash;     // not a key: the loader's hash of the shards' contents (Loader.content_hash), 0 = none
} DataConfig;

typedef struct {
    char dir[CONFIG_STR];      // checkpoint folder
    int64_t every;             // write a checkpoint every N steps (0 = only at the end)
    bool final;                // write one after the last step
    int keep;                  // keep the newest K checkpoints
    int64_t keep_every;        // and permanently every M-th step (0 = none)
    ResumeFrom resume;         // auto | never | a checkpoint folder (resume_path)
    char resume_path[CONFIG_STR];
    bool overwrite;            // resume: never may replace another run's checkpoints in dir
} CheckpointConfig;

typedef struct {
    char dir[CONFIG_STR];      // metrics.jsonl goes here
    int every;                 // print a step line every N steps
    int64_t val_every;         // validation loss every N steps (0 = off)
    int64_t attention_every;   // sparse attention density/recall every N steps (0 = off)
    double min_recall;         // a warning for a layer whose sampled recall is under it (0 = never)
    bool tensorboard;          // also TensorBoard event files in dir (trainer/tensorboard.h)
    bool profile;              // the per-op profile of one step (model/profile.h) into dir/profile.json
} LogConfig;

typedef struct {
    EvalModel model;           // latest (newest checkpoint in checkpoint.dir) | a checkpoint / HF folder (model_path)
    char model_path[CONFIG_STR];
    char tasks[CONFIG_STR];    // comma list of perplexity, passkey, niah, ruler
    char lengths[CONFIG_STR];  // comma list of context lengths in tokens
    char depths[CONFIG_STR];   // comma list of needle depths in [0, 1]
    int samples;               // samples per cell (and per perplexity length)
    int passkey_digits;        // digits of the passkey task's key
    EvalText text;             // heldout (the loader's validation stream) | a text file (text_path)
    char text_path[CONFIG_STR];
    HaystackKind haystack;     // filler | text: what NIAH hides its needle in
    EvalTokenizer tokenizer;   // model | bytes | a tokenizer.json or its folder (tokenizer_path)
    char tokenizer_path[CONFIG_STR];
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

// model.preset: a published Qwen2.5 base model whose shapes stand in for a
// config.json (config.c); PRESET_NONE = the section's own keys.
typedef enum {
    PRESET_NONE, PRESET_QWEN25_0_5B, PRESET_QWEN25_1_5B, PRESET_QWEN25_3B, PRESET_QWEN25_7B, PRESET_QWEN25_14B,
    PRESET_QWEN25_32B, PRESET_QWEN25_72B
} ModelPreset;

typedef struct {
    ModelConfig model;
    ModelPreset model_preset;  // model.preset (beside ModelConfig, which mirrors config.json)
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
// model.preset (no folder's config.json): the preset's shapes in place of
// the model section's defaults, under the run file and the overrides.
void config_from_args(Config *cfg, const char *path, int argc, char **argv, bool eval_model);
// The same for `mtrain plan`, which needs the architecture only: a
// train.init_from folder that is not there is passed over (the preset or the
// run file's model keys give the shapes). Returns where the shapes came from.
const char *config_for_plan(Config *cfg, const char *path, int argc, char **argv);
// Cross-field checks (e.g. heads divisible by kv heads) after loading.
void config_validate(const Config *cfg, const char *source);
// The value of an enum key of cfg as the run file spells it, or of a
// keyword-or-path key its keyword or path: field points into cfg (e.g.
// &cfg->attention.layout, &cfg->eval.text).
const char *config_enum_name(const Config *cfg, const void *field);
// The keys that decide what a run computes, "section.key=value\n" each, in
// schema order: the model, attention, data and train sections but
// model.preset (its shapes are keys of their own) and the keys of how it is
// computed (train.steps, raised to go on; train.backend,
// max_bad_steps, micro_batches, which changes with the grid, loss_chunk,
// recompute; attention.ring, ring_send, layout), then
// "data.content=HEX" when data.content_hash is set (shards re-tokenized
// under the same path are another run). Checkpoints record it as the run's
// fingerprint. Returns the length (truncated at size - 1).
size_t config_run_keys(const Config *cfg, char *out, size_t size);
// Whether the dW GEMMs run on a second stream (train.dw_stream; auto: off).
bool config_dw_stream_on(const Config *cfg);
// Print the fully resolved config as YAML.
void config_print(const Config *cfg, FILE *out);
// Print docs/CONFIG.md (markdown table of every key).
void config_print_doc(FILE *out);

#endif
