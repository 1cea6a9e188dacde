// decode.c: generation with a KV cache (decode.h): the decoder layers of
// model.c's graph on a chunk of new tokens, their keys and values written
// into the cache and their queries attending to all of it, through the
// backend's ops (the CPU's and the CUDA one's alike).
#include "decode.h"

#include <math.h>
#include <stdlib.h>

void decoder_init(Decoder *d, Model *m, int64_t capacity, int64_t chunk) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    CHECK(capacity >= 1 && chunk >= 1, "decoder of %lld tokens, %lld per step", (long long)capacity,
          (long long)chunk);
    if (chunk > capacity) chunk = capacity;
    int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
    *d = (Decoder){.m = m, .capacity = capacity, .chunk = chunk};
    d->k_cache = xcalloc((size_t)c->num_layers, sizeof(Act *));
    d->v_cache = xcalloc((size_t)c->num_layers, sizeof(Act *));
    for (int l = 0; l < c->num_layers; l++) {
        d->k_cache[l] = be->alloc(be->act_bytes * (size_t)(capacity * KD));
        d->v_cache[l] = be->alloc(be->act_bytes * (size_t)(capacity * KD));
    }
    int64_t *pos = xmalloc(sizeof(int64_t) * (size_t)capacity);
    for (int64_t t = 0; t < capacity; t++) pos[t] = t;
    d->positions = be->alloc(sizeof(int64_t) * (size_t)capacity);
    be->upload(d->positions, pos, sizeof(int64_t) * (size_t)capacity);
    free(pos);
    d->tokens = be->alloc(sizeof(int32_t) * (size_t)chunk);
    Act **acts[] = {&d->x, &d->h, &d->out, &d->q, &d->att, &d->qkv, &d->gate_up, &d->act};
    int64_t widths[] = {H, H, H, QD, QD, QD + 2 * KD, 2 * I, I};
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
        *acts[i] = be->alloc(be->act_bytes * (size_t)(chunk * widths[i]));
    d->logits = be->alloc(be->act_bytes * (size_t)V);
    d->rstd = be->alloc(sizeof(float) * (size_t)chunk);
    d->lse = be->alloc(sizeof(float) * (size_t)(chunk * c->num_heads));
}

void decoder_free(Decoder *d) {
    const Backend *be = d->m->be;
    for (int l = 0; l < d->m->cfg.num_layers; l++) {
        be->free(d->k_cache[l]);
        be->free(d->v_cache[l]);
    }
    free(d->k_cache);
    free(d->v_cache);
    Act *acts[] = {d->x, d->h, d->out, d->q, d->att, d->qkv, d->gate_up, d->act, d->logits};
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) be->free(acts[i]);
    be->free(d->positions);
    be->free(d->tokens);
    be->free(d->rstd);
    be->free(d->lse);
    *d = (Decoder){0};
}

// Layer l on the chunk's T tokens at positions p .. p + T - 1: d->x [T, H]
// the residual stream entering it, d->h its input norm; on exit d->x is the
// layer's output and d->h that normed by `next_norm` (the next layer's input
// norm, or the final norm). Keys and values go to cache rows p .. p + T - 1.
static void decoder_layer(Decoder *d, int l, int64_t p, int64_t T, const Weight *next_norm) {
    Model *m = d->m;
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int H = c->hidden_size, I = c->intermediate_size;
    int QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
    float eps = (float)c->rms_norm_eps;
#define W(which) model_weight(m, model_layer_param(m, l, which))
    Act *k = model_act_at(m, d->k_cache[l], p * KD), *v = model_act_at(m, d->v_cache[l], p * KD);
    const int64_t *pos = d->positions + p;
    be->matmul_forward(d->qkv, d->h, W(LAYER_Q_WEIGHT), W(LAYER_Q_BIAS), T, H, QD + 2 * KD);
    be->rope(d->qkv, d->q, k, v, c->num_heads, c->num_kv_heads, pos, T, c->head_dim, m->rope_inv_freq,
             m->rope_attention_factor, 0);
    // [T, Hq, D] queries against the cache's p + T keys.
    AttnShape s = {T, p + T, c->num_heads, c->num_kv_heads, c->head_dim, m->attention.block_size,
                   (float)(1.0 / sqrt((double)c->head_dim)), NULL, 0, NULL};
    be->attention_cached(m->attn, &s, d->q, pos, d->k_cache[l], d->v_cache[l], d->positions, d->att, d->lse);
    be->matmul_forward(d->out, d->att, W(LAYER_O_WEIGHT), NULL, T, QD, H);
    be->residual_rmsnorm_forward(d->h, d->rstd, d->x, d->out, W(LAYER_POST_NORM), T, H, eps);
    be->matmul_forward(d->gate_up, d->h, W(LAYER_GATE_WEIGHT), NULL, T, H, 2 * I);
    be->swiglu_forward(d->act, d->gate_up, T, I);
    be->matmul_forward(d->out, d->act, W(LAYER_DOWN_WEIGHT), NULL, T, I, H);
    be->residual_rmsnorm_forward(d->h, d->rstd, d->x, d->out, next_norm, T, H, eps);
#undef W
}

// One chunk of T <= d->chunk tokens appended at d->length.
static void decoder_chunk(Decoder *d, const int32_t *tokens, int64_t T) {
    Model *m = d->m;
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    be->upload(d->tokens, tokens, sizeof(int32_t) * (size_t)T);
    be->embedding_forward(d->x, d->tokens, model_weight(m, model_embedding_param()), T, c->hidden_size);
    be->rmsnorm_forward(d->h, d->rstd, d->x, model_weight(m, model_layer_param(m, 0, LAYER_INPUT_NORM)), T,
                        c->hidden_size, (float)c->rms_norm_eps);
    for (int l = 0; l < c->num_layers; l++) {
        int next = l + 1 < c->num_layers ? model_layer_param(m, l + 1, LAYER_INPUT_NORM) : model_final_norm_param(m);
        decoder_layer(d, l, d->length, T, model_weight(m, next));
    }
    d->length += T;
}

void decoder_append(Decoder *d, const int32_t *tokens, int64_t n, float *logits_host) {
    Model *m = d->m;
    const ModelConfig *c = &m->cfg;
    CHECK(n >= 1 && d->length + n <= d->capacity, "decoder: %lld tokens after %lld, beyond its %lld",
          (long long)n, (long long)d->length, (long long)d->capacity);
    for (int64_t i = 0; i < n; i++)
        CHECK(tokens[i] >= 0 && tokens[i] < c->vocab_size, "decoder: token %d outside the vocabulary [0, %d)",
              tokens[i], c->vocab_size);
    int64_t last = 0;
    for (int64_t t0 = 0; t0 < n; t0 += d->chunk) {
        last = n - t0 < d->chunk ? n - t0 : d->chunk;
        decoder_chunk(d, tokens + t0, last);
    }
    // The head on the last token's normed state only.
    m->be->matmul_forward(d->logits, model_act_at(m, d->h, (last - 1) * c->hidden_size),
                          model_weight(m, model_head_param(m)), NULL, 1, c->hidden_size, c->vocab_size);
    m->be->act_to_host(logits_host, d->logits, c->vocab_size);
}
