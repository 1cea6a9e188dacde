// optimizer.c: gradient clipping, learning-rate schedules and AdamW.
#include "optimizer.h"

#include <math.h>
#include <stdlib.h>
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
    model_mark_phase(m, PHASE_UPDATE);
    // This rank's range of the gradient (all of it unless ZeRO-1 sharded).
    int64_t begin = m->opt_begin, end = m->opt_begin + m->opt_count;
    double squares = be->sum_squares(m->grad_mem + begin, m->opt_count);
    if (m->opt_comm) comm_allreduce(m->opt_comm, &squares, 1, DT_DOUBLE, REDUCE_SUM);
    double norm = sqrt(squares);
    if (lr_out) *lr_out = lr_at(oc, step);
    if (!isfinite(norm)) return norm;  // a bad step: parameters and moments stay as they are
    const float clip = oc->grad_clip > 0 && norm > oc->grad_clip ? (float)(oc->grad_clip / norm) : 1.0f;
    double lr = lr_at(oc, step);
    model_alloc_optimizer(m);
    // Each tensor's part in the range, all in one AdamW pass, which writes the
    // compute copy of the range too; under ZeRO-1 the ranks' ranges then go to every rank.
    AdamWTensor *tensors = xmalloc(sizeof(AdamWTensor) * (size_t)m->num_params);
    int count = 0;
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        int64_t lo = p->offset > begin ? p->offset : begin;
        int64_t hi = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (lo < hi) tensors[count++] = (AdamWTensor){lo - begin, hi - lo, p->decay ? (float)oc->weight_decay : 0.0f};
    }
    const AdamWStep hp = {(float)lr, (float)oc->beta1, (float)oc->beta2, (float)oc->eps, clip, step};
    be->adamw(m->param_mem + (begin - m->master_begin), model_weight_at(m, begin), m->grad_mem + begin, m->adam_m,
              m->adam_v, tensors, count, &hp);
    free(tensors);
    if (m->opt_comm) be->weights_allgather(m->opt_comm, m->weight_mem, model_shard_size(m, m->opt_comm->size));
    if (lr_out) *lr_out = lr;
    return norm;
}
