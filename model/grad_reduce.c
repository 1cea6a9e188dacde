// grad_reduce.c: the model's gradients and optimizer state as the trainer
// sees them, without touching an arena: zeroing, the finite test, the sum
// over the ranks (whole, in buckets started during the last backward, or
// ZeRO-1's reduce-scatter), the AdamW moments in and out for checkpoints, and
// the memory each arena takes.
#include <math.h>

#include "../dist/comm.h"
#include "model.h"

void model_zero_grads(Model *m) {
    model_mark_phase(m, PHASE_UPDATE);
    m->be->zero(m->grad_mem, sizeof(float) * (size_t)m->arena_floats);
}

bool model_grads_finite(const Model *m) {
    model_mark_phase(m, PHASE_UPDATE);
    return isfinite(m->be->sum_squares(m->grad_mem, m->total_params));
}

void model_poison_grads(Model *m) {
    static const float not_a_number = NAN;
    m->be->upload(m->grad_mem, &not_a_number, sizeof(float));
}

void model_set_grad_reduce(Model *m, const struct Comm *over, int64_t bucket_floats) {
    CHECK(!m->opt_comm || m->opt_comm == over, "ZeRO-1 shards over other ranks than the gradients are summed over");
    m->grad_comm = over;
    m->grad_bucket = !m->opt_comm && over->size > 1 && bucket_floats > 0 ? bucket_floats : 0;
}

bool model_grads_bucketed(const Model *m) { return m->grad_bucket > 0; }

// Model.grads_final during a bucketed backward: [offset, total_params) is
// final; once it has grown by at least a bucket past what was started, that
// part starts reducing (the embedding's, at offset 0, waits for
// model_reduce_grads).
static void bucket_ready(void *ctx, int64_t offset) {
    Model *m = ctx;
    if (offset == 0 || m->grad_started - offset < m->grad_bucket) return;
    m->be->allreduce_sum_start(m->grad_comm, m->grad_mem + offset, m->grad_started - offset);
    m->grad_started = offset;
}

void model_grads_start(Model *m) {
    if (!model_grads_bucketed(m)) return;
    m->grad_started = m->total_params;
    m->grads_final = bucket_ready;
    m->grads_final_ctx = m;
}

void model_reduce_grads(Model *m) {
    const struct Comm *over = m->grad_comm;
    model_mark_phase(m, PHASE_UPDATE);
    if (model_grads_bucketed(m)) {
        m->grads_final = NULL;
        if (m->grad_started > 0) m->be->allreduce_sum_start(over, m->grad_mem, m->grad_started);
        m->be->allreduce_sum_finish(over);
    } else if (over->size == 1) {
        return;
    } else if (m->opt_comm) {
        m->be->reduce_scatter_sum(over, m->grad_mem, model_shard_size(m, over->size));
    } else {
        m->be->allreduce_sum(over, m->grad_mem, m->total_params);
    }
}

void model_read_moment(const Model *m, int part, int64_t first, int64_t count, float *host) {
    m->be->download(host, (part ? m->adam_v : m->adam_m) + first, sizeof(float) * (size_t)count);
}

void model_set_moments(Model *m, int64_t offset, const float *host_m, const float *host_v, int64_t n) {
    int64_t lo = m->opt_begin > offset ? m->opt_begin : offset;
    int64_t end = m->opt_begin + m->opt_count, hi = end < offset + n ? end : offset + n;
    if (lo >= hi) return;
    size_t bytes = sizeof(float) * (size_t)(hi - lo);
    m->be->upload(m->adam_m + (lo - m->opt_begin), host_m + (lo - offset), bytes);
    m->be->upload(m->adam_v + (lo - m->opt_begin), host_v + (lo - offset), bytes);
}

bool model_master_sharded(const Model *m) { return m->opt_comm && m->be->shards_masters; }

ModelMemory model_memory(const Model *m) {
    bool own_copy = (void *)m->weight_mem != (void *)m->param_mem;  // CPU: the compute copy is the master
    ModelMemory mem = {
        .master = (double)m->master_count * sizeof(float),
        .compute = own_copy ? (double)m->arena_floats * (double)m->be->weight_bytes : 0,
        .grads = (double)m->arena_floats * sizeof(float),
        .adam = 2.0 * (double)m->opt_count * sizeof(float),
    };
    return mem;
}

double model_attention_ring_bytes(const Model *m) { return m->be->attention_ring_bytes(m->attn); }
