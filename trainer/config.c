// config.c: the run configuration. One schema table lists every key (section,
// name, type, default, range, meaning, place in Config); defaults, YAML
// loading (libyaml events, with line numbers), command-line overrides,
// validation, printing and the docs/CONFIG.md reference are all driven by it.
// Every user error is one line on stderr naming the file and line (or the
// override), the key, the problem and what was expected.
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "../dist/util.h"
#include "../model/hf_config.h"
#include "args.h"
#include "commands.h"

// ----------------------------------------------------------------------------
// The schema

// T_PATH: a keyword or a path. The kind (int) is the keyword's index, or the
// number of keywords for a path; the path goes to the field KEY_path.
typedef enum { T_INT, T_INT64, T_UINT64, T_DOUBLE, T_BOOL, T_STRING, T_ENUM, T_PATH } KeyType;

// Range bounds of numbers are inclusive unless flagged open.
enum { MIN_OPEN = 1, MAX_OPEN = 2 };

typedef struct {
    const char *section;
    const char *key;
    size_t offset;          // into Config
    KeyType type;
    const char *def;        // default value, as text
    double min, max;        // numbers only
    int open;               // MIN_OPEN | MAX_OPEN
    const char *const *names; // enums and T_PATH: the names of the C enum's values 0, 1, ..., then NULL
    const char *meaning;
    size_t path_offset;     // T_PATH only: into Config, the path's char[CONFIG_STR]
    const char *path_what;  // T_PATH only: what the path names ("a text file")
} Key;

// Each key names its Config field, so the key and the field cannot drift apart.
#define FIELD(sec, key) #sec, #key, offsetof(Config, sec.key)
#define INT(sec, key, def, lo, hi, doc) {FIELD(sec, key), T_INT, #def, lo, hi, 0, NULL, doc, 0, NULL}
#define INT64(sec, key, def, lo, hi, doc) {FIELD(sec, key), T_INT64, #def, lo, hi, 0, NULL, doc, 0, NULL}
#define UINT64(sec, key, def, doc) {FIELD(sec, key), T_UINT64, #def, 0, 0, 0, NULL, doc, 0, NULL}
#define DOUBLE(sec, key, def, lo, hi, open, doc) {FIELD(sec, key), T_DOUBLE, #def, lo, hi, open, NULL, doc, 0, NULL}
#define BOOL(sec, key, def, doc) {FIELD(sec, key), T_BOOL, #def, 0, 0, 0, NULL, doc, 0, NULL}
#define STRING(sec, key, def, doc) {FIELD(sec, key), T_STRING, def, 0, 0, 0, NULL, doc, 0, NULL}
#define ENUM(sec, key, def, names, doc) {FIELD(sec, key), T_ENUM, def, 0, 0, 0, names, doc, 0, NULL}
#define PATH(sec, key, def, names, what, doc) \
    {FIELD(sec, key), T_PATH, def, 0, 0, 0, names, doc, offsetof(Config, sec.key##_path), what}
#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

// Enum keys are stored as C enums, read and written as int.
#define ENUM_FIELD_IS_INT(sec, key) \
    _Static_assert(sizeof(((Config *)0)->sec.key) == sizeof(int), #sec "." #key " is not int-sized")
_Static_assert(sizeof(((Config *)0)->model_preset) == sizeof(int), "model.preset is not int-sized");
ENUM_FIELD_IS_INT(model, rope_scaling.type);
ENUM_FIELD_IS_INT(attention, type);
ENUM_FIELD_IS_INT(attention, ring);
ENUM_FIELD_IS_INT(attention, ring_send);
ENUM_FIELD_IS_INT(attention, budget);
ENUM_FIELD_IS_INT(attention, layout);
ENUM_FIELD_IS_INT(attention, kernels);
ENUM_FIELD_IS_INT(parallel, comm);
ENUM_FIELD_IS_INT(train, backend);
ENUM_FIELD_IS_INT(train, lr_schedule);
ENUM_FIELD_IS_INT(train, gemm_choice);
ENUM_FIELD_IS_INT(train, dw_stream);
ENUM_FIELD_IS_INT(eval, haystack);
ENUM_FIELD_IS_INT(data, packing);
// Keyword-or-path keys: an int-sized kind, and a path of CONFIG_STR bytes.
#define PATH_FIELDS(sec, key) \
    ENUM_FIELD_IS_INT(sec, key); \
    _Static_assert(sizeof(((Config *)0)->sec.key##_path) == CONFIG_STR, #sec "." #key "_path is not a config string")
PATH_FIELDS(attention, budget_file);
PATH_FIELDS(train, init_from);
PATH_FIELDS(data, train);
PATH_FIELDS(data, val);
PATH_FIELDS(checkpoint, resume);
PATH_FIELDS(eval, model);
PATH_FIELDS(eval, text);
PATH_FIELDS(eval, tokenizer);
ENUM_FIELD_IS_INT(hardware, gpu);

static const Key keys[] = {
    {"model", "preset", offsetof(Config, model_preset), T_ENUM, "none", 0, 0, 0, NAMES("none", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"), "The shapes of a published Qwen2.5 base model (its `config.json`: vocabulary, widths, layers, heads, `rope_theta`, `rms_norm_eps`, `max_position_embeddings`, tied embeddings) in place of the section's defaults when no `train.init_from` folder gives them; keys set beside it win. `mtrain plan` plans from it when the `train.init_from` folder is not there; `train` with an `init_from` folder always takes the folder's `config.json`.", 0, NULL},
    INT(model, vocab_size, 256, 2, 1 << 24, "Vocabulary size (rows of the embedding and the LM head)."),
    INT(model, hidden_size, 64, 1, 65536, "Width of the residual stream."),
    INT(model, intermediate_size, 172, 1, 1 << 20, "Width of the SwiGLU MLP (gate and up projections)."),
    INT(model, num_layers, 2, 1, 1024, "Number of transformer layers (HF `num_hidden_layers`)."),
    INT(model, num_heads, 4, 1, 1024, "Query heads (HF `num_attention_heads`)."),
    INT(model, num_kv_heads, 2, 1, 1024, "Key/value heads (GQA); must divide `num_heads`."),
    INT(model, head_dim, 0, 0, 1024, "Dimension of one head; 0 = `hidden_size / num_heads`. Must be even (RoPE)."),
    DOUBLE(model, rope_theta, 1000000.0, 0, INFINITY, MIN_OPEN, "RoPE base frequency θ."),
    DOUBLE(model, rms_norm_eps, 1e-6, 0, INFINITY, MIN_OPEN, "Epsilon inside RMSNorm."),
    BOOL(model, tie_word_embeddings, true, "The LM head reuses the embedding matrix."),
    DOUBLE(model, init_std, 0.02, 0, 10, 0, "Standard deviation of the random initialisation (HF `initializer_range`)."),
    INT(model, max_position_embeddings, 32768, 1, 1 << 30, "Longest context the model is declared for (written to `config.json`)."),
    ENUM(model, rope_scaling.type, "none", NAMES("none", "yarn"), "RoPE context extension (HF `rope_scaling`, a nested mapping in YAML): `none` = plain RoPE with `rope_theta`; `yarn` = YaRN with the keys below, as transformers computes it."),
    DOUBLE(model, rope_scaling.factor, 1.0, 1, 65536, 0, "YaRN: context extension factor s (low frequencies are divided by s)."),
    INT(model, rope_scaling.original_max_position_embeddings, 0, 0, 1 << 30, "YaRN: the context the model was trained at; 0 = `max_position_embeddings`."),
    DOUBLE(model, rope_scaling.beta_fast, 32.0, 0, INFINITY, MIN_OPEN, "YaRN: dimensions turning more than beta_fast times over the original context keep their frequency."),
    DOUBLE(model, rope_scaling.beta_slow, 1.0, 0, INFINITY, MIN_OPEN, "YaRN: dimensions turning fewer than beta_slow times are fully interpolated; must be below `beta_fast`."),
    DOUBLE(model, rope_scaling.attention_factor, 0.0, 0, INFINITY, 0, "YaRN: multiplies cos and sin; 0 = derived: 0.1·ln(s) + 1 (or the mscale ratio)."),
    DOUBLE(model, rope_scaling.mscale, 0.0, 0, INFINITY, 0, "YaRN: with `mscale_all_dim`, attention factor = m(s, mscale) / m(s, mscale_all_dim), m(s, k) = 0.1·k·ln(s) + 1; 0 = unset."),
    DOUBLE(model, rope_scaling.mscale_all_dim, 0.0, 0, INFINITY, 0, "YaRN: see `mscale`; 0 = unset."),
    BOOL(model, rope_scaling.truncate, true, "YaRN: round the blended band of dimensions outward to whole dimensions (transformers' default)."),

    ENUM(attention, type, "dense", NAMES("dense", "sparse"), "Attention algorithm: `dense` = exact causal flash attention; `sparse` = dynamic vertical-slash sparse attention."),
    INT(attention, block_size, 128, 1, 65536, "Tile size in tokens for queries and keys (and the granularity of the sparse index)."),
    ENUM(attention, ring, "flat", NAMES("flat", "hierarchical"), "Ring schedule over the cp ranks: `flat` = one ring; `hierarchical` = inner rings of `parallel.cp_inner` ranks (one node) inside an outer ring, the outer transfer posted before a whole inner loop."),
    ENUM(attention, ring_send, "full", NAMES("full", "selected"), "Ring: `full` = every K/V chunk travels whole; `selected` = each hop sends only the chunk's blocks that the receiving and later ranks use: their sparse index, or for dense attention the blocks their queries see (causal, and with `data.doc_mask` within their documents); identical results, fewer bytes."),
    INT(attention, last_q, 64, 1, 1 << 20, "Sparse: the last `last_q` queries of the sequence estimate the pattern."),
    DOUBLE(attention, top_p, 0.9, 0, 1, MIN_OPEN, "Sparse, budget `topp`: per head, the fewest vertical (and slash) lines whose estimated softmax mass reaches `top_p`."),
    INT(attention, max_vertical, 4096, 0, 1 << 30, "Sparse, budget `topp`: at most this many vertical lines per head."),
    INT(attention, max_slash, 4096, 0, 1 << 30, "Sparse, budget `topp`: at most this many slash lines per head."),
    INT(attention, sink, 64, 0, 1 << 30, "Sparse: the first `sink` tokens are always attended to (vertical lines)."),
    INT(attention, local, 128, 0, 1 << 30, "Sparse: the nearest `local` diagonals (offsets 0..local-1) are always attended to."),
    ENUM(attention, budget, "topp", NAMES("topp", "fixed"), "Sparse: `topp` selects by cumulative mass (`top_p`); `fixed` takes the top `vertical` / `slash` lines per head."),
    INT(attention, vertical, 1024, 0, 1 << 30, "Sparse, budget `fixed`: vertical lines per head."),
    INT(attention, slash, 1024, 0, 1 << 30, "Sparse, budget `fixed`: slash lines per head."),
    PATH(attention, budget_file, "none", NAMES("none"), "a budget file", "Sparse, budget `fixed`: `none`, or a text file of `layer head vertical slash` lines that overrides the counts per layer and head."),
    ENUM(attention, kernels, "auto", NAMES("auto", "sm80", "sm90"), "Which attention kernels a GPU runs (`train.backend: cuda`), per kind (dense and sparse, forward and backward) and head dim: `auto` = a GPU sweep's measured choice for the GPU's architecture (attention/kernels/attn_choice.h), else the cost model's among the mma.sync kernels (the Hopper kernels run only where a sweep chose them); `sm80` = the mma.sync kernels; `sm90` = the Hopper kernels where a kind has them (the dense forward, head dims 64 and 128; wgmma, TMA), the mma.sync ones elsewhere: a GPU without compute capability 9.0 stops the run with one line."),
    ENUM(attention, layout, "striped", NAMES("contiguous", "zigzag", "striped"), "How a sequence's blocks of `block_size` tokens are spread over context-parallel ranks; the loader hands each rank its tokens in this order."),

    INT(parallel, threads, 0, 0, 4096, "OpenMP (and OpenBLAS) threads of each rank on the CPU backend; 0 = the CPUs of this node divided by the MPI ranks on it (at least 1; all CPUs for one process). A setting that oversubscribes the node gets a warning."),
    INT(parallel, dp, 0, 0, 1 << 20, "Data-parallel groups; 0 = world size / `cp`. `dp` × `cp` must equal the number of ranks."),
    INT(parallel, cp, 0, 0, 1 << 20, "Context-parallel ranks sharing one sequence (the attention ring); 0 = world size / `dp` (all ranks when `dp` is 0 too)."),
    INT(parallel, cp_inner, 0, 0, 1 << 20, "Ranks of one inner ring of the hierarchical schedule (must divide `cp`); 0 = the ranks per node (their greatest common divisor with `cp`)."),
    INT(parallel, zero, 0, 0, 1, "ZeRO stage: 0 = every rank holds the whole AdamW state; 1 = the AdamW moments, and on the CUDA backend the fp32 master weights, are sharded over every rank holding the same parameters, `dp` × `cp` (the gradients are reduce-scattered, each rank updates its share of the parameters, then the compute weights are all-gathered: bf16 on CUDA, the fp32 weights on the CPU). Checkpoints hold the full fp32 weights either way; under 1 each rank writes its shard of the moments (`optimizer.K-of-N.zst`, docs/FORMATS.md), and a checkpoint resumes with either value on any dp × cp."),
    DOUBLE(parallel, bucket_mb, 25.0, 0, 1e6, 0, "Without ZeRO: the gradient all-reduce runs in buckets of at least this many MiB of the gradient arena, each launched during the last micro-batch's backward as soon as its layers' gradients are final (overlapped with the rest of the backward on the CUDA backend's communication stream); 0 = one all-reduce of the whole arena after the backward."),
    ENUM(parallel, comm, "nccl", NAMES("nccl", "mpi"), "How the CUDA backend moves device buffers between ranks (the gradient all-reduce): `nccl` = NCCL communicators beside the MPI ones, one GPU per rank (more ranks than GPUs on a node stops the run with one line); `mpi` = staged through host memory and the MPI communicators, for machines where NCCL cannot run (ranks then share the node's GPUs, rank on the node modulo GPUs). The CPU backend always uses MPI."),
    DOUBLE(parallel, timeout_s, 600.0, 0, 1e9, MIN_OPEN, "A transfer or collective that does not complete within this many seconds ends every rank with a message naming the rank and operation."),

    ENUM(train, backend, "cpu", NAMES("cpu", "cuda", "auto"), "Compute backend: `cpu` (fp32, OpenMP, OpenBLAS); `cuda` (one GPU per rank: bf16 activations and compute weights, fp32 master weights, gradients and AdamW moments; cuBLASLt matmuls, flash attention; data parallel over ranks with `parallel.dp`, gradients summed per `parallel.comm`; a `parallel.cp` ring with dense or sparse attention (the sparse pattern estimated over the ring, as on the CPU), its transfers per `parallel.comm`); `auto` = `cuda` when this build has the CUDA backend and a GPU is visible, else `cpu`. `cuda` in a build without it or with no GPU visible stops the run with one line saying which. Also picks the backend of `mtrain score` and `mtrain eval`."),
    INT64(train, steps, 100, 0, 1e12, "Total optimizer steps."),
    INT(train, seq_len, 256, 2, 1 << 30, "Tokens per training sequence."),
    INT(train, micro_batches, 1, 1, 1 << 20, "Sequences per optimizer step (gradient accumulation)."),
    DOUBLE(train, lr, 1e-3, 0, 10, 0, "Peak learning rate: the lr of the last warmup step and of the first step after warmup (of step 1 when `warmup_steps` is 0)."),
    DOUBLE(train, min_lr, 0.0, 0, 10, 0, "Learning rate the decay approaches: cosine and linear reach it one step after the last step, so the last step still learns (as the common schedulers do); at most `lr`."),
    INT64(train, warmup_steps, 0, 0, 1e12, "Steps of linear warmup: step s <= `warmup_steps` uses `lr` * s / `warmup_steps` (no step at lr 0); more than `steps` trains with `steps` (a note says so)."),
    ENUM(train, lr_schedule, "cosine", NAMES("constant", "cosine", "linear"), "After warmup, from `lr` at step `warmup_steps` + 1: `constant`, or `cosine` / `linear` decay with progress (step - `warmup_steps` - 1) / (`steps` - `warmup_steps`) towards `min_lr`."),
    DOUBLE(train, weight_decay, 0.1, 0, 10, 0, "AdamW decoupled weight decay."),
    DOUBLE(train, beta1, 0.9, 0, 1, MAX_OPEN, "AdamW first-moment decay."),
    DOUBLE(train, beta2, 0.95, 0, 1, MAX_OPEN, "AdamW second-moment decay."),
    DOUBLE(train, eps, 1e-8, 0, INFINITY, MIN_OPEN, "AdamW epsilon."),
    DOUBLE(train, grad_clip, 1.0, 0, 1e9, 0, "Clip the global gradient norm to this value; 0 = off."),
    UINT64(train, seed, 1234, "Seed of the initialisation and of the data order."),
    ENUM(train, recompute, "auto", NAMES("none", "selective", "full", "auto"), "What the forward keeps for the backward: `none` = every layer's activations (fastest, most memory); `selective` = each layer's input, attention output and its lse, the backward recomputing the norms, projections, RoPE and the MLP but not attention; `full` = each layer's input only, the backward recomputing the whole layer, attention included (least memory); `auto` = the first of none, selective, full whose planned memory (`mtrain plan`, which prints each) fits the GPU of the hardware section (usable HBM) or, on the CPU backend, the node's MemAvailable for its ranks; on a GPU without a profile (`hardware.gpu: none`) `none`. The same gradients bit for bit on the CPU backend under every policy."),
    INT(train, loss_chunk, 1024, 1, 1 << 30, "Tokens per chunk of the fused LM head + cross entropy."),
    ENUM(train, gemm_choice, "timed", NAMES("timed", "heuristic"), "How each GEMM problem (shape, transposes, output type, bias, adding to its output or not) gets its cuBLASLt algorithm on the CUDA backend: `timed` = at its first use (in the run's first step) up to 8 of the heuristic's answers (split-K among them where it offers it, its parts added in fp32) each run once, then twice between two events on the stream, the fastest kept for the run; one line per problem (`gemm choice: OP m M n N k K: answer I of A (algo, tile, split-K) ms`, m n k as cuBLASLt is asked: forward OC tokens IC, dinp IC tokens OC, dweight IC OC tokens) and after the first step their cost (problems, answers, launches, seconds). Under the CPU execution model of CUDA (build/sim/mtrain), whose timings are the CPU's, `timed` is `heuristic` unless the test hook `MTRAIN_TEST_GEMM_ANSWER=N|fastest` asks for the timing, keeping the N-th answer or the fastest. `heuristic` = the heuristic's first answer, untimed, nothing printed. Every answer meets the same accuracy bounds. The CPU backend has one GEMM and ignores the key."),
    ENUM(train, dw_stream, "auto", NAMES("auto", "on", "off"), "Where the backward's weight-gradient (dW) GEMMs and the fused q, k, v bias gradient run on the CUDA backend: `on` = on a second stream, each after the main stream's work before it, overlapping the input-gradient (dX) GEMM beside it and what follows until the graph rewrites a dW's inputs or needs the layer's gradients whole (an event joins it into the main stream after each MLP chunk, before the input norm's backward and after each LM-head chunk), with a second cuBLASLt workspace of 32 MiB; the same GEMMs with the same algorithms, so the same bits as `off`. `off` = everything on one stream. `auto` = `off` until a GPU measures that the second stream pays (the GPU check's `dw_stream` stage). The CPU backend ignores the key."),
    INT(train, mlp_chunk, 16384, 0, 1 << 30, "Tokens per chunk of the MLP: its gate, up and SiLU product (and their gradients) exist for this many tokens only, shared by the layers, and the backward recomputes them chunk by chunk from the saved norm output. Used under `recompute` selective or full (whose backward recomputes the MLP anyway: no extra work), and without it when `seq_len` per rank is above this (one more GEMM per layer in the backward); 0 = the MLP whole, its [tokens, intermediate_size] buffers kept per layer. The same results on the CPU backend when one chunk covers the sequence."),
    PATH(train, init_from, "none", NAMES("none"), "a Hugging Face folder", "`none` (random initialisation) or a Hugging Face folder (`config.json` + `model.safetensors`) to start from."),
    INT(train, max_bad_steps, 5, 1, 1 << 30, "A step whose loss or gradient norm is not finite on any rank is skipped on every rank (weights and AdamW state unchanged, its sequences consumed) and logged; this many in a row stop the run (exit 1, checkpoints kept). For testing, `MTRAIN_TEST_NAN_STEP=N[,RANK[,COUNT]]` in the environment makes the loss and gradient of COUNT steps from step N (default 1) NaN on world rank RANK (default 0)."),
    BOOL(train, memory_check, true, "Before allocating, compare the planned memory of the run (as `mtrain plan` prints it; CPU backend: the host memory of every rank on this node) with what the node has (`MemAvailable`) and refuse the run with the breakdown when it does not fit; `false` starts anyway. The CUDA backend prints its GPU's memory plan at start instead and checks no host memory."),

    PATH(data, train, "synthetic", NAMES("synthetic"), "comma-separated shard globs", "Training data: a shard glob or comma-separated globs (`data/*.shard,extra/a.shard`), or `synthetic` for the built-in generator. Documents are shuffled per epoch from `train.seed` and packed into sequences (see docs/ARCHITECTURE.md, section Data, and docs/DECISIONS.md)."),
    INT(data, val_sequences, 4, 1, 1 << 20, "Held-out sequences in each validation pass."),
    PATH(data, val, "holdout", NAMES("holdout"), "comma-separated shard globs", "Validation data: `holdout` = documents of `data.train` chosen from `train.seed`, as many as `val_sequences` sequences need, never trained on (only when validation runs, `log.val_every` > 0: otherwise nothing is held out); or a shard glob (comma-separated globs allowed). Synthetic data always uses held-out sequences."),
    BOOL(data, check_tokenizer, true, "Stop when a shard was made by another tokenizer than the `tokenizer.json` of `train.init_from` (as `mtrain shard info` shows: `bytes` or the XXH64 of a tokenizer.json); `false` trains anyway. Shards of format version 1 (unknown tokenizer) are not checked."),
    BOOL(data, doc_mask, false, "Document-aware attention: a query attends only to earlier keys of its own document (the packed sequence's document starts), in every attention kernel (CPU and CUDA, dense and sparse); `false` lets every token attend across the documents packed into its sequence, as pretraining mixes do. Works with any `parallel.cp` (every cp rank knows the document starts; ring steps whose chunk holds no key of the rank's documents do no attention work, and with `attention.ring_send: selected` a chunk is not sent when no later holder on its ring path needs it either). Sparse attention estimates from same-document scores only, its index holds for each query block only blocks and columns of the block's documents plus each document's first `attention.sink` tokens, and `attention_density` is the share of the causal pairs of one document."),
    BOOL(data, reset_positions, false, "RoPE positions restart at 0 at each document start of a packed sequence (a token continuing a document from the previous sequence counts from the sequence start), so every document is seen at the positions it would have alone; masks and the ring layouts keep the sequence's global positions. With `doc_mask: true` this changes nothing but rounding (RoPE scores depend only on the distance between query and key); with `doc_mask: false` tokens then attend across documents at distances that mix the two numberings. Also `mtrain score --docs`."),
    ENUM(data, packing, "sequential", NAMES("sequential", "balanced", "padded"), "How a step's training sequences are formed. `sequential`: consecutive windows of the shuffled document stream (docs/ARCHITECTURE.md, Data). `balanced`: the same windows of the step (dp ranks x micro-batches sequences) cut into their documents, which are dealt longest first into the step's sequences so that each holds about the same attention work (the sum of L(L+1)/2 over its documents, what `doc_mask: true` computes), splitting a document only where no sequence has room for it; every token of the step is used once, the data cursor and resume are as exact as with `sequential`. Each rank reads the whole step's sequences. `padded`: every sequence starts a document (or continues one longer than `train.seq_len` + 1 tokens, cut into pieces of `seq_len` targets) and holds no other; the positions after it are padding with no target (the loss and its gradient are the mean over the step's targets, padding excluded), so a task sample (`mtrain tasks`) of at most `seq_len` + 1 tokens is always seen whole. Validation sequences stay sequential."),

    STRING(checkpoint, dir, "checkpoints", "Folder of the checkpoints (`step_XXXXXXXX/`, `latest`)."),
    INT64(checkpoint, every, 0, 0, 1e12, "Write a checkpoint every N steps; 0 = only after the last step."),
    BOOL(checkpoint, final, true, "Write a checkpoint after the last step; `false`: none then (a run kept only for its measurements; `every` and a stop by signal still write theirs)."),
    INT(checkpoint, keep, 3, 1, 1 << 20, "Keep the run's newest K checkpoints (its older ones are removed; other runs' checkpoints are never counted nor removed)."),
    INT64(checkpoint, keep_every, 0, 0, 1e12, "Also keep every checkpoint whose step is a multiple of M, for good; 0 = none."),
    PATH(checkpoint, resume, "auto", NAMES("auto", "never"), "a checkpoint folder", "`auto`: continue from the newest complete checkpoint in `dir`, if any, of the run that wrote last (`latest`) (refused when it belongs to another configuration: its fingerprint, the keys that decide what a run computes, differs); `never`: start fresh, a new run; or a checkpoint folder (other than the one `auto` takes: a roll-back, a new run branched off it)."),
    BOOL(checkpoint, overwrite, false, "With `resume: never`, a `dir` holding another run's checkpoints is refused; `true` removes them and starts fresh. With `resume` a folder other than the latest checkpoint (a roll-back), a `dir` holding step folders the new run could write (steps after the folder's, up to `train.steps`) is refused; `true` replaces them as it writes."),

    STRING(log, dir, "logs", "Folder of `metrics.jsonl` (and the TensorBoard event files, `tensorboard`)."),
    INT(log, every, 1, 1, 1e9, "Print a step line every N steps."),
    INT64(log, val_every, 0, 0, 1e12, "Validation loss before training and every N steps (and after the last); 0 = off."),
    INT64(log, attention_every, 0, 0, 1e12, "Sparse attention: every N steps, per layer the density (computed / causal score elements) and the recall in the step line (`recall`, `est`: means over layers) and `metrics.jsonl` (`attention_density`, `attention_recall`, `attention_estimation_recall`): `recall` is the share of each query's softmax mass that the pattern holds, measured against dense attention on 64 query rows spread over the sequence away from the estimation rows; `est` the same on the estimation rows themselves, which chose the pattern; 0 = off."),
    DOUBLE(log, min_recall, 0, 0, 1, 0, "Sparse attention, with `attention_every`: a warning names each layer whose `recall` falls under this share and the budget setting to raise (`attention.top_p`, `max_vertical` / `max_slash`, or the fixed `vertical` / `slash`); 0 = never."),
    BOOL(log, profile, false, "The per-op profile of one step, the run's second (its first when it runs one): each op timed on the device (CUDA: events on the stream; CPU: the wall clock) and, under the CPU execution model of CUDA, its device launches counted, by category (GEMM by shape, attention, norms, RoPE, SwiGLU, cross entropy, embedding, optimizer, communication, memory, other) and phase (forward, recompute, backward, loss, update), with idle = the step's wall time less the ops'. Rank 0 prints the table (calls, launches, ms, % of the step, TFLOP/s or GB/s of the work the shapes imply) and writes it as JSON to `profile.json` in `dir`. The profiled step waits for nothing more, but its time includes the marks' cost."),
    BOOL(log, tensorboard, false, "Also write the step metrics as TensorBoard scalars (`train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `train/mfu`, `val/loss`; with sparse attention statistics `attention/density`, `attention/recall`, `attention/estimation_recall` (means over layers) and on a ring `ring/mib`) to `events.out.tfevents.*` in `dir`, one file per run start (`tensorboard --logdir DIR`)."),

    PATH(eval, model, "latest", NAMES("latest"), "a checkpoint or Hugging Face folder", "Model to evaluate: `latest` = the newest complete checkpoint in `checkpoint.dir`, or a checkpoint / Hugging Face folder (its `config.json` must match the `model` section)."),
    STRING(eval, tasks, "perplexity,passkey,niah,ruler", "Comma-separated tasks: `perplexity` (by length, on `eval.text`), `passkey`, `niah` (needle in a haystack), `ruler` (single key, multi-key, multi-value, variable tracking)."),
    STRING(eval, lengths, "512,1024", "Comma-separated context lengths in tokens (each >= 2; a task's prompt is exactly this long, its answer follows)."),
    STRING(eval, depths, "0,0.25,0.5,0.75,1", "Comma-separated needle depths in [0, 1]: where in the haystack the asked needle sits (0 = start, 1 = end)."),
    INT(eval, samples, 4, 1, 1 << 20, "Samples per (task, length, depth) cell, and sequences per perplexity length."),
    INT(eval, passkey_digits, 5, 1, 9, "Digits of the `passkey` task's key (its first digit 1 to 9): 5 = 10000 to 99999, chance of a right guess 1 in 90000; 1 = 1 to 9, chance 1 in 9."),
    PATH(eval, text, "heldout", NAMES("heldout"), "a text file", "Text for perplexity (and for `haystack: text`): `heldout` = the loader's validation stream of `data.train` / `data.val`, or a text file tokenized with `eval.tokenizer`."),
    ENUM(eval, haystack, "filler", NAMES("filler", "text"), "What the `niah` needle hides in: built-in filler sentences, or `eval.text` (cycled when shorter than the haystack)."),
    PATH(eval, tokenizer, "model", NAMES("model", "bytes"), "a tokenizer.json or a folder holding one", "Tokenizer of the task prompts and of a text file: `model` = the evaluated folder's `tokenizer.json` when it has one, else `bytes`; `bytes` (ids are bytes, docs/FORMATS.md); a Hugging Face `tokenizer.json`, or a folder holding it. Perplexity on `heldout` needs none."),
    STRING(eval, out, "eval", "Output folder: `results.json`, `perplexity.png`, `heatmap_TASK.png`."),
    UINT64(eval, seed, 1234, "Seed of the task generators (keys, values, filler start, distractor depths)."),

    ENUM(hardware, gpu, "none", NAMES("none", "a100-40g", "a100-80g", "h100", "h200"), "GPU profile of `mtrain plan` (`--gpu` overrides it): `none` = plan the CPU backend (unless `peak_tflops` and `hbm_gib` describe a GPU); a name = the datasheet figures of that GPU (SXM, trainer/plan.c). The keys below replace single figures."),
    DOUBLE(hardware, peak_tflops, 0.0, 0, 1e6, 0, "Dense bf16 peak TFLOP/s of one GPU; 0 = the profile's. On the CPU backend: the TFLOP/s of one rank that MFU (step line, metrics.jsonl) is measured against; 0 = the best 1024^3 sgemm over 0.2 s measured at start. A step that runs faster raises it to its rate (MFU never above 100%)."),
    DOUBLE(hardware, hbm_gib, 0.0, 0, 1e6, 0, "Memory of one GPU in GiB; 0 = the profile's."),
    DOUBLE(hardware, hbm_gbs, 0.0, 0, 1e6, 0, "Memory bandwidth of one GPU, GB/s; 0 = the profile's."),
    DOUBLE(hardware, nvlink_gbs, 0.0, 0, 1e6, 0, "GPU-to-GPU bandwidth inside a node (NVLink), GB/s per direction; 0 = the profile's."),
    DOUBLE(hardware, network_gbs, 0.0, 0, 1e6, 0, "Bandwidth of one GPU across nodes (its share of the node's NICs), GB/s per direction; 0 = the profile's."),
    INT(hardware, gpus_per_node, 0, 0, 1024, "GPUs per node (the inner ring when `parallel.cp_inner` is 0); 0 = the profile's."),
};
#define NUM_KEYS ((int)(sizeof(keys) / sizeof(keys[0])))

typedef struct {
    const char *name;
    const char *meaning;
} Section;

// In printing order.
static const Section sections[] = {
    {"model", "The Qwen2 architecture."},
    {"attention", "How attention is computed."},
    {"parallel", "CPU threads, and the grid of MPI ranks (world = dp × cp, cp = outer × inner; see docs/ARCHITECTURE.md)."},
    {"train", "Optimisation: backend, schedule, AdamW, batch shape."},
    {"data", "Where the training tokens come from."},
    {"checkpoint", "Where checkpoints go."},
    {"log", "Progress lines and metrics."},
    {"eval", "`mtrain eval`: perplexity by length, passkey / needle-in-a-haystack grids, RULER-style tasks (see docs/USAGE.md, Evaluation)."},
    {"hardware", "The machine `mtrain plan` plans for (see docs/PERFORMANCE.md, Planner against measured memory), and the peak MFU is measured against."},
};
#define NUM_SECTIONS ((int)(sizeof(sections) / sizeof(sections[0])))

// ----------------------------------------------------------------------------
// Values: parse text, check ranges, store into and fetch from Config

typedef struct {
    int64_t i;      // T_INT, T_INT64, T_ENUM and T_PATH (the value's index, -1 = not allowed)
    uint64_t u;     // T_UINT64
    double d;       // T_DOUBLE
    bool b;         // T_BOOL
    const char *s;  // T_STRING, and T_PATH's path ("" for a keyword)
} Value;

// Shortest decimal text that reads back as exactly x, always with a '.' so
// that YAML readers see a float ("1.0", "1.0e-08").
static void format_double(double x, char *buf, size_t size) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    size_t len = strlen(buf);
    if (strpbrk(buf, ".n") || len + 3 > size) return;  // has a point already, or is nan/inf
    char *e = strchr(buf, 'e');
    size_t at = e ? (size_t)(e - buf) : len;
    memmove(buf + at + 2, buf + at, len - at + 1);
    memcpy(buf + at, ".0", 2);
}

// A number as it appears in a range ("1048576", "0.5").
static void format_bound(double x, char *buf, size_t size) {
    if (x == floor(x) && fabs(x) < 1e15) snprintf(buf, size, "%.0f", x);
    else format_double(x, buf, size);
}

// The set of accepted values, e.g. "[1, 65536]", "> 0", "[0, 1)", "flat, hierarchical".
static void describe_range(const Key *k, char *buf, size_t size) {
    char lo[40], hi[40];
    format_bound(k->min, lo, sizeof(lo));
    format_bound(k->max, hi, sizeof(hi));
    switch (k->type) {
    case T_INT: case T_INT64:
        snprintf(buf, size, "[%s, %s]", lo, hi);
        break;
    case T_UINT64:
        snprintf(buf, size, "[0, %llu]", (unsigned long long)UINT64_MAX);
        break;
    case T_DOUBLE:
        if (isinf(k->max)) snprintf(buf, size, "%s %s", k->open & MIN_OPEN ? ">" : ">=", lo);
        else snprintf(buf, size, "%c%s, %s%c", k->open & MIN_OPEN ? '(' : '[', lo, hi, k->open & MAX_OPEN ? ')' : ']');
        break;
    case T_BOOL:
        snprintf(buf, size, "true, false");
        break;
    case T_STRING:
        snprintf(buf, size, "1 to %d bytes", CONFIG_STR - 1);
        break;
    case T_ENUM: case T_PATH: {
        size_t n = 0;
        buf[0] = 0;
        for (int i = 0; k->names[i] && n < size; i++)
            n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", k->names[i]);
        if (k->type == T_PATH && n < size)
            snprintf(buf + n, size - n, ", or %s: 1 to %d bytes", k->path_what, CONFIG_STR - 1);
        break;
    }
    }
}

// What a value must be, for error messages: "an integer in [1, 65536]".
static void describe_expected(const Key *k, char *buf, size_t size) {
    char range[200];
    describe_range(k, range, sizeof(range));
    switch (k->type) {
    case T_INT: case T_INT64: case T_UINT64: snprintf(buf, size, "an integer in %s", range); break;
    case T_DOUBLE:
        snprintf(buf, size, "a number %s%s", isinf(k->max) ? "" : "in ", range);
        break;
    case T_BOOL: snprintf(buf, size, "true or false"); break;
    case T_STRING: snprintf(buf, size, "a string of %s", range); break;
    case T_ENUM: snprintf(buf, size, "one of %s", range); break;
    case T_PATH: snprintf(buf, size, "%s", range); break;
    }
}

static const char *type_name(KeyType type) {
    switch (type) {
    case T_INT: return "integer";
    case T_INT64: return "integer (64-bit)";
    case T_UINT64: return "unsigned 64-bit integer";
    case T_DOUBLE: return "number";
    case T_BOOL: return "bool";
    case T_STRING: return "string";
    case T_ENUM: return "enum";
    case T_PATH: return "keyword or path";
    }
    return "?";
}

// The index of text among the enum's names, or -1.
static int enum_index(const Key *k, const char *text) {
    for (int i = 0; k->names[i]; i++)
        if (!strcmp(k->names[i], text)) return i;
    return -1;
}

// The name of enum value `index`, or NULL when there is none.
static const char *enum_name(const Key *k, int64_t index) {
    for (int64_t i = 0; k->names[i]; i++)
        if (i == index) return k->names[i];
    return NULL;
}

// The kind of a T_PATH key's path: the number of its keywords.
static int64_t path_kind(const Key *k) {
    int64_t n = 0;
    while (k->names[n]) n++;
    return n;
}

// A string of 1 to CONFIG_STR - 1 bytes.
static bool string_fits(const char *s) {
    return s[0] != 0 && strlen(s) < CONFIG_STR;
}

// Quote a user-supplied value for a one-line message: control characters
// become '?', and long values are cut.
static void quote_for_message(const char *text, char *buf, size_t size) {
    size_t n = 0, limit = size < 68 ? size : 68;
    buf[n++] = '\'';
    for (const char *c = text; *c && n + 5 < limit; c++) buf[n++] = iscntrl((unsigned char)*c) ? '?' : *c;
    if (strlen(text) + 5 >= limit) { buf[n++] = '.'; buf[n++] = '.'; buf[n++] = '.'; }
    buf[n++] = '\'';
    buf[n] = 0;
}

// Is v inside the key's range (or allowed set)?
static bool in_range(const Key *k, const Value *v) {
    switch (k->type) {
    case T_INT: case T_INT64:
        return (double)v->i >= k->min && (double)v->i <= k->max;
    case T_DOUBLE: {
        bool above_min = k->open & MIN_OPEN ? v->d > k->min : v->d >= k->min;
        bool below_max = k->open & MAX_OPEN ? v->d < k->max : v->d <= k->max;
        return isfinite(v->d) && above_min && below_max;
    }
    case T_STRING: return string_fits(v->s);
    case T_ENUM: return enum_name(k, v->i) != NULL;
    case T_PATH: return enum_name(k, v->i) != NULL || (v->i == path_kind(k) && string_fits(v->s));
    case T_UINT64: case T_BOOL: return true;
    }
    return false;
}

// Parse text as the key's type. On failure write the problem ("'abc' is not
// an integer") into why and return false. Ranges are checked separately.
static bool parse_value(const Key *k, const char *text, Value *v, char *why, size_t why_size) {
    char quoted[80];
    quote_for_message(text, quoted, sizeof(quoted));
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case T_INT: case T_INT64:
        v->i = strtoll(text, &end, 10);
        if (!isspace((unsigned char)text[0]) && end != text && *end == 0 && errno != ERANGE) return true;
        snprintf(why, why_size, "%s is not an integer", quoted);
        return false;
    case T_UINT64:
        v->u = strtoull(text, &end, 10);
        if (isdigit((unsigned char)text[0]) && *end == 0 && errno != ERANGE) return true;
        snprintf(why, why_size, "%s is not an unsigned integer", quoted);
        return false;
    case T_DOUBLE:
        v->d = strtod(text, &end);
        if (!isspace((unsigned char)text[0]) && end != text && *end == 0 && isfinite(v->d)) return true;
        snprintf(why, why_size, "%s is not a number", quoted);
        return false;
    case T_BOOL:
        v->b = !strcmp(text, "true");
        if (v->b || !strcmp(text, "false")) return true;
        snprintf(why, why_size, "%s is not a bool", quoted);
        return false;
    case T_STRING:
        v->s = text;
        return true;
    case T_ENUM:
        v->i = enum_index(k, text);
        return true;
    case T_PATH:
        v->i = enum_index(k, text);
        v->s = v->i < 0 ? text : "";
        if (v->i < 0) v->i = path_kind(k);
        return true;
    }
    return false;
}

static void store(const Key *k, Config *cfg, const Value *v) {
    void *p = (char *)cfg + k->offset;
    switch (k->type) {
    case T_INT: *(int *)p = (int)v->i; break;
    case T_INT64: *(int64_t *)p = v->i; break;
    case T_UINT64: *(uint64_t *)p = v->u; break;
    case T_DOUBLE: *(double *)p = v->d; break;
    case T_BOOL: *(bool *)p = v->b; break;
    case T_STRING: snprintf((char *)p, CONFIG_STR, "%s", v->s); break;
    case T_ENUM: *(int *)p = (int)v->i; break;
    case T_PATH:
        *(int *)p = (int)v->i;
        snprintf((char *)cfg + k->path_offset, CONFIG_STR, "%s", v->s);
        break;
    }
}

static Value fetch(const Key *k, const Config *cfg) {
    const void *p = (const char *)cfg + k->offset;
    Value v = {0};
    switch (k->type) {
    case T_INT: case T_ENUM: v.i = *(const int *)p; break;
    case T_INT64: v.i = *(const int64_t *)p; break;
    case T_UINT64: v.u = *(const uint64_t *)p; break;
    case T_DOUBLE: v.d = *(const double *)p; break;
    case T_BOOL: v.b = *(const bool *)p; break;
    case T_STRING: v.s = (const char *)p; break;
    case T_PATH:
        v.i = *(const int *)p;
        v.s = (const char *)cfg + k->path_offset;
        break;
    }
    return v;
}

// A string value as YAML: plain when that reads back as the same string,
// double-quoted (with escapes) otherwise.
static void print_yaml_string(const char *s, FILE *out) {
    static const char *reserved[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"};
    bool plain = isalpha((unsigned char)s[0]) || s[0] == '/' || s[0] == '_';
    for (const char *c = s; *c && plain; c++)
        plain = isalnum((unsigned char)*c) || strchr("_./-", *c);
    for (size_t i = 0; plain && i < sizeof(reserved) / sizeof(reserved[0]); i++)
        plain = strcasecmp(s, reserved[i]) != 0;
    if (plain) { fputs(s, out); return; }
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
        else if (*c == '\n') fputs("\\n", out);
        else if (*c == '\t') fputs("\\t", out);
        else if (*c < 0x20 || *c == 0x7f) fprintf(out, "\\x%02x", *c);
        else fputc(*c, out);
    }
    fputc('"', out);
}

// The value as YAML text (strings unquoted; print_yaml_string quotes them).
static void format_value(const Key *k, const Value *v, char *buf, size_t size) {
    switch (k->type) {
    case T_INT: case T_INT64: snprintf(buf, size, "%lld", (long long)v->i); break;
    case T_UINT64: snprintf(buf, size, "%llu", (unsigned long long)v->u); break;
    case T_DOUBLE: format_double(v->d, buf, size); break;
    case T_BOOL: snprintf(buf, size, "%s", v->b ? "true" : "false"); break;
    case T_STRING: snprintf(buf, size, "%s", v->s); break;
    case T_ENUM: snprintf(buf, size, "%s", enum_name(k, v->i) ? enum_name(k, v->i) : "?"); break;
    case T_PATH: snprintf(buf, size, "%s", enum_name(k, v->i) ? enum_name(k, v->i) : v->s); break;
    }
}

// Parse, check and store one value; `where` is "FILE:LINE" or "override '...'".
static void set_key(Config *cfg, const Key *k, const char *text, const char *where) {
    char why[200], expected[300];
    Value v;
    describe_expected(k, expected, sizeof(expected));
    if (!parse_value(k, text, &v, why, sizeof(why)))
        fail("%s: %s.%s: %s (expected %s)", where, k->section, k->key, why, expected);
    if (!in_range(k, &v)) {
        char quoted[80];
        quote_for_message(text, quoted, sizeof(quoted));
        bool text_key = k->type == T_STRING || k->type == T_PATH;
        const char *problem = k->type == T_ENUM ? "is not allowed"
                            : text_key && !text[0] ? "is empty"
                            : text_key ? "is too long" : "is out of range";
        fail("%s: %s.%s: %s %s (expected %s)", where, k->section, k->key, quoted, problem, expected);
    }
    store(k, cfg, &v);
}

// ----------------------------------------------------------------------------
// Names: lookup and "did you mean"

static int find_section(const char *name) {
    for (int s = 0; s < NUM_SECTIONS; s++)
        if (!strcmp(sections[s].name, name)) return s;
    return -1;
}

static const Key *find_key(const char *section, const char *key) {
    for (int i = 0; i < NUM_KEYS; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].key, key)) return &keys[i];
    return NULL;
}

// Levenshtein distance; b is a schema name (short), a may be anything.
static int edit_distance(const char *a, const char *b) {
    int nb = (int)strlen(b), row[64];
    if (nb >= 64) return 1 << 20;
    for (int j = 0; j <= nb; j++) row[j] = j;
    for (int i = 1; a[i - 1]; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= nb; j++) {
            int up = row[j];
            int sub = diag + (a[i - 1] != b[j - 1]);
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[nb];
}

// Close enough to be a typo of the candidate?
static bool is_near(const char *typed, int distance) {
    int len = (int)strlen(typed);
    return distance <= (len + 2) / 3;
}

static void fail_unknown_section(const char *where, const char *name) {
    int best = -1, best_d = 1 << 20;
    for (int s = 0; s < NUM_SECTIONS; s++) {
        int d = edit_distance(name, sections[s].name);
        if (d < best_d) { best_d = d; best = s; }
    }
    char quoted[80];
    quote_for_message(name, quoted, sizeof(quoted));
    if (is_near(name, best_d))
        fail("%s: unknown section %s (did you mean '%s'?)", where, quoted, sections[best].name);
    char list[256];
    size_t n = 0;
    for (int s = 0; s < NUM_SECTIONS; s++)
        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", s ? ", " : "", sections[s].name);
    fail("%s: unknown section %s (expected one of %s)", where, quoted, list);
}

// Names users bring from elsewhere (Hugging Face config.json, other trainers)
// and the key that means the same here; looked up whatever section they are in.
static const struct { const char *name, *section, *key; } key_aliases[] = {
    {"num_hidden_layers", "model", "num_layers"},
    {"num_attention_heads", "model", "num_heads"},
    {"num_key_value_heads", "model", "num_kv_heads"},
    {"initializer_range", "model", "init_std"},
    {"rope_scaling", "model", "rope_scaling.type"},
    {"batch_size", "train", "micro_batches"},
    {"gradient_accumulation_steps", "train", "micro_batches"},
    {"learning_rate", "train", "lr"},
    {"max_steps", "train", "steps"},
    {"max_grad_norm", "train", "grad_clip"},
    {"save_every", "checkpoint", "every"},
    {"save_steps", "checkpoint", "every"},
    {"eval_every", "log", "val_every"},
};

// Keys this trainer had before, the key that replaced each and its values for the old ones.
static const struct { const char *section, *name, *key, *values; } renamed_keys[] = {
    {"train", "checkpoint_activations", "train.recompute", "true = full, false = none"},
};

// The nearest key by edit distance, in `section` only (same_section) or in
// the others; *distance gets its distance.
static const Key *nearest_key(const char *section, const char *key, bool same_section, int *distance) {
    const Key *best = NULL;
    *distance = 1 << 20;
    for (int i = 0; i < NUM_KEYS; i++) {
        if ((strcmp(section, keys[i].section) == 0) != same_section) continue;
        int d = edit_distance(key, keys[i].key);
        if (d < *distance) { *distance = d; best = &keys[i]; }
    }
    return best;
}

// Unknown key in a known section: suggest what it is called here (a known
// alias), else the nearest key of the same section, else of another section.
static void fail_unknown_key(const char *where, const char *section, const char *key) {
    char full[CONFIG_STR + 80], quoted[80];
    snprintf(full, sizeof(full), "%s.%s", section, key);
    quote_for_message(full, quoted, sizeof(quoted));
    for (size_t i = 0; i < sizeof(key_aliases) / sizeof(key_aliases[0]); i++)
        if (!strcmp(key, key_aliases[i].name))
            fail("%s: unknown key %s (did you mean '%s.%s'?)", where, quoted, key_aliases[i].section,
                 key_aliases[i].key);
    for (size_t i = 0; i < sizeof(renamed_keys) / sizeof(renamed_keys[0]); i++)
        if (!strcmp(section, renamed_keys[i].section) && !strcmp(key, renamed_keys[i].name))
            fail("%s: %s is now '%s' (%s)", where, quoted, renamed_keys[i].key, renamed_keys[i].values);
    int d;
    const Key *best = nearest_key(section, key, true, &d);
    if (!best || !is_near(key, d)) best = nearest_key(section, key, false, &d);
    if (best && is_near(key, d))
        fail("%s: unknown key %s (did you mean '%s.%s'?)", where, quoted, best->section, best->key);
    char list[1024];
    size_t n = 0;
    list[0] = 0;
    for (int i = 0; i < NUM_KEYS; i++)
        if (!strcmp(keys[i].section, section))
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", n ? ", " : "", keys[i].key);
    fail("%s: unknown key %s (expected one of the keys of '%s': %s)", where, quoted, section, list);
}

// ----------------------------------------------------------------------------
// Defaults, YAML, overrides

void config_defaults(Config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    for (int i = 0; i < NUM_KEYS; i++) set_key(cfg, &keys[i], keys[i].def, "built-in default");
}

typedef struct {
    yaml_parser_t parser;
    yaml_event_t event;
    const char *path;
} YamlReader;

static int event_line(const YamlReader *r) {
    return (int)r->event.start_mark.line + 1;
}

// Advance to the next event; malformed YAML and aliases end the program.
static void next_event(YamlReader *r) {
    yaml_event_delete(&r->event);
    if (!yaml_parser_parse(&r->parser, &r->event)) {
        const yaml_parser_t *p = &r->parser;
        const char *problem = p->problem ? p->problem : "cannot read the file";
        // libyaml's words for a line that does not line up with its mapping.
        if (p->context && strstr(p->context, "block mapping") &&
            (strstr(problem, "expected key") || strstr(problem, "mapping values")))
            fail("%s:%d: indentation: this line does not line up with the keys of the mapping at line %d (expected "
                 "the keys of one section at one indentation, nested mappings indented further)", r->path,
                 (int)p->problem_mark.line + 1, (int)p->context_mark.line + 1);
        if (p->context)
            fail("%s:%d: invalid YAML: %s (%s at line %d)", r->path, (int)p->problem_mark.line + 1, problem,
                 p->context, (int)p->context_mark.line + 1);
        fail("%s:%d: invalid YAML: %s", r->path, (int)p->problem_mark.line + 1, problem);
    }
    if (r->event.type == YAML_ALIAS_EVENT)
        fail("%s:%d: YAML aliases (*name) are not supported (expected plain values)", r->path, event_line(r));
}

static const char *event_kind(const yaml_event_t *e) {
    switch (e->type) {
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    default: return "a scalar";
    }
}

// An empty plain scalar: `section:` with nothing after it.
static bool is_empty_value(const yaml_event_t *e) {
    return e->type == YAML_SCALAR_EVENT && e->data.scalar.length == 0 &&
           e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static const char *scalar_text(const yaml_event_t *e) {
    return (const char *)e->data.scalar.value;
}

// Is `name` a group of keys ("rope_scaling" for "rope_scaling.factor", ...)?
static bool is_group(const char *section, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < NUM_KEYS; i++)
        if (!strcmp(keys[i].section, section) && !strncmp(keys[i].key, name, n) && keys[i].key[n] == '.') return true;
    return false;
}

// The keys of one section (group = NULL), or of one nested group such as
// model.rope_scaling (keys "group.name"), after its MAPPING_START.
static void read_section(YamlReader *r, Config *cfg, const char *section, const char *group, int *key_line) {
    char where[CONFIG_STR + 32], name[2 * CONFIG_STR];
    for (;;) {
        next_event(r);
        if (r->event.type == YAML_MAPPING_END_EVENT) return;
        snprintf(where, sizeof(where), "%s:%d", r->path, event_line(r));
        if (r->event.type != YAML_SCALAR_EVENT)
            fail("%s: section '%s': keys must be plain names, not %s (expected key: value lines)", where, section,
                 event_kind(&r->event));
        snprintf(name, sizeof(name), "%s%s%s", group ? group : "", group ? "." : "", scalar_text(&r->event));
        if (!group && is_group(section, name)) {
            next_event(r);
            if (r->event.type != YAML_MAPPING_START_EVENT)
                fail("%s:%d: %s.%s is %s (expected a mapping of key: value lines)", r->path, event_line(r), section,
                     name, event_kind(&r->event));
            read_section(r, cfg, section, name, key_line);
            continue;
        }
        const Key *k = find_key(section, name);
        if (!k) fail_unknown_key(where, section, name);
        int index = (int)(k - keys);
        if (key_line[index])
            fail("%s: %s.%s is given twice (first at line %d)", where, section, k->key, key_line[index]);
        key_line[index] = event_line(r);

        next_event(r);
        snprintf(where, sizeof(where), "%s:%d", r->path, event_line(r));
        if (r->event.type != YAML_SCALAR_EVENT) {
            char expected[300];
            describe_expected(k, expected, sizeof(expected));
            fail("%s: %s.%s: %s is not a value (expected %s)", where, section, k->key, event_kind(&r->event),
                 expected);
        }
        // A plain value running on to the next line: that line is indented
        // deeper than its key and was read as part of the value.
        const yaml_mark_t *start = &r->event.start_mark, *end = &r->event.end_mark;
        if (r->event.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && end->line > start->line) {
            char quoted[80];
            quote_for_message(scalar_text(&r->event), quoted, sizeof(quoted));
            fail("%s: indentation: line %d is indented deeper than %s.%s and was read as part of its value %s "
                 "(expected each key on its own line, at the indentation of the keys of '%s')", where,
                 (int)end->line + 1, section, k->key, quoted, section);
        }
        set_key(cfg, k, scalar_text(&r->event), where);
    }
}

// The sections of the top-level mapping, after its MAPPING_START.
static void read_sections(YamlReader *r, Config *cfg) {
    int section_line[NUM_SECTIONS] = {0}, key_line[NUM_KEYS] = {0};
    char where[CONFIG_STR + 32];
    for (;;) {
        next_event(r);
        if (r->event.type == YAML_MAPPING_END_EVENT) return;
        snprintf(where, sizeof(where), "%s:%d", r->path, event_line(r));
        if (r->event.type != YAML_SCALAR_EVENT)
            fail("%s: section names must be plain words, not %s (expected e.g. 'train:')", where,
                 event_kind(&r->event));
        int s = find_section(scalar_text(&r->event));
        for (int i = 0; s < 0 && i < NUM_KEYS; i++)  // a key at the left margin
            if (!strcmp(scalar_text(&r->event), keys[i].key))
                fail("%s: indentation: '%s' is not a section but the key '%s.%s' (expected it indented under '%s:')",
                     where, keys[i].key, keys[i].section, keys[i].key, keys[i].section);
        if (s < 0) fail_unknown_section(where, scalar_text(&r->event));
        if (section_line[s])
            fail("%s: section '%s' is given twice (first at line %d)", where, sections[s].name, section_line[s]);
        section_line[s] = event_line(r);

        next_event(r);
        if (r->event.type == YAML_MAPPING_START_EVENT) read_section(r, cfg, sections[s].name, NULL, key_line);
        else if (!is_empty_value(&r->event))
            fail("%s:%d: section '%s' is %s (expected a mapping of key: value lines)", r->path, event_line(r),
                 sections[s].name, event_kind(&r->event));
    }
}

void config_load_yaml(Config *cfg, const char *path) {
    FILE *f = xfopen(path, "rb");
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) fail("%s: is a directory (expected a YAML run file)", path);
    YamlReader r;
    memset(&r, 0, sizeof(r));
    r.path = path;
    if (!yaml_parser_initialize(&r.parser)) fail("%s: cannot start the YAML parser (out of memory)", path);
    yaml_parser_set_input_file(&r.parser, f);

    next_event(&r);  // STREAM_START
    next_event(&r);
    if (r.event.type == YAML_DOCUMENT_START_EVENT) {
        next_event(&r);
        if (r.event.type == YAML_MAPPING_START_EVENT) read_sections(&r, cfg);
        else if (!is_empty_value(&r.event))
            fail("%s:%d: the top level is %s (expected a mapping of sections such as 'model:' and 'train:')", path,
                 event_line(&r), event_kind(&r.event));
        next_event(&r);  // DOCUMENT_END
        next_event(&r);
        if (r.event.type != YAML_STREAM_END_EVENT)
            fail("%s:%d: a second YAML document (expected one document)", path, event_line(&r));
    }
    yaml_event_delete(&r.event);
    yaml_parser_delete(&r.parser);
    fclose(f);
}

void config_override(Config *cfg, const char *assignment) {
    char where[160], quoted[80];
    quote_for_message(assignment, quoted, sizeof(quoted));
    snprintf(where, sizeof(where), "override %s", quoted);
    const char *eq = strchr(assignment, '=');
    const char *dot = strchr(assignment, '.');
    if (!eq || !dot || dot > eq) fail("%s: not an assignment (expected section.key=value)", where);

    char section[CONFIG_STR], key[CONFIG_STR];
    snprintf(section, sizeof(section), "%.*s", (int)(dot - assignment), assignment);
    snprintf(key, sizeof(key), "%.*s", (int)(eq - dot - 1), dot + 1);
    if (find_section(section) < 0) fail_unknown_section(where, section);
    const Key *k = find_key(section, key);
    if (!k) fail_unknown_key(where, section, key);
    set_key(cfg, k, eq + 1, where);
}

// Defaults, the run file, the overrides.
static void load_layers(Config *cfg, const char *path, int argc, char **argv) {
    config_load_yaml(cfg, path);
    for (int i = 0; i < argc; i++) config_override(cfg, argv[i]);
}

// Keys that name a file or folder, checked before any work so that a missing
// one is reported with its key. A key that holds a keyword is not checked.
// eval_model (`mtrain eval`, `tasks`): checkpoint.dir and log.dir are not
// written, so a read-only one is fine.
static void check_path_keys(const Config *cfg, const char *source, bool eval_model) {
    const struct {
        const char *key;
        const char *value;     // the path, or NULL for a keyword
        const char *inside;    // a file the folder must hold, or NULL
        const char *expected;
    } paths[] = {
        {"checkpoint.resume", cfg->checkpoint.resume == RESUME_PATH ? cfg->checkpoint.resume_path : NULL, "state.json",
         "auto, never or a checkpoint folder step_XXXXXXXX"},
        {"attention.budget_file", cfg->attention.budget_file == BUDGET_FILE_PATH ? cfg->attention.budget_file_path : NULL,
         NULL, "none or a budget file"},
        {"eval.text", cfg->eval.text == TEXT_FILE ? cfg->eval.text_path : NULL, NULL, "heldout or a text file"},
        {"eval.tokenizer", cfg->eval.tokenizer == TOKENIZER_FILE ? cfg->eval.tokenizer_path : NULL, NULL,
         "model, bytes, a tokenizer.json or a folder holding one"},
    };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        const char *v = paths[i].value;
        if (!v) continue;
        char inside[2 * CONFIG_STR];
        snprintf(inside, sizeof(inside), "%s/%s", v, paths[i].inside ? paths[i].inside : "");
        if (access(paths[i].inside ? inside : v, R_OK) != 0)
            fail("%s: %s: %s: no such %s (expected %s)", source, paths[i].key, v,
                 paths[i].inside ? "checkpoint folder" : "file or folder", paths[i].expected);
    }
    // Output folders: created when needed, so their nearest existing
    // ancestor must be a folder we may write in.
    const struct { const char *key, *value; } outputs[] = {
        {"checkpoint.dir", cfg->checkpoint.dir}, {"log.dir", cfg->log.dir}, {"eval.out", cfg->eval.out}};
    for (size_t i = eval_model ? 2 : 0; i < sizeof(outputs) / sizeof(outputs[0]); i++) {
        char existing[CONFIG_STR];
        snprintf(existing, sizeof(existing), "%s", outputs[i].value);
        struct stat st;
        while (stat(existing, &st) != 0 && strchr(existing, '/')) *strrchr(existing, '/') = 0;
        if (existing[0] == 0) snprintf(existing, sizeof(existing), "/");
        if (stat(existing, &st) != 0) snprintf(existing, sizeof(existing), ".");
        if (stat(existing, &st) == 0 && !S_ISDIR(st.st_mode))
            fail("%s: %s: %s: cannot create it, %s is not a folder (expected a folder path)", source, outputs[i].key,
                 outputs[i].value, existing);
        if (access(existing, W_OK | X_OK) != 0)
            fail("%s: %s: %s: cannot create it, %s is not writable (expected a folder path we may write)", source,
                 outputs[i].key, outputs[i].value, existing);
    }
}

// The architecture comes from the model folder's config.json: a model key
// that the run file or an override sets to another value stops the run,
// naming the key, both values and the fix. The context keys
// (max_position_embeddings, rope_theta, rope_scaling.*) may differ: that is
// how a run extends the context.
static void check_folder_architecture(const Config *cfg, const Config *folder_cfg, const char *source,
                                      const char *key, const char *config_json) {
    static const char *const architecture[] = {"vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                               "num_heads", "num_kv_heads", "head_dim", "tie_word_embeddings"};
    for (size_t i = 0; i < sizeof(architecture) / sizeof(architecture[0]); i++) {
        const Key *k = find_key("model", architecture[i]);
        Value run = fetch(k, cfg), folder = fetch(k, folder_cfg);
        char run_text[40], folder_text[40];
        format_value(k, &run, run_text, sizeof(run_text));
        format_value(k, &folder, folder_text, sizeof(folder_text));
        if (strcmp(run_text, folder_text) != 0)
            fail("%s: model.%s: %s, but %s (%s) has %s (expected %s or no model.%s: a run that starts from a "
                 "model folder takes its architecture from config.json; remove the key from the run file or the "
                 "overrides)", source, k->key, run_text, config_json, key, folder_text, folder_text, k->key);
    }
}

// model.preset: the config.json of each Qwen2.5 base model as published on
// Hugging Face (Qwen/Qwen2.5-0.5B, -1.5B, -3B, -7B, -14B, -32B, -72B); all
// have rope_theta 1e6 and SiLU, head_dim = hidden / heads. The 7B and larger
// models have a padded vocabulary of 152064 and untied embeddings.
static const struct {
    int vocab, hidden, intermediate, layers, heads, kv_heads, max_positions;
    double rms_norm_eps;
    bool tie;
} presets[] = {
    [PRESET_QWEN25_0_5B] = {151936, 896, 4864, 24, 14, 2, 32768, 1e-6, true},
    [PRESET_QWEN25_1_5B] = {151936, 1536, 8960, 28, 12, 2, 131072, 1e-6, true},
    [PRESET_QWEN25_3B] = {151936, 2048, 11008, 36, 16, 2, 32768, 1e-6, true},
    [PRESET_QWEN25_7B] = {152064, 3584, 18944, 28, 28, 4, 131072, 1e-6, false},
    [PRESET_QWEN25_14B] = {152064, 5120, 13824, 48, 40, 8, 131072, 1e-5, false},
    [PRESET_QWEN25_32B] = {152064, 5120, 27648, 64, 40, 8, 131072, 1e-5, false},
    [PRESET_QWEN25_72B] = {152064, 8192, 29568, 80, 64, 8, 131072, 1e-5, false},
};

// The preset's shapes over the model section (the other keys keep their values).
static void apply_preset(ModelConfig *m, ModelPreset preset) {
    m->vocab_size = presets[preset].vocab;
    m->hidden_size = presets[preset].hidden;
    m->intermediate_size = presets[preset].intermediate;
    m->num_layers = presets[preset].layers;
    m->num_heads = presets[preset].heads;
    m->num_kv_heads = presets[preset].kv_heads;
    m->head_dim = 0;
    m->rope_theta = 1e6;
    m->rms_norm_eps = presets[preset].rms_norm_eps;
    m->max_position_embeddings = presets[preset].max_positions;
    m->tie_word_embeddings = presets[preset].tie;
}

// config_from_args and config_for_plan: folder_required = false takes a
// train.init_from folder without a config.json as absent (the plan needs the
// architecture only). Returns where the model section's shapes came from.
static const char *config_load(Config *cfg, const char *path, int argc, char **argv, bool eval_model,
                               bool folder_required) {
    char source[CONFIG_STR + 32];
    snprintf(source, sizeof(source), "%s%s", path, argc > 0 ? " (with overrides)" : "");
    config_defaults(cfg);
    load_layers(cfg, path, argc, argv);
    // The folder that gives the model section, copied: loading again resets cfg.
    const char *key = "train.init_from";
    char folder[CONFIG_STR];
    bool from_folder = cfg->train.init_from == INIT_FOLDER;
    snprintf(folder, sizeof(folder), "%s", cfg->train.init_from_path);
    if (eval_model && cfg->eval.model == EVAL_MODEL_FOLDER) {
        key = "eval.model";
        from_folder = true;
        snprintf(folder, sizeof(folder), "%s", cfg->eval.model_path);
    }
    char config_json[CONFIG_STR + 16];
    snprintf(config_json, sizeof(config_json), "%s/config.json", folder);
    if (from_folder && access(config_json, R_OK) != 0) {
        if (folder_required)
            fail("%s: %s: %s: no config.json there (expected a Hugging Face model folder or checkpoint)", source, key,
                 folder);
        from_folder = false;
    }
    ModelPreset preset = cfg->model_preset;
    const char *shapes = "the run file's model section";
    if (from_folder || preset != PRESET_NONE) {
        // The folder's config.json, or else the preset, replaces the defaults
        // of the model section; the run file and the overrides are applied
        // again on top of it.
        config_defaults(cfg);
        if (from_folder) hf_config_read(config_json, &cfg->model);
        else apply_preset(&cfg->model, preset);
        Config *folder_cfg = NULL;
        if (from_folder) {
            folder_cfg = xmalloc(sizeof(Config));
            *folder_cfg = *cfg;
        }
        load_layers(cfg, path, argc, argv);
        if (from_folder) check_folder_architecture(cfg, folder_cfg, source, key, config_json);
        free(folder_cfg);
        shapes = from_folder ? "train.init_from's config.json" : "model.preset and the run file's model section";
    }
    config_validate(cfg, source);
    check_path_keys(cfg, source, eval_model);
    return shapes;
}

void config_from_args(Config *cfg, const char *path, int argc, char **argv, bool eval_model) {
    config_load(cfg, path, argc, argv, eval_model, true);
}

const char *config_for_plan(Config *cfg, const char *path, int argc, char **argv) {
    return config_load(cfg, path, argc, argv, false, false);
}

// ----------------------------------------------------------------------------
// Validation, printing, documentation

void config_validate(const Config *cfg, const char *source) {
    for (int i = 0; i < NUM_KEYS; i++) {
        const Key *k = &keys[i];
        Value v = fetch(k, cfg);
        if (in_range(k, &v)) continue;
        char text[CONFIG_STR], quoted[80], expected[300];
        format_value(k, &v, text, sizeof(text));
        quote_for_message(text, quoted, sizeof(quoted));
        describe_expected(k, expected, sizeof(expected));
        fail("%s: %s.%s: %s is not valid (expected %s)", source, k->section, k->key, quoted, expected);
    }
    const ModelConfig *m = &cfg->model;
    if (m->num_heads % m->num_kv_heads != 0)
        fail("%s: model.num_heads: %d is not a multiple of model.num_kv_heads = %d (expected num_heads %% "
             "num_kv_heads == 0)", source, m->num_heads, m->num_kv_heads);
    if (m->head_dim == 0 && m->hidden_size % m->num_heads != 0)
        fail("%s: model.hidden_size: %d is not a multiple of model.num_heads = %d (expected a multiple, or an "
             "explicit model.head_dim)", source, m->hidden_size, m->num_heads);
    int head_dim = m->head_dim ? m->head_dim : m->hidden_size / m->num_heads;
    if (head_dim % 2 != 0)
        fail("%s: model.head_dim: %d%s is odd (expected an even head dimension for RoPE)", source, head_dim,
             m->head_dim ? "" : " (hidden_size / num_heads)");
    const RopeScaling *rs = &m->rope_scaling;
    char fast[40], slow[40];
    format_double(rs->beta_fast, fast, sizeof(fast));
    format_double(rs->beta_slow, slow, sizeof(slow));
    if (rs->type == ROPE_YARN && rs->beta_fast <= rs->beta_slow)
        fail("%s: model.rope_scaling.beta_fast: %s is not above model.rope_scaling.beta_slow = %s (expected "
             "beta_fast > beta_slow)", source, fast, slow);
    const TrainConfig *t = &cfg->train;
    char lr[40], min_lr[40];
    format_double(t->lr, lr, sizeof(lr));
    format_double(t->min_lr, min_lr, sizeof(min_lr));
    if (t->min_lr > t->lr)
        fail("%s: train.min_lr: %s is above train.lr = %s (expected min_lr <= lr)", source, min_lr, lr);
    const DataConfig *d = &cfg->data;
    if (d->train == DATA_SYNTHETIC && d->val == VAL_SHARDS)
        fail("%s: data.val: %s names shards but data.train is 'synthetic' (expected data.val: holdout)", source,
             d->val_path);
    int64_t lengths[EVAL_MAX_LIST];
    double depths[EVAL_MAX_LIST];
    eval_task_set(&cfg->eval, source);
    eval_length_list(&cfg->eval, source, lengths);
    eval_depth_list(&cfg->eval, source, depths);
}

// ----------------------------------------------------------------------------
// The eval lists

// Split a comma-separated list into items[] (spaces around items trimmed); an
// empty item or more than EVAL_MAX_LIST items fail naming source and key.
static int split_list(const char *source, const char *key, const char *text, const char *expected,
                      char items[][CONFIG_STR]) {
    char quoted[80];
    quote_for_message(text, quoted, sizeof(quoted));
    int n = 0;
    for (const char *p = text;; p++) {
        size_t len = strcspn(p, ",");
        const char *a = p, *b = p + len;
        while (a < b && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) b--;
        if (a == b) fail("%s: eval.%s: %s: item %d is empty (expected %s)", source, key, quoted, n + 1, expected);
        if (n == EVAL_MAX_LIST)
            fail("%s: eval.%s: %s has more than %d items (expected %s)", source, key, quoted, EVAL_MAX_LIST, expected);
        snprintf(items[n++], CONFIG_STR, "%.*s", (int)(b - a), a);
        p += len;
        if (!*p) return n;
    }
}

// One item that is not what the list holds.
static void fail_item(const char *source, const char *key, const char *item, const char *problem,
                      const char *expected) {
    char quoted[80];
    quote_for_message(item, quoted, sizeof(quoted));
    fail("%s: eval.%s: %s %s (expected %s)", source, key, quoted, problem, expected);
}

unsigned eval_task_set(const EvalConfig *e, const char *source) {
    static const char *names[] = {"perplexity", "passkey", "niah", "ruler"};
    const char *expected = "a comma-separated list of perplexity, passkey, niah, ruler";
    char items[EVAL_MAX_LIST][CONFIG_STR];
    int n = split_list(source, "tasks", e->tasks, expected, items);
    unsigned set = 0;
    for (int i = 0; i < n; i++) {
        unsigned bit = 0;
        for (unsigned t = 0; t < sizeof(names) / sizeof(names[0]); t++)
            if (!strcmp(items[i], names[t])) bit = 1u << t;
        if (!bit) fail_item(source, "tasks", items[i], "is not a task", expected);
        if (set & bit) fail_item(source, "tasks", items[i], "is given twice", expected);
        set |= bit;
    }
    return set;
}

int eval_length_list(const EvalConfig *e, const char *source, int64_t *out) {
    const char *expected = "a comma-separated list of distinct lengths in tokens, integers in [2, 1073741824]";
    char items[EVAL_MAX_LIST][CONFIG_STR];
    int n = split_list(source, "lengths", e->lengths, expected, items);
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(items[i], &end, 10);
        if (*end || errno || v < 2 || v > (1 << 30)) fail_item(source, "lengths", items[i], "is not a length", expected);
        for (int j = 0; j < i; j++)
            if (out[j] == v) fail_item(source, "lengths", items[i], "is given twice", expected);
        out[i] = v;
    }
    return n;
}

int eval_depth_list(const EvalConfig *e, const char *source, double *out) {
    const char *expected = "a comma-separated list of distinct depths, numbers in [0, 1]";
    char items[EVAL_MAX_LIST][CONFIG_STR];
    int n = split_list(source, "depths", e->depths, expected, items);
    for (int i = 0; i < n; i++) {
        char *end;
        double v = strtod(items[i], &end);
        if (*end || !(v >= 0 && v <= 1)) fail_item(source, "depths", items[i], "is not a depth", expected);
        for (int j = 0; j < i; j++)
            if (out[j] == v) fail_item(source, "depths", items[i], "is given twice", expected);
        out[i] = v;
    }
    return n;
}

const char *config_enum_name(const Config *cfg, const void *field) {
    size_t offset = (size_t)((const char *)field - (const char *)cfg);
    for (int i = 0; i < NUM_KEYS; i++)
        if ((keys[i].type == T_ENUM || keys[i].type == T_PATH) && keys[i].offset == offset) {
            Value v = fetch(&keys[i], cfg);
            CHECK(in_range(&keys[i], &v), "%s.%s holds %d, not one of its values", keys[i].section, keys[i].key,
                  *(const int *)field);
            return keys[i].type == T_PATH && v.i == path_kind(&keys[i]) ? v.s : enum_name(&keys[i], v.i);
        }
    fail("config_enum_name: no enum or keyword-or-path key at offset %zu of Config", offset);
}

size_t config_run_keys(const Config *cfg, char *out, size_t size) {
    // How a run is computed, not what: resumable with other values.
    static const char *const how[] = {"model.preset", "train.steps", "train.backend", "train.max_bad_steps", "train.micro_batches",
                                      "train.loss_chunk", "train.mlp_chunk", "train.recompute", "train.gemm_choice", "train.dw_stream",
                                      "attention.ring", "attention.ring_send", "attention.layout", "attention.kernels"};
    char text[CONFIG_STR + 64], name[128];
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < NUM_KEYS; i++) {
        const Key *k = &keys[i];
        bool run_section = !strcmp(k->section, "model") || !strcmp(k->section, "attention") ||
                           !strcmp(k->section, "data") || !strcmp(k->section, "train");
        snprintf(name, sizeof(name), "%s.%s", k->section, k->key);
        bool excluded = false;
        for (size_t j = 0; j < sizeof(how) / sizeof(how[0]); j++) excluded |= !strcmp(name, how[j]);
        if (!run_section || excluded) continue;
        Value v = fetch(k, cfg);
        format_value(k, &v, text, sizeof(text));
        if (used < size) used += (size_t)snprintf(out + used, size - used, "%s=%s\n", name, text);
    }
    if (cfg->data.content_hash && used < size)
        used += (size_t)snprintf(out + used, size - used, "data.content=%016" PRIx64 "\n", cfg->data.content_hash);
    return used < size ? used : size - 1;
}

// auto: off until a GPU's measurement shows that the second stream pays.
bool config_dw_stream_on(const Config *cfg) { return cfg->train.dw_stream == DW_STREAM_ON; }

void config_print(const Config *cfg, FILE *out) {
    char text[CONFIG_STR + 64];
    for (int s = 0; s < NUM_SECTIONS; s++) {
        fprintf(out, "%s:\n", sections[s].name);
        const char *group = NULL;  // the nested mapping being printed
        size_t group_len = 0;
        for (int i = 0; i < NUM_KEYS; i++) {
            const Key *k = &keys[i];
            if (strcmp(k->section, sections[s].name)) continue;
            Value v = fetch(k, cfg);
            const char *dot = strchr(k->key, '.');
            if (dot && !(group && group_len == (size_t)(dot - k->key) && !strncmp(group, k->key, group_len))) {
                group = k->key;
                group_len = (size_t)(dot - k->key);
                fprintf(out, "  %.*s:\n", (int)group_len, group);
            }
            if (dot) fprintf(out, "    %s: ", dot + 1);
            else fprintf(out, "  %s: ", k->key);
            if (k->type == T_STRING || (k->type == T_PATH && v.i == path_kind(k))) print_yaml_string(v.s, out);
            else { format_value(k, &v, text, sizeof(text)); fputs(text, out); }
            fputc('\n', out);
        }
    }
}

void config_print_doc(FILE *out) {
    fputs("# Run configuration\n\n"
          "<!-- Generated by `build/mtrain config --doc` from the schema in trainer/config.c; do not edit. -->\n\n"
          "A run is described by one YAML file with up to eight sections (`model`, `attention`, `parallel`,\n"
          "`train`, `data`, `checkpoint`, `log`, `eval`), each a mapping of `key: value` lines. Every key is optional:\n"
          "a key that is not given keeps the default listed below. Any key can be overridden on the command\n"
          "line after the run file as `section.key=value`, e.g.\n"
          "`build/mtrain train configs/tiny-cpu.yaml train.lr=1e-3 train.steps=10 checkpoint.dir=checkpoints/lr1e-3`; overrides are applied in\n"
          "order, after the file. `build/mtrain config RUN.yaml [overrides]` prints the fully resolved\n"
          "configuration as YAML.\n\n"
          "Values are checked strictly: integers must be whole decimal integers, numbers accept `3e-4`,\n"
          "bools are `true` or `false`; a key of type keyword or path reads one of its keywords as that\n"
          "keyword and anything else as a path (`./none` is a file named `none`). Unknown sections or keys,\n"
          "values of the wrong type or out of range, keys given twice, malformed YAML and inconsistent\n"
          "combinations (e.g. `num_heads` not a multiple of `num_kv_heads`, `min_lr` above `lr`,\n"
          "`data.val` shards with `data.train: synthetic`, a model key that disagrees with `train.init_from`'s\n"
          "`config.json`) stop the program\n"
          "before any work with one line on stderr naming the file and line (or the override), the key, the\n"
          "problem and what was expected, e.g.\n\n"
          "```\n"
          "mtrain: run.yaml:7: unknown key 'train.lrr' (did you mean 'train.lr'?)\n"
          "```\n",
          out);
    char range[300], def[CONFIG_STR + 64];
    Config defaults;
    config_defaults(&defaults);
    for (int s = 0; s < NUM_SECTIONS; s++) {
        fprintf(out, "\n## %s\n\n%s\n\n", sections[s].name, sections[s].meaning);
        fputs("| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n", out);
        for (int i = 0; i < NUM_KEYS; i++) {
            const Key *k = &keys[i];
            if (strcmp(k->section, sections[s].name)) continue;
            Value v = fetch(k, &defaults);
            format_value(k, &v, def, sizeof(def));
            describe_range(k, range, sizeof(range));
            fprintf(out, "| `%s.%s` | %s | `%s` | %s | %s |\n", k->section, k->key, type_name(k->type), def, range,
                    k->meaning);
        }
    }
}

// ----------------------------------------------------------------------------
// mtrain config RUN.yaml [section.key=value ...] | mtrain config --doc

int cmd_config(int argc, char **argv) {
    if (argc == 1 && !strcmp(argv[0], "--doc")) {
        config_print_doc(stdout);
        return 0;
    }
    const char *usage = "usage: mtrain config RUN.yaml [section.key=value ...] | mtrain config --doc";
    if (argc < 1 || argv[0][0] == '-') fail("%s", usage);
    if (args_refused(args_parse(NULL, 0, argc - 1, argv + 1, argc), usage)) return 2;
    Config cfg;
    config_from_args(&cfg, argv[0], argc - 1, argv + 1, false);
    config_print(&cfg, stdout);
    return 0;
}
