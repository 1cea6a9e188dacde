// checkpoint.h: training checkpoints (docs/FORMATS.md). A checkpoint is a folder
// checkpoint.dir/step_XXXXXXXX/ holding
//   model.safetensors + config.json  a valid Hugging Face folder (F32 weights)
//   run.yaml                         the resolved run config
//   optimizer.zst                    AdamW moments, zstd-compressed, checksummed;
//                                    under ZeRO-1 instead optimizer.K-of-N.zst,
//                                    one shard per rank, and optimizer.index.json
//   state.json                       step, tokens seen, data cursor, RNG state,
//                                    XXH64 of model.safetensors, the name and
//                                    XXH64 of the optimizer file (optimizer.zst
//                                    or optimizer.index.json), run fingerprint
// It is written as step_XXXXXXXX.tmp.<pid>/, every file fsynced, then renamed;
// the `latest` pointer file moves last. A folder without the final name is
// never read, so a process killed while writing leaves the previous one in use.
// A step folder being replaced is first moved to step_XXXXXXXX.old.<pid>/, one
// being pruned to step_XXXXXXXX.del.<pid>/; checkpoint_recover_dir cleans up
// after a writer that died in any of these windows. Step numbers of 9 digits
// and more make longer names (step_123456789).
// Every checkpoint records its run's id (made at a fresh start, kept across
// resumes): pruning counts and removes only the run's own checkpoints, and
// `latest` names the newest of the run that wrote last. One run at a time
// holds checkpoint.dir and log.dir (the mtrain.lock file in each).
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
    uint64_t run_id;         // the run's id (checkpoint_new_run_id), never 0
    int64_t bad_in_a_row;    // bad steps in a row ending at `step` (train.max_bad_steps)
    char grid[128];          // how the steps were made: "dp D x cp C, layout L, S sequences a step" ("" unknown)
} TrainState;

// Write the checkpoint for state->step and apply the keep policy, with a
// progress line when it takes long. params: host [total_params], the whole
// fp32 master weights (model_gather_params) on the writer (rank 0 of over,
// or the caller when over is NULL), unused elsewhere. The moments stream in
// pieces from the model's adam_m and adam_v. over: under ZeRO-1 the ranks the
// moments are sharded over (with the checkpoint wait's time limit), each of
// which calls this and writes its own shard (optimizer.K-of-N.zst) into the
// folder in parallel; rank 0 writes the rest and renames the folder into
// place once every rank's shard is complete (their checksums gathered). NULL:
// one process writes optimizer.zst, the whole moments.
// Pruning removes only checkpoints of state->run_id, never the checkpoint
// just written nor resumed_from (the folder an explicit checkpoint.resume
// loaded, or NULL).
void checkpoint_save(const Config *cfg, const Model *m, const TrainState *state, const float *params,
                     const struct Comm *over, const char *resumed_from);
// Before a run writes into dir (checkpoints: checkpoint.dir, else log.dir):
// remove the NAME.tmp.PID and NAME.del.PID files and folders of mtrain's
// writers no longer alive, and put back (or remove, when the new one made it)
// a NAME.old.PID folder moved aside by a replacement. Only the names mtrain
// writes count (checkpoint.dir: step_N.tmp|old|del.PID and latest.tmp.PID;
// log.dir: metrics.jsonl.tmp.PID); every other entry is left alone.
void checkpoint_recover_dir(const char *dir, bool checkpoints);
// Take the exclusive locks (flock on DIR/mtrain.lock, which records "pid PID
// on HOST") of checkpoint.dir and log.dir, creating them, for as long as the
// process lives; fail with one line naming the holder when another run has
// one.
void checkpoint_lock_dirs(const Config *cfg);
// A new run id: 64 random bits, never 0.
uint64_t checkpoint_new_run_id(void);
// Whether the checkpoint folder dir records the fingerprint of cfg's run
// (config_run_keys); when not, diff gets the differing keys as
// "key CHECKPOINT -> RUN, ...".
bool checkpoint_same_run(const char *dir, const Config *cfg, char *diff, size_t diff_size);
// For checkpoint.resume: never: fail (one line) when checkpoint.dir holds a
// checkpoint of another run or an incomplete one, unless checkpoint.overwrite,
// which removes them.
void checkpoint_clear_other_runs(const Config *cfg);
// For a roll-back (an explicit checkpoint.resume of `from`, at step
// from_step, other than the latest checkpoint): fail (one line naming the
// steps) when checkpoint.dir holds a step folder the new run could write,
// one of steps (from_step, train.steps], unless checkpoint.overwrite.
void checkpoint_check_roll_back(const Config *cfg, const char *from, int64_t from_step);
// The host bytes a checkpoint write adds to a copy of the parameters when the
// moments stream (a piece buffer and the compressor's).
size_t checkpoint_stream_bytes(void);
// The checkpoint folder in dir that a run continues into out: the newest
// complete checkpoint of the run whose checkpoint `latest` names, or the
// newest complete one of any run when `latest` names none (warning about
// newer incomplete or damaged ones it skips: a state.json that is not a JSON
// object with a run_id); 0 if there is none.
int checkpoint_find_latest(const char *dir, char *out, size_t out_bytes);
// checkpoint_find_latest, and rewrite dir/latest, with a warning, when it
// does not name the folder found (a kill between a step folder's rename and
// `latest`'s, a folder removed by hand).
int checkpoint_repair_latest(const char *dir, char *out, size_t out_bytes);
// Load weights, optimizer moments and state from a checkpoint folder. Refuses
// (one line naming the field) a checkpoint of another model shape, weights
// whose XXH64 differs from state.json's, an optimizer file other than the
// one state.json names with its XXH64, counts outside [0, 2^53], fields that
// disagree (tokens_seen other than data_cursor x train.seq_len,
// bad_steps_in_a_row beyond step), hex words that are not 1 to 16 hex
// digits, and a step_N folder whose state.json records another step.
void checkpoint_load(const char *path, Model *m, TrainState *state);
// Load the weights of a Hugging Face folder (train.init_from, and every
// verb that reads a model folder) into m after checking that its config.json
// describes the same architecture and, in a checkpoint's step folder (one
// holding state.json), that model.safetensors has the XXH64 state.json
// records; with a progress line when it takes long.
void model_load_hf_folder(Model *m, const char *dir);

#endif
