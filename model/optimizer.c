// optimizer.c: gradient clipping, learning-rate schedules and AdamW.
#include "optimizer.h"

#include <math.h>
#include <string.h>

#include "../dist/comm.h"

double lr_at(const OptimizerConfig *oc, int64_t step) {
    if (oc->warmup_steps > 0 && step <= oc->warmup_steps) return oc->lr * (double)step / (double)oc->warmup_steps;
    if (oc->schedule == LR_CONSTANT) return oc->lr;
    // Step warmup_steps + 1 is at progress 0 (the peak); min_lr is reached
    // one step after total_steps, so the last step still learns.
    int64_t decay_steps = oc->total_steps - oc->warmup_steps;
    double progress = decay_steps > 0 ? (double)(step - oc->warmup_steps - 1) / (double)decay_steps : 0.0;
    if (progress > 1.0) progress = 1.0;
    double frac = oc->schedule == LR_COSINE ? 0.5 * (1.0 + cos(M_PI * progress)) : 1.0 - progress;
    return oc->min_lr + (oc->lr - oc->min_lr) * frac;
}

double optimizer_step(Model *m, const OptimizerConfig *oc, int64_t step, double *lr_out) {
    const Backend *be = m->be;
    // This rank's range of the gradient (all of it unless ZeRO-1 sharded).
    int64_t begin = m->opt_begin, end = m->opt_begin + m->opt_count;
    double squares = be->sum_squares(m->grad_mem + begin, m->opt_count);
    if (m->opt_comm) comm_allreduce(m->opt_comm, &squares, 1, DT_DOUBLE, REDUCE_SUM);
    double norm = sqrt(squares);
    if (lr_out) *lr_out = lr_at(oc, step);
    if (!isfinite(norm)) return norm;  // a bad step: parameters and moments stay as they are
    if (oc->grad_clip > 0 && norm > oc->grad_clip) be->scale(m->grad_mem + begin, (float)(oc->grad_clip / norm), m->opt_count);
    double lr = lr_at(oc, step);
    model_alloc_optimizer(m);
    // Each tensor's part in the range.
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        int64_t lo = p->offset > begin ? p->offset : begin;
        int64_t hi = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (lo >= hi) continue;
        be->adamw(m->param_mem + (lo - m->master_begin), m->grad_mem + lo, m->adam_m + (lo - begin),
                  m->adam_v + (lo - begin), hi - lo, (float)lr, (float)oc->beta1, (float)oc->beta2, (float)oc->eps,
                  p->decay ? (float)oc->weight_decay : 0.0f, step);
    }
    model_weights_changed(m);
    if (lr_out) *lr_out = lr;
    return norm;
}
