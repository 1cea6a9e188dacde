// hf_config.h: Hugging Face config.json of a Qwen2 model <-> ModelConfig.
#ifndef MTRAIN_HF_CONFIG_H
#define MTRAIN_HF_CONFIG_H

#include "model_config.h"

// Read and validate `path` (a config.json); any problem is a one-line fail()
// naming the file and the field. Optional fields take Qwen2's defaults.
// RoPE scaling comes from `rope_scaling` (or transformers 5's `rope_parameters`):
// null / absent / type "default" = plain RoPE, "yarn" = YaRN; other types are refused.
void hf_config_read(const char *path, ModelConfig *mc);
// Write a complete Qwen2 config.json (tmp file + fsync + rename). Doubles are
// printed so that they read back bit-identical; rope_scaling is null or the
// YaRN object (original_max_position_embeddings resolved); torch_dtype is
// "float32" or "bfloat16", the dtype of the weights beside it.
// keep_from (NULL = none): a config.json whose other keys (bos_token_id,
// eos_token_id, anything mtrain does not own) are carried over unchanged.
void hf_config_write(const char *path, const ModelConfig *mc, const char *torch_dtype, const char *keep_from);

#endif
