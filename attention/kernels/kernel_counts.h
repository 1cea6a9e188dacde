// kernel_counts.h: the work of the project's attention kernels as functions of
// their shapes, the counts the CPU execution model of CUDA measures per kernel
// (cudasim_kernel_counts, docs/SIM.md): mma.sync.m16n8k16 instructions,
// ldmatrix and cp.async bytes, warp shuffles, block barriers and atomics.
// The plan derives each kernel's time from them (trainer/plan.c); the sim test
// tests/sim/gpu_test_counts.c holds them equal to what the kernels do. The tile
// shapes are those of attention/kernels/flash_cuda.cu (Tiles<D>) and
// attention/kernels/sparse_cuda.cu (KEY_TILE, one query block per CTA; the
// backward's blocks one key block per CTA, SparseBackwardTile).
#ifndef MTRAIN_KERNEL_COUNTS_H
#define MTRAIN_KERNEL_COUNTS_H

#include <stdint.h>

// Attention's backward FLOPs over its forward: 5 GEMMs (with the recomputed
// scores) against 2.
#define ATTN_BACKWARD_FLOPS 2.5

typedef struct {
    double launches, blocks, mma, ldmatrix_bytes, cp_async_bytes, shuffles, barriers, atomics;
} KernelCounts;

// Tile shapes of the dense kernels for head dim d (64 or 128).
typedef struct {
    int fwd_bm, fwd_bn, bwd_bm, bwd_bn;
} FlashTiles;
FlashTiles flash_tiles(int head_dim);
#define SPARSE_KEY_TILE 64

// Tile pairs (query tile of bm, key tile of bn) a causal pass over one
// contiguous sequence of t tokens visits, for one head: the forward's (every
// key tile that starts at or before the query tile's last position) or the
// backward's (every query tile whose last position is at or after the key
// tile's first).
double flash_forward_pairs(int64_t t, int bm, int bn);
double flash_backward_pairs(int64_t t, int bm, int bn);

// One launch of the dense forward (flash_forward_kernel, no documents):
// q_tiles CTAs of fwd_bm queries, pairs (query tile, key tile) visited, both
// summed over the heads.
KernelCounts flash_forward_counts(int head_dim, double q_tiles, double pairs);
// One launch of the dense backward (flash_backward_kernel, no documents):
// k_tiles CTAs of bwd_bn keys, pairs visited, rows of dq the pairs add to
// (bwd_bm per pair where the query tile is whole, its rows before the end
// where it is short), keys of dk, dv (summed over the heads).
KernelCounts flash_backward_counts(int head_dim, double k_tiles, double pairs, double dq_rows, double keys);
// One launch of the sparse forward (sparse_forward_kernel, no documents)
// over rows index rows (query blocks of block_size, summed over the heads):
// tiles key tiles of SPARSE_KEY_TILE visited (the selected blocks' and the
// columns').
KernelCounts sparse_forward_counts(int head_dim, int block_size, double rows, double tiles);
// The sparse backward's query tile (sparse_cuda.cu, SparseBackwardTile): 128
// rows at head dim 64, 64 at 128.
int sparse_backward_bm(int head_dim);
// One launch of the sparse backward's blocks (sparse_backward_blocks_kernel,
// key-major, no documents): ctas CTAs of one key block of block_size keys
// (summed over the heads), active those whose block some query block
// selects; tiles the query tiles of sparse_backward_bm rows they visit (per
// CTA the rows of its selecting query blocks, that many at a time); dq_rows
// the rows of those tiles that exist (add to dq); keys the keys of the
// active CTAs (their dk, dv).
KernelCounts sparse_backward_block_counts(int head_dim, int block_size, double ctas, double active, double tiles,
                                          double dq_rows, double keys);
// One launch of the sparse backward's columns (sparse_backward_columns_kernel
// with one or two K/V buffers, no documents): rows index rows (summed over
// the heads), active those with a column in the call; tiles the column
// tiles of SPARSE_KEY_TILE they visit, keys their columns.
KernelCounts sparse_backward_column_counts(int head_dim, int block_size, double rows, double active, double tiles,
                                           double keys);

// Bytes through shared memory (ldmatrix + cp.async) per mma.sync of c.
double shared_bytes_per_mma(KernelCounts c);

// The sparse pattern's estimation on the GPU (attention/sparse/sparse_select_cuda.cu):
// both passes (est_lse_kernel with its merge, est_scores_kernel) of `queries`
// estimation queries against `keys` keys, num_heads q heads over num_kv_heads.
// fp32 FMAs of the score tiles (queries rounded up to the tiles' blocks of
// 64); shared-memory wavefronts of plain loads, stores and shared atomics as
// bytes (128 per wavefront: the sim does not count plain shared accesses, so
// these follow the kernels' loops by hand); exp2f calls; global atomics (the
// slash windows); HBM bytes (keys read once per kv head per pass, the
// partial (max, sum) pairs, the vertical and slash sums read and written).
typedef struct {
    double blocks, fma, shared_bytes, exps, atomics, hbm_bytes;
} EstimationCounts;
EstimationCounts sparse_estimation_counts(int head_dim, int num_heads, int num_kv_heads, int64_t queries,
                                          int64_t keys);
// The selection and one build of the index on the GPU as HBM bytes: the
// selection's 2 x num_heads x seq_len sort keys (written, sorted in
// SELECTION_SORT_PASSES passes that each read and write them, read to take
// and mark) and the marks; the index's two launches (count, fill) over rows
// = num_heads x query blocks, each reading the lines of its head up to its
// last query (8 bytes each: the slash lines, nearly all of them short
// offsets, and on average half the vertical lines), and the blocks and
// columns written (at most as many as the lines).
#define SELECTION_SORT_PASSES 8
double sparse_selection_bytes(int num_heads, int64_t seq_len);
double sparse_index_build_bytes(double rows, double vertical_lines, double slash_lines);

#endif
