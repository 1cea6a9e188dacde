// run.h: the set-up of a run that every verb shares (train, eval, score,
// generate, the data commands): the start on a run file, the ranks' GPUs and
// output, threads, a model and a loader built from the run config, the cp
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
// model_init with the backend and the attention/loss/checkpointing settings.
void model_from_config(Model *m, const Config *cfg);
// loader_open with the run's data, vocabulary, sequence length and seed;
// with validation false no validation stream (nothing held out).
void loader_from_config(Loader *l, const Config *cfg, bool validation);
// Attention over the cp ring when cp > 1 (dense, or sparse with the pattern
// estimated over the ring), with the schedule of attention.ring.
void model_join_ring(Model *m, const Config *cfg, const Dist *dist);
// Ranks other than 0 write stdout to /dev/null: rank 0 alone speaks (errors
// still reach stderr from any rank).
void quiet_other_ranks(const Dist *dist);
// The CUDA backend's ranks (train.backend cuda, or auto with a GPU): each to
// its GPU, with the device communicators of parallel.comm, before the backend
// is first used (without a GPU, backend_select says why). A collective.
void join_devices(const Config *cfg, Dist *dist);
// The start of a verb on a run file (argv[0]) and overrides: config, MPI,
// the rank grid, the GPUs (join_devices), and stdout on rank 0 only. Prints usage and returns false
// when no run file is given. eval_model: see config_from_args.
bool run_start(int argc, char **argv, const char *usage, bool eval_model, Config *cfg, Dist *dist);
// The whitespace-separated integers of file path (`what`s), each in [0,
// limit) (`range` names the limit), strictly ascending when `ascending`;
// their number in *count. One line naming the file and the value otherwise.
int64_t *read_int_file(const char *path, const char *what, int64_t limit, const char *range, bool ascending,
                       int64_t *count);

#endif
