// model_config.h: the Qwen2 architecture hyper-parameters, shared by the run
// config (trainer/config.c) and Hugging Face config.json I/O (model/hf_config.c).
#ifndef MTRAIN_MODEL_CONFIG_H
#define MTRAIN_MODEL_CONFIG_H

#include <stdbool.h>

#define CONFIG_STR 512

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
} ModelConfig;

#endif
