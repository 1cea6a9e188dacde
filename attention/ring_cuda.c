// ring_cuda.c: ring attention on device buffers (ring_cuda.h): a RingMemory
// on the GPU for ring.c's schedules. Buffers are cudaMalloc'ed, copies, row
// moves and the forward init / backward delta are enqueued on the op's
// stream, messages go through a DeviceExchange (dist/comm_device.h): with
// NCCL the host never waits inside a layer. Token lists for row moves are
// copied to a device buffer before each move (stream-ordered).
#ifdef MTRAIN_CUDA

#include "ring_cuda.h"

#include <stdlib.h>

#include "../dist/comm_device.h"
#include "../dist/cuda_check.h"
#include "../dist/util.h"
#include "attention_cuda.h"
#include "ring_plan.h"
#include "ring_rows_cuda.h"
#include "ring_sparse.h"

typedef struct {
    const Comm *cp;
    int inner;
    Ring ring;
    bool built;
    int64_t *positions;        // [N] the ring's positions on the device
    cudaStream_t stream;       // the op's stream of the current call
    DeviceExchange *exchange;  // made on the first call, with that stream
    int64_t *sel;              // [sel_count] device copy of a token list
    int64_t sel_count;
    size_t sel_bytes;
    void *staging;             // [staging_bytes] in-place row moves go through it
    size_t staging_bytes;
    RingMemory memory;
    RingKernels kernels;
    RingNeed need;             // ring_send selected: key blocks each rank's queries read
    uint64_t *need_bits;       // [cp size, need.words]
    RingTraffic traffic;
} RingCuda;

// ---- the device memory ----

// Zeroed: with ring_send selected a chunk's unsent rows stay as they were,
// and the dense kernels read them under the causal mask (weight 0, so they
// must be finite).
static void *dev_alloc(void *ctx, size_t bytes) {
    RingCuda *rc = ctx;
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, rc->stream));
    return p;
}

static void dev_release(void *ctx, void *buf) {
    (void)ctx;
    CUDA_CHECK(cudaFree(buf));
}

static void dev_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    RingCuda *rc = ctx;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, rc->stream));
}

static void dev_zero(void *ctx, void *dst, size_t bytes) {
    RingCuda *rc = ctx;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, rc->stream));
}

// sel [n] (host) on the device (room made by begin).
static const int64_t *device_sel(RingCuda *rc, const int64_t *sel, int64_t n) {
    CHECK(n <= rc->sel_count, "ring attention (CUDA): a list of %lld tokens (room for %lld)", (long long)n,
          (long long)rc->sel_count);
    // pageable source: staged when cudaMemcpyAsync returns
    CUDA_CHECK(cudaMemcpyAsync(rc->sel, sel, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice, rc->stream));
    return rc->sel;
}

// In place (dst == src) the source is copied aside first: threads move rows in any order.
static const void *apart(RingCuda *rc, const void *dst, const void *src, size_t bytes) {
    if (dst != src) return src;
    CHECK(bytes <= rc->staging_bytes, "ring attention (CUDA): a message of %zu bytes (room for %zu)", bytes,
          rc->staging_bytes);
    CUDA_CHECK(cudaMemcpyAsync(rc->staging, src, bytes, cudaMemcpyDeviceToDevice, rc->stream));
    return rc->staging;
}

// At least `bytes` of *buf (device). Only between ring calls: cudaFree waits
// for the whole device, which inside a call would wait for transfers whose
// peers wait for this host.
static void room(void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return;
    if (*buf) CUDA_CHECK(cudaFree(*buf));
    CUDA_CHECK(cudaMalloc(buf, bytes));
    *have = bytes;
}

static void dev_gather_rows(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                            size_t row_bytes) {
    RingCuda *rc = ctx;
    if (n == 0) return;
    src = apart(rc, dst, src, (size_t)(2 * full) * row_bytes);
    ring_gather_rows_cuda(dst, src, full, device_sel(rc, sel, n), n, row_bytes, rc->stream);
}

static void dev_scatter_rows(void *ctx, void *dst, const void *src, int64_t full, const int64_t *sel, int64_t n,
                             size_t row_bytes) {
    RingCuda *rc = ctx;
    if (n == 0) return;
    src = apart(rc, dst, src, (size_t)(2 * n) * row_bytes);
    ring_scatter_rows_cuda(dst, src, full, device_sel(rc, sel, n), n, row_bytes, rc->stream);
}

static void dev_add_rows(void *ctx, float *dk, float *dv, const float *in, const int64_t *sel, int64_t n,
                         int64_t kv) {
    RingCuda *rc = ctx;
    if (n == 0) return;
    ring_add_rows_cuda(dk, dv, in, device_sel(rc, sel, n), n, kv, rc->stream);
}

static void dev_send(void *ctx, const Comm *c, const void *buf, size_t bytes, int to, int tag, RingRequest *req) {
    RingCuda *rc = ctx;
    (void)c;
    req->id = comm_device_send(rc->exchange, buf, bytes, to, tag);
}

static void dev_recv(void *ctx, const Comm *c, void *buf, size_t bytes, int from, int tag, RingRequest *req) {
    RingCuda *rc = ctx;
    (void)c;
    req->id = comm_device_recv(rc->exchange, buf, bytes, from, tag);
}

static void dev_wait(void *ctx, const Comm *c, RingRequest *reqs, int n, const char *op) {
    RingCuda *rc = ctx;
    (void)c;
    for (int i = 0; i < n; i++) {
        comm_device_wait(rc->exchange, reqs[i].id, op);
        reqs[i] = RING_REQUEST_NULL;
    }
}

static void dev_forward_init(void *ctx, const AttnShape *shape, float *o, float *lse) {
    RingCuda *rc = ctx;
    attn_forward_init_cuda(shape, o, lse, rc->stream);
}

static void dev_backward_delta(void *ctx, const AttnShape *shape, const void *o, const void *dout, float *delta) {
    RingCuda *rc = ctx;
    attn_backward_delta_cuda(shape, o, dout, delta, rc->stream);
}

// ---- the dense kernels per ring step ----

static void dense_forward(void *ctx, const AttnShape *shape, const void *q, const int64_t *q_pos, const void *k,
                          const void *v, const int64_t *k_pos, float *o, float *lse) {
    RingCuda *rc = ctx;
    attn_dense_forward_cuda(shape, q, q_pos, k, v, k_pos, o, lse, rc->stream);
}

static void dense_backward(void *ctx, const AttnShape *shape, const void *q, const int64_t *q_pos, const void *k,
                           const void *v, const int64_t *k_pos, const float *lse, const float *delta,
                           const void *dout, float *dq, float *dk, float *dv) {
    RingCuda *rc = ctx;
    attn_dense_backward_cuda(shape, q, q_pos, k, v, k_pos, lse, delta, dout, dq, dk, dv, rc->stream);
}

// ---- the ring ----

static void forget_sequence(RingCuda *rc) {
    if (!rc->built) return;
    ring_free(&rc->ring);
    CUDA_CHECK(cudaFree(rc->positions));
    rc->positions = NULL;
    rc->built = false;
}

static void ring_free_cuda(void *ring) {
    RingCuda *rc = ring;
    forget_sequence(rc);
    comm_device_exchange_free(rc->exchange);
    if (rc->sel) CUDA_CHECK(cudaFree(rc->sel));
    if (rc->staging) CUDA_CHECK(cudaFree(rc->staging));
    free(rc->need_bits);
    free(rc);
}

static void ring_sequence(void *ring, const int64_t *pos, int64_t tokens) {
    RingCuda *rc = ring;
    forget_sequence(rc);
    ring_init(&rc->ring, rc->cp, rc->inner, pos, tokens);
    const int64_t N = rc->ring.offsets[rc->cp->size];
    CUDA_CHECK(cudaMalloc((void **)&rc->positions, sizeof(int64_t) * (size_t)(N > 0 ? N : 1)));
    CUDA_CHECK(cudaMemcpy(rc->positions, rc->ring.positions, sizeof(int64_t) * (size_t)N, cudaMemcpyHostToDevice));
    ring_set_memory(&rc->ring, &rc->memory, rc->positions);
    rc->built = true;
    rc->traffic = (RingTraffic){0};
}

// The call's stream, the exchange, and with ring_send selected the key
// blocks each rank's queries read for this shape.
static const RingKernels *begin(RingCuda *rc, const AttnShape *shape, RingSend send, cudaStream_t stream) {
    CHECK(rc->built, "ring attention (CUDA): a call before the sequence's positions (ring_cuda_sequence)");
    rc->stream = stream;
    if (!rc->exchange) rc->exchange = comm_device_exchange_new(rc->cp, stream);
    const int64_t rows = rc->ring.max_count + 1, kv = (int64_t)shape->num_kv_heads * shape->head_dim;
    room((void **)&rc->sel, &rc->sel_bytes, sizeof(int64_t) * (size_t)rows);
    rc->sel_count = rows;
    room(&rc->staging, &rc->staging_bytes, sizeof(float) * (size_t)(2 * rows * kv));
    rc->kernels.need = NULL;
    if (send != RING_SEND_SELECTED) return &rc->kernels;
    const int64_t words = ring_need_words(rc->ring.offsets[rc->cp->size], shape->block_size);
    rc->need_bits = xrealloc(rc->need_bits, (size_t)(rc->cp->size * words) * sizeof(uint64_t));
    ring_dense_need(&rc->ring, shape, words, rc->need_bits);
    rc->need = (RingNeed){.block_size = shape->block_size, .words = words, .need = rc->need_bits};
    rc->kernels.need = &rc->need;
    return &rc->kernels;
}

static void ring_forward(void *ring, const AttnShape *shape, RingSend send, const uint16_t *q, const uint16_t *k,
                         const uint16_t *v, float *o_acc, float *lse, cudaStream_t stream) {
    RingCuda *rc = ring;
    ring_attn_forward(&rc->ring, begin(rc, shape, send, stream), shape, q, k, v, o_acc, lse);
}

static void ring_backward(void *ring, const AttnShape *shape, RingSend send, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, const uint16_t *o, const float *lse, const uint16_t *dout,
                          float *dq_acc, float *dk_acc, float *dv_acc, cudaStream_t stream) {
    RingCuda *rc = ring;
    ring_attn_backward(&rc->ring, begin(rc, shape, send, stream), shape, q, k, v, o, lse, dout, dq_acc, dk_acc,
                       dv_acc);
}

static double ring_bytes(const void *ring) {
    const RingCuda *rc = ring;
    return (double)(rc->traffic.kv_bytes + rc->traffic.dkv_bytes);
}

AttnRingCuda ring_cuda_new(const Comm *cp, int inner) {
    RingCuda *rc = xcalloc(1, sizeof(RingCuda));
    rc->cp = cp;
    rc->inner = inner;
    rc->memory = (RingMemory){
        .act_bytes = sizeof(uint16_t), .alloc = dev_alloc, .release = dev_release, .copy = dev_copy,
        .zero = dev_zero, .gather_rows = dev_gather_rows, .scatter_rows = dev_scatter_rows,
        .add_rows = dev_add_rows, .send = dev_send, .recv = dev_recv, .wait = dev_wait,
        .forward_init = dev_forward_init, .backward_delta = dev_backward_delta, .ctx = rc,
    };
    rc->kernels = (RingKernels){.forward = dense_forward, .backward = dense_backward, .ctx = rc,
                                .traffic = &rc->traffic};
    return (AttnRingCuda){.ring = rc, .cp_size = cp->size, .sequence = ring_sequence, .forward = ring_forward,
                          .backward = ring_backward, .bytes = ring_bytes, .free = ring_free_cuda};
}

#endif
