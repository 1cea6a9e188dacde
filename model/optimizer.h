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

// Learning rate at optimizer step `step` (1-based): linear warmup from 0,
// then constant, cosine or linear decay from lr to min_lr at total_steps.
double lr_at(const OptimizerConfig *oc, int64_t step);
// Clip and apply AdamW for step `step` (1-based) to the parameters in
// [opt_begin, opt_begin + opt_count) (all of them unless ZeRO-1 sharded). Returns the gradient norm
// before clipping; *lr_out gets the learning rate used.
double optimizer_step(Model *m, const OptimizerConfig *oc, int64_t step, double *lr_out);

#endif
