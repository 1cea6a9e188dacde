// model.c: the Qwen2.5 decoder (docs/ARCHITECTURE.md, Model) as one graph over the backend
// op table: parameter table, seeded initialisation, activation arena, forward,
// fused chunked LM head + cross entropy, and backward under a recompute
// policy (none; selective: the layer but its attention from the saved input,
// attention output and lse; full: the whole layer from its saved input).
// Attention is one op of the backend (on one rank or, under context
// parallelism, over the ring of the cp group): everything else is
// token-local, so a rank runs the same graph on its own tokens at their
// global positions. Element types follow model/backend.h: the ops read the
// compute copy of the weights (weight_mem) and write Act activations and fp32
// row statistics; gradients and the optimizer stay on the fp32 arenas.
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/comm.h"
#include "profile.h"
#include "rope.h"

// The tensors of one decoder layer: HF suffix, weight decay, initialisation.
static const struct {
    const char *suffix;
    bool decay;
    ParamInit init;
} layer_tensors[LAYER_TENSORS] = {
    [LAYER_INPUT_NORM] = {"input_layernorm.weight", false, INIT_ONES},
    [LAYER_Q_WEIGHT] = {"self_attn.q_proj.weight", true, INIT_NORMAL},
    [LAYER_Q_BIAS] = {"self_attn.q_proj.bias", false, INIT_ZEROS},
    [LAYER_K_WEIGHT] = {"self_attn.k_proj.weight", true, INIT_NORMAL},
    [LAYER_K_BIAS] = {"self_attn.k_proj.bias", false, INIT_ZEROS},
    [LAYER_V_WEIGHT] = {"self_attn.v_proj.weight", true, INIT_NORMAL},
    [LAYER_V_BIAS] = {"self_attn.v_proj.bias", false, INIT_ZEROS},
    [LAYER_O_WEIGHT] = {"self_attn.o_proj.weight", true, INIT_NORMAL},
    [LAYER_POST_NORM] = {"post_attention_layernorm.weight", false, INIT_ONES},
    [LAYER_GATE_WEIGHT] = {"mlp.gate_proj.weight", true, INIT_NORMAL},
    [LAYER_UP_WEIGHT] = {"mlp.up_proj.weight", true, INIT_NORMAL},
    [LAYER_DOWN_WEIGHT] = {"mlp.down_proj.weight", true, INIT_NORMAL},
};

// Shape of a layer tensor: [out, in] for matrices, [n] for vectors.
static int layer_tensor_shape(const ModelConfig *c, LayerTensor which, int64_t shape[2]) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    switch (which) {
    case LAYER_INPUT_NORM: case LAYER_POST_NORM: shape[0] = H; return 1;
    case LAYER_Q_WEIGHT: shape[0] = QD; shape[1] = H; return 2;
    case LAYER_Q_BIAS: shape[0] = QD; return 1;
    case LAYER_K_WEIGHT: case LAYER_V_WEIGHT: shape[0] = KD; shape[1] = H; return 2;
    case LAYER_K_BIAS: case LAYER_V_BIAS: shape[0] = KD; return 1;
    case LAYER_O_WEIGHT: shape[0] = H; shape[1] = QD; return 2;
    case LAYER_GATE_WEIGHT: case LAYER_UP_WEIGHT: shape[0] = I; shape[1] = H; return 2;
    case LAYER_DOWN_WEIGHT: shape[0] = H; shape[1] = I; return 2;
    default: FAIL("bad layer tensor %d", (int)which);
    }
}

// A layer's tensors in the arena: q, k, v's weights adjacent and then their
// biases, so that one [QD + 2 KD, H] weight and one bias make all three
// projections in one GEMM (the gradients alike: one dW GEMM); gate and up
// adjacent ([2I, H], one GEMM). The input norm first: a layer's tensors are
// the arena from its offset to the next layer's (Model.grads_final).
static const LayerTensor layer_arena_order[LAYER_TENSORS] = {
    LAYER_INPUT_NORM, LAYER_Q_WEIGHT, LAYER_K_WEIGHT, LAYER_V_WEIGHT, LAYER_Q_BIAS, LAYER_K_BIAS,
    LAYER_V_BIAS, LAYER_O_WEIGHT, LAYER_POST_NORM, LAYER_GATE_WEIGHT, LAYER_UP_WEIGHT, LAYER_DOWN_WEIGHT,
};

// A tensor at the end of the table; its offset is set by place_param.
static void add_param(Model *m, const char *name, int ndim, const int64_t *shape, bool decay, ParamInit init) {
    ParamInfo *p = &m->params[m->num_params++];
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) { p->shape[i] = shape[i]; p->numel *= shape[i]; }
    p->decay = decay;
    p->init = init;
}

// Tensor i at the end of the arena.
static void place_param(Model *m, int i) {
    m->params[i].offset = m->total_params;
    m->total_params += m->params[i].numel;
}

void model_init(Model *m, const ModelConfig *config, const Backend *be, const AttentionConfig *attention,
                int loss_chunk) {
    memset(m, 0, sizeof(*m));
    m->cfg = *config;
    if (m->cfg.head_dim == 0) m->cfg.head_dim = config->hidden_size / config->num_heads;
    const ModelConfig *cfg = &m->cfg;
    m->be = be;
    if (attention) {
        m->attention = *attention;
    } else {
        m->attention.type = ATTN_DENSE;
        m->attention.block_size = 64;
    }
    m->attn = be->attention_new(&m->attention, config->num_layers, config->num_heads);
    model_set_ring(m, NULL, 1);
    m->attention_stats = xcalloc((size_t)config->num_layers, sizeof(SparseStats));
    m->loss_chunk = loss_chunk;
    int L = cfg->num_layers;
    m->params = xcalloc((size_t)(3 + L * LAYER_TENSORS), sizeof(ParamInfo));
    int64_t embed_shape[2] = {cfg->vocab_size, cfg->hidden_size}, norm_shape[1] = {cfg->hidden_size};
    add_param(m, "model.embed_tokens.weight", 2, embed_shape, true, INIT_NORMAL);
    for (int l = 0; l < L; l++) {
        for (int t = 0; t < LAYER_TENSORS; t++) {
            char name[96];
            int64_t shape[2];
            int ndim = layer_tensor_shape(cfg, (LayerTensor)t, shape);
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, layer_tensors[t].suffix);
            add_param(m, name, ndim, shape, layer_tensors[t].decay, layer_tensors[t].init);
        }
    }
    add_param(m, "model.norm.weight", 1, norm_shape, false, INIT_ONES);
    if (!cfg->tie_word_embeddings) add_param(m, "lm_head.weight", 2, embed_shape, true, INIT_NORMAL);
    place_param(m, model_embedding_param());
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LAYER_TENSORS; t++) place_param(m, model_layer_param(m, l, layer_arena_order[t]));
    for (int i = model_final_norm_param(m); i < m->num_params; i++) place_param(m, i);
    size_t bytes = (size_t)m->total_params * sizeof(float);
    m->param_mem = be->alloc(bytes);
    m->grad_mem = be->alloc(bytes);
    m->opt_count = m->total_params;
    m->arena_floats = m->total_params;
    m->master_count = m->total_params;
    m->weight_mem = be->weights_new(m->param_mem, 0, m->total_params, m->total_params);
    size_t rope_bytes = sizeof(double) * (size_t)(cfg->head_dim / 2);
    double *inv_freq = xmalloc(rope_bytes);
    m->rope_attention_factor = rope_frequencies(cfg, cfg->head_dim, inv_freq);
    m->rope_inv_freq = be->alloc(rope_bytes);
    m->loss_sum = be->alloc(sizeof(double));
    be->upload(m->rope_inv_freq, inv_freq, rope_bytes);
    free(inv_freq);
}

void model_set_attention(Model *m, const AttentionConfig *attention) {
    m->attention = *attention;
    m->be->attention_free(m->attn);
    m->attn = m->be->attention_new(attention, m->cfg.num_layers, m->cfg.num_heads);
    model_set_ring(m, m->cp, m->ring_inner);
}

void model_set_ring(Model *m, const struct Comm *cp, int inner) {
    m->cp = m->be->attention_set_ring(m->attn, cp, inner) ? cp : NULL;
    m->ring_inner = inner;
}

void model_attention_stats_begin(Model *m) {
    m->collect_attention_stats = true;
    memset(m->attention_stats, 0, sizeof(SparseStats) * (size_t)m->cfg.num_layers);
}

SparseStats *model_attention_stats_end(Model *m) {
    if (!m->collect_attention_stats) return NULL;
    m->collect_attention_stats = false;
    return m->attention_stats;
}

// *kept = a copy of doc_starts [count] (none when NULL), *kept_count its length.
static void keep_starts(int64_t **kept, int64_t *kept_count, const int64_t *doc_starts, int64_t count) {
    *kept_count = doc_starts ? count : 0;
    *kept = xrealloc(*kept, (size_t)(*kept_count + 1) * sizeof(int64_t));
    if (*kept_count) memcpy(*kept, doc_starts, (size_t)count * sizeof(int64_t));
}

void model_set_documents(Model *m, const int64_t *doc_starts, int64_t count) {
    keep_starts(&m->doc_starts, &m->doc_count, doc_starts, count);
}

void model_set_rope_documents(Model *m, const int64_t *doc_starts, int64_t count) {
    keep_starts(&m->rope_doc_starts, &m->rope_doc_count, doc_starts, count);
}

int64_t model_shard_size(const Model *m, int shards) { return (m->total_params + shards - 1) / shards; }

void model_shard_optimizer(Model *m, const struct Comm *over) {
    CHECK(!m->adam_m, "model_shard_optimizer after the moments were allocated");
    const Backend *be = m->be;
    int shard = over->rank, shards = over->size;
    m->opt_comm = over;
    int64_t size = model_shard_size(m, shards);
    m->opt_begin = size * shard < m->total_params ? size * shard : m->total_params;
    m->opt_count = m->total_params - m->opt_begin < size ? m->total_params - m->opt_begin : size;
    // The arenas again (zero-filled; the weights are set later): gradients and
    // compute copy with room for the last shard's padding, the master this
    // rank's shard (or, when the backend keeps it whole, padded as well).
    be->weights_free(m->weight_mem, m->param_mem);
    be->free(m->param_mem);
    be->free(m->grad_mem);
    m->arena_floats = size * shards;
    m->master_begin = be->shards_masters ? size * shard : 0;
    m->master_count = be->shards_masters ? size : m->arena_floats;
    m->param_mem = be->alloc(sizeof(float) * (size_t)m->master_count);
    m->grad_mem = be->alloc(sizeof(float) * (size_t)m->arena_floats);
    m->weight_mem = be->weights_new(m->param_mem, m->master_begin, m->master_count, m->arena_floats);
}

void model_alloc_optimizer(Model *m) {
    size_t bytes = (size_t)(m->opt_count > 0 ? m->opt_count : 1) * sizeof(float);
    if (!m->adam_m) m->adam_m = m->be->alloc(bytes);
    if (!m->adam_v) m->adam_v = m->be->alloc(bytes);
}

static void free_activations(Model *m) {
    const Backend *be = m->be;
    if (!m->max_tokens) return;
    be->free(m->activation_arena);
    m->activation_arena = NULL;
    be->free(m->tokens);
    be->free(m->targets);
    be->free(m->positions);
    be->free(m->rope_positions);
    free(m->layers);
    m->layers = NULL;
    m->max_tokens = 0;
}

void model_free(Model *m) {
    const Backend *be = m->be;
    free_activations(m);
    be->weights_free(m->weight_mem, m->param_mem);
    be->free(m->param_mem);
    be->free(m->grad_mem);
    be->free(m->rope_inv_freq);
    be->free(m->loss_sum);
    if (m->adam_m) be->free(m->adam_m);
    if (m->adam_v) be->free(m->adam_v);
    free(m->params);
    be->attention_free(m->attn);
    free(m->attention_stats);
    free(m->doc_starts);
    free(m->rope_doc_starts);
    memset(m, 0, sizeof(*m));
}

int model_embedding_param(void) { return 0; }
int model_layer_param(const Model *m, int layer, LayerTensor which) {
    CHECK(layer >= 0 && layer < m->cfg.num_layers, "layer %d out of range", layer);
    return 1 + layer * LAYER_TENSORS + (int)which;
}
int model_final_norm_param(const Model *m) { return 1 + m->cfg.num_layers * LAYER_TENSORS; }
int model_head_param(const Model *m) {
    return m->cfg.tie_word_embeddings ? model_embedding_param() : model_final_norm_param(m) + 1;
}
int model_param_index(const Model *m, const char *name) {
    for (int i = 0; i < m->num_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}
float *model_tensor(const Model *m, float *arena, int index) { return arena + m->params[index].offset; }
Weight *model_weight_at(const Model *m, int64_t offset) {
    return (Weight *)((char *)m->weight_mem + (size_t)offset * m->be->weight_bytes);
}
Weight *model_weight(const Model *m, int index) { return model_weight_at(m, m->params[index].offset); }

void model_set_params(Model *m, int64_t offset, const float *host, int64_t n) {
    int64_t end = m->master_begin + m->master_count;
    int64_t lo = offset > m->master_begin ? offset : m->master_begin, hi = offset + n < end ? offset + n : end;
    if (lo < hi)
        m->be->upload(m->param_mem + (lo - m->master_begin), host + (lo - offset), sizeof(float) * (size_t)(hi - lo));
}

void model_weights_changed(Model *m) {
    m->be->weights_refresh(m->weight_mem, m->param_mem, m->master_begin, m->master_count);
    if (m->opt_comm) m->be->weights_allgather(m->opt_comm, m->weight_mem, model_shard_size(m, m->opt_comm->size));
}

void model_gather_shards(const Model *m, const float *shard, float *host) {
    const Comm *over = m->opt_comm;
    int64_t size = model_shard_size(m, over->size);
    float *send = xcalloc((size_t)size, sizeof(float));
    float *recv = over->rank == 0 ? xmalloc(sizeof(float) * (size_t)(size * over->size)) : NULL;
    m->be->download(send, shard, sizeof(float) * (size_t)m->opt_count);
    comm_gather(over, send, recv, size, DT_FLOAT, 0);
    if (recv) memcpy(host, recv, sizeof(float) * (size_t)m->total_params);
    free(recv);
    free(send);
}

void model_gather_params(const Model *m, float *host) {
    if (model_master_sharded(m)) model_gather_shards(m, m->param_mem, host);
    else m->be->download(host, m->param_mem, sizeof(float) * (size_t)m->total_params);
}

// Tensor i's elements [first, first + n) into out: element j of a normal
// tensor is init_std * rng_normal_at(rng_hash(seed, i), j), on every thread.
static void init_tensor_piece(const Model *m, int i, uint64_t seed, int64_t first, int64_t n, float *out) {
    const ParamInfo *p = &m->params[i];
    if (p->init == INIT_NORMAL) {
        rng_normal_fill(out, n, rng_hash(seed, (uint64_t)i), (uint64_t)first, m->cfg.init_std);
        return;
    }
    const float value = p->init == INIT_ONES ? 1.0f : 0.0f;
    for (int64_t j = 0; j < n; j++) out[j] = value;
}

void model_init_weights(Model *m, uint64_t seed) {
    // In pieces of 16 MiB with progress (about 2 GiB at 0.5B): on a host
    // backend straight into the master (which it holds whole), on a GPU
    // through a host buffer.
    const int64_t piece = (int64_t)1 << 22;
    const bool in_place = !m->be->on_gpu;
    float *host = in_place ? NULL : xmalloc(sizeof(float) * (size_t)(m->total_params < piece ? m->total_params : piece));
    Progress progress;
    progress_begin(&progress, "initialising the weights", (int64_t)sizeof(float) * m->total_params, "MiB", 1 << 20);
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        for (int64_t first = 0; first < p->numel; first += piece) {
            int64_t n = p->numel - first < piece ? p->numel - first : piece;
            init_tensor_piece(m, i, seed, first, n, in_place ? m->param_mem + p->offset + first : host);
            if (!in_place) model_set_params(m, p->offset + first, host, n);
            progress_add(&progress, (int64_t)sizeof(float) * n);
        }
    }
    progress_end(&progress);
    free(host);
    model_weights_changed(m);
}

// Elements of (part of) the activation arena: Act tensors and fp32 statistics.
typedef struct {
    int64_t act, stat;
} ArenaCount;

// Every Act tensor and the statistics as a whole take a multiple of
// ARENA_ALIGN elements, so that each starts 16-byte aligned whatever the
// shapes (the CUDA backend's cuBLASLt matmuls need it).
#define ARENA_ALIGN 64
static int64_t arena_span(int64_t elements) { return (elements + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

int64_t model_mlp_chunk_rows(int mlp_chunk, RecomputePolicy recompute, int64_t T) {
    if (mlp_chunk <= 0 || (recompute == RECOMPUTE_NONE && T <= mlp_chunk)) return 0;
    return mlp_chunk < T ? mlp_chunk : T;
}

// The attention output and its lse of one layer.
static ArenaCount attention_out_count(const ModelConfig *c, int64_t T) {
    return (ArenaCount){arena_span(T * (int64_t)c->num_heads * c->head_dim), (int64_t)c->num_heads * T};
}

// One layer's saved activations, excluding x_in (and, without attention_out,
// att and lse); its gate_up and act of mlp_rows tokens (0: the MLP's chunk
// buffers are shared).
static ArenaCount layer_act_count(const ModelConfig *c, int64_t T, int64_t mlp_rows, bool attention_out) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    ArenaCount att = attention_out ? attention_out_count(c, T) : (ArenaCount){0, 0};
    return (ArenaCount){3 * arena_span(T * H) + arena_span(T * QD) + 2 * arena_span(T * KD) +
                            arena_span(mlp_rows * 2 * I) + arena_span(mlp_rows * I) + att.act,
                        2 * T + att.stat};
}

int64_t model_loss_chunk_rows(int loss_chunk, int64_t T) { return loss_chunk < T ? loss_chunk : T; }

// The backward buffers (dx, dh; qkv with datt; dq, dk, dv; dgate_up, dact
// of mlp_rows tokens) and the loss chunk: Act elements (the backward keeps
// no statistics).
static int64_t grad_act_count(const ModelConfig *c, int loss_chunk, int64_t T, int64_t mlp_rows) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    return 2 * arena_span(T * H) + arena_span(T * (QD + 2 * KD)) + arena_span(T * QD) + 2 * arena_span(T * KD) +
           arena_span(mlp_rows * 2 * I) + arena_span(mlp_rows * I) +
           arena_span(model_loss_chunk_rows(loss_chunk, T) * c->vocab_size);
}

// With the MLP in chunks of C tokens, one shared gate_up [C, 2I] and act
// [C, I] in place of every kept layer's [T, 2I] and [T, I], and the
// gradients' [C, 2I] and [C, I].
// Under a recompute policy the layers share one set of the recomputed
// activations (selective: each keeping its own attention output and lse).
static ArenaCount activation_count(const ModelConfig *c, RecomputePolicy recompute, int loss_chunk, int mlp_chunk,
                                   int64_t T) {
    const int64_t C = model_mlp_chunk_rows(mlp_chunk, recompute, T);
    const int64_t L = c->num_layers;
    ArenaCount layers;
    if (recompute == RECOMPUTE_NONE) {
        ArenaCount layer = layer_act_count(c, T, C ? 0 : T, true);
        layers = (ArenaCount){L * layer.act, L * layer.stat};
    } else {
        const bool selective = recompute == RECOMPUTE_SELECTIVE;
        ArenaCount shared = layer_act_count(c, T, C ? 0 : T, !selective), att = attention_out_count(c, T);
        layers = selective ? (ArenaCount){shared.act + L * att.act, shared.stat + L * att.stat} : shared;
    }
    return (ArenaCount){arena_span(T * (int64_t)c->hidden_size) * (L + 2) + layers.act +
                            grad_act_count(c, loss_chunk, T, C ? C : T) + arena_span(C * 2 * c->intermediate_size) +
                            arena_span(C * c->intermediate_size),
                        arena_span(T + layers.stat)};
}

size_t model_activation_arena_bytes(const ModelConfig *c, RecomputePolicy recompute, int loss_chunk, int mlp_chunk,
                                    int64_t T, size_t act_bytes) {
    ArenaCount n = activation_count(c, recompute, loss_chunk, mlp_chunk, T);
    return (size_t)n.act * act_bytes + (size_t)n.stat * sizeof(float);
}

size_t model_activation_bytes(const Model *m, int64_t T) {
    return model_activation_arena_bytes(&m->cfg, m->recompute, m->loss_chunk, m->mlp_chunk, T, m->be->act_bytes);
}

Act *model_act_at(const Model *m, Act *base, int64_t elements) {
    return (Act *)((char *)base + (size_t)elements * m->be->act_bytes);
}

static void zero_act(const Model *m, Act *x, int64_t n) { m->be->zero(x, m->be->act_bytes * (size_t)n); }
// Elements from dq to the end of dv [T, KD] (dq, dk, dv carved in turn for the arena's tokens).
static int64_t dqkv_span(const Model *m, int64_t T, int64_t KD) {
    return ((const char *)m->dv - (const char *)m->dq) / (int64_t)m->be->act_bytes + T * KD;
}

// Carves the activation arena: statistics from stat on, Act tensors from act on.
typedef struct {
    const Model *m;
    float *stat;
    Act *act;
} ArenaCursor;

static float *take_stat(ArenaCursor *cur, int64_t count) {
    float *p = cur->stat;
    cur->stat += count;
    return p;
}

static Act *take_act(ArenaCursor *cur, int64_t count) {
    Act *p = cur->act;
    cur->act = model_act_at(cur->m, p, arena_span(count));
    return p;
}

static void carve_attention_out(LayerActs *a, ArenaCursor *cur, const ModelConfig *c, int64_t T) {
    a->att = take_act(cur, T * c->num_heads * c->head_dim);
    a->lse = take_stat(cur, (int64_t)c->num_heads * T);
}

// A layer's activations but x_in (layer_act_count), att and lse only with attention_out.
static void carve_layer(LayerActs *a, ArenaCursor *cur, const ModelConfig *c, int64_t T, int64_t mlp_rows,
                        bool attention_out) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    a->rstd_attn = take_stat(cur, T);
    a->h_attn = take_act(cur, T * H);
    a->q = take_act(cur, T * QD);
    a->k = take_act(cur, T * KD);
    a->v = take_act(cur, T * KD);
    if (attention_out) carve_attention_out(a, cur, c, T);
    a->x_mid = take_act(cur, T * H);
    a->rstd_mlp = take_stat(cur, T);
    a->h_mlp = take_act(cur, T * H);
    if (!mlp_rows) return;
    a->gate_up = take_act(cur, mlp_rows * 2 * I);
    a->act = take_act(cur, mlp_rows * I);
}

// Carve the activation arena for T tokens under m's policy (at least one
// token, so that a cp rank holding none still has buffers for the ring).
static void carve_activations(Model *m, int64_t T) {
    if (T < 1) T = 1;
    free_activations(m);
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    const bool shared = m->recompute != RECOMPUTE_NONE, selective = m->recompute == RECOMPUTE_SELECTIVE;
    // The fp32 statistics first (padded to ARENA_ALIGN), then the Act tensors.
    ArenaCount count = activation_count(c, m->recompute, m->loss_chunk, m->mlp_chunk, T);
    const int64_t C = m->mlp_chunk_rows = model_mlp_chunk_rows(m->mlp_chunk, m->recompute, T);
    size_t bytes = model_activation_bytes(m, T);
    m->activation_arena = be->alloc(bytes);
    float *stats = m->activation_arena;
    Act *acts = (Act *)(stats + count.stat);
    ArenaCursor cur = {m, stats, acts};
    m->layers = xcalloc((size_t)c->num_layers, sizeof(LayerActs));
    for (int l = 0; l < c->num_layers; l++) m->layers[l].x_in = take_act(&cur, T * H);
    m->x_final = take_act(&cur, T * H);
    m->rstd_final = take_stat(&cur, T);
    m->h_final = take_act(&cur, T * H);
    if (shared) carve_layer(&m->scratch, &cur, c, T, C ? 0 : T, !selective);
    else for (int l = 0; l < c->num_layers; l++) carve_layer(&m->layers[l], &cur, c, T, C ? 0 : T, true);
    if (selective)
        for (int l = 0; l < c->num_layers; l++) carve_attention_out(&m->layers[l], &cur, c, T);
    if (C) {  // one set of chunk buffers that every layer's MLP uses in turn
        LayerActs chunk;
        carve_layer(&chunk, &cur, c, 0, C, false);
        for (int l = 0; l < c->num_layers; l++) {
            LayerActs *a = shared ? &m->scratch : &m->layers[l];
            a->gate_up = chunk.gate_up, a->act = chunk.act;
        }
    }
    m->dx = take_act(&cur, T * H);
    m->dh = take_act(&cur, T * H);
    m->qkv = m->datt = take_act(&cur, T * (QD + 2 * KD));
    m->dq = take_act(&cur, T * QD);   // dq, dk, dv adjacent: dqkv_span
    m->dk = take_act(&cur, T * KD);
    m->dv = take_act(&cur, T * KD);
    m->dgate_up = take_act(&cur, (C ? C : T) * 2 * I);
    m->dact = take_act(&cur, (C ? C : T) * I);
    m->logits = take_act(&cur, model_loss_chunk_rows(m->loss_chunk, T) * c->vocab_size);
    CHECK(cur.stat <= (float *)acts && (char *)cur.act == (char *)m->activation_arena + bytes,
          "activation arena miscounted");
    m->tokens = be->alloc(sizeof(int32_t) * (size_t)T);
    m->targets = be->alloc(sizeof(int32_t) * (size_t)T);
    m->positions = be->alloc(sizeof(int64_t) * (size_t)T);
    m->rope_positions = be->alloc(sizeof(int64_t) * (size_t)T);
    m->max_tokens = T;
}

void model_set_activations(Model *m, RecomputePolicy recompute, int mlp_chunk, int64_t tokens) {
    CHECK(recompute == RECOMPUTE_NONE || recompute == RECOMPUTE_SELECTIVE || recompute == RECOMPUTE_FULL,
          "model_set_activations: recompute policy %d is not none, selective or full", (int)recompute);
    m->recompute = recompute;
    m->mlp_chunk = mlp_chunk;
    carve_activations(m, tokens);
}

// The activations layer l uses: its own, or the shared scratch set with
// its x_in (selective: and its att and lse).
static LayerActs *layer_acts(Model *m, int l) {
    LayerActs *a = &m->layers[l];
    if (m->recompute == RECOMPUTE_NONE) return a;
    m->scratch.x_in = a->x_in;
    if (m->recompute == RECOMPUTE_SELECTIVE) m->scratch.att = a->att, m->scratch.lse = a->lse;
    return &m->scratch;
}

static AttnShape attn_shape(const Model *m, int64_t T) {
    const ModelConfig *c = &m->cfg;
    AttnShape s = {T, T, c->num_heads, c->num_kv_heads, c->head_dim, m->attention.block_size,
                   (float)(1.0 / sqrt((double)c->head_dim)), m->doc_count ? m->doc_starts : NULL,
                   m->doc_count, NULL};
    return s;
}

// Where layer l's output goes and the norm that reads it: the next layer's
// x_in with its input norm (h_attn, rstd_attn: its own, or the scratch set's
// when recomputing), or after the last layer x_final and the final norm.
typedef struct {
    Act *x, *h;
    float *rstd;
    const Weight *weight;
} NormedOutput;

static NormedOutput layer_output(const Model *m, int l) {
    if (l + 1 == m->cfg.num_layers)
        return (NormedOutput){m->x_final, m->h_final, m->rstd_final, model_weight(m, model_final_norm_param(m))};
    const LayerActs *next = m->recompute != RECOMPUTE_NONE ? &m->scratch : &m->layers[l + 1];
    return (NormedOutput){m->layers[l + 1].x_in, next->h_attn, next->rstd_attn,
                          model_weight(m, model_layer_param(m, l + 1, LAYER_INPUT_NORM))};
}

// The input norm of layer l: a->h_attn, a->rstd_attn from a->x_in.
static void input_norm(Model *m, int l, LayerActs *a, int64_t T) {
    m->be->rmsnorm_forward(a->h_attn, a->rstd_attn, a->x_in, model_weight(m, model_layer_param(m, l, LAYER_INPUT_NORM)),
                           T, m->cfg.hidden_size, (float)m->cfg.rms_norm_eps);
}

// The MLP's gate_up [n, 2I] (one GEMM: gate's and up's weights are adjacent,
// [2I, H]) and act [n, I] of tokens [t0, t0 + n) (h_mlp's rows) into a's
// buffers from their first row.
static void mlp_up(Model *m, int l, LayerActs *a, int64_t t0, int64_t n) {
    const Backend *be = m->be;
    const int H = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    const Act *h = model_act_at(m, a->h_mlp, t0 * H);
    be->matmul_forward(a->gate_up, h, model_weight(m, model_layer_param(m, l, LAYER_GATE_WEIGHT)), NULL, n, H, 2 * I);
    be->swiglu_forward(a->act, a->gate_up, n, I);
}

// What one call of layer_forward runs: the forward pass, or a recomputation
// of what the backward reads (recompute_pass).
typedef struct {
    bool input_norm;   // take the input norm (else the previous layer's fused residual + norm wrote a->h_attn)
    bool attention;    // run attention into a->att, a->lse (else they are kept from the forward pass)
    bool plan_sparse;  // sparse attention: estimate the layer's pattern (else reuse its last: the forward's)
    bool output;       // the MLP's down projection and the residual + next norm into the output
} LayerPass;

static const LayerPass forward_pass = {.attention = true, .plan_sparse = true, .output = true};

// The recomputation before layer l's backward: under full also attention
// (on the forward's sparse pattern), under selective not.
static LayerPass recompute_pass(const Model *m) {
    return (LayerPass){.input_norm = true, .attention = m->recompute == RECOMPUTE_FULL};
}

// One decoder layer on a->x_in, whose input norm is in a->h_attn unless
// pass->input_norm; with pass->output the output, its residual added and its
// norm taken in one op, goes to out (else out is unused).
static void layer_forward(Model *m, int l, LayerActs *a, const LayerPass *pass, const NormedOutput *out,
                          int64_t T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int H = c->hidden_size, I = c->intermediate_size;
    int QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
#define W(which) model_weight(m, model_layer_param(m, l, which))
    if (pass->input_norm) input_norm(m, l, a, T);
    // q|k|v in one GEMM (their weights and biases adjacent: [QD + 2 KD, H],
    // [QD + 2 KD]), split by RoPE into a->q, a->k, a->v.
    be->matmul_forward(m->qkv, a->h_attn, W(LAYER_Q_WEIGHT), W(LAYER_Q_BIAS), T, H, QD + 2 * KD);
    be->rope(m->qkv, a->q, a->k, a->v, c->num_heads, c->num_kv_heads, m->rope_positions, T, c->head_dim,
             m->rope_inv_freq, m->rope_attention_factor, 0);
    AttnShape s = attn_shape(m, T);
    if (pass->attention)
        be->attention_forward(m->attn, l, pass->plan_sparse, &s, a->q, a->k, a->v, m->positions, a->att, a->lse,
                              m->collect_attention_stats ? &m->attention_stats[l] : NULL);
    be->matmul_forward(a->x_mid, a->att, W(LAYER_O_WEIGHT), NULL, T, QD, H);
    be->residual_rmsnorm_forward(a->h_mlp, a->rstd_mlp, a->x_mid, a->x_in, W(LAYER_POST_NORM), T, H,
                                 (float)c->rms_norm_eps);
    // The MLP whole (its gate_up and act kept for the backward), or in
    // chunks of tokens (the backward recomputes them chunk by chunk).
    const int64_t rows = m->mlp_chunk_rows ? m->mlp_chunk_rows : T;
    if (!m->mlp_chunk_rows) mlp_up(m, l, a, 0, T);
    if (!pass->output) return;
    for (int64_t t0 = 0; t0 < T; t0 += rows) {
        const int64_t n = T - t0 < rows ? T - t0 : rows;
        if (m->mlp_chunk_rows) mlp_up(m, l, a, t0, n);
        be->matmul_forward(model_act_at(m, out->x, t0 * H), a->act, W(LAYER_DOWN_WEIGHT), NULL, n, I, H);
    }
    be->residual_rmsnorm_forward(out->h, out->rstd, out->x, a->x_mid, out->weight, T, H, (float)c->rms_norm_eps);
#undef W
}

// The dW GEMMs of a second stream joined (Backend.weight_grads_join): before
// a buffer they read is written again, and before gradients are final.
static void join_weight_grads(const Model *m) {
    if (m->be->weight_grads_join) m->be->weight_grads_join();
}

// Backward of layer l: m->dx holds d(layer output) on entry, d(x_in) on exit.
static void layer_backward(Model *m, int l, LayerActs *a, int64_t T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int H = c->hidden_size, I = c->intermediate_size;
    int QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
#define W(which) model_weight(m, model_layer_param(m, l, which))
#define G(which) model_tensor(m, m->grad_mem, model_layer_param(m, l, which))
    // MLP: out = x_mid + down(silu(gate(h)) * up(h)), h = norm(x_mid); in
    // chunks of tokens, each recomputing its gate_up and act first.
    // The first op to fill a buffer writes it (nothing zeroed): each chunk's
    // rows of dh are written by the fused gate|up's dinp.
    const int64_t rows = m->mlp_chunk_rows ? m->mlp_chunk_rows : T;
    for (int64_t t0 = 0; t0 < T; t0 += rows) {
        const int64_t n = T - t0 < rows ? T - t0 : rows;
        Act *dx = model_act_at(m, m->dx, t0 * H), *dh = model_act_at(m, m->dh, t0 * H), *h = model_act_at(m, a->h_mlp, t0 * H);
        if (m->mlp_chunk_rows) mlp_up(m, l, a, t0, n);
        be->matmul_backward(m->dact, G(LAYER_DOWN_WEIGHT), dx, a->act, W(LAYER_DOWN_WEIGHT), n, I, H);
        be->swiglu_backward(m->dgate_up, m->dact, a->gate_up, n, I);
        be->matmul_backward(dh, G(LAYER_GATE_WEIGHT), m->dgate_up, h, W(LAYER_GATE_WEIGHT), n, H, 2 * I);
        join_weight_grads(m);   // the next chunk rewrites act and dgate_up, the norm below dx
    }
    // d(x_mid) = d(out) (the residual, already in dx) + the norm's gradient, added in place.
    be->rmsnorm_backward(m->dx, G(LAYER_POST_NORM), m->dh, a->x_mid, W(LAYER_POST_NORM), a->rstd_mlp, T, H);
    // attention: x_mid = x_in + o_proj(attention(rope(q), rope(k), v)), from h = norm(x_in)
    be->matmul_backward(m->datt, G(LAYER_O_WEIGHT), m->dx, a->att, W(LAYER_O_WEIGHT), T, QD, H);
    AttnShape s = attn_shape(m, T);
    // The attention backward adds into dq, dk, dv: zeroed at once (adjacent in the arena).
    zero_act(m, m->dq, dqkv_span(m, T, KD));
    be->attention_backward(m->attn, l, &s, a->q, a->k, a->v, m->positions, a->att, a->lse, m->datt,
                           m->dq, m->dk, m->dv);
    // RoPE's backward joins dq, dk, dv into d(q|k|v) (over datt, read by
    // now): one dX and one dW GEMM and one bias sum for all three.
    be->rope(m->qkv, m->dq, m->dk, m->dv, c->num_heads, c->num_kv_heads, m->rope_positions, T, c->head_dim,
             m->rope_inv_freq, m->rope_attention_factor, 1);
    be->matmul_backward(m->dh, G(LAYER_Q_WEIGHT), m->qkv, a->h_attn, W(LAYER_Q_WEIGHT), T, H, QD + 2 * KD);
    be->bias_backward(G(LAYER_Q_BIAS), m->qkv, QD + 2 * KD, T);
    join_weight_grads(m);   // the norm rewrites dx (the o projection's dW reads it); the layer's gradients final
    be->rmsnorm_backward(m->dx, G(LAYER_INPUT_NORM), m->dh, a->x_in, W(LAYER_INPUT_NORM), a->rstd_attn, T, H);
#undef W
#undef G
}

// Embedding, every layer, final norm (the last layer's fused residual +
// norm): h_final [T, H] ready for the head.
static void model_forward(Model *m, const int32_t *tokens, const int64_t *positions, int64_t T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    model_mark_phase(m, PHASE_FORWARD);
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            fail("token %d at position %lld is outside the vocabulary [0, %d)", tokens[t], (long long)t, c->vocab_size);
    if (T > m->max_tokens || !m->max_tokens) carve_activations(m, T);
    int64_t *pos = xmalloc(2 * sizeof(int64_t) * (size_t)T), *rope_pos = pos + T;
    for (int64_t t = 0; t < T; t++) pos[t] = positions ? positions[t] : t;
    be->upload(m->positions, pos, sizeof(int64_t) * (size_t)T);
    be->attention_sequence(m->attn, pos, T);
    rope_document_positions(pos, T, m->rope_doc_starts, m->rope_doc_count, rope_pos);
    be->upload(m->rope_positions, rope_pos, sizeof(int64_t) * (size_t)T);
    free(pos);
    be->upload(m->tokens, tokens, sizeof(int32_t) * (size_t)T);
    be->embedding_forward(m->layers[0].x_in, m->tokens, model_weight(m, model_embedding_param()), T, c->hidden_size);
    input_norm(m, 0, layer_acts(m, 0), T);
    for (int l = 0; l < c->num_layers; l++) {
        NormedOutput out = layer_output(m, l);
        layer_forward(m, l, layer_acts(m, l), &forward_pass, &out, T);
        progress_add(m->progress, 1);
    }
}

// Fused LM head + cross entropy over h_final, one chunk of tokens at a time.
// With backward, dh = d(h_final) and the head's gradient accumulates.
static double head_loss(Model *m, const int32_t *targets, int64_t T, float grad_scale, bool backward) {
    const Backend *be = m->be;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    be->upload(m->targets, targets, sizeof(int32_t) * (size_t)T);
    const Weight *head = model_weight(m, model_head_param(m));
    float *dhead = model_tensor(m, m->grad_mem, model_head_param(m));
    model_mark_phase(m, PHASE_LOSS);
    be->zero(m->loss_sum, sizeof(double));
    for (int64_t c0 = 0; c0 < T; c0 += m->loss_chunk) {
        int64_t n = T - c0 < m->loss_chunk ? T - c0 : m->loss_chunk;
        Act *h = model_act_at(m, m->h_final, c0 * H);
        be->matmul_forward(m->logits, h, head, NULL, n, H, V);
        be->cross_entropy(m->logits, m->targets + c0, n, V, grad_scale, m->loss_sum);
        if (backward) {   // each chunk writes its rows of dh
            be->matmul_backward(model_act_at(m, m->dh, c0 * H), dhead, m->logits, h, head, n, H, V);
            join_weight_grads(m);   // the next chunk rewrites the logits
        }
    }
    double loss;   // read once for the whole sequence
    be->download(&loss, m->loss_sum, sizeof(loss));
    return loss;
}

double model_loss(Model *m, const int32_t *tokens, const int32_t *targets, const int64_t *positions,
                  int64_t T) {
    model_forward(m, tokens, positions, T);
    return head_loss(m, targets, T, 0.0f, false);
}

void model_mark_phase(const Model *m, ProfilePhase phase) {
    if (m->be->profile_phase) m->be->profile_phase(phase);
}

void model_profile_begin(Model *m) { m->be = profile_begin(m->be); }
void model_profile_end(Model *m, Profile *out) { m->be = profile_end(out); }

// The arena from offset on is final for this backward pass (Model.grads_final).
static void grads_final(Model *m, int64_t offset) {
    if (m->grads_final) m->grads_final(m->grads_final_ctx, offset);
}

double model_forward_backward(Model *m, const int32_t *tokens, const int32_t *targets,
                              const int64_t *positions, int64_t T, float grad_scale) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int H = c->hidden_size;
    model_forward(m, tokens, positions, T);
    double loss = head_loss(m, targets, T, grad_scale, true);
    model_mark_phase(m, PHASE_BACKWARD);
    zero_act(m, m->dx, T * H);
    int fn = model_final_norm_param(m);
    be->rmsnorm_backward(m->dx, model_tensor(m, m->grad_mem, fn), m->dh, m->x_final, model_weight(m, fn), m->rstd_final,
                         T, H);
    grads_final(m, m->params[fn].offset);
    const LayerPass recompute = recompute_pass(m);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        LayerActs *a = layer_acts(m, l);
        if (m->recompute != RECOMPUTE_NONE) {
            model_mark_phase(m, PHASE_RECOMPUTE);
            layer_forward(m, l, a, &recompute, NULL, T);
            model_mark_phase(m, PHASE_BACKWARD);
        }
        layer_backward(m, l, a, T);
        grads_final(m, m->params[model_layer_param(m, l, LAYER_INPUT_NORM)].offset);
        progress_add(m->progress, 1);
    }
    be->embedding_backward(model_tensor(m, m->grad_mem, model_embedding_param()), m->tokens, m->dx, T, H);
    grads_final(m, 0);
    return loss;
}

void model_logits_range(Model *m, const int32_t *tokens, const int64_t *positions, int64_t T, int64_t first,
                        int64_t count, float *logits_host) {
    const ModelConfig *c = &m->cfg;
    int H = c->hidden_size, V = c->vocab_size;
    CHECK(first >= 0 && count >= 0 && first + count <= T, "logits of [%lld, %lld) of %lld tokens", (long long)first,
          (long long)(first + count), (long long)T);
    model_forward(m, tokens, positions, T);
    const Weight *head = model_weight(m, model_head_param(m));
    for (int64_t c0 = 0; c0 < count; c0 += m->loss_chunk) {
        int64_t n = count - c0 < m->loss_chunk ? count - c0 : m->loss_chunk;
        m->be->matmul_forward(m->logits, model_act_at(m, m->h_final, (first + c0) * H), head, NULL, n, H, V);
        m->be->act_to_host(logits_host + c0 * V, m->logits, n * V);
    }
}

void model_logits(Model *m, const int32_t *tokens, const int64_t *positions, int64_t T, float *logits_host) {
    model_logits_range(m, tokens, positions, T, 0, T, logits_host);
}
