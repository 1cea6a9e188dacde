// kernel_cost.c: the attention kernels' per-phase cost model (kernel_cost.h).
//
// Per SM, each phase's time on its unit: mma.sync on the tensor cores,
// ldmatrix and cp.async bytes through shared memory, exp2 on the SFUs;
// the L2 atomics on the whole GPU. The binding phase runs at its rate; of
// the other phases a block hides the fraction `overlap` behind it, and k
// co-resident blocks hide 1 - (1 - overlap)^k (another block's warps issue
// while one waits). Every barrier stalls its block barrier_clocks, shared
// by the k blocks. So, with S = sms x clock:
//   t = max(m, s, e, a) + (1 - overlap)^k (m + s + e + a - max(m, s, e, a)) + B / (S k) x barrier_clocks
//   m = mma / (S mma_per_clock), s = bytes / (S smem_bytes_per_clock),
//   e = exp2 / (S exp2_per_clock), a = atomics / (clock atomics_per_clock).
// Calibration (docs/PLANNER.md, "The cost model"): the atomics' rate,
// overlap and barrier_clocks fitted to the eight dense kernel times the H200
// measured at 16K and 64K tokens (docs/PERFORMANCE.md, "Measured on a GPU"):
// every one within 8 %; tests/unit/test_plan_cost.c holds the fit to that.
#include "kernel_cost.h"

#include <math.h>
#include <string.h>

// Rates. Sourced: SM counts and clocks (NVIDIA A100 and H100 whitepapers:
// 108 SMs at 1.41 GHz boost, 132 at 1.83 GHz; the H200 ran its kernels at
// 1.98 GHz: nvidia-smi in docs/PERFORMANCE.md, "Measured on a GPU"); on
// sm_80 mma.sync is the tensor cores' native instruction, 2048 dense bf16
// FLOPs per SM per clock (A100 whitepaper) = 0.5 m16n8k16; shared memory 128
// bytes per SM per clock (CUDA C++ Programming Guide: 32 banks of 4 bytes);
// exp2 16 results per SM per clock (Programming Guide, Arithmetic
// Instructions: exp2f's throughput, compute capability 8.0 and 9.0).
// Assumed: mma.sync on sm_90 at sm_80's 0.5 per SM per clock (the H200's
// kernel times do not bind on it; gpu_sweep_attention's mma.sync
// micro-benchmark measures it). Calibrated on the H200's eight kernel times:
// L2 fp32 atomics at 2.5 per 512 KiB L2 slice per clock (A100 80 slices,
// H100/H200 100), overlap 0.05 (the measured kernels hide almost nothing: one or
// two blocks per SM), a barrier 550 clocks; sm_80 takes sm_90's.
#define ATOMICS_PER_SLICE 2.5
#define BARRIER_CLOCKS 550
#define OVERLAP 0.05
static const AttnGpuRates attn_rates[] = {
    {"a100-40g", "sm_80", 108, 1.41, 0.5, 128, 16, 80 * ATOMICS_PER_SLICE, BARRIER_CLOCKS, OVERLAP},
    {"a100-80g", "sm_80", 108, 1.41, 0.5, 128, 16, 80 * ATOMICS_PER_SLICE, BARRIER_CLOCKS, OVERLAP},
    {"h100", "sm_90", 132, 1.83, 0.5, 128, 16, 100 * ATOMICS_PER_SLICE, BARRIER_CLOCKS, OVERLAP},
    {"h200", "sm_90", 132, 1.98, 0.5, 128, 16, 100 * ATOMICS_PER_SLICE, BARRIER_CLOCKS, OVERLAP},
};

const AttnGpuRates *attn_gpu_rates(const char *name) {
    for (size_t i = 0; i < sizeof(attn_rates) / sizeof(attn_rates[0]); i++)
        if (!strcmp(attn_rates[i].name, name)) return &attn_rates[i];
    return NULL;
}

double attn_exp2_count(const KernelCounts *c, int head_dim, bool backward) {
    return c->mma * 2048.0 / (head_dim * (backward ? 5.0 : 2.0));
}

int attn_blocks_per_sm(bool sparse, bool backward, int head_dim, int block_size) {
    if (!backward) return sparse ? 256 / (block_size == 128 ? 128 : 64) : 2;
    if (!sparse) return 1;
    (void)head_dim;   // the sparse backward's shared memory and registers fit alike at 64 and 128
    return block_size == 128 ? 1 : 2;
}

void attn_pass_counts(int d, int64_t n, double heads, double density, int block_size, KernelCounts *fwd,
                      KernelCounts *bwd) {
    if (density < 1.0) {
        const int B = block_size == 128 ? 128 : 64;
        const double rows = heads * (double)((n + B - 1) / B);
        const double tiles = fmax(rows, density * heads * flash_forward_pairs(n, B, SPARSE_KEY_TILE));
        *fwd = sparse_forward_counts(d, B, rows, tiles);
        // The backward's work as key blocks (the columns counted among them): the pairs (query block, key
        // block) of the forward's tiles, sparse_backward_bm rows a query tile.
        const double pairs = tiles * SPARSE_KEY_TILE / B;
        *bwd = sparse_backward_block_counts(d, B, rows, rows, pairs * B / sparse_backward_bm(d), pairs * B,
                                            heads * (double)n);
        return;
    }
    const FlashTiles f = flash_tiles(d);
    const double bwd_pairs = heads * flash_backward_pairs(n, f.bwd_bm, f.bwd_bn);
    *fwd = flash_forward_counts(d, heads * (double)((n + f.fwd_bm - 1) / f.fwd_bm),
                                heads * flash_forward_pairs(n, f.fwd_bm, f.fwd_bn));
    *bwd = flash_backward_counts(d, heads * (double)((n + f.bwd_bn - 1) / f.bwd_bn), bwd_pairs, bwd_pairs * f.bwd_bm,
                                 heads * (double)n);
}

AttnCost attn_cost(const KernelCounts *c, double exp2, int blocks_per_sm, const AttnGpuRates *g) {
    const double per_sm = g->sms * g->clock_ghz * 1e9, k = blocks_per_sm > 0 ? blocks_per_sm : 1;
    AttnCost r = {
        .mma = c->mma / (per_sm * g->mma_per_clock),
        .smem = (c->ldmatrix_bytes + c->cp_async_bytes) / (per_sm * g->smem_bytes_per_clock),
        .exp2 = exp2 / (per_sm * g->exp2_per_clock),
        .atomics = c->atomics / (g->clock_ghz * 1e9 * g->atomics_per_clock),
        .barriers = c->barriers / (per_sm * k) * g->barrier_clocks,
    };
    const double pipe = fmax(fmax(r.mma, r.smem), fmax(r.exp2, r.atomics));
    r.binds = r.mma >= pipe ? "tensor" : r.smem >= pipe ? "shared memory" : r.exp2 >= pipe ? "exp2" : "L2 atomics";
    r.seconds = pipe + pow(1 - g->overlap, k) * (r.mma + r.smem + r.exp2 + r.atomics - pipe) + r.barriers;
    return r;
}
