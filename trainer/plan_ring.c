// plan_ring.c: `mtrain plan RUN.yaml --ring [--density D]`: the ring's
// overlap on paper, for the CUDA backend as designed on the run's GPU. Per
// layer and ring step, flat and hierarchical: attention compute (dense and
// at a density), the K/V and dK/dV bytes each step sends (ring_send full and
// selected, from ring_send_tokens, the byte planner of attention/ring/ring_plan.c),
// their time on the inner (NVLink) and outer (network) links, whether the
// step's compute hides them, and per layer the time of the forward and the
// backward. Link speeds and the attention kernels' derived times are the
// planner's (plan.c); docs/PLANNER.md names one run of it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../attention/ring/ring_plan.h"
#include "../attention/ring/ring_sparse.h"
#include "plan.h"

enum { DENSE, SPARSE };    // attention compute
enum { FULL, SELECTED };   // ring_send
enum { INNER, OUTER };     // link

// One schedule (flat or hierarchical) of the run's ring, on paper.
typedef struct {
    Plan plan[2];                 // [DENSE, SPARSE]: the planner's figures
    Ring ring;                    // geometry only (no communicator behind cp)
    Comm comm;
    int W;
    double *attention[2];         // [W] ms of one forward pass of step s (slowest rank)
    double *kv[2][2];             // [ring_send][link] [W] most K/V bytes a rank sends on the link in step s
    double *dkv[2];               // [ring_send] [W] most dK/dV bytes a rank sends at the end of backward step s
    double coverage;              // sparse: the share of key-block offsets some head's planted lines hit
} RingTable;

// Pairs (q, k) with k <= q of the ascending positions q_pos [Tq], k_pos [Tk].
static double causal_pairs(const int64_t *q_pos, int64_t Tq, const int64_t *k_pos, int64_t Tk) {
    double pairs = 0;
    int64_t j = 0;
    for (int64_t i = 0; i < Tq; i++) {
        while (j < Tk && k_pos[j] <= q_pos[i]) j++;
        pairs += (double)j;
    }
    return pairs;
}

// The run's tokens in cfg's layout over cp ranks, inner per inner ring.
static void ring_build(RingTable *t, const Config *cfg, int inner) {
    ring_init_layout(&t->ring, &t->comm, cfg->attention.layout, cfg->train.seq_len, cfg->attention.block_size, t->W,
                     inner);
}

// Forward attention of each step: the planner's mean step scaled by the
// causal pairs of the step's slowest rank over the mean pairs of a rank and
// step. Sparse work is assumed to spread over the steps as causal work does.
static void step_attention(RingTable *t) {
    const int W = t->W;
    double *slowest = xcalloc((size_t)W, sizeof(double)), total = 0;
    for (int r = 0; r < W; r++) {
        const Place p = ring_place(&t->ring, r, 1);
        for (int s = 0; s < W; s++) {
            const int c = ring_chunk_at(&p, s / p.inner, s % p.inner);
            double pairs = causal_pairs(t->ring.positions + t->ring.offsets[r], t->ring.counts[r],
                                        t->ring.positions + t->ring.offsets[c], t->ring.counts[c]);
            total += pairs;
            if (pairs > slowest[s]) slowest[s] = pairs;
        }
    }
    for (int a = DENSE; a <= SPARSE; a++) {
        t->attention[a] = xmalloc((size_t)W * sizeof(double));
        for (int s = 0; s < W; s++)
            t->attention[a][s] = 1e3 * t->plan[a].attention_fwd_step_s * slowest[s] / (total / ((double)W * W));
    }
    free(slowest);
}

// Key blocks every rank's query blocks use under the planted pattern into
// bits [W, words]: per q head the offsets 0 .. local-1 and `slash` offsets
// drawn at N * u^3 (u uniform: near the diagonal), drawn independently per
// head (seeded). Vertical lines add no block (their columns are gathered
// once per layer, outside the ring). A rank's need is the union over heads,
// so the heads collapse into one whose offsets keep one of each pair of key
// blocks an offset selects (sparse_index_build: blocks qb - floor(d / B) and
// qb - ceil(d / B)). Returns the share of the N / B block offsets hit.
static double planted_need(const Ring *ring, const Config *cfg, double slash, int64_t words, uint64_t *bits) {
    const int64_t N = cfg->train.seq_len;
    const int B = cfg->attention.block_size, W = ring->cp->size;
    char *hit = xcalloc((size_t)N, 1);  // hit[d]: some head has an offset of d's block pair
    Rng rng;
    rng_seed(&rng, 1);
    for (int h = 0; h < cfg->model.num_heads; h++) {
        for (int64_t d = 0; d < cfg->attention.local && d < N; d++) hit[d % B ? d - d % B + 1 : d] = 1;
        for (int64_t n = 0; n < (int64_t)slash; n++) {
            const double u = rng_uniform(&rng);
            const int64_t d = (int64_t)((double)N * u * u * u) % N;
            hit[d % B ? d - d % B + 1 : d] = 1;
        }
    }
    int64_t starts[2] = {0, 0}, none[2] = {0, 0};
    int64_t *offsets = xmalloc((size_t)N * sizeof(int64_t));
    const int64_t nb = (N + B - 1) / B;
    char *block_hit = xcalloc((size_t)nb + 1, 1);  // key-block offsets floor(d / B) and ceil(d / B)
    int64_t blocks = 0;
    for (int64_t d = 0; d < N; d++) {
        if (!hit[d]) continue;
        offsets[starts[1]++] = d;
        for (int64_t k = d / B; k <= (d + B - 1) / B; k++) {
            blocks += !block_hit[k];
            block_hit[k] = 1;
        }
    }
    const SparsePattern pattern = {1, N, none, NULL, starts, offsets};
    int64_t *q_blocks = xmalloc((size_t)(ring->max_count / B + 2) * sizeof(int64_t));
    for (int r = 0; r < W; r++) {
        const int64_t nqb = (ring->counts[r] + B - 1) / B, *pos = ring->positions + ring->offsets[r];
        for (int64_t i = 0; i < nqb; i++) q_blocks[i] = pos[i * B] / B;
        SparseIndex index;
        sparse_index_build(&pattern, B, q_blocks, nqb, &index);
        ring_need_row(&index, words, bits + r * words);
        sparse_index_free(&index);
    }
    free(q_blocks); free(offsets); free(hit); free(block_hit);
    return (double)blocks / (double)nb;
}

// Bytes per step with ring_send full and selected (the sparse pattern's
// blocks at the sparse plan's density, or the causal blocks when dense),
// split by link: the outer transfer leaves at inner step 0.
static void step_bytes(RingTable *t, const Config *cfg, double slash) {
    const int W = t->W, B = cfg->attention.block_size;
    const Plan *p = &t->plan[SPARSE];
    const double kv_token = p->ring_fwd_bytes / (double)p->tokens;
    const double dkv_token = (p->ring_bwd_bytes - p->ring_fwd_bytes) / (double)p->tokens;
    const int64_t words = ring_need_words(cfg->train.seq_len, B);
    uint64_t *bits = xmalloc((size_t)(W * words) * sizeof(uint64_t)), *mask = xmalloc((size_t)words * sizeof(uint64_t));
    if (p->density < 1.0) {
        t->coverage = planted_need(&t->ring, cfg, slash, words, bits);
    } else {
        const AttnShape shape = {.num_heads = cfg->model.num_heads, .block_size = B};
        ring_dense_need(&t->ring, &shape, words, bits);
    }
    const RingNeed need = {B, words, bits};
    int64_t *kv = xmalloc((size_t)W * W * sizeof(int64_t)), *dkv = xmalloc((size_t)W * W * sizeof(int64_t));
    int64_t *sel = xmalloc((size_t)(t->ring.max_count + 1) * sizeof(int64_t));
    for (int m = FULL; m <= SELECTED; m++) {
        const RingNeed *n = m == SELECTED ? &need : NULL;
        ring_send_tokens(&t->ring, n, kv, dkv);
        for (int l = INNER; l <= OUTER; l++) t->kv[m][l] = xcalloc((size_t)W, sizeof(double));
        t->dkv[m] = xcalloc((size_t)W, sizeof(double));
        for (int r = 0; r < W; r++) {
            const Place pl = ring_place(&t->ring, r, 1);
            for (int s = 0; s < W; s++) {
                const int so = s / pl.inner, si = s % pl.inner;
                int64_t outer = 0;
                if (si == 0 && so < pl.outer - 1)
                    outer = ring_selected_tokens(&t->ring, &pl, n, ring_chunk_at(&pl, so, 0),
                                                 ring_kv_serves(&pl, so + 1, 0), mask, sel);
                t->kv[m][OUTER][s] = fmax(t->kv[m][OUTER][s], (double)outer * kv_token);
                t->kv[m][INNER][s] = fmax(t->kv[m][INNER][s], (double)(kv[r * W + s] - outer) * kv_token);
                t->dkv[m][s] = fmax(t->dkv[m][s], (double)dkv[r * W + s] * dkv_token);
            }
        }
    }
    free(sel); free(kv); free(dkv); free(mask); free(bits);
}

// The link a dK/dV accumulator leaving inner step si takes: after the last
// inner step it goes to the next node (or home), on the outer ring when
// there is one.
static int dkv_link(const RingTable *t, int si) {
    return si == t->ring.inner - 1 && t->ring.outer > 1 ? OUTER : INNER;
}

// Milliseconds of `bytes` on link l.
static double link_ms(const RingTable *t, int l, double bytes) {
    const Plan *p = &t->plan[SPARSE];
    return 1e3 * bytes / ((l == INNER ? p->inner_gbs : p->outer_gbs) * 1e9);
}

// Transfer time (ms) that must fit under step s of a pass on link l:
// forward, the K/V leaving in step s (the outer one under the whole inner
// round); backward, also the dK/dV accumulator the step before sent on the
// same link (on the inner ring it arrives for this step's add; the node's
// sum, sent after a round's last step, travels under the next round).
static double load_ms(const RingTable *t, bool backward, int m, int l, int s) {
    const int inner = t->ring.inner, si = s % inner;
    double bytes = t->kv[m][l][s];
    if (backward && l == INNER && si > 0 && dkv_link(t, si - 1) == INNER) bytes += t->dkv[m][s - 1];
    if (backward && l == OUTER && si == 0 && s > 0 && dkv_link(t, inner - 1) == OUTER) bytes += t->dkv[m][s - 1];
    return link_ms(t, l, bytes);
}

// Attention ms of step s in a pass (backward: the plan's derived backward / forward ratio).
static double step_ms(const RingTable *t, bool backward, int a, int s) {
    return t->attention[a][s] * (backward ? t->plan[a].attention_backward_ratio : 1.0);
}

// Time of one layer's pass (ms): each step lasts as long as its compute or
// its inner transfer, each round of inner steps as long as those or its
// outer transfer (the device exchange posts an outer hop in its own NCCL
// group on its own stream, so only the round's end waits for it:
// dist/comm_device.h); the backward ends with the last dK/dV going home,
// under no compute. *attention: the compute alone.
static double layer_ms(const RingTable *t, bool backward, int a, int m, double *attention) {
    const int inner = t->ring.inner;
    double total = 0;
    *attention = 0;
    for (int so = 0; so < t->ring.outer; so++) {
        double round = 0;
        for (int si = 0; si < inner; si++) {
            const int s = so * inner + si;
            round += fmax(step_ms(t, backward, a, s), load_ms(t, backward, m, INNER, s));
            *attention += step_ms(t, backward, a, s);
        }
        total += fmax(round, load_ms(t, backward, m, OUTER, so * inner));
    }
    if (backward) total += link_ms(t, dkv_link(t, inner - 1), t->dkv[m][t->W - 1]);
    return total;
}

// Whether step s's transfer on link l fits under compute a with ring_send
// m: an inner one under the step, an outer one (inner step 0) under the round.
static bool step_hidden(const RingTable *t, bool backward, int a, int m, int l, int s) {
    double compute = 0;
    for (int si = 0; si < (l == INNER ? 1 : t->ring.inner); si++) compute += step_ms(t, backward, a, s + si);
    return load_ms(t, backward, m, l, s) <= compute;
}

// "yes, NO, yes": whether step s's transfer on link l is hidden, dense with
// ring_send full, sparse full, sparse selected.
static void print_hidden(const RingTable *t, bool backward, int l, int s, FILE *out) {
    const bool hidden[3] = {step_hidden(t, backward, DENSE, FULL, l, s), step_hidden(t, backward, SPARSE, FULL, l, s),
                            step_hidden(t, backward, SPARSE, SELECTED, l, s)};
    for (int i = 0; i < 3; i++) fprintf(out, "%s%s", i ? ", " : "", hidden[i] ? "yes" : "NO");
    fprintf(out, " |");
}

// The per-step table of one pass, then the layer's totals; ms [3]: the
// layer's time dense with ring_send full, sparse full, sparse selected.
static void print_pass(const RingTable *t, bool backward, FILE *out, double ms[3]) {
    const double MIB = 1.0 / (1 << 20);
    const int inner = t->ring.inner;
    fprintf(out, "\n%s, per ring step of one layer (ms, MiB; full / selected)\n\n", backward ? "backward" : "forward");
    fprintf(out, "| step (outer.inner) | attention dense | attention sparse | K/V MiB | %sinner ms | outer ms | "
            "inner hidden: dense full, sparse full, sparse selected | outer hidden: the same |\n",
            backward ? "dK/dV MiB (sent after the step) | " : "");
    fprintf(out, "|---|---|---|---|%s---|---|---|---|\n", backward ? "---|" : "");
    for (int s = 0; s < t->W; s++) {
        fprintf(out, "| %d.%d | %.3f | %.3f | %.2f / %.2f | ", s / inner, s % inner, step_ms(t, backward, DENSE, s),
                step_ms(t, backward, SPARSE, s), (t->kv[FULL][INNER][s] + t->kv[FULL][OUTER][s]) * MIB,
                (t->kv[SELECTED][INNER][s] + t->kv[SELECTED][OUTER][s]) * MIB);
        if (backward)
            fprintf(out, "%.2f / %.2f%s | ", t->dkv[FULL][s] * MIB, t->dkv[SELECTED][s] * MIB,
                    s == t->W - 1 ? " home" : dkv_link(t, s % inner) == OUTER ? " outer" : "");
        const bool outer = s % inner == 0 && t->ring.outer > 1;
        fprintf(out, "%.3f / %.3f | ", load_ms(t, backward, FULL, INNER, s), load_ms(t, backward, SELECTED, INNER, s));
        if (outer) fprintf(out, "%.3f / %.3f | ", load_ms(t, backward, FULL, OUTER, s),
                           load_ms(t, backward, SELECTED, OUTER, s));
        else fprintf(out, "- | ");
        print_hidden(t, backward, INNER, s, out);
        fputc(' ', out);
        if (outer) print_hidden(t, backward, OUTER, s, out);
        else fprintf(out, "- |");
        fputc('\n', out);
    }
    double att[3];
    ms[0] = layer_ms(t, backward, DENSE, FULL, &att[0]);
    ms[1] = layer_ms(t, backward, SPARSE, FULL, &att[1]);
    ms[2] = layer_ms(t, backward, SPARSE, SELECTED, &att[2]);
    fprintf(out, "\n%s per layer: dense full %.2f ms (attention %.2f, exposed %.2f) | sparse full %.2f ms (attention "
            "%.2f, exposed %.2f) | sparse selected %.2f ms (exposed %.2f)\n", backward ? "backward" : "forward",
            ms[0], att[0], fmax(0, ms[0] - att[0]), ms[1], att[1], fmax(0, ms[1] - att[1]), ms[2],
            fmax(0, ms[2] - att[2]));
}

static void table_free(RingTable *t) {
    for (int i = 0; i < 2; i++) {
        free(t->attention[i]);
        free(t->dkv[i]);
        for (int l = 0; l < 2; l++) free(t->kv[i][l]);
    }
    ring_free(&t->ring);
}

// The tables of cfg under one schedule (inner ranks per inner ring; inner =
// cp: flat). ms [2][3]: the layer's forward and backward time as print_pass.
static void print_schedule(const Config *cfg, const GpuProfile *gpu, double density, int inner, FILE *out,
                           double ms[2][3]) {
    Config c = *cfg;
    c.attention.ring = inner == cfg->parallel.cp ? RING_FLAT : RING_HIERARCHICAL;
    c.parallel.cp_inner = inner;
    RingTable t = {.W = cfg->parallel.cp};
    plan_build(&t.plan[DENSE], &c, gpu, 0, false, 1.0);
    plan_build(&t.plan[SPARSE], &c, gpu, 0, false, density);
    ring_build(&t, &c, inner);
    step_attention(&t);
    step_bytes(&t, &c, plan_slash_lines(&c.attention, c.train.seq_len, t.plan[SPARSE].density));
    fprintf(out, "\n## %s ring: %d x %d (outer x inner), inner hops %.4g GB/s (%s)", inner == cfg->parallel.cp ? "flat"
            : "hierarchical", t.ring.outer, inner, t.plan[SPARSE].inner_gbs,
            t.plan[SPARSE].inner_gbs == gpu->nvlink_gbs ? "NVLink" : "network: the ring spans nodes");
    if (t.ring.outer > 1)
        fprintf(out, ", outer hops %.4g GB/s (%s)", t.plan[SPARSE].outer_gbs,
                t.plan[SPARSE].outer_gbs == gpu->nvlink_gbs ? "NVLink" : "network");
    fputc('\n', out);
    for (int pass = 0; pass < 2; pass++) print_pass(&t, pass == 1, out, ms[pass]);
    double sent[2] = {0, 0};
    for (int m = FULL; m <= SELECTED; m++)
        for (int s = 0; s < t.W; s++) sent[m] += t.kv[m][INNER][s] + t.kv[m][OUTER][s];
    if (t.plan[SPARSE].density < 1.0)
        fprintf(out, "\nsparse selected sends %.1f%% of full's K/V bytes: a hop carries the blocks of its chunk "
                "that the receiving or a later rank's query blocks use, and the planted lines of the %d heads hit "
                "%.1f%% of the %lld key-block offsets%s\n", 100 * sent[SELECTED] / fmax(sent[FULL], 1),
                c.model.num_heads, 100 * t.coverage,
                (long long)((c.train.seq_len + c.attention.block_size - 1) / c.attention.block_size),
                t.coverage > 0.95 ? " (with this many slash lines per head every block is used by some rank's "
                "queries: selected saves nothing here, as computed; a lower --density shows where it starts to)" : "");
    table_free(&t);
}

void plan_ring_print(const Config *cfg, const GpuProfile *gpu, double density, FILE *out) {
    const ModelConfig *mc = &cfg->model;
    const int W = cfg->parallel.cp, D = mc->head_dim ? mc->head_dim : mc->hidden_size / mc->num_heads;
    Plan dense, sparse;
    plan_build(&dense, cfg, gpu, 0, false, 1.0);
    plan_build(&sparse, cfg, gpu, 0, false, density);
    const double kv_token = sparse.ring_fwd_bytes / (double)sparse.tokens;
    const double dkv_token = (sparse.ring_bwd_bytes - sparse.ring_fwd_bytes) / (double)sparse.tokens;
    const double slash = plan_slash_lines(&cfg->attention, cfg->train.seq_len, sparse.density);
    fprintf(out, "ring overlap on paper: CUDA backend as designed on %s, one sequence of %d tokens, cp %d, layout %s "
            "(block %d), %lld tokens per rank (most), heads %d/%d x %d\n", gpu->name, cfg->train.seq_len, W,
            layout_name(cfg->attention.layout), cfg->attention.block_size, (long long)sparse.tokens, mc->num_heads,
            mc->num_kv_heads, D);
    fprintf(out, "links: NVLink %.0f GB/s per direction per GPU (%.0f GB/s bidirectional); network %.1f GB/s per "
            "direction per GPU (%.0f Gb/s per node of %d GPUs, shared when all send at once)\n", gpu->nvlink_gbs,
            2 * gpu->nvlink_gbs, gpu->internode_gbs, gpu->internode_gbs * gpu->gpus_per_node * 8, gpu->gpus_per_node);
    fprintf(out, "compute: %.0f TFLOP/s bf16 peak; attention kernels' derived time (cost model) at %.1f%% of it dense, %.1f%% sparse; sparse density "
            "%.4f (%.1f%% sparse, %s); backward %.2f x forward dense, %.2f sparse; per step: the planner's mean step x the causal "
            "pairs of the step's slowest rank / the mean (sparse work assumed spread as causal work)\n",
            gpu->peak_tflops, 100 * dense.attention_efficiency, 100 * sparse.attention_efficiency, sparse.density,
            100 * (1 - sparse.density), density > 0 ? "--density" : cfg->attention.type == ATTN_DENSE ? "dense run"
            : sparse.density_assumed ? "the top_p caps' bound" : "the fixed budget", dense.attention_backward_ratio,
            sparse.attention_backward_ratio);
    fprintf(out, "bytes: K/V %.0f per token (bf16), dK/dV accumulators %.0f per token (fp32); selected: %s\n", kv_token,
            dkv_token, sparse.density < 1.0 ? "the blocks of a planted pattern at the sparse density"
            : "the causal key blocks (ring_dense_need)");
    if (sparse.density < 1.0)
        fprintf(out, "  planted pattern: per q head %d local and %.0f slash offsets at N*u^3 (u uniform, independent "
                "per head, seed 1); a rank's need is the union over the %d heads; vertical lines are gathered once "
                "per layer outside the ring\n", cfg->attention.local, floor(slash), mc->num_heads);
    fprintf(out, "overlap: a transfer is hidden when it takes no longer than the compute it runs under (inner: the "
            "step; outer: the whole inner round); a pass lasts the sum of max(compute, transfer); the backward's "
            "dK/dV accumulators add to the link their step uses and the last one goes home after the last step%s\n",
            dense.recompute == RECOMPUTE_FULL ? "; with recompute full the backward recomputes the forward "
            "first (one more forward pass)" : "");
    double ms[2][2][3];  // [flat, hierarchical][forward, backward][dense full, sparse full, sparse selected]
    int hier = cfg->parallel.cp_inner > 0 && cfg->parallel.cp_inner < W ? cfg->parallel.cp_inner : gpu->gpus_per_node;
    if (!(hier < W && W % hier == 0)) hier = W;  // no hierarchical ring: the flat one only
    print_schedule(cfg, gpu, density, W, out, ms[0]);
    if (hier < W) print_schedule(cfg, gpu, density, hier, out, ms[1]);
    fprintf(out, "\n## per layer, ms (forward / backward)\n\n| ring | dense full | sparse full | sparse selected |\n"
            "|---|---|---|---|\n");
    for (int h = 0; h < (hier < W ? 2 : 1); h++)
        fprintf(out, "| %s %d x %d | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f |\n", h ? "hierarchical" : "flat",
                h ? W / hier : 1, h ? hier : W, ms[h][0][0], ms[h][1][0], ms[h][0][1], ms[h][1][1], ms[h][0][2],
                ms[h][1][2]);
}
