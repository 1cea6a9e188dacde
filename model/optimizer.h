// optimizer.h: one optimizer step over the model's gradient arena: global
// gradient norm, clipping, learning-rate schedule and AdamW (decoupled weight
// decay, none on norms and biases).
#ifndef MTRAIN_OPTIMIZER_H
#define MTRAIN_OPTIMIZER_H

#include <stdint.h>

#include "model.h"

typedef enum { LR_CONSTANT, LR_COSINE, LR_LINEAR } LrSchedule;

typedef struct {
    double lr, min_lr;
    int64_t warmup_steps, total_steps;
    LrSchedule schedule;
    double weight_decay, beta1, beta2, eps;
    double grad_clip;          // 0 = off
} OptimizerConfig;

// Learning rate at optimizer step `step` (1-based) of total_steps T with W
// warmup steps: lr * step / W during warmup (step W at the peak), then
// constant, or cosine / linear decay from lr at step W + 1 towards min_lr
// with progress (step - W - 1) / (T - W), so that min_lr would be reached one
// step after the last: with W = 0 the first step is at lr, and no step runs
// at lr 0 unless lr or min_lr is 0 and asked for.
double lr_at(const OptimizerConfig *oc, int64_t step);
// Clip and apply AdamW for step `step` (1-based) to the parameters in
// [opt_begin, opt_begin + opt_count) (all of them unless ZeRO-1 sharded), then
// refresh the compute copy (model_weights_changed). Under ZeRO-1 (opt_comm)
// the gradient holds this rank's shard of the reduced sum
// (reduce_scatter_sum): the norm is summed over opt_comm, and the refresh
// all-gathers the compute copy of the updated shards (collective over
// opt_comm; CPU: the fp32 master, CUDA: bf16). Returns the gradient norm before clipping;
// *lr_out gets the learning rate used.
double optimizer_step(Model *m, const OptimizerConfig *oc, int64_t step, double *lr_out);

#endif
