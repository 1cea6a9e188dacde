// checkpoint.h: training checkpoints (docs/FORMATS.md). A checkpoint is a folder
// checkpoint.dir/step_XXXXXXXX/ holding
//   model.safetensors + config.json  a valid Hugging Face folder (F32 weights)
//   run.yaml                         the resolved run config
//   optimizer.zst                    AdamW moments, zstd-compressed, checksummed
//   state.json                       step, tokens seen, data cursor, RNG state
// It is written as step_XXXXXXXX.tmp.<pid>/, every file fsynced, then renamed;
// the `latest` pointer file moves last. A folder without the final name is
// never read, so a process killed while writing leaves the previous one in use.
#ifndef MTRAIN_CHECKPOINT_H
#define MTRAIN_CHECKPOINT_H

#include <stdint.h>

#include "../model/model.h"
#include "config.h"

typedef struct {
    int64_t step;            // optimizer steps completed
    int64_t tokens_seen;     // training tokens consumed
    int64_t data_cursor;     // the next sequence the loader hands out
    Rng rng;                 // the run's RNG state
} TrainState;

// Write the checkpoint for state->step and apply the keep policy, with a
// progress line when it takes long. moments: host [2, total_params], the full
// AdamW m then v (gathered over the dp ranks under ZeRO-1), or NULL: streamed
// in pieces from the model's unsharded adam_m and adam_v. The parameters come
// from m->param_mem.
void checkpoint_save(const Config *cfg, const Model *m, const TrainState *state, const float *moments);
// The host bytes a checkpoint write adds to a copy of the parameters when the
// moments stream (a piece buffer and the compressor's).
size_t checkpoint_stream_bytes(void);
// The newest complete checkpoint folder in dir into out; 0 if there is none.
int checkpoint_find_latest(const char *dir, char *out, size_t out_bytes);
// Load weights, optimizer moments and state from a checkpoint folder. Refuses
// (one line naming the field) a checkpoint of another model shape.
void checkpoint_load(const char *path, Model *m, TrainState *state);
// Load the weights of a Hugging Face folder (train.init_from) into m after
// checking that its config.json describes the same architecture, with a
// progress line when it takes long.
void model_load_hf_folder(Model *m, const char *dir);

#endif
