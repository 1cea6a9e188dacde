// model.h: the Qwen2.5 graph over a backend op table. One parameter table
// (Hugging Face names, shapes, weight-decay flags) describes every tensor;
// parameters, gradients and AdamW moments are one flat fp32 arena each, laid
// out in table order (under ZeRO-1 the moments, and on a backend that shards
// masters the parameters, hold this rank's shard of it); the backend's
// compute copy of the parameters (Weight, refreshed by
// model_weights_changed) is whole, with the same layout. Activations are
// the backend's Act type, row statistics fp32 (model/backend.h).
// Forward/backward run one sequence of T tokens at a time:
// the whole sequence on one rank, or this rank's tokens (at their global
// positions) with attention over the context-parallel ring (model_set_ring).
#ifndef MTRAIN_MODEL_H
#define MTRAIN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../dist/progress.h"
#include "../dist/util.h"
#include "backend.h"
#include "model_config.h"

// The tensors of one decoder layer, in table order (Hugging Face's; the
// arena holds them in another: model.c's layer_arena_order).
typedef enum {
    LAYER_INPUT_NORM, LAYER_Q_WEIGHT, LAYER_Q_BIAS, LAYER_K_WEIGHT, LAYER_K_BIAS,
    LAYER_V_WEIGHT, LAYER_V_BIAS, LAYER_O_WEIGHT, LAYER_POST_NORM,
    LAYER_GATE_WEIGHT, LAYER_UP_WEIGHT, LAYER_DOWN_WEIGHT, LAYER_TENSORS
} LayerTensor;

typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } ParamInit;

typedef struct {
    char name[96];           // Hugging Face tensor name
    int ndim;                // 1 or 2
    int64_t shape[2];        // [out, in] for matrices
    int64_t numel;
    int64_t offset;          // in floats, into each arena (arena order, not table order: model.c)
    bool decay;              // AdamW weight decay applies
    ParamInit init;
} ParamInfo;

// Activations of one layer kept for backward (all [T, ...], token-major).
typedef struct {
    Act *x_in;               // [T, H] residual stream entering the layer
    float *rstd_attn;        // [T]
    Act *h_attn;             // [T, H] normed input of attention
    Act *q, *k, *v;          // [T, Hq*D], [T, Hkv*D] x2 (after RoPE)
    Act *att;                // [T, Hq*D] attention output
    float *lse;              // [Hq, T]
    Act *x_mid;              // [T, H] residual after attention
    float *rstd_mlp;         // [T]
    Act *h_mlp;              // [T, H]
    Act *gate_up;            // [T, 2I]: each token's gate [I], then up [I] (one GEMM)
    Act *act;                // [T, I]
} LayerActs;

typedef struct {
    ModelConfig cfg;
    const Backend *be;
    RecomputePolicy recompute;  // model_set_activations
    AttentionConfig attention;  // dense | sparse, tile size, sparse budgets
    int loss_chunk;          // tokens per fused LM-head + cross-entropy chunk
    int mlp_chunk;           // tokens per MLP chunk (model_mlp_chunk_rows; model_set_activations); 0 = the MLP whole
    int64_t mlp_chunk_rows;  // the activations' MLP chunk (0 = gate_up, act [T, 2I], [T, I] kept per layer)

    int num_params;
    ParamInfo *params;       // the parameter table
    int64_t total_params;    // floats in each arena
    float *grad_mem;               // backend memory [arena_floats]: gradients
    int64_t arena_floats;          // total_params, or shards × shard size under ZeRO-1 (the padding stays 0)
    float *param_mem;              // backend memory [master_count]: fp32 master weights of the arena range
    int64_t master_begin, master_count;  // [master_begin, + master_count): all, or this rank's ZeRO-1 shard
    Weight *weight_mem;            // the backend's compute copy of all the parameters [arena_floats]
    int64_t opt_begin, opt_count;  // the arena range whose AdamW moments this rank holds and updates
    float *adam_m, *adam_v;        // backend memory [opt_count] (ZeRO-1: this rank's shard)
    const struct Comm *opt_comm;   // ZeRO-1: the ranks the moments are sharded over (rank r holds shard r); else NULL

    int64_t max_tokens;      // T the activations were sized for (0 = none yet)
    void *activation_arena;  // backend memory: the fp32 statistics, then the Act tensors
    LayerActs *layers;       // [num_layers]; recomputing, only x_in (selective: and att, lse) is per layer
    LayerActs scratch;       // the shared buffers of the recomputed activations (recompute not none)
    Act *x_final, *h_final;  // [T, H]
    float *rstd_final;       // [T]
    Act *dx, *dh, *dq, *dk, *dv;
    // [T, QD + 2 KD]: each layer's fused q|k|v projection before RoPE splits
    // it, then in the backward d(q|k|v) as RoPE's backward joins it (one dX
    // and one dW GEMM); its first T·QD elements are datt until the attention
    // backward has read it.
    Act *qkv, *datt;
    Act *dgate_up, *dact;    // [mlp_chunk_rows or T, 2I], [mlp_chunk_rows or T, I]
    Act *logits;             // [min(loss_chunk, max_tokens), V]
    int32_t *tokens, *targets;
    int64_t *positions;      // [T] global positions (masks, ring layouts)
    int64_t *rope_positions; // [T] the positions RoPE rotates by (model_set_rope_documents)
    double *rope_inv_freq;   // [head_dim / 2], backend memory (model/rope.c)
    double *loss_sum;        // one double, backend memory: the chunks' cross entropy of a sequence
    double rope_attention_factor;  // scales RoPE cos and sin (YaRN; 1 otherwise)
    Progress *progress;      // NULL, or counts every layer of a forward and of a backward pass

    // Attention: the backend's state (patterns, ring), opaque here.
    AttnState *attn;
    bool collect_attention_stats;   // sparse: add to attention_stats in each forward
    SparseStats *attention_stats;   // [num_layers]

    // Context parallelism (model_set_ring): cp == NULL runs attention locally.
    // Called by model_forward_backward as soon as a suffix of the gradient
    // arena is final for the pass: [offset, arena end) gets none of its
    // gradient after this (the final norm and LM head, then each layer from
    // the last, then the embedding at offset 0). NULL: not called.
    void (*grads_final)(void *ctx, int64_t offset);
    void *grads_final_ctx;
    // The gradient reduction (model_set_grad_reduce).
    const struct Comm *grad_comm;   // the ranks the gradients are summed over
    int64_t grad_bucket;            // floats per bucket, at least; 0 = one sum after the backward
    int64_t grad_started;           // a bucketed backward: [grad_started, total_params) has started reducing
    const struct Comm *cp;
    int ring_inner;                 // inner ring size of the schedule
    // Documents (model_set_documents): attention masked by document when set.
    int64_t *doc_starts, doc_count;  // [doc_count] sorted global positions (none: no mask)
    // RoPE positions restart at these documents (model_set_rope_documents).
    int64_t *rope_doc_starts, rope_doc_count;  // [rope_doc_count] sorted global positions (none: global)
} Model;

// Build the table for cfg and allocate parameters and gradients (zero), with
// this attention (NULL: dense over 64-token tiles) and LM-head + loss chunks
// of loss_chunk tokens; model_set_attention changes the attention later.
void model_init(Model *m, const ModelConfig *cfg, const Backend *be, const AttentionConfig *attention,
                int loss_chunk);
// The activation arena for sequences of up to `tokens` tokens under this
// recompute policy (not RECOMPUTE_AUTO) and MLP chunk (tokens; 0 = the MLP
// whole), carved at once. A model never given one runs with policy none and
// the MLP whole; a forward over more tokens than carved carves it again, larger.
void model_set_activations(Model *m, RecomputePolicy recompute, int mlp_chunk, int64_t tokens);
// Use this attention; for budget fixed, reads the budget file when set.
void model_set_attention(Model *m, const AttentionConfig *attention);
void model_free(Model *m);
// Run attention over the ring of cp (inner ranks per inner ring) from now
// on; cp == NULL or a single rank: locally. Every forward is then collective
// over cp (one ring per sequence, built from the positions).
void model_set_ring(Model *m, const struct Comm *cp, int inner);
// Sparse attention's density and recall per layer: from
// model_attention_stats_begin (zeroed) every plan forward adds its layer's;
// model_attention_stats_end stops and returns them [num_layers] (this
// rank's; NULL when not collecting).
void model_attention_stats_begin(Model *m);
SparseStats *model_attention_stats_end(Model *m);
// Mask attention by document from now on: the sorted global positions where a
// document begins (doc_starts [count], copied); a query sees only keys of its
// own document. NULL: one document per sequence (the causal mask only).
void model_set_documents(Model *m, const int64_t *doc_starts, int64_t count);
// RoPE positions restart at 0 at each of these sorted global positions from
// now on (doc_starts [count], copied; data.reset_positions), while masks and
// the ring keep the global positions. NULL: RoPE uses the global positions.
void model_set_rope_documents(Model *m, const int64_t *doc_starts, int64_t count);
// ZeRO-1 over `over`: hold and update the AdamW moments of shard over->rank
// of over->size equal runs of the arena (the last shorter) only; the
// gradient arena and the compute copy grow to shards × shard size (zero
// padding), so that the shards are the blocks of a reduce-scatter and an
// all-gather; on a backend that shards masters (Backend.shards_masters) the
// fp32 master holds that shard only, else the master arena grows as well.
// Before model_alloc_optimizer and before the weights are set.
void model_shard_optimizer(Model *m, const struct Comm *over);
// Floats of one shard (model_shard_optimizer): ceil(total_params / shards).
int64_t model_shard_size(const Model *m, int shards);
// Allocate the AdamW moments of [opt_begin, opt_begin + opt_count) (training only).
void model_alloc_optimizer(Model *m);
// Seeded initialisation: matrices N(0, init_std), norms 1, biases 0; each
// element a function of (seed, tensor, index), the same for any thread count.
void model_init_weights(Model *m, uint64_t seed);
// host [n]: the fp32 master weights of arena floats [offset, offset + n);
// this rank keeps the part its master holds (all of it unless sharded).
// Every writer of the master goes through this, then model_weights_changed.
void model_set_params(Model *m, int64_t offset, const float *host, int64_t n);
// The master changed (optimizer step, loading, initialisation): refresh the
// compute copy from this rank's master range, then under ZeRO-1 all-gather
// the compute copy over opt_comm (collective over it).
void model_weights_changed(Model *m);
// host [total_params] = the whole fp32 master weights: downloaded, or
// gathered from the shards when the master is sharded (collective over
// opt_comm then, host filled on its rank 0 only: NULL on the others). The
// one reader of whole masters (checkpoints, exports).
void model_gather_params(const Model *m, float *host);
// ZeRO-1: host [total_params] on rank 0 of opt_comm (unused, may be NULL,
// on the others) = the arena of which shard [opt_count] (backend memory:
// moments, or a sharded master) is each rank's part (collective over
// opt_comm).
void model_gather_shards(const Model *m, const float *shard, float *host);
// Index of a tensor in the table: layer tensor, embedding, final norm, head.
int model_layer_param(const Model *m, int layer, LayerTensor which);
int model_param_index(const Model *m, const char *name);  // -1 if absent
int model_embedding_param(void);
int model_final_norm_param(const Model *m);
int model_head_param(const Model *m);  // the embedding when tied
// Backend pointer to a tensor in a whole arena (grad_mem, or an unsharded param_mem).
float *model_tensor(const Model *m, float *arena, int index);
// The Act element `elements` after base (backend memory).
Act *model_act_at(const Model *m, Act *base, int64_t elements);
// Backend pointer to a tensor's compute copy (in weight_mem).
Weight *model_weight(const Model *m, int index);
// Backend pointer to the compute copy of arena element `offset`.
Weight *model_weight_at(const Model *m, int64_t offset);

// One sequence (or this rank's part of it): forward, fused chunked LM head +
// cross entropy, backward. tokens, targets and positions are host arrays [T]
// (positions: global, ascending; NULL = 0..T-1); target < 0 is ignored. Gradients
// ACCUMULATE into grad_mem scaled by grad_scale (e.g. 1/(valid*micro_batches)).
// Returns the summed cross entropy over valid targets.
double model_forward_backward(Model *m, const int32_t *tokens, const int32_t *targets,
                              const int64_t *positions, int64_t T, float grad_scale);
// Forward only: the summed cross entropy over valid targets (no gradients).
double model_loss(Model *m, const int32_t *tokens, const int32_t *targets, const int64_t *positions,
                  int64_t T);
// Forward only; logits [T, V] written to host memory.
void model_logits(Model *m, const int32_t *tokens, const int64_t *positions, int64_t T, float *logits_host);
// Forward on T tokens; the logits of positions [first, first + count) only
// ([count, V] in host memory): what evaluation needs at 512K × 152K vocab.
void model_logits_range(Model *m, const int32_t *tokens, const int64_t *positions, int64_t T, int64_t first,
                        int64_t count, float *logits_host);

// The per-op profile (model/profile.h): the ops from model_profile_begin
// to model_profile_end run through the profile's table, into *out at the
// end. model_mark_phase: the phase of the ops that follow (nothing outside
// a profile).
struct Profile;
void model_profile_begin(Model *m);
void model_profile_end(Model *m, struct Profile *out);
void model_mark_phase(const Model *m, ProfilePhase phase);

// Gradients and optimizer state (model/grad_reduce.c). Zero the gradient arena.
void model_zero_grads(Model *m);
// Whether every gradient is finite (their sum of squares, before any reduction).
bool model_grads_finite(const Model *m);
// MTRAIN_TEST_NAN_STEP: a NaN into the first gradient.
void model_poison_grads(Model *m);
// Sum the gradients over the ranks of `over` (every rank then makes the same
// update): in buckets of at least bucket_floats (0: none) started during the
// last micro-batch's backward when over has several ranks and the moments
// are whole; under ZeRO-1 (model_shard_optimizer over the same ranks) one
// reduce-scatter, each rank receiving the sum of its shard; else one
// all-reduce after the backward.
void model_set_grad_reduce(Model *m, const struct Comm *over, int64_t bucket_floats);
// Whether the sum runs in buckets during the backward (the gradients are then
// no longer this rank's alone after it).
bool model_grads_bucketed(const Model *m);
// Bucketed: the next backward (the step's last) starts each bucket as its
// gradients are final (Model.grads_final). Otherwise nothing.
void model_grads_start(Model *m);
// The sum over the ranks (collective over them): the rest of the buckets
// and a wait for all, or the whole reduce-scatter or all-reduce.
void model_reduce_grads(Model *m);
// host [count] = floats [first, first + count) of this rank's AdamW moment
// `part` (0 = m, 1 = v) [opt_count].
void model_read_moment(const Model *m, int part, int64_t first, int64_t count, float *host);
// host_m, host_v [n]: the moments of arena floats [offset, offset + n); this
// rank keeps the part of its own range (a checkpoint of any sharding resumes
// under any other).
void model_set_moments(Model *m, int64_t offset, const float *host_m, const float *host_v, int64_t n);
// Whether this rank's fp32 master holds its ZeRO-1 shard only (a backend that
// shards masters, under ZeRO-1).
bool model_master_sharded(const Model *m);
// Bytes this rank holds per arena: the fp32 master, the compute copy when it
// is not the master (0 on the CPU), gradients, the two moments.
typedef struct {
    double master, compute, grads, adam;
} ModelMemory;
ModelMemory model_memory(const Model *m);
// Bytes this rank sent over the ring for the last sequence's attention
// (Backend.attention_ring_bytes).
double model_attention_ring_bytes(const Model *m);

// Bytes of activation memory for T tokens (printed at start-up).
size_t model_activation_bytes(const Model *m, int64_t T);
// Bytes of that arena for a model of shape c (head_dim set) on a backend
// whose Act elements take act_bytes, without building one (trainer/plan.c):
// saved activations, backward buffers and the LM-head chunk
// [model_loss_chunk_rows, vocab] in act_bytes each, the row statistics (rstd,
// lse) in fp32.
size_t model_activation_arena_bytes(const ModelConfig *c, RecomputePolicy recompute, int loss_chunk, int mlp_chunk,
                                    int64_t T, size_t act_bytes);
// Tokens per MLP chunk for T tokens: 0 = the MLP whole, its gate, up and act
// [T, I] kept per layer for the backward; else gate, up, act and their
// gradients exist for this many tokens only, shared by the layers, and the
// backward recomputes them chunk by chunk from the saved norm output. Chunks
// when mlp_chunk > 0 and either the policy recomputes (its backward recomputes
// the MLP anyway) or T is above mlp_chunk.
int64_t model_mlp_chunk_rows(int mlp_chunk, RecomputePolicy recompute, int64_t T);
// Rows of the LM-head chunk for T tokens: loss_chunk, or T when fewer (no
// chunk holds more tokens than the step has).
int64_t model_loss_chunk_rows(int loss_chunk, int64_t T);

#endif
