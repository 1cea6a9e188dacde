// hf_io.h: model weights in and out of Hugging Face form: a folder with
// config.json and model.safetensors under HF tensor names.
#ifndef MTRAIN_HF_IO_H
#define MTRAIN_HF_IO_H

#include "model.h"
#include "safetensors.h"

// Read DIR/model.safetensors into the parameters. Every tensor of the table
// must be present with its exact shape (F32, F16 or BF16); extra tensors are
// ignored (lm_head.weight of a tied model, rotary buffers of old exports).
void model_load_safetensors(Model *m, const char *path);
// Write one arena (param_mem, grad_mem, ...) under HF names as safetensors.
void model_write_safetensors(const Model *m, float *arena, const char *path, StDtype dtype);

#endif
