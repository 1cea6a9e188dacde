// train.h: the pieces of a run that the CLI verbs share: threads, a model
// built from the run config, the optimizer settings.
#ifndef MTRAIN_TRAIN_H
#define MTRAIN_TRAIN_H

#include "../model/model.h"
#include "../model/optimizer.h"
#include "config.h"

// OpenMP threads from parallel.threads (0 = leave the default: all cores).
void apply_threads(const Config *cfg);
// model_init with the backend and the attention/loss/checkpointing settings.
void model_from_config(Model *m, const Config *cfg);
OptimizerConfig optimizer_config(const Config *cfg);

#endif
