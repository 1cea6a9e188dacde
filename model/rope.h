// rope.h: the RoPE frequency table of a model: the inverse frequency of each
// rotated pair of dimensions and the factor that scales cos and sin, for
// plain RoPE (θ^(-2i/D)) and for YaRN context extension, computed as
// Hugging Face transformers does (_compute_yarn_parameters), in double.
#ifndef MTRAIN_ROPE_H
#define MTRAIN_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model_config.h"

// Is rope_scaling YaRN (ROPE_YARN), rather than plain RoPE (ROPE_NONE)?
bool rope_is_yarn(const RopeScaling *rs);
// The pre-extension context length: original_max_position_embeddings, or
// max_position_embeddings when that is 0.
int rope_original_context(const ModelConfig *c);
// Fill inv_freq [D/2] for head dimension D; returns the attention factor
// (1 for plain RoPE).
double rope_frequencies(const ModelConfig *c, int D, double *inv_freq);
// The RoPE position of each token when positions restart at every document:
// out[t] = positions[t] - (the largest document start <= positions[t], or 0).
// positions [T] ascending global positions (one rank's tokens in its layout),
// doc_starts [count] ascending global positions where a document begins.
void rope_document_positions(const int64_t *positions, int64_t T, const int64_t *doc_starts, int64_t count,
                             int64_t *out);

#endif
