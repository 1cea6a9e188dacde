// hf_io.h: model weights in and out of Hugging Face form: a folder with
// config.json and either model.safetensors or, for large models, shards
// model-0000i-of-0000N.safetensors listed by model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}).
#ifndef MTRAIN_HF_IO_H
#define MTRAIN_HF_IO_H

#include <stdint.h>

#include "../dist/progress.h"
#include "model.h"
#include "safetensors.h"

// Read the weights of folder `dir` into the parameters: the shards of
// dir/model.safetensors.index.json when that exists, else dir/model.safetensors.
// Every tensor of the table must be found exactly once with its exact shape
// (F32, F16 or BF16, mixed freely); a tensor the model does not have is an
// error, except lm_head.weight of a tied model and rotary_emb.inv_freq buffers.
// Each problem is one line naming the file. progress (may be NULL) counts the
// bytes of every parameter loaded. Refreshes the compute copy.
void model_load_hf_weights(Model *m, const char *dir, Progress *progress);
// Write the parameters params [total_params] (host memory, from
// model_gather_params) into the existing folder `dir` as `dtype` (ST_F32, or
// ST_BF16 rounded to nearest even): one model.safetensors when they fit in
// max_shard_bytes of tensor data (0 = no limit), else shards of at most that
// size in table order (a larger tensor gets a shard of its own) and the index.
// Returns the number of files holding tensors.
int model_write_hf_weights(const Model *m, const float *params, const char *dir, StDtype dtype,
                           uint64_t max_shard_bytes);
// Write one whole arena (grad_mem, an unsharded param_mem) under HF names as one safetensors file.
void model_write_safetensors(const Model *m, float *arena, const char *path, StDtype dtype);
// The gradients (whole arena) under HF names as one F32 safetensors file.
void model_write_grads(const Model *m, const char *path);
// Copy the files of a Hugging Face folder that travel with its weights
// (tokenizer files, generation_config.json) that `from` has into `to`.
void hf_copy_side_files(const char *from, const char *to);

#endif
