// gpu_test_sparse.c: the CUDA block-sparse + vertical-column flash attention
// (attention/kernels/sparse_cuda.cu) against the CPU sparse kernels
// (attention/kernels/sparse_flash_cpu.c) on the same bf16-rounded inputs and the same
// index, fresh random ones per case: random vertical-slash patterns turned
// into an index by sparse_index_build, lengths that are not multiples of the
// block, blocks 64 and 128, head dims 64 and 128, GQA 1, 2 and 8, 1 to 3 key
// chunks of a striped layout (block = the index's block) merged in ring
// order; with documents (DOC_STARTS: one-token documents, documents across
// blocks and tiles), the index restricted by sparse_index_documents as the
// CPU op does; each random pattern is also indexed on the GPU
// (sparse_index_build_cuda, documents included), which must give the CPU's
// index entry for entry; and the same index split as the cp ring computes
// it (the block pass per chunk, then the column pass over the index's
// columns gathered out of the chunks: each column once) against the CPU.
// The small cases include one chunk of the all-blocks index at blocks of
// 64, so that the key-major backward's CTAs take 3 to 5 query tiles (its
// pipeline's third token slot). Also: the all-blocks index (every slash offset)
// against the dense CUDA kernels on the same inputs, with and without
// documents. And the GPU pattern pipeline
// (attention/sparse/sparse_select_cuda.cu): estimation against a double-precision
// reference; selection and index against sparse_select / sparse_index_build
// run on the GPU's own scores (copied back), which must give identical lines
// and index, tie-breaks included (the CPU estimation itself uses cblas,
// which GPU machines may lack; fed the same scores, the two selections have
// no fp32 noise to disagree on), the index with documents rebuilt into the
// same buffers and the other budget selected into the same pattern (both
// poisoned first). Runs on a GPU under `make test-gpu`, and on the CPU
// under the CUDA simulator in `make test` (tests/sim/test_sim.sh).
//   build/tests/gpu_test_sparse         every case
//   build/tests/gpu_test_sparse small   the small cases (compute-sanitizer)
//   build/tests/gpu_test_sparse index   only the long index row (every run
//                                       starts with it; tests/sim/test_sim.sh's
//                                       mutants of the index's barriers)
//
// Tolerances as gpu_test_attention.c: relative Frobenius error <= 1e-2 for O,
// delta, dQ, dK, dV and 1e-4 for the LSE against the CPU; sparse (all blocks)
// against dense on the GPU: 1e-3 (same bf16 roundings, other sum orders).
// Outputs are poisoned (NaN) before the kernels write them; gradients start
// from random values and their increments are compared; the forward has no
// atomics, so two runs must agree bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/attention.h"
#include "../../attention/kernels/attention_cuda.h"
#include "../../attention/layout.h"
#include "../../attention/sparse/sparse.h"
#include "../../attention/kernels/sparse_cuda.h"
#include "../../attention/sparse/sparse_select_cuda.h"
#include "../../dist/cuda_check.h"
#include "../../dist/util.h"
#include "../lib/check.h"
#include "gpu_common.h"

#define TOL 1e-2
#define TOL_LSE 1e-4
#define TOL_DENSE 1e-3
#define DOC_SINK 4           // attention.sink of the cases with documents

// Document starts of the cases with documents (those below the sequence's
// length): positions 0..2 before the first document, one-token documents at
// 5 and 256, documents crossing the 64- and 128-token blocks and tiles.
static const int64_t DOC_STARTS[] = {3, 5, 6, 129, 200, 256, 257, 700, 1000, 2050, 4000};

typedef struct {
    int64_t n;       // sequence length
    int D, Hq, Hkv, B;
    int world;       // 1: queries and keys are the whole sequence; else striped chunks
    int rank;        // the queries' rank; chunks come in ring order from it
    double density;  // probability of each vertical line and slash line; < 0: all blocks
    int docs;        // 1: documents at DOC_STARTS; 0: one document
} Case;

// The inputs of one case: queries (rank's tokens) and the key chunks in ring
// order; host bf16 bits, their fp32 values, device copies.
typedef struct {
    int64_t Tq, nq;
    int64_t *qpos, *d_qpos;
    uint16_t *q, *dout, *d_q, *d_dout;
    float *qf, *doutf;
    int nch;
    int64_t *T, **pos, **d_pos;
    uint16_t **k, **v, **d_k, **d_v;
    float **kf, **vf;
} Inputs;

// Forward and backward results, host fp32: O (bf16 values), LSE, delta, and
// the increments of dQ and of every chunk's dK, dV (chunks concatenated).
typedef struct {
    float *o, *lse, *delta, *dq, *dk, *dv;
} Results;

static const int64_t *d_doc_starts;   // DOC_STARTS on the device (main)

static AttnShape shape_of(const Case *c, int64_t Tq, int64_t Tk) {
    int64_t count = 0;
    while (c->docs && count < (int64_t)(sizeof DOC_STARTS / sizeof DOC_STARTS[0]) && DOC_STARTS[count] < c->n)
        count++;
    return (AttnShape){Tq, Tk, c->Hq, c->Hkv, c->D, c->B, 1.0f / sqrtf((float)c->D),
                       count > 0 ? DOC_STARTS : NULL, count, count > 0 ? d_doc_starts : NULL};
}

static int64_t total_keys(const Inputs *in) {
    int64_t n = 0;
    for (int i = 0; i < in->nch; i++) n += in->T[i];
    return n;
}

static Inputs make_inputs(const Case *c, Rng *rng) {
    Inputs in = {.nch = c->world};
    in.qpos = xmalloc((size_t)c->n * sizeof(int64_t));
    in.Tq = layout_rank_positions(LAYOUT_STRIPED, c->n, c->B, c->world, c->rank, in.qpos);
    in.nq = in.Tq * c->Hq * c->D;
    in.T = xmalloc((size_t)in.nch * sizeof(int64_t));
    in.pos = xmalloc((size_t)in.nch * sizeof(int64_t *));
    in.d_pos = xmalloc((size_t)in.nch * sizeof(int64_t *));
    in.k = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.v = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.d_k = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.d_v = xmalloc((size_t)in.nch * sizeof(uint16_t *));
    in.kf = xmalloc((size_t)in.nch * sizeof(float *));
    in.vf = xmalloc((size_t)in.nch * sizeof(float *));
    for (int i = 0; i < in.nch; i++) {
        const int r = ((c->rank - i) % c->world + c->world) % c->world;
        in.pos[i] = xmalloc((size_t)c->n * sizeof(int64_t));
        in.T[i] = layout_rank_positions(LAYOUT_STRIPED, c->n, c->B, c->world, r, in.pos[i]);
        const int64_t nk = in.T[i] * c->Hkv * c->D;
        random_bf16(rng, nk, &in.k[i], &in.kf[i]);
        random_bf16(rng, nk, &in.v[i], &in.vf[i]);
        in.d_pos[i] = to_device(in.pos[i], (size_t)in.T[i] * sizeof(int64_t));
        in.d_k[i] = to_device(in.k[i], (size_t)nk * sizeof(uint16_t));
        in.d_v[i] = to_device(in.v[i], (size_t)nk * sizeof(uint16_t));
    }
    random_bf16(rng, in.nq, &in.q, &in.qf);
    random_bf16(rng, in.nq, &in.dout, &in.doutf);
    in.d_q = to_device(in.q, (size_t)in.nq * sizeof(uint16_t));
    in.d_dout = to_device(in.dout, (size_t)in.nq * sizeof(uint16_t));
    in.d_qpos = to_device(in.qpos, (size_t)in.Tq * sizeof(int64_t));
    return in;
}

static void free_inputs(Inputs *in) {
    for (int i = 0; i < in->nch; i++) {
        CUDA_CHECK(cudaFree(in->d_pos[i])); CUDA_CHECK(cudaFree(in->d_k[i])); CUDA_CHECK(cudaFree(in->d_v[i]));
        free(in->pos[i]); free(in->k[i]); free(in->v[i]); free(in->kf[i]); free(in->vf[i]);
    }
    CUDA_CHECK(cudaFree(in->d_q)); CUDA_CHECK(cudaFree(in->d_dout)); CUDA_CHECK(cudaFree(in->d_qpos));
    free(in->T); free(in->pos); free(in->d_pos); free(in->k); free(in->v); free(in->d_k); free(in->d_v);
    free(in->kf); free(in->vf); free(in->qpos); free(in->q); free(in->dout); free(in->qf); free(in->doutf);
}

static void free_results(Results *r) {
    free(r->o); free(r->lse); free(r->delta); free(r->dq); free(r->dk); free(r->dv);
}

// A random vertical-slash pattern (each vertical line with probability
// `density`, each slash with density / 10 so that many rows keep columns
// outside their blocks, offset 0 always; density < 0: every offset, i.e.
// every causal block) into *pattern, and its index for the queries' blocks
// (q_blocks [num_q_blocks]), restricted to the documents where there are some.
static void make_index(const Case *c, const Inputs *in, Rng *rng, SparsePattern *pattern, int64_t **q_blocks,
                       SparseIndex *index) {
    const int64_t N = c->n;
    SparsePattern p = {.num_heads = c->Hq, .seq_len = N};
    p.vertical_start = xmalloc((size_t)(c->Hq + 1) * sizeof(int64_t));
    p.slash_start = xmalloc((size_t)(c->Hq + 1) * sizeof(int64_t));
    p.vertical = xmalloc((size_t)(c->Hq * N + 1) * sizeof(int64_t));
    p.slash = xmalloc((size_t)(c->Hq * N + 1) * sizeof(int64_t));
    p.vertical_start[0] = p.slash_start[0] = 0;
    for (int h = 0; h < c->Hq; h++) {
        int64_t nv = p.vertical_start[h], ns = p.slash_start[h];
        for (int64_t i = 0; i < N; i++) {
            if (c->density >= 0 && rng_uniform(rng) < c->density) p.vertical[nv++] = i;
            if (i == 0 || c->density < 0 || rng_uniform(rng) < c->density / 10) p.slash[ns++] = i;
        }
        p.vertical_start[h + 1] = nv;
        p.slash_start[h + 1] = ns;
    }
    const int64_t nqb = (in->Tq + c->B - 1) / c->B;
    *q_blocks = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) (*q_blocks)[i] = in->qpos[i * c->B] / c->B;
    sparse_index_build(&p, c->B, *q_blocks, nqb, index);
    const AttnShape s = shape_of(c, in->Tq, in->Tq);
    sparse_index_documents(&s, DOC_SINK, index);
    *pattern = p;
}

// A host pattern on the device, in SparsePatternCuda's layout (capacities:
// the most lines of any head).
static void pattern_to_device(const SparsePattern *p, SparsePatternCuda *d) {
    const int H = p->num_heads;
    int64_t most_v = 1, most_s = 1;
    for (int h = 0; h < H; h++) {
        const int64_t nv = p->vertical_start[h + 1] - p->vertical_start[h];
        const int64_t ns = p->slash_start[h + 1] - p->slash_start[h];
        most_v = nv > most_v ? nv : most_v;
        most_s = ns > most_s ? ns : most_s;
    }
    int64_t *vertical = xcalloc((size_t)(H * most_v), sizeof(int64_t));
    int64_t *slash = xcalloc((size_t)(H * most_s), sizeof(int64_t));
    int64_t *counts = xmalloc(2 * (size_t)H * sizeof(int64_t));
    for (int h = 0; h < H; h++) {
        counts[h] = p->vertical_start[h + 1] - p->vertical_start[h];
        counts[H + h] = p->slash_start[h + 1] - p->slash_start[h];
        memcpy(vertical + h * most_v, p->vertical + p->vertical_start[h], (size_t)counts[h] * sizeof(int64_t));
        memcpy(slash + h * most_s, p->slash + p->slash_start[h], (size_t)counts[H + h] * sizeof(int64_t));
    }
    *d = (SparsePatternCuda){.num_heads = H, .seq_len = p->seq_len, .vertical_capacity = most_v,
                             .slash_capacity = most_s, .vertical_allocated = H * most_v,
                             .slash_allocated = H * most_s, .count_allocated = 2 * H};
    d->vertical = to_device(vertical, (size_t)(H * most_v) * sizeof(int64_t));
    d->slash = to_device(slash, (size_t)(H * most_s) * sizeof(int64_t));
    d->vertical_count = to_device(counts, 2 * (size_t)H * sizeof(int64_t));
    d->slash_count = d->vertical_count + H;
    free(vertical); free(slash); free(counts);
}

static int64_t *from_device_i64(const int64_t *dev, int64_t n) {
    int64_t *x = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    if (n > 0) CUDA_CHECK(cudaMemcpy(x, dev, (size_t)n * sizeof(int64_t), cudaMemcpyDeviceToHost));
    return x;
}

// Whether the device pattern dp holds the host pattern p's lines, head by head.
static int same_pattern(const SparsePatternCuda *dp, const SparsePattern *p) {
    CUDA_CHECK(cudaDeviceSynchronize());
    const int H = p->num_heads;
    int64_t *vc = from_device_i64(dp->vertical_count, H), *sc = from_device_i64(dp->slash_count, H);
    int64_t *vl = from_device_i64(dp->vertical, H * dp->vertical_capacity);
    int64_t *sl = from_device_i64(dp->slash, H * dp->slash_capacity);
    int same = 1;
    for (int h = 0; h < H && same; h++) {
        same = vc[h] == p->vertical_start[h + 1] - p->vertical_start[h] &&
               sc[h] == p->slash_start[h + 1] - p->slash_start[h];
        same = same &&
               memcmp(vl + h * dp->vertical_capacity, p->vertical + p->vertical_start[h],
                      (size_t)vc[h] * sizeof(int64_t)) == 0 &&
               memcmp(sl + h * dp->slash_capacity, p->slash + p->slash_start[h], (size_t)sc[h] * sizeof(int64_t)) == 0;
    }
    free(vc); free(sc); free(vl); free(sl);
    return same;
}

// Every allocated entry of a device pattern or index set to -1 (0xff bytes),
// so that a rebuild into it must write all it holds.
static void poison_pattern(SparsePatternCuda *dp) {
    CUDA_CHECK(cudaMemset(dp->vertical, 0xff, (size_t)dp->vertical_allocated * sizeof(int64_t)));
    CUDA_CHECK(cudaMemset(dp->slash, 0xff, (size_t)dp->slash_allocated * sizeof(int64_t)));
    CUDA_CHECK(cudaMemset(dp->vertical_count, 0xff, (size_t)dp->count_allocated * sizeof(int64_t)));
}

static void poison_index(SparseIndexCuda *dx) {
    CUDA_CHECK(cudaMemset(dx->q_blocks, 0xff, (size_t)dx->q_block_capacity * sizeof(int64_t)));
    CUDA_CHECK(cudaMemset(dx->block_start, 0xff, (size_t)dx->row_capacity * sizeof(int64_t)));
    CUDA_CHECK(cudaMemset(dx->column_start, 0xff, (size_t)dx->column_row_capacity * sizeof(int64_t)));
    CUDA_CHECK(cudaMemset(dx->blocks, 0xff, (size_t)dx->block_capacity * sizeof(int64_t)));
    CUDA_CHECK(cudaMemset(dx->columns, 0xff, (size_t)dx->column_capacity * sizeof(int64_t)));
}

// Whether the device index dx equals the host index x: the same row starts,
// blocks and columns.
static int same_index(const SparseIndexCuda *dx, const SparseIndex *x) {
    CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t rows = x->num_heads * x->num_q_blocks;
    int64_t *bs = from_device_i64(dx->block_start, rows + 1), *cs = from_device_i64(dx->column_start, rows + 1);
    int same = memcmp(bs, x->block_start, (size_t)(rows + 1) * sizeof(int64_t)) == 0 &&
               memcmp(cs, x->column_start, (size_t)(rows + 1) * sizeof(int64_t)) == 0;
    if (same) {
        int64_t *bl = from_device_i64(dx->blocks, bs[rows]), *cl = from_device_i64(dx->columns, cs[rows]);
        same = memcmp(bl, x->blocks, (size_t)bs[rows] * sizeof(int64_t)) == 0 &&
               memcmp(cl, x->columns, (size_t)cs[rows] * sizeof(int64_t)) == 0;
        free(bl); free(cl);
    }
    free(bs); free(cs);
    return same;
}

// Random starting gradients (the same for every run of a case).
typedef struct {
    float *dq, *dk, *dv;       // [nq], [total keys * Hkv * D] x 2
} Start;

// The CPU sparse kernels over every chunk.
static Results cpu_run(const Case *c, const Inputs *in, const SparseIndex *index, const Start *st) {
    const int64_t nl = in->Tq * c->Hq, nk = total_keys(in) * c->Hkv * c->D;
    Results r = {xmalloc((size_t)in->nq * sizeof(float) + 1), xmalloc((size_t)nl * sizeof(float) + 1),
                 xmalloc((size_t)nl * sizeof(float) + 1), xmalloc((size_t)in->nq * sizeof(float) + 1),
                 xmalloc((size_t)nk * sizeof(float) + 1), xmalloc((size_t)nk * sizeof(float) + 1)};
    const AttnShape s0 = shape_of(c, in->Tq, 0);
    attn_forward_init(&s0, r.o, r.lse);
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        attn_sparse_forward_cpu(&s, index, in->qf, in->qpos, in->kf[i], in->vf[i], in->pos[i], r.o, r.lse);
    }
    attn_backward_delta(&s0, r.o, in->doutf, r.delta);
    memcpy(r.dq, st->dq, (size_t)in->nq * sizeof(float));
    memcpy(r.dk, st->dk, (size_t)nk * sizeof(float));
    memcpy(r.dv, st->dv, (size_t)nk * sizeof(float));
    int64_t off = 0;
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        attn_sparse_backward_cpu(&s, index, in->qf, in->qpos, in->kf[i], in->vf[i], in->pos[i], r.lse,
                                 r.delta, in->doutf, r.dq, r.dk + off, r.dv + off);
        off += in->T[i] * c->Hkv * c->D;
    }
    subtract(r.dq, st->dq, in->nq);
    subtract(r.dk, st->dk, nk);
    subtract(r.dv, st->dv, nk);
    return r;
}

// The columns of an index gathered out of the key chunks, as the cp ring
// gathers them: ascending positions, where each sits in the chunks'
// concatenated keys, and their K/V rows on the device.
typedef struct {
    int64_t n;
    int64_t *d_pos;            // [n] device
    int64_t *at;               // [n] key row in the concatenated chunks
    uint16_t *d_k, *d_v;       // [n, Hkv, D] device
} Columns;

static Columns gather_columns(const Case *c, const Inputs *in, const SparseIndex *index) {
    const int64_t rows = (int64_t)index->num_heads * index->num_q_blocks, w = (int64_t)c->Hkv * c->D;
    char *mark = xcalloc((size_t)c->n, 1);
    for (int64_t e = 0; e < index->column_start[rows]; e++) mark[index->columns[e]] = 1;
    Columns cols = {0};
    int64_t *pos = xmalloc((size_t)(c->n + 1) * sizeof(int64_t));
    cols.at = xmalloc((size_t)(c->n + 1) * sizeof(int64_t));
    uint16_t *k = xmalloc((size_t)(c->n * w + 1) * sizeof(uint16_t)), *v = xmalloc((size_t)(c->n * w + 1) * sizeof(uint16_t));
    for (int64_t x = 0; x < c->n; x++) {
        if (!mark[x]) continue;
        int64_t off = 0;
        for (int i = 0; i < in->nch; off += in->T[i], i++)
            for (int64_t t = 0; t < in->T[i]; t++) {
                if (in->pos[i][t] != x) continue;
                memcpy(k + cols.n * w, in->k[i] + t * w, (size_t)w * sizeof(uint16_t));
                memcpy(v + cols.n * w, in->v[i] + t * w, (size_t)w * sizeof(uint16_t));
                pos[cols.n] = x;
                cols.at[cols.n++] = off + t;
            }
    }
    cols.d_pos = to_device(pos, (size_t)(cols.n + 1) * sizeof(int64_t));
    cols.d_k = to_device(k, (size_t)(cols.n * w + 1) * sizeof(uint16_t));
    cols.d_v = to_device(v, (size_t)(cols.n * w + 1) * sizeof(uint16_t));
    free(mark); free(pos); free(k); free(v);
    return cols;
}

static void free_columns(Columns *cols) {
    CUDA_CHECK(cudaFree(cols->d_pos)); CUDA_CHECK(cudaFree(cols->d_k)); CUDA_CHECK(cudaFree(cols->d_v));
    free(cols->at);
}

// The GPU forward of every chunk into fresh poisoned (then initialised) o_acc
// and lse: sparse with `index`, dense when it is NULL; with `cols` the block
// pass per chunk, then the column pass over the gathered columns (as on the
// cp ring). Returns o_acc (device).
static float *gpu_forward(const Case *c, const Inputs *in, const SparseIndexCuda *index, const Columns *cols,
                          float *d_lse) {
    float *d_oacc = poisoned((size_t)in->nq * sizeof(float));
    CUDA_CHECK(cudaMemset(d_lse, 0xff, (size_t)(in->Tq * c->Hq) * sizeof(float)));
    const AttnShape s0 = shape_of(c, in->Tq, 0);
    attn_forward_init_cuda(&s0, d_oacc, d_lse, 0);
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        if (index)
            attn_sparse_forward_part_cuda(cols ? SPARSE_BLOCKS : SPARSE_ALL, &s, index, in->d_q, in->d_qpos,
                                          in->d_k[i], in->d_v[i], in->d_pos[i], d_oacc, d_lse, 0);
        else
            attn_dense_forward_cuda(&s, in->d_q, in->d_qpos, in->d_k[i], in->d_v[i], in->d_pos[i], d_oacc,
                                    d_lse, 0);
    }
    if (cols) {
        const AttnShape s = shape_of(c, in->Tq, cols->n);
        attn_sparse_forward_part_cuda(SPARSE_COLUMNS, &s, index, in->d_q, in->d_qpos, cols->d_k, cols->d_v,
                                      cols->d_pos, d_oacc, d_lse, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return d_oacc;
}

// Forward (twice: checks that the runs agree bit for bit) and backward on
// the GPU, sparse with `index` or dense when it is NULL; with `cols` split
// into the block and the column pass (gpu_forward), the columns' dK/dV
// added to their chunks' rows afterwards.
static Results gpu_run(const Case *c, const Inputs *in, const SparseIndexCuda *index, const Columns *cols,
                       const Start *st, const char *name) {
    const int64_t nl = in->Tq * c->Hq, nk = total_keys(in) * c->Hkv * c->D, w = (int64_t)c->Hkv * c->D;
    float *d_lse = poisoned((size_t)nl * sizeof(float));
    float *d_oacc = gpu_forward(c, in, index, cols, d_lse);
    float *oacc1 = from_device_f32(d_oacc, in->nq), *lse1 = from_device_f32(d_lse, nl);
    CUDA_CHECK(cudaFree(d_oacc));
    d_oacc = gpu_forward(c, in, index, cols, d_lse);
    float *oacc2 = from_device_f32(d_oacc, in->nq), *lse2 = from_device_f32(d_lse, nl);
    EXPECT_COUNTED(memcmp(oacc1, oacc2, (size_t)in->nq * sizeof(float)) == 0 &&
                   memcmp(lse1, lse2, (size_t)nl * sizeof(float)) == 0, "%s forward repeatable", name);

    const AttnShape s0 = shape_of(c, in->Tq, 0);
    uint16_t *d_o = poisoned((size_t)in->nq * sizeof(uint16_t));
    attn_output_bf16_cuda(&s0, d_oacc, d_o, 0);
    float *d_delta = poisoned((size_t)nl * sizeof(float));
    attn_backward_delta_cuda(&s0, d_o, in->d_dout, d_delta, 0);
    float *d_dq = to_device(st->dq, (size_t)in->nq * sizeof(float));
    float *d_dk = to_device(st->dk, (size_t)nk * sizeof(float));
    float *d_dv = to_device(st->dv, (size_t)nk * sizeof(float));
    int64_t off = 0;
    for (int i = 0; i < in->nch; i++) {
        const AttnShape s = shape_of(c, in->Tq, in->T[i]);
        if (index)
            attn_sparse_backward_part_cuda(cols ? SPARSE_BLOCKS : SPARSE_ALL, &s, index, in->d_q, in->d_qpos,
                                           in->d_k[i], in->d_v[i], in->d_pos[i], d_lse, d_delta, in->d_dout, d_dq,
                                           d_dk + off, d_dv + off, 0);
        else
            attn_dense_backward_cuda(&s, in->d_q, in->d_qpos, in->d_k[i], in->d_v[i], in->d_pos[i], d_lse,
                                     d_delta, in->d_dout, d_dq, d_dk + off, d_dv + off, 0);
        off += in->T[i] * c->Hkv * c->D;
    }
    float *col_dk = NULL, *col_dv = NULL;
    if (cols) {
        const AttnShape s = shape_of(c, in->Tq, cols->n);
        float *d_cdk = poisoned((size_t)(cols->n * w + 1) * sizeof(float));
        float *d_cdv = poisoned((size_t)(cols->n * w + 1) * sizeof(float));
        CUDA_CHECK(cudaMemset(d_cdk, 0, (size_t)(cols->n * w + 1) * sizeof(float)));
        CUDA_CHECK(cudaMemset(d_cdv, 0, (size_t)(cols->n * w + 1) * sizeof(float)));
        attn_sparse_backward_part_cuda(SPARSE_COLUMNS, &s, index, in->d_q, in->d_qpos, cols->d_k, cols->d_v,
                                       cols->d_pos, d_lse, d_delta, in->d_dout, d_dq, d_cdk, d_cdv, 0);
        col_dk = from_device_f32(d_cdk, cols->n * w);
        col_dv = from_device_f32(d_cdv, cols->n * w);
        CUDA_CHECK(cudaFree(d_cdk)); CUDA_CHECK(cudaFree(d_cdv));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    Results r = {from_device_bf16(d_o, in->nq), lse2, from_device_f32(d_delta, nl),
                 from_device_f32(d_dq, in->nq), from_device_f32(d_dk, nk), from_device_f32(d_dv, nk)};
    for (int64_t j = 0; cols && j < cols->n; j++)
        for (int64_t x = 0; x < w; x++) {
            r.dk[cols->at[j] * w + x] += col_dk[j * w + x];
            r.dv[cols->at[j] * w + x] += col_dv[j * w + x];
        }
    free(col_dk); free(col_dv);
    subtract(r.dq, st->dq, in->nq);
    subtract(r.dk, st->dk, nk);
    subtract(r.dv, st->dv, nk);
    CUDA_CHECK(cudaFree(d_lse)); CUDA_CHECK(cudaFree(d_oacc)); CUDA_CHECK(cudaFree(d_o));
    CUDA_CHECK(cudaFree(d_delta)); CUDA_CHECK(cudaFree(d_dq)); CUDA_CHECK(cudaFree(d_dk));
    CUDA_CHECK(cudaFree(d_dv));
    free(oacc1); free(oacc2); free(lse1);
    return r;
}

static void compare(const char *name, const char *what, const Results *a, const Results *b, int64_t nq,
                    int64_t nl, int64_t nk, double tol, double tol_lse) {
    double e;
    EXPECT_COUNTED((e = rel_frobenius(a->o, b->o, nq)) <= tol, "%s %s O rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->lse, b->lse, nl)) <= tol_lse, "%s %s LSE rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius(a->delta, b->delta, nl)) <= tol, "%s %s delta rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius_floor(a->dq, b->dq, nq, GRAD_FLOOR)) <= tol, "%s %s dQ rel %.2e", name, what, e);
    EXPECT_COUNTED((e = rel_frobenius_floor(a->dk, b->dk, nk, GRAD_FLOOR)) <= tol, "%s %s dK rel %.2e", name, what,
                   e);
    EXPECT_COUNTED((e = rel_frobenius(a->dv, b->dv, nk)) <= tol, "%s %s dV rel %.2e", name, what, e);
}

static void run_case(const Case *c, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    Inputs in = make_inputs(c, &rng);
    SparsePattern pattern;
    SparseIndex index;
    int64_t *q_blocks;
    make_index(c, &in, &rng, &pattern, &q_blocks, &index);
    const int64_t rows = c->Hq * index.num_q_blocks;
    char name[200];
    snprintf(name, sizeof name, "N=%lld D=%d Hq=%d Hkv=%d B=%d chunks=%d %s%s (%lld blocks, %lld columns)",
             (long long)c->n, c->D, c->Hq, c->Hkv, c->B, c->world, c->density < 0 ? "all-blocks" : "random",
             c->docs ? " documents" : "", (long long)index.block_start[rows], (long long)index.column_start[rows]);
    // The same pattern indexed on the GPU (documents included) gives the same index.
    const AttnShape sq = shape_of(c, in.Tq, in.Tq);
    SparsePatternCuda d_pattern;
    pattern_to_device(&pattern, &d_pattern);
    int64_t *d_q_blocks = to_device(q_blocks, (size_t)index.num_q_blocks * sizeof(int64_t));
    SparseIndexCuda built = {0};
    sparse_index_build_cuda(&d_pattern, c->B, d_q_blocks, index.num_q_blocks, sq.doc_starts_device, sq.doc_count, DOC_SINK,
                            &built, 0);
    EXPECT_COUNTED(same_index(&built, &index), "%s GPU index identical to the CPU's", name);
    sparse_index_free_cuda(&built);
    sparse_pattern_free_cuda(&d_pattern);
    CUDA_CHECK(cudaFree(d_q_blocks));
    free(q_blocks);
    sparse_pattern_free(&pattern);

    SparseIndexCuda d_index;
    sparse_index_to_cuda(&index, &d_index);
    const int64_t nl = in.Tq * c->Hq, nk = total_keys(&in) * c->Hkv * c->D;
    const Start st = {random_f32(&rng, in.nq), random_f32(&rng, nk), random_f32(&rng, nk)};

    Results cpu = cpu_run(c, &in, &index, &st);
    Results gpu = gpu_run(c, &in, &d_index, NULL, &st, name);
    compare(name, "vs CPU", &gpu, &cpu, in.nq, nl, nk, TOL, TOL_LSE);
    // The block pass per chunk and the column pass over the gathered columns
    // (the cp ring's split): each column once, so the CPU's results.
    Columns cols = gather_columns(c, &in, &index);
    Results split = gpu_run(c, &in, &d_index, &cols, &st, name);
    compare(name, "blocks + gathered columns vs CPU", &split, &cpu, in.nq, nl, nk, TOL, TOL_LSE);
    free_results(&split);
    free_columns(&cols);
    if (c->density < 0) {
        Results dense = gpu_run(c, &in, NULL, NULL, &st, name);
        compare(name, "vs dense GPU", &gpu, &dense, in.nq, nl, nk, TOL_DENSE, TOL_LSE);
        free_results(&dense);
    }
    free_results(&cpu);
    free_results(&gpu);
    free(st.dq); free(st.dk); free(st.dv);
    sparse_index_free_cuda(&d_index);
    sparse_index_free(&index);
    free_inputs(&in);
}

// The index of a long row (barriers between the iterations of its loops):
// H heads, one query block qb = LONG_QB of B = 64 (N = (LONG_QB + 1) * 64
// tokens, 260 bitmap words: the block loop runs twice over 256 threads), one
// document from LONG_DOC with a sink of LONG_SINK columns (the sink loop
// runs three times), LONG_VERTICAL vertical lines (the vertical loop three
// times), a slash every 11 blocks (bits in every word, counts differing
// between words); every loop's data lies in all eight warps and differs
// between its iterations, so a warp that reuses the scan's shared totals
// before the others have read them gives another index.
#define LONG_QB 8299
#define LONG_DOC 100
#define LONG_SINK 600
#define LONG_VERTICAL 700
static void run_long_index_case(int H) {
    const int B = 64;
    const int64_t N = (int64_t)(LONG_QB + 1) * B, q_lo = (int64_t)LONG_QB * B, doc_starts[] = {LONG_DOC};
    SparsePattern p = {.num_heads = H, .seq_len = N};
    p.vertical_start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    p.slash_start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    p.vertical = xmalloc((size_t)(H * LONG_VERTICAL) * sizeof(int64_t));
    p.slash = xmalloc((size_t)(H * (q_lo / (11 * B) + 2)) * sizeof(int64_t));
    p.vertical_start[0] = p.slash_start[0] = 0;
    for (int h = 0; h < H; h++) {
        int64_t nv = p.vertical_start[h], ns = p.slash_start[h];
        for (int j = 0; j < LONG_VERTICAL; j++) p.vertical[nv++] = LONG_DOC + LONG_SINK + 97 * j + 13 * h;
        p.slash[ns++] = 0;
        for (int64_t d = 5 + 11 * B * (h + 1); d < q_lo - 12 * B; d += 11 * B) p.slash[ns++] = d;
        p.vertical_start[h + 1] = nv;
        p.slash_start[h + 1] = ns;
    }
    const int64_t q_blocks[] = {LONG_QB};
    SparseIndex x;
    sparse_index_build(&p, B, q_blocks, 1, &x);
    const AttnShape s = {1, 1, H, 1, 64, B, 1.0f, doc_starts, 1, NULL};
    sparse_index_documents(&s, LONG_SINK, &x);
    SparsePatternCuda dp;
    pattern_to_device(&p, &dp);
    int64_t *d_q_blocks = to_device(q_blocks, sizeof q_blocks), *d_docs = to_device(doc_starts, sizeof doc_starts);
    SparseIndexCuda dx = {0};
    sparse_index_build_cuda(&dp, B, d_q_blocks, 1, d_docs, 1, LONG_SINK, &dx, 0);
    EXPECT_COUNTED(same_index(&dx, &x), "long index row: N=%lld H=%d, %lld blocks, %lld columns identical to the "
                   "CPU's", (long long)N, H, (long long)x.block_start[H], (long long)x.column_start[H]);
    sparse_index_free_cuda(&dx);
    sparse_pattern_free_cuda(&dp);
    sparse_index_free(&x);
    sparse_pattern_free(&p);
    CUDA_CHECK(cudaFree(d_q_blocks));
    CUDA_CHECK(cudaFree(d_docs));
}

// One case of the pattern pipeline: Lq estimation queries (the sequence's
// last), the keys of every chunk, budget "topp" or "fixed".
typedef struct {
    Case c;
    int Lq;
    const char *budget;
} SelectCase;

// Estimation reference in double: lse [Hq, Lq], vertical and slash [Hq, N];
// with documents only keys of each query's document.
static void estimate_reference(const Case *c, const Inputs *in, int Lq, const float *qef, const int64_t *qe_pos,
                               double *lse, double *vertical, double *slash) {
    const double scale = 1.0 / sqrt((double)c->D);
    for (int h = 0; h < c->Hq; h++) {
        const int g = h / (c->Hq / c->Hkv);
        for (int e = 0; e < Lq; e++) {
            for (int pass = 0; pass < 2; pass++) {
                double m = -INFINITY, l = 0;
                const AttnShape s = shape_of(c, Lq, 0);
                const int64_t first = attn_doc_first(s.doc_starts, s.doc_count, qe_pos[e]);
                for (int i = 0; i < in->nch; i++)
                    for (int64_t j = 0; j < in->T[i]; j++) {
                        if (in->pos[i][j] > qe_pos[e] || in->pos[i][j] < first) continue;
                        double x = 0;
                        for (int d = 0; d < c->D; d++)
                            x += (double)qef[((int64_t)e * c->Hq + h) * c->D + d] *
                                 in->kf[i][(j * c->Hkv + g) * c->D + d];
                        x *= scale;
                        if (pass == 0) {
                            if (x > m) { l = l * exp(m - x) + 1; m = x; } else l += exp(x - m);
                        } else {
                            const double p = exp(x - lse[h * Lq + e]);
                            vertical[h * c->n + in->pos[i][j]] += p;
                            slash[h * c->n + qe_pos[e] - in->pos[i][j]] += p;
                        }
                    }
                if (pass == 0) lse[h * Lq + e] = m + log(l);
            }
        }
    }
}

static double rel_frobenius_f64(const float *a, const double *b, int64_t n) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        norm += b[i] * b[i];
    }
    return sqrt(diff) / (sqrt(norm) + 1e-30);
}

static void run_select_case(const SelectCase *sc, uint64_t seed) {
    const Case *c = &sc->c;
    const int Lq = sc->Lq, Hq = c->Hq;
    const int64_t N = c->n;
    Rng rng;
    rng_seed(&rng, seed);
    char name[160];
    snprintf(name, sizeof name, "select N=%lld D=%d Hq=%d Hkv=%d B=%d chunks=%d Lq=%d %s%s", (long long)N, c->D,
             Hq, c->Hkv, c->B, c->world, Lq, sc->budget, c->docs ? " documents" : "");
    Inputs in = make_inputs(c, &rng);
    uint16_t *qe;
    float *qef;
    random_bf16(&rng, (int64_t)Lq * Hq * c->D, &qe, &qef);
    int64_t *qe_pos = xmalloc((size_t)Lq * sizeof(int64_t));
    for (int e = 0; e < Lq; e++) qe_pos[e] = N - Lq + e;
    uint16_t *d_qe = to_device(qe, (size_t)Lq * Hq * c->D * sizeof(uint16_t));
    int64_t *d_qe_pos = to_device(qe_pos, (size_t)Lq * sizeof(int64_t));

    // GPU estimation over the chunks: pass 1, then pass 2 with the final lse.
    const int64_t nl = (int64_t)Hq * Lq, ns = Hq * N;
    float *lse0 = xmalloc((size_t)nl * sizeof(float));
    for (int64_t i = 0; i < nl; i++) lse0[i] = -INFINITY;
    float *d_lse = to_device(lse0, (size_t)nl * sizeof(float));
    float *d_vertical = poisoned((size_t)ns * sizeof(float)), *d_slash = poisoned((size_t)ns * sizeof(float));
    CUDA_CHECK(cudaMemset(d_vertical, 0, (size_t)ns * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_slash, 0, (size_t)ns * sizeof(float)));
    for (int i = 0; i < in.nch; i++) {
        const AttnShape s = shape_of(c, Lq, in.T[i]);
        sparse_estimate_lse_cuda(&s, d_qe, d_qe_pos, in.d_k[i], in.d_pos[i], d_lse, 0);
    }
    for (int i = 0; i < in.nch; i++) {
        const AttnShape s = shape_of(c, Lq, in.T[i]);
        sparse_estimate_scores_cuda(&s, d_qe, d_qe_pos, in.d_k[i], in.d_pos[i], d_lse, N, d_vertical, d_slash, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    float *lse = from_device_f32(d_lse, nl), *vertical = from_device_f32(d_vertical, ns);
    float *slash = from_device_f32(d_slash, ns);
    double *lse_ref = xcalloc((size_t)nl, sizeof(double)), *v_ref = xcalloc((size_t)ns, sizeof(double));
    double *s_ref = xcalloc((size_t)ns, sizeof(double));
    estimate_reference(c, &in, Lq, qef, qe_pos, lse_ref, v_ref, s_ref);
    double e;
    EXPECT_COUNTED((e = rel_frobenius_f64(lse, lse_ref, nl)) <= TOL_LSE, "%s lse_est rel %.2e", name, e);
    EXPECT_COUNTED((e = rel_frobenius_f64(vertical, v_ref, ns)) <= TOL_DENSE, "%s vertical rel %.2e", name, e);
    EXPECT_COUNTED((e = rel_frobenius_f64(slash, s_ref, ns)) <= TOL_DENSE, "%s slash rel %.2e", name, e);

    // Selection and index on the same (GPU) scores, both sides.
    AttentionConfig cfg = {.top_p = 0.9, .max_vertical = (int)(N / 8), .max_slash = (int)(N / 16), .sink = 4,
                           .local = 8, .vertical = (int)(N / 20) + 1, .slash = (int)(N / 40) + 1};
    cfg.budget = strcmp(sc->budget, "fixed") ? BUDGET_TOPP : BUDGET_FIXED;
    SparsePattern p;
    sparse_select(&cfg, vertical, slash, Hq, N, NULL, NULL, &p);
    SparsePatternCuda dp = {0};
    sparse_select_cuda(&cfg, d_vertical, d_slash, Hq, N, NULL, NULL, &dp, 0);
    const int64_t nqb = (in.Tq + c->B - 1) / c->B, rows = Hq * nqb;
    int64_t *q_blocks = xmalloc((size_t)nqb * sizeof(int64_t));
    for (int64_t i = 0; i < nqb; i++) q_blocks[i] = in.qpos[i * c->B] / c->B;
    int64_t *d_q_blocks = to_device(q_blocks, (size_t)nqb * sizeof(int64_t));
    SparseIndex x;
    sparse_index_build(&p, c->B, q_blocks, nqb, &x);
    SparseIndexCuda dx = {0};
    sparse_index_build_cuda(&dp, c->B, d_q_blocks, nqb, NULL, 0, 0, &dx, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    EXPECT_COUNTED(same_pattern(&dp, &p), "%s pattern identical (%lld vertical, %lld slash lines)", name,
                   (long long)p.vertical_start[Hq], (long long)p.slash_start[Hq]);
    EXPECT_COUNTED(same_index(&dx, &x), "%s index identical (%lld blocks, %lld columns)", name,
                   (long long)x.block_start[rows], (long long)x.column_start[rows]);
    // The index rebuilt into the same (poisoned) buffers with the documents (without: the same again).
    const AttnShape s = shape_of(c, in.Tq, in.Tq);
    sparse_index_documents(&s, cfg.sink, &x);
    poison_index(&dx);
    sparse_index_build_cuda(&dp, c->B, d_q_blocks, nqb, s.doc_starts_device, s.doc_count, cfg.sink, &dx, 0);
    EXPECT_COUNTED(same_index(&dx, &x), "%s index%s identical, reusing the index (%lld blocks, %lld columns)", name,
                   c->docs ? " with documents" : "", (long long)x.block_start[rows], (long long)x.column_start[rows]);
    // The other budget selected into the same (poisoned) pattern: the CPU's lines for it.
    AttentionConfig other = cfg;
    other.budget = cfg.budget == BUDGET_FIXED ? BUDGET_TOPP : BUDGET_FIXED;
    SparsePattern p2;
    sparse_select(&other, vertical, slash, Hq, N, NULL, NULL, &p2);
    poison_pattern(&dp);
    sparse_select_cuda(&other, d_vertical, d_slash, Hq, N, NULL, NULL, &dp, 0);
    EXPECT_COUNTED(same_pattern(&dp, &p2), "%s pattern of budget %s into the reused pattern identical (%lld "
                   "vertical, %lld slash lines)", name, other.budget == BUDGET_FIXED ? "fixed" : "topp",
                   (long long)p2.vertical_start[Hq], (long long)p2.slash_start[Hq]);
    sparse_pattern_free(&p2);

    sparse_index_free_cuda(&dx);
    sparse_pattern_free_cuda(&dp);
    sparse_index_free(&x);
    sparse_pattern_free(&p);
    CUDA_CHECK(cudaFree(d_q_blocks)); CUDA_CHECK(cudaFree(d_qe)); CUDA_CHECK(cudaFree(d_qe_pos));
    CUDA_CHECK(cudaFree(d_lse)); CUDA_CHECK(cudaFree(d_vertical)); CUDA_CHECK(cudaFree(d_slash));
    free(q_blocks); free(qe); free(qef); free(qe_pos); free(lse0); free(lse); free(vertical); free(slash);
    free(lse_ref); free(v_ref); free(s_ref);
    free_inputs(&in);
}

int main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    const int index_only = argc > 1 && strcmp(argv[1], "index") == 0;
    CHECK(argc == 1 || small || index_only, "usage: %s [small | index]", argv[0]);
    d_doc_starts = to_device(DOC_STARTS, sizeof DOC_STARTS);
    run_long_index_case(2);
    if (index_only) {
        printf("1 case: %d passed, %d failed\n", checks - check_failures, check_failures);
        return check_exit();
    }
    // {n, D, Hq, Hkv, B, world, rank, density, docs}
    static const Case cases[] = {
        {1, 64, 2, 2, 64, 1, 0, 0.1, 0},
        {100, 128, 4, 2, 64, 1, 0, 0.1, 0},
        {300, 64, 8, 1, 128, 2, 1, 0.1, 0},
        {300, 128, 4, 4, 64, 3, 0, -1, 0},
        {300, 64, 4, 2, 64, 1, 0, 0.1, 1},
        {300, 128, 4, 1, 128, 3, 1, 0.1, 1},
        {300, 64, 2, 2, 64, 2, 0, -1, 1},
        {300, 128, 2, 1, 64, 1, 0, -1, 0},
        {300, 64, 2, 1, 64, 1, 0, -1, 1},
        {1000, 128, 8, 1, 64, 3, 2, 0.05, 0},
        {1000, 64, 4, 2, 128, 1, 0, 0.05, 0},
        {1000, 128, 2, 2, 128, 2, 0, -1, 0},
        {1000, 128, 8, 2, 64, 3, 2, 0.05, 1},
        {2500, 64, 4, 1, 128, 1, 0, 0.05, 1},
        {2500, 128, 16, 2, 128, 3, 1, 0.02, 0},
        {4099, 64, 8, 8, 64, 2, 1, 0.02, 0},
        {4099, 128, 16, 2, 64, 1, 0, -1, 0},
    };
    int count = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (small && cases[i].n > 300) continue;
        run_case(&cases[i], 2000 + i);
        count++;
    }
    // {{n, D, Hq, Hkv, B, world, rank, unused, docs}, Lq, budget}
    static const SelectCase select_cases[] = {
        {{200, 64, 4, 2, 64, 1, 0, 0, 0}, 16, "topp"},
        {{300, 128, 4, 1, 64, 2, 1, 0, 0}, 64, "fixed"},
        {{300, 64, 4, 2, 64, 2, 0, 0, 1}, 100, "topp"},
        {{1500, 128, 8, 2, 128, 3, 2, 0, 0}, 64, "topp"},
        {{2000, 64, 4, 4, 64, 2, 0, 0, 0}, 128, "fixed"},
        {{3000, 128, 16, 2, 64, 1, 0, 0, 0}, 64, "topp"},
        {{300, 128, 4, 2, 128, 1, 0, 0, 1}, 64, "fixed"},
        {{1100, 64, 4, 1, 64, 3, 1, 0, 1}, 128, "topp"},
        {{2100, 128, 8, 2, 128, 2, 1, 0, 1}, 32, "fixed"},
    };
    for (size_t i = 0; i < sizeof select_cases / sizeof select_cases[0]; i++) {
        if (small && select_cases[i].c.n > 300) continue;
        run_select_case(&select_cases[i], 3000 + i);
        count++;
    }
    printf("%d cases: %d passed, %d failed\n", count, checks - check_failures, check_failures);
    return check_exit();
}
