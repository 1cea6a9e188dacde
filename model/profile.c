// profile.c: the per-op profile of one step (profile.h): a Backend whose ops
// run the inner backend's between two of its marks and add the time, the
// device launches and the work their shapes imply to a row per category,
// phase and shape. Marks are read after the step (profile_end), so that the
// step itself waits for nothing more than it does unprofiled. Work: FLOPs
// for GEMMs (2 per multiply-add) and attention (the causal half of the
// scores and values, backward 2.5 times the forward); bytes for the rest,
// every tensor read or written once at its element size.
#include "profile.h"

#include <string.h>
#include <unistd.h>

#include "../dist/comm.h"
#include "../dist/util.h"

// An op between two marks, added to its row after the step.
typedef struct {
    int row, begin, end;
} PendingOp;

static struct {
    const Backend *inner;
    Backend table;
    Profile *profile;      // the rows being filled
    ProfilePhase phase;
    PendingOp *ops;
    int num_ops, ops_capacity;
    int first_mark;
    double start_s;
    long start_launches;
} prof;

static const char *const category_names[PROFILE_CATEGORIES] = {
    "gemm", "attention", "norm", "rope", "swiglu", "cross_entropy", "embedding", "optimizer", "communication",
    "memory", "other"};
static const char *const phase_names[PROFILE_PHASES] = {"forward", "recompute", "backward", "loss", "update"};

const char *profile_category_name(ProfileCategory c) { return category_names[c]; }
const char *profile_phase_name(ProfilePhase p) { return phase_names[p]; }

static int find_row(ProfileCategory category, const char *shape) {
    Profile *p = prof.profile;
    for (int i = 0; i < p->num_rows; i++) {
        const ProfileRow *r = &p->rows[i];
        if (r->category == category && r->phase == prof.phase && !strcmp(r->shape, shape)) return i;
    }
    CHECK(p->num_rows < PROFILE_MAX_ROWS, "profile: more than %d rows", PROFILE_MAX_ROWS);
    ProfileRow *r = &p->rows[p->num_rows];
    memset(r, 0, sizeof(*r));
    r->category = category;
    r->phase = prof.phase;
    snprintf(r->shape, sizeof(r->shape), "%s", shape);
    return p->num_rows++;
}

// The op about to run: its row (work added now), its first mark and the
// launches so far; op_end makes its second mark.
typedef struct {
    int row, begin;
    long launches;
} OpStart;

static OpStart op_begin(ProfileCategory category, const char *shape, double flops, double bytes) {
    OpStart s = {find_row(category, shape), prof.inner->profile_mark(), prof.inner->profile_launches()};
    ProfileRow *r = &prof.profile->rows[s.row];
    r->calls++;
    r->flops += flops;
    r->bytes += bytes;
    return s;
}

static void op_end(OpStart s) {
    int end = prof.inner->profile_mark();
    long launches = prof.inner->profile_launches();
    ProfileRow *r = &prof.profile->rows[s.row];
    r->launches = launches < 0 ? -1 : r->launches + (launches - s.launches);
    if (prof.num_ops == prof.ops_capacity) {
        prof.ops_capacity = prof.ops_capacity ? 2 * prof.ops_capacity : 1024;
        prof.ops = xrealloc(prof.ops, sizeof(PendingOp) * (size_t)prof.ops_capacity);
    }
    prof.ops[prof.num_ops++] = (PendingOp){s.row, s.begin, end};
}

// Runs `call` as one op of category and shape with that work.
#define PROFILED(category, shape, flops, bytes, call) \
    do {                                               \
        OpStart op_ = op_begin(category, shape, flops, bytes); \
        call;                                          \
        op_end(op_);                                   \
    } while (0)

static double act(int64_t n) { return (double)n * (double)prof.inner->act_bytes; }

static void p_zero(void *ptr, size_t bytes) { PROFILED(PROFILE_MEMORY, "zero", 0, (double)bytes, prof.inner->zero(ptr, bytes)); }
static void p_upload(void *dst, const void *src, size_t bytes) {
    PROFILED(PROFILE_MEMORY, "upload", 0, (double)bytes, prof.inner->upload(dst, src, bytes));
}
static void p_download(void *dst, const void *src, size_t bytes) {
    PROFILED(PROFILE_MEMORY, "download", 0, (double)bytes, prof.inner->download(dst, src, bytes));
}
static void p_copy(void *dst, const void *src, size_t bytes) {
    PROFILED(PROFILE_MEMORY, "copy", 0, 2.0 * (double)bytes, prof.inner->copy(dst, src, bytes));
}
static void p_act_to_host(float *host, const Act *src, int64_t n) {
    PROFILED(PROFILE_MEMORY, "download", 0, act(n), prof.inner->act_to_host(host, src, n));
}
static void p_weights_refresh(Weight *w, const float *master, int64_t begin, int64_t count) {
    PROFILED(PROFILE_OPTIMIZER, "", 0, (4.0 + (double)prof.inner->weight_bytes) * (double)count,
             prof.inner->weights_refresh(w, master, begin, count));
}
static void p_weights_allgather(const struct Comm *c, Weight *w, int64_t count) {
    PROFILED(PROFILE_COMMUNICATION, "weights all-gather", 0, (double)prof.inner->weight_bytes * (double)count,
             prof.inner->weights_allgather(c, w, count));
}
static void p_embedding_forward(Act *out, const int32_t *tokens, const Weight *table, int64_t T, int H) {
    PROFILED(PROFILE_EMBEDDING, "", 0, act(T * H) + (double)prof.inner->weight_bytes * (double)(T * H),
             prof.inner->embedding_forward(out, tokens, table, T, H));
}
static void p_embedding_backward(float *dtable, const int32_t *tokens, const Act *dout, int64_t T, int H) {
    PROFILED(PROFILE_EMBEDDING, "", 0, act(T * H) + 8.0 * (double)(T * H),
             prof.inner->embedding_backward(dtable, tokens, dout, T, H));
}

// "[T, IC] -> [T, OC]": a GEMM's shape, the same for its forward and backward.
static const char *gemm_shape(char *buf, size_t size, int64_t T, int IC, int OC) {
    snprintf(buf, size, "[%lld, %d] -> [%lld, %d]", (long long)T, IC, (long long)T, OC);
    return buf;
}
static void p_matmul_forward(Act *out, const Act *inp, const Weight *weight, const Weight *bias, int64_t T, int IC,
                             int OC) {
    char shape[48];
    PROFILED(PROFILE_GEMM, gemm_shape(shape, sizeof(shape), T, IC, OC), 2.0 * (double)T * IC * OC, 0,
             prof.inner->matmul_forward(out, inp, weight, bias, T, IC, OC));
}
static void p_matmul_backward(Act *dinp, float *dweight, const Act *dout, const Act *inp,
                              const Weight *weight, int64_t T, int IC, int OC) {
    char shape[48];
    const double products = (dinp ? 1 : 0) + (dweight ? 1 : 0);
    PROFILED(PROFILE_GEMM, gemm_shape(shape, sizeof(shape), T, IC, OC), 2.0 * products * (double)T * IC * OC, 0,
             prof.inner->matmul_backward(dinp, dweight, dout, inp, weight, T, IC, OC));
}
static void p_bias_backward(float *dbias, const Act *dout, int OC, int64_t T) {
    PROFILED(PROFILE_OTHER, "bias gradients", 0, act(T * (int64_t)OC) + 8.0 * (double)OC,
             prof.inner->bias_backward(dbias, dout, OC, T));
}
static void p_rmsnorm_forward(Act *out, float *rstd, const Act *inp, const Weight *weight, int64_t T, int H,
                              float eps) {
    PROFILED(PROFILE_NORM, "", 0, act(2 * T * H) + 4.0 * (double)T,
             prof.inner->rmsnorm_forward(out, rstd, inp, weight, T, H, eps));
}
static void p_rmsnorm_backward(Act *dinp, float *dweight, const Act *dout, const Act *inp, const Weight *weight,
                               const float *rstd, int64_t T, int H) {
    PROFILED(PROFILE_NORM, "", 0, act(4 * T * H) + 4.0 * (double)T,
             prof.inner->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, T, H));
}
static void p_residual_rmsnorm_forward(Act *out, float *rstd, Act *x, const Act *delta, const Weight *weight,
                                       int64_t T, int H, float eps) {
    PROFILED(PROFILE_NORM, "", 0, act(4 * T * H) + 4.0 * (double)T,
             prof.inner->residual_rmsnorm_forward(out, rstd, x, delta, weight, T, H, eps));
}
static void p_rope(Act *qkv, Act *q, Act *k, Act *v, int q_heads, int k_heads, const int64_t *pos, int64_t T, int D,
                   const double *inv_freq, double attention_factor, int inverse) {
    PROFILED(PROFILE_ROPE, "", 0, act(2 * T * (int64_t)(q_heads + 2 * k_heads) * D),
             prof.inner->rope(qkv, q, k, v, q_heads, k_heads, pos, T, D, inv_freq, attention_factor, inverse));
}
static void p_swiglu_forward(Act *out, const Act *gate_up, int64_t rows, int width) {
    PROFILED(PROFILE_SWIGLU, "", 0, act(3 * rows * width), prof.inner->swiglu_forward(out, gate_up, rows, width));
}
static void p_swiglu_backward(Act *dgate_up, const Act *dout, const Act *gate_up, int64_t rows, int width) {
    PROFILED(PROFILE_SWIGLU, "", 0, act(5 * rows * width),
             prof.inner->swiglu_backward(dgate_up, dout, gate_up, rows, width));
}
static double p_sum_squares(const float *x, int64_t n) {
    double sum = 0;
    PROFILED(PROFILE_OPTIMIZER, "", 0, 4.0 * (double)n, sum = prof.inner->sum_squares(x, n));
    return sum;
}
static void p_cross_entropy(Act *logits, const int32_t *targets, int64_t C, int V, float grad_scale, double *loss) {
    PROFILED(PROFILE_CROSS_ENTROPY, "", 0, act(2 * C * V), prof.inner->cross_entropy(logits, targets, C, V, grad_scale, loss));
}

// Causal attention's FLOPs: the scores and the values of the half of the
// (q, k) pairs a query sees.
static double attention_flops(const AttnShape *s) {
    return 2.0 * (double)s->q_tokens * (double)s->k_tokens * s->num_heads * s->head_dim;
}
static void p_attention_sequence(AttnState *st, const int64_t *pos, int64_t tokens) {
    PROFILED(PROFILE_ATTENTION, "sequence", 0, 0, prof.inner->attention_sequence(st, pos, tokens));
}
static void p_attention_forward(AttnState *st, int layer, bool plan, const AttnShape *shape, const Act *q,
                                const Act *k, const Act *v, const int64_t *pos, Act *o, float *lse, SparseStats *stats) {
    PROFILED(PROFILE_ATTENTION, "", attention_flops(shape), 0,
             prof.inner->attention_forward(st, layer, plan, shape, q, k, v, pos, o, lse, stats));
}
static void p_attention_backward(AttnState *st, int layer, const AttnShape *shape, const Act *q, const Act *k,
                                 const Act *v, const int64_t *pos, const Act *o, const float *lse, const Act *dout,
                                 Act *dq, Act *dk, Act *dv) {
    PROFILED(PROFILE_ATTENTION, "", 2.5 * attention_flops(shape), 0,
             prof.inner->attention_backward(st, layer, shape, q, k, v, pos, o, lse, dout, dq, dk, dv));
}
static void p_allreduce_sum(const struct Comm *c, float *buf, int64_t n) {
    PROFILED(PROFILE_COMMUNICATION, "all-reduce", 0, 4.0 * (double)n, prof.inner->allreduce_sum(c, buf, n));
}
static void p_allreduce_sum_start(const struct Comm *c, float *buf, int64_t n) {
    PROFILED(PROFILE_COMMUNICATION, "all-reduce start", 0, 4.0 * (double)n, prof.inner->allreduce_sum_start(c, buf, n));
}
static void p_allreduce_sum_finish(const struct Comm *c) {
    PROFILED(PROFILE_COMMUNICATION, "all-reduce wait", 0, 0, prof.inner->allreduce_sum_finish(c));
}
static void p_reduce_scatter_sum(const struct Comm *c, float *arena, int64_t count) {
    PROFILED(PROFILE_COMMUNICATION, "reduce-scatter", 0, 4.0 * (double)count * c->size,
             prof.inner->reduce_scatter_sum(c, arena, count));
}
static void p_adamw(float *param, Weight *weight, const float *grad, float *m, float *v, const AdamWTensor *tensors,
                    int count, const AdamWStep *hp) {
    int64_t n = 0;
    for (int i = 0; i < count; i++) n += tensors[i].n;
    PROFILED(PROFILE_OPTIMIZER, "", 0, (28.0 + (double)prof.inner->weight_bytes) * (double)n,
             prof.inner->adamw(param, weight, grad, m, v, tensors, count, hp));
}
// The compute stream's wait for the dW stream's GEMMs (Backend.weight_grads_join): the time they
// took beyond what ran beside them.
static void p_weight_grads_join(void) {
    PROFILED(PROFILE_GEMM, "dW stream join", 0, 0, prof.inner->weight_grads_join());
}
static void p_phase(ProfilePhase phase) { prof.phase = phase; }

const Backend *profile_begin(const Backend *inner) {
    CHECK(!prof.inner, "profile_begin: a profile is already running");
    static Profile rows;
    memset(&rows, 0, sizeof(rows));
    prof.inner = inner;
    prof.profile = &rows;
    prof.phase = PHASE_UPDATE;
    prof.num_ops = 0;
    prof.table = *inner;   // memory, weights' set-up, attention state and the device's figures as they are
    Backend *t = &prof.table;
    t->zero = p_zero, t->upload = p_upload, t->download = p_download, t->copy = p_copy;
    t->act_to_host = p_act_to_host, t->weights_refresh = p_weights_refresh, t->weights_allgather = p_weights_allgather;
    t->embedding_forward = p_embedding_forward, t->embedding_backward = p_embedding_backward;
    t->matmul_forward = p_matmul_forward, t->matmul_backward = p_matmul_backward, t->bias_backward = p_bias_backward;
    t->rmsnorm_forward = p_rmsnorm_forward, t->rmsnorm_backward = p_rmsnorm_backward;
    t->residual_rmsnorm_forward = p_residual_rmsnorm_forward, t->rope = p_rope;
    t->swiglu_forward = p_swiglu_forward, t->swiglu_backward = p_swiglu_backward;
    t->sum_squares = p_sum_squares, t->cross_entropy = p_cross_entropy;
    t->attention_sequence = p_attention_sequence, t->attention_forward = p_attention_forward;
    t->attention_backward = p_attention_backward;
    t->allreduce_sum = p_allreduce_sum, t->allreduce_sum_start = p_allreduce_sum_start;
    t->allreduce_sum_finish = p_allreduce_sum_finish, t->reduce_scatter_sum = p_reduce_scatter_sum;
    t->adamw = p_adamw, t->profile_phase = p_phase;
    if (inner->weight_grads_join) t->weight_grads_join = p_weight_grads_join;
    inner->profile_clear();
    prof.start_s = now_seconds();
    prof.start_launches = inner->profile_launches();
    prof.first_mark = inner->profile_mark();
    return t;
}

const Backend *profile_end(Profile *out) {
    const Backend *inner = prof.inner;
    CHECK(inner, "profile_end without profile_begin");
    const long launches = inner->profile_launches();
    const int last = inner->profile_mark();
    Profile *p = prof.profile;
    for (int i = 0; i < prof.num_ops; i++) p->rows[prof.ops[i].row].ms += inner->profile_ms(prof.ops[i].begin, prof.ops[i].end);
    inner->profile_ms(prof.first_mark, last);   // the device done with the step
    p->wall_ms = 1e3 * (now_seconds() - prof.start_s);
    p->launches = launches < 0 ? -1 : launches - prof.start_launches;
    *out = *p;
    inner->profile_clear();
    prof.inner = NULL;
    return inner;
}

double profile_device_ms(const Profile *p) {
    double ms = 0;
    for (int i = 0; i < p->num_rows; i++) ms += p->rows[i].ms;
    return ms;
}

// A row's rate: TFLOP/s of FLOPs, else GB/s of bytes, into buf ("" without either).
static const char *rate(char *buf, size_t size, double flops, double bytes, double ms) {
    if (ms <= 0) snprintf(buf, size, "-");
    else if (flops > 0) snprintf(buf, size, "%.2f TFLOP/s", flops / (ms * 1e-3) * 1e-12);
    else if (bytes > 0) snprintf(buf, size, "%.1f GB/s", bytes / (ms * 1e-3) * 1e-9);
    else snprintf(buf, size, "-");
    return buf;
}

// The totals of each category.
static void category_totals(const Profile *p, ProfileRow totals[PROFILE_CATEGORIES]) {
    memset(totals, 0, sizeof(ProfileRow) * PROFILE_CATEGORIES);
    for (int c = 0; c < PROFILE_CATEGORIES; c++) totals[c].launches = p->launches < 0 ? -1 : 0;
    for (int i = 0; i < p->num_rows; i++) {
        const ProfileRow *r = &p->rows[i];
        ProfileRow *t = &totals[r->category];
        t->category = r->category;
        t->calls += r->calls;
        t->launches = r->launches < 0 ? -1 : t->launches + r->launches;
        t->ms += r->ms;
        t->flops += r->flops;
        t->bytes += r->bytes;
    }
}

void profile_print(const Profile *p, int64_t step, FILE *out) {
    const double device = profile_device_ms(p);
    char buf[32];
    fprintf(out, "profile of step %lld (log.profile): wall %.3f ms = ops %.3f + idle %.3f", (long long)step,
            p->wall_ms, device, p->wall_ms - device);
    if (p->launches >= 0) fprintf(out, "; %lld device launches", (long long)p->launches);
    fprintf(out, "\n| category | phase | shape | calls | launches | ms | %% of step | rate |\n|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < PROFILE_CATEGORIES; c++)
        for (int i = 0; i < p->num_rows; i++) {
            const ProfileRow *r = &p->rows[i];
            if ((int)r->category != c) continue;
            fprintf(out, "| %s | %s | %s | %lld | %lld | %.3f | %.1f | %s |\n", category_names[c], phase_names[r->phase],
                    r->shape, (long long)r->calls, (long long)r->launches, r->ms, 100 * r->ms / p->wall_ms,
                    rate(buf, sizeof(buf), r->flops, r->bytes, r->ms));
        }
    ProfileRow totals[PROFILE_CATEGORIES];
    category_totals(p, totals);
    for (int c = 0; c < PROFILE_CATEGORIES; c++)
        fprintf(out, "| **%s** | all | | %lld | %lld | %.3f | %.1f | %s |\n", category_names[c], (long long)totals[c].calls,
                (long long)totals[c].launches, totals[c].ms, 100 * totals[c].ms / p->wall_ms,
                rate(buf, sizeof(buf), totals[c].flops, totals[c].bytes, totals[c].ms));
    fprintf(out, "| **idle** | | | | | %.3f | %.1f | |\n| **step** | | | | %lld | %.3f | 100.0 | |\n",
            p->wall_ms - device, 100 * (p->wall_ms - device) / p->wall_ms, (long long)p->launches, p->wall_ms);
    fflush(out);
}

void profile_write_json(const Profile *p, int64_t step, const char *path) {
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = xfopen(tmp, "w");
    const double device = profile_device_ms(p);
    fprintf(f, "{\"step\": %lld, \"wall_ms\": %.6f, \"ops_ms\": %.6f, \"idle_ms\": %.6f, \"launches\": %lld, \"rows\": [",
            (long long)step, p->wall_ms, device, p->wall_ms - device, (long long)p->launches);
    for (int i = 0; i < p->num_rows; i++) {
        const ProfileRow *r = &p->rows[i];
        fprintf(f, "%s{\"category\": \"%s\", \"phase\": \"%s\", \"shape\": \"%s\", \"calls\": %lld, \"launches\": %lld, "
                "\"ms\": %.6f, \"flops\": %.6g, \"bytes\": %.6g}", i ? ", " : "", category_names[r->category],
                phase_names[r->phase], r->shape, (long long)r->calls, (long long)r->launches, r->ms, r->flops, r->bytes);
    }
    fprintf(f, "], \"categories\": {");
    ProfileRow totals[PROFILE_CATEGORIES];
    category_totals(p, totals);
    for (int c = 0; c < PROFILE_CATEGORIES; c++)
        fprintf(f, "%s\"%s\": {\"calls\": %lld, \"launches\": %lld, \"ms\": %.6f}", c ? ", " : "", category_names[c],
                (long long)totals[c].calls, (long long)totals[c].launches, totals[c].ms);
    fprintf(f, "}}\n");
    xfclose_sync(f, tmp);
    rename_into_place(tmp, path);
}
