// attention_cuda_op.cu: the CUDA backend's attention op (attention_api.h),
// composed as attention_cpu.c composes the CPU one: one path, the device
// ring that attention_cuda_set_ring makes (ring_cuda.h: a ring of one on one
// GPU) makes each layer's sparse plan (on this GPU alone on a ring of one)
// and runs ring.c's schedule over the dense kernels or the layer's index on
// device buffers. Only the trainer's programs link it (the ring's objects
// need MPI); the GPU programs of the kernels alone do not. The state keeps
// what lives between calls: the config and its fixed budgets, each layer's
// device pattern from the sequence's plan forward, one device index
// (rebuilt from a layer's pattern on the device when a call needs another
// layer's: every layer's index is not kept), whether the sequence's
// positions are 0 .. T-1, the document starts on the device, and the
// scratch; every device buffer is allocated once and grown (the index and
// the patterns by sparse_select_cuda and sparse_index_build_cuda
// themselves):
//   o_acc            [T, Hq, D] fp32   the forward's running output
//   dq_acc           [T, Hq, D] fp32   the backward's sums, then added into
//   dk_acc, dv_acc   [T, Hkv, D] fp32  the bf16 dq, dk, dv
//   q_blocks         [T / B] int64     the query blocks of the index
//   docs             [N] int64         the document starts (AttnShape.doc_starts_device;
//                                      room for one per token of the sequence)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// sparse.h is C (sparse_budget_tables): first, with C linkage.
extern "C" {
#include "../sparse/sparse.h"
}
#include "../attention_api.h"
#include "../../dist/cuda_check.h"
#include "../../dist/cuda_elementwise.cuh"
#include "../../dist/cuda_kernel.h"
#include "../kernels/attention_cuda.h"
#include "../kernels/attn_variants.h"
#include "../kernels/sparse_cuda.h"
#include "../ring/ring_cuda.h"
#include "../sparse/sparse_select_cuda.h"

// sparse_select_cuda.cu's estimation takes at most this many queries.
#define EST_MAX_QUERIES 128

// A device buffer that only grows.
typedef struct {
    void *ptr;
    size_t bytes;
} Scratch;

struct AttnState {
    AttentionConfig cfg;
    int num_layers, num_heads;
    int *budget_vertical;        // [num_layers * Hq] budget fixed, else NULL
    int *budget_slash;           // [num_layers * Hq]
    SparsePatternCuda *pattern;  // [num_layers] the layer's pattern (sparse)
    bool *planned;               // [num_layers] pattern holds this sequence's
    SparseIndexCuda index;       // the index of layer index_layer's pattern (-1: none)
    int index_layer;
    int64_t tokens;              // the sequence's
    bool pos_is_iota;            // its position t is t for every t
    RingCuda *ring;              // the cp ring (NULL before attention_cuda_set_ring)
    void **ring_layer;           // [num_layers] sparse on a ring: the plan's state of the layer (ring's)
    Scratch o_acc, dq_acc, dk_acc, dv_acc, q_blocks, docs;
    int64_t *docs_host;          // [docs_capacity] page-locked: the starts last copied to docs
    int64_t docs_count, docs_capacity;
    cudaEvent_t docs_copied;     // after that copy (NULL before the first)
};

// ---- state ----

// At least `bytes` of s; a larger buffer replaces it (cudaFree waits for the
// device, so no queued work still uses the old one).
static void *scratch(Scratch *s, size_t bytes) {
    if (bytes <= s->bytes) return s->ptr;
    if (s->ptr) CUDA_CHECK(cudaFree(s->ptr));
    CUDA_CHECK(cudaMalloc(&s->ptr, bytes));
    s->bytes = bytes;
    return s->ptr;
}

static void scratch_free(Scratch *s) {
    if (s->ptr) CUDA_CHECK(cudaFree(s->ptr));
    *s = Scratch{};
}

extern "C" AttnState *attention_cuda_new(const AttentionConfig *cfg, int num_layers, int num_heads) {
    const bool sparse = cfg->type == ATTN_SPARSE;
    CHECK(!sparse || cfg->block_size == 64 || cfg->block_size == 128,
          "attention.block_size %d: the CUDA sparse attention supports 64 and 128", cfg->block_size);
    CHECK(!sparse || cfg->last_q <= EST_MAX_QUERIES,
          "attention.last_q %d: the CUDA sparse estimation takes at most %d queries", cfg->last_q, EST_MAX_QUERIES);
    attn_variants_constrain(cfg->kernels);
    AttnState *st = (AttnState *)xcalloc(1, sizeof(AttnState));
    st->cfg = *cfg;
    st->num_layers = num_layers;
    st->num_heads = num_heads;
    st->pattern = (SparsePatternCuda *)xcalloc((size_t)num_layers, sizeof(SparsePatternCuda));
    st->index_layer = -1;
    st->planned = (bool *)xcalloc((size_t)num_layers, sizeof(bool));
    st->ring_layer = (void **)xcalloc((size_t)num_layers, sizeof(void *));
    sparse_budget_tables(cfg, num_layers, num_heads, &st->budget_vertical, &st->budget_slash);
    return st;
}

static void forget_plans(AttnState *st) {
    for (int l = 0; l < st->num_layers; l++) st->planned[l] = false;
    st->index_layer = -1;
}

// The ring's layer states (before the ring goes).
static void forget_ring_layers(AttnState *st) {
    for (int l = 0; l < st->num_layers; l++) {
        ring_cuda_layer_free(st->ring_layer[l]);
        st->ring_layer[l] = NULL;
    }
}

extern "C" void attention_cuda_free(AttnState *st) {
    if (!st) return;
    for (int l = 0; l < st->num_layers; l++) sparse_pattern_free_cuda(&st->pattern[l]);
    forget_ring_layers(st);
    sparse_index_free_cuda(&st->index);
    Scratch *all[] = {&st->o_acc, &st->dq_acc, &st->dk_acc, &st->dv_acc, &st->q_blocks, &st->docs};
    for (Scratch *s : all) scratch_free(s);
    if (st->docs_host) CUDA_CHECK(cudaFreeHost(st->docs_host));
    if (st->docs_copied) CUDA_CHECK(cudaEventDestroy(st->docs_copied));
    ring_cuda_free(st->ring);
    free(st->pattern);
    free(st->planned);
    free(st->ring_layer);
    free(st->budget_vertical);
    free(st->budget_slash);
    free(st);
}

extern "C" bool attention_cuda_set_ring(AttnState *st, const struct Comm *cp, int inner) {
    forget_ring_layers(st);
    forget_plans(st);
    ring_cuda_free(st->ring);
    st->ring = ring_cuda_new(cp, inner);
    return ring_cuda_size(st->ring) > 1;
}

extern "C" void attention_cuda_sequence(AttnState *st, const int64_t *pos, int64_t tokens) {
    forget_plans(st);
    st->tokens = tokens;
    st->pos_is_iota = true;
    for (int64_t t = 0; t < tokens; t++) st->pos_is_iota &= pos[t] == t;
    CHECK(st->ring, "attention (CUDA): a sequence before the ring (attention_cuda_set_ring)");
    ring_cuda_sequence(st->ring, pos, tokens);
}

// The call's shape with its document starts on the device
// (doc_starts_device; none without documents). They are copied only when
// they differ from the last copy's, i.e. once per sequence, through the
// page-locked docs_host, which the host rewrites once that copy has run
// (a wait on docs_copied; the copy was enqueued a sequence ago). Both
// buffers hold one start per token of the sequence (this rank's tokens on
// every rank of the ring), more only for a longer list: allocated in the
// first sequence.
static AttnShape with_documents(AttnState *st, const AttnShape *shape, cudaStream_t stream) {
    AttnShape s = *shape;
    const int64_t n = shape->doc_starts ? shape->doc_count : 0;
    if (n == 0) return s;
    const size_t bytes = sizeof(int64_t) * (size_t)n;
    if (n != st->docs_count || memcmp(st->docs_host, shape->doc_starts, bytes)) {
        if (st->docs_copied) CUDA_CHECK(cudaEventSynchronize(st->docs_copied));
        else CUDA_CHECK(cudaEventCreateWithFlags(&st->docs_copied, cudaEventDisableTiming));
        if (n > st->docs_capacity) {
            const int64_t tokens = st->tokens * ring_cuda_size(st->ring), capacity = n > tokens ? n : tokens;
            if (st->docs_host) CUDA_CHECK(cudaFreeHost(st->docs_host));
            CUDA_CHECK(cudaMallocHost((void **)&st->docs_host, sizeof(int64_t) * (size_t)capacity));
            scratch(&st->docs, sizeof(int64_t) * (size_t)capacity);
            st->docs_capacity = capacity;
        }
        memcpy(st->docs_host, shape->doc_starts, bytes);
        CUDA_CHECK(cudaMemcpyAsync(st->docs.ptr, st->docs_host, bytes, cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaEventRecord(st->docs_copied, stream));
        st->docs_count = n;
    }
    s.doc_starts_device = (const int64_t *)st->docs.ptr;
    return s;
}

// ---- the sparse plan ----

// Layer l's fixed budgets [Hq], or NULL (budget topp).
static const int *layer_budget(const AttnState *st, const int *budget, int l) {
    return budget ? budget + (size_t)l * st->num_heads : NULL;
}

// Layer l's index for this rank's query blocks (positions pos, device) in
// st->index: built from the layer's pattern unless it holds it already.
static const SparseIndexCuda *layer_index(AttnState *st, int l, const AttnShape *s, const int64_t *pos,
                                          cudaStream_t stream) {
    if (st->index_layer == l) return &st->index;
    const int B = s->block_size;
    const int64_t nqb = (s->q_tokens + B - 1) / B;
    int64_t *q_blocks = (int64_t *)scratch(&st->q_blocks, sizeof(int64_t) * (size_t)(nqb + 1));
    sparse_query_blocks_cuda(pos, s->q_tokens, B, q_blocks, stream);
    sparse_index_build_cuda(&st->pattern[l], B, q_blocks, nqb, s->doc_starts_device, s->doc_count, st->cfg.sink,
                            &st->index, stream);
    st->index_layer = l;
    return &st->index;
}

// ---- forward and backward ----

// Over several ranks.
static bool on_ring(const AttnState *st) { return ring_cuda_size(st->ring) > 1; }

static void check_call(const AttnState *st, int layer, const AttnShape *s) {
    CHECK(layer >= 0 && layer < st->num_layers, "attention (CUDA): layer %d outside [0, %d)", layer,
          st->num_layers);
    CHECK(s->q_tokens == s->k_tokens && (s->q_tokens >= 1 || on_ring(st)), "attention (CUDA): %lld queries and %lld "
          "keys (this rank's tokens, at least one without a ring)", (long long)s->q_tokens, (long long)s->k_tokens);
    if (st->cfg.type != ATTN_SPARSE) return;
    CHECK(s->block_size == 64 || s->block_size == 128,
          "attention.block_size %d: the CUDA sparse attention supports 64 and 128", s->block_size);
    if (on_ring(st)) return;   // the ring's positions come from the layout: whole blocks of B
    CHECK(st->tokens == s->q_tokens && st->pos_is_iota, "attention (CUDA): the sparse attention of %lld tokens "
          "needs the sequence's positions 0 .. T-1 (attention_cuda_sequence)", (long long)s->q_tokens);
}

// Layer l's pattern and this rank's index, estimated by the ring (on this
// GPU alone on a ring of one; collective); stats: NULL or its density added
// (the recall: by the plan forward).
static void plan_layer_pattern(AttnState *st, int l, const AttnShape *s, const uint16_t *q, const uint16_t *k,
                               cudaStream_t stream, SparseStats *stats) {
    const SparsePlanCall call = {&st->cfg, s, q, k, layer_budget(st, st->budget_vertical, l),
                                 layer_budget(st, st->budget_slash, l), stats};
    ring_cuda_sparse_plan(st->ring, &call, &st->pattern[l], &st->index, &st->ring_layer[l], stream);
    st->planned[l] = true;
    st->index_layer = l;
}

// Layer l's call through the ring: sparse, its index (planned by the
// sequence's first forward) and over several ranks the ring's layer state;
// dense: neither.
static RingCallCuda layer_call(AttnState *st, int l, const AttnShape *s, const int64_t *pos, cudaStream_t stream) {
    RingCallCuda call{};
    call.shape = s;
    call.send = st->cfg.ring_send;
    call.stream = stream;
    if (st->cfg.type != ATTN_SPARSE) return call;
    CHECK(st->planned[l], "attention (CUDA): layer %d used before its sequence's plan forward", l);
    call.index = layer_index(st, l, s, pos, stream);
    call.layer = st->ring_layer[l];
    return call;
}

// One path for every case: the ring's schedule (a ring of one on one GPU)
// over the dense kernels or the layer's index.
extern "C" void attention_cuda_forward(AttnState *st, int layer, bool plan, const AttnShape *shape,
                                       const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                       const int64_t *pos, uint16_t *o, float *lse, SparseStats *stats,
                                       cudaStream_t stream) {
    check_call(st, layer, shape);
    attn_variants_report(shape->head_dim, st->cfg.type == ATTN_SPARSE);   // once per process
    const AttnShape s = with_documents(st, shape, stream);
    const size_t nq = (size_t)(s.q_tokens * s.num_heads * s.head_dim);
    float *o_acc = (float *)scratch(&st->o_acc, sizeof(float) * nq);
    if (plan && st->cfg.type == ATTN_SPARSE) plan_layer_pattern(st, layer, &s, q, k, stream, stats);
    RingCallCuda call = layer_call(st, layer, &s, pos, stream);
    call.q = q, call.k = k, call.v = v;
    call.out = AttnOut{o_acc, lse};
    call.stats = plan ? stats : NULL;
    ring_cuda_forward(st->ring, &call);
    attn_output_bf16_cuda(&s, o_acc, o, stream);
}

extern "C" void attention_cuda_cached(AttnState *st, const AttnShape *shape, const uint16_t *q, const int64_t *q_pos,
                                      const uint16_t *k, const uint16_t *v, const int64_t *k_pos, uint16_t *o,
                                      float *lse, cudaStream_t stream) {
    CHECK(st->ring, "attention (CUDA): a cached call before the ring (attention_cuda_set_ring)");
    const AttnShape s = with_documents(st, shape, stream);
    float *o_acc = (float *)scratch(&st->o_acc, sizeof(float) * (size_t)(s.q_tokens * s.num_heads * s.head_dim));
    RingCallCuda call{};
    call.shape = &s;
    call.stream = stream;
    call.q = q, call.k = k, call.v = v, call.q_pos = q_pos;
    call.out = AttnOut{o_acc, lse};
    ring_cuda_cached(st->ring, &call, k_pos);
    attn_output_bf16_cuda(&s, o_acc, o, stream);
}

extern "C" void attention_cuda_backward(AttnState *st, int layer, const AttnShape *shape, const uint16_t *q,
                                        const uint16_t *k, const uint16_t *v, const int64_t *pos,
                                        const uint16_t *o, const float *lse, const uint16_t *dout, uint16_t *dq,
                                        uint16_t *dk, uint16_t *dv, cudaStream_t stream) {
    check_call(st, layer, shape);
    const AttnShape s = with_documents(st, shape, stream);
    const int64_t nq = s.q_tokens * s.num_heads * s.head_dim;
    const int64_t nk = s.k_tokens * s.num_kv_heads * s.head_dim;
    float *dq_acc = (float *)scratch(&st->dq_acc, sizeof(float) * (size_t)nq);
    float *dk_acc = (float *)scratch(&st->dk_acc, sizeof(float) * (size_t)nk);
    float *dv_acc = (float *)scratch(&st->dv_acc, sizeof(float) * (size_t)nk);
    CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, sizeof(float) * (size_t)nq, stream));
    CUDA_CHECK(cudaMemsetAsync(dk_acc, 0, sizeof(float) * (size_t)nk, stream));
    CUDA_CHECK(cudaMemsetAsync(dv_acc, 0, sizeof(float) * (size_t)nk, stream));
    RingCallCuda call = layer_call(st, layer, &s, pos, stream);
    call.q = q, call.k = k, call.v = v, call.o = o, call.dout = dout;
    call.grads = AttnGrads{lse, NULL, dq_acc, dk_acc, dv_acc};
    ring_cuda_backward(st->ring, &call);
    launch_add_into((__nv_bfloat16 *)dq, dq_acc, nq, stream);
    launch_add_into((__nv_bfloat16 *)dk, dk_acc, nk, stream);
    launch_add_into((__nv_bfloat16 *)dv, dv_acc, nk, stream);
}

extern "C" double attention_cuda_ring_bytes(const AttnState *st) {
    return st->ring ? ring_cuda_bytes(st->ring) : 0;
}
