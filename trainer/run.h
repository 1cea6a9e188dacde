// run.h: the set-up of a run that every verb shares (train, eval, score,
// generate, the data commands): the start of the ranks (MPI, grid, GPUs,
// output) on a resolved config or a run file, threads, a model and a loader built from the run config, the cp
// ring, and reading integer files.
#ifndef MTRAIN_RUN_H
#define MTRAIN_RUN_H

#include "../data/loader.h"
#include "../dist/comm.h"
#include "../model/model.h"
#include "config.h"

// The OpenMP (and OpenBLAS) threads of this rank: parallel.threads, or with 0
// the node's CPUs divided by its ranks (at least 1, at most this rank's
// CPUs). An explicit setting that oversubscribes the node gets a one-line
// warning on stderr (rank 0). Returns the threads.
int apply_threads(const Config *cfg, const Dist *dist);
// model_init with the backend and the attention, loss and MLP chunk settings;
// its activation arena carved for `tokens` under recompute (auto: none, for
// the verbs that do not plan it; 0 tokens: sized by the first forward).
void model_from_config(Model *m, const Config *cfg, RecomputePolicy recompute, int64_t tokens);
// loader_open with the run's data, vocabulary, sequence length and seed;
// with validation false no validation stream (nothing held out).
void loader_from_config(Loader *l, const Config *cfg, bool validation);
// Attention over the cp ring when cp > 1 (dense, or sparse with the pattern
// estimated over the ring), with the schedule of attention.ring.
void model_join_ring(Model *m, const Config *cfg, const Dist *dist);
// The start of every verb that loads a model, on its resolved config: MPI,
// the rank grid of parallel.* (source names the config in its errors),
// stdout on rank 0 only, and on the CUDA backend each rank to its GPU with
// the device communicators of parallel.comm, before the backend is first
// used (backend_join_devices). A collective.
void run_start(const Config *cfg, Dist *dist, const char *source);
// run_start on a run file (argv[0]) and overrides (config_from_args;
// eval_model: see there). Prints usage and returns false when no run file is
// given, or an unknown option (args_refused) among the overrides.
bool run_start_file(int argc, char **argv, const char *usage, bool eval_model, Config *cfg, Dist *dist);
// The whitespace-separated integers of file path (`what`s), each in [0,
// limit) (`range` names the limit), strictly ascending when `ascending`;
// their number in *count. One line naming the file and the value otherwise.
int64_t *read_int_file(const char *path, const char *what, int64_t limit, const char *range, bool ascending,
                       int64_t *count);

#endif
