// model_config.h: the Qwen2 architecture hyper-parameters and the recompute policy, shared by the run
// config (trainer/config.c) and Hugging Face config.json I/O (model/hf_config.c).
#ifndef MTRAIN_MODEL_CONFIG_H
#define MTRAIN_MODEL_CONFIG_H

#include <stdbool.h>

#define CONFIG_STR 512

// HF `rope_scaling`: how the RoPE frequencies are stretched for a context
// longer than the one the model was trained at (model/rope.c has the math).
// A zero-filled struct (type ROPE_NONE) means plain RoPE.
typedef enum { ROPE_NONE, ROPE_YARN } RopeType;

typedef struct {
    RopeType type;             // none | yarn  (HF `type` / `rope_type`)
    double factor;             // context extension factor s >= 1
    int original_max_position_embeddings; // context before extension; 0 = max_position_embeddings
    double beta_fast;          // YaRN: rotations where interpolation ends (HF default 32)
    double beta_slow;          // YaRN: rotations where it is complete (HF default 1)
    double attention_factor;   // multiplies cos and sin; 0 = derived from factor (and mscale)
    double mscale;             // with mscale_all_dim: attention_factor = m(s, mscale) / m(s, mscale_all_dim); 0 = unset
    double mscale_all_dim;
    bool truncate;             // YaRN: correction range rounded to whole dimensions (HF default true)
} RopeScaling;

typedef struct {
    int vocab_size;            // vocab_size
    int hidden_size;           // hidden_size
    int intermediate_size;     // intermediate_size
    int num_layers;            // num_hidden_layers
    int num_heads;             // num_attention_heads
    int num_kv_heads;          // num_key_value_heads
    int head_dim;              // hidden_size / num_attention_heads (Qwen2 has no separate key)
    double rope_theta;         // rope_theta
    double rms_norm_eps;       // rms_norm_eps
    bool tie_word_embeddings;  // tie_word_embeddings
    double init_std;           // initializer_range
    int max_position_embeddings; // max_position_embeddings
    RopeScaling rope_scaling;  // rope_scaling (null in config.json = type none)
} ModelConfig;

// What the forward keeps for the backward (train.recompute), from the fastest
// and largest to the slowest and smallest; every policy gives the same
// gradients bit for bit on the CPU backend.
typedef enum {
    RECOMPUTE_NONE,       // every layer's activations kept
    RECOMPUTE_SELECTIVE,  // each layer's input, attention output and lse kept; the norms, projections, RoPE
                          // and MLP recomputed in the backward (attention is not run again)
    RECOMPUTE_FULL,       // each layer's input kept; the whole layer recomputed, attention forward included
    RECOMPUTE_AUTO        // the trainer's choice (trainer/plan.c), never a model's
} RecomputePolicy;

#endif
