// decode.h: generation with a KV cache over the model graph (model.h) and the
// backend op table: tokens are appended to a cache of every layer's keys and
// values (after RoPE), a chunk of new tokens at a time; each chunk runs the
// decoder layers on its own tokens only, with attention of its queries
// against the whole cache (Backend.attention_cached: causal, dense). A
// prompt goes in as chunks of up to `chunk` tokens, each generated token as
// a chunk of one. Positions are 0, 1, 2, ... (one sequence, no documents).
#ifndef MTRAIN_DECODE_H
#define MTRAIN_DECODE_H

#include <stdint.h>

#include "model.h"

typedef struct {
    Model *m;
    int64_t capacity;        // tokens the cache holds
    int64_t length;          // tokens in the cache
    int64_t chunk;           // most tokens per step
    Act **k_cache, **v_cache;  // [num_layers] each [capacity, Hkv * D]
    int64_t *positions;      // [capacity] 0 .. capacity - 1 (backend memory)
    int32_t *tokens;         // [chunk] (backend memory)
    Act *x, *h, *q, *att, *out;  // [chunk, H] x2, [chunk, Hq * D] x2, [chunk, H]
    Act *qkv, *gate_up, *act;    // [chunk, (Hq + 2 Hkv) D], [chunk, 2I], [chunk, I] (model.h's fused projections)
    Act *logits;             // [1, V]
    float *rstd, *lse;       // [chunk], [Hq, chunk]
} Decoder;

// A decoder of m (weights loaded) for up to capacity tokens, chunk tokens per step.
void decoder_init(Decoder *d, Model *m, int64_t capacity, int64_t chunk);
void decoder_free(Decoder *d);
// Append tokens [n] (in the vocabulary; length + n <= capacity) to the
// cache; logits_host [V] = the logits after the last of them.
void decoder_append(Decoder *d, const int32_t *tokens, int64_t n, float *logits_host);

#endif
