// kernel_counts.c: the attention kernels' counted work as functions of their
// shapes (kernel_counts.h). Each formula follows its kernel's loops: per CTA the
// tile loads and reductions before the loop, per visited tile pair the warp
// tile products of attention/kernels/flash_tiles.cuh (16 rows a warp, mma_abt:
// K/16 x (1 + N/16) ldmatrix.x4 and K/16 x N/8 mma; mma_pb: K/16 x N/16
// ldmatrix.x4 and K/16 x N/8 mma; mma_atb as mma_abt; 32 rows a warp, the
// forwards' and the dense backward's mma_abt32 and mma_ab32: K/16 x (2 +
// N/16) ldmatrix.x4 and 2 x K/16 x N/8 mma; mma_pb32: K/16 x N/16
// ldmatrix.x4 and 2 x K/16 x N/8 mma), the barriers and the next tile's
// cp.async. An ldmatrix.x4 reads 512 bytes; a cp.async copies 16.
#include "kernel_counts.h"

#include <math.h>

FlashTiles flash_tiles(int head_dim) {
    return head_dim == 128 ? (FlashTiles){128, 64, 64, 128} : (FlashTiles){128, 64, 128, 128};
}

double flash_forward_pairs(int64_t t, int bm, int bn) {
    double pairs = 0;
    for (int64_t i0 = 0; i0 < t; i0 += bm) pairs += (double)(((i0 + bm < t ? i0 + bm : t) - 1) / bn + 1);
    return pairs;
}

double flash_backward_pairs(int64_t t, int bm, int bn) {
    const int64_t nqt = (t + bm - 1) / bm;
    double pairs = 0;
    for (int64_t j0 = 0; j0 < t; j0 += bn) pairs += (double)(nqt - j0 / bm);
    return pairs;
}

// Warp instructions of the tile products (16 rows per warp; the A operand
// of the 32-row mma_abt32 is two fragments per step, its B fragment one).
static double abt_ldmatrix(int k, int n) { return k / 16.0 * (1 + n / 16.0); }
static double abt32_ldmatrix(int k, int n) { return k / 16.0 * (2 + n / 16.0); }
static double pb_ldmatrix(int k, int n) { return k / 16.0 * (n / 16.0); }
static double product_mma(int k, int n) { return k / 16.0 * (n / 8.0); }

KernelCounts flash_forward_counts(int head_dim, double q_tiles, double pairs) {
    const FlashTiles f = flash_tiles(head_dim);
    const int D = head_dim, BM = f.fwd_bm, BN = f.fwd_bn, NW = BM / 32;   // 32 rows a warp
    return (KernelCounts){
        .launches = 1, .blocks = q_tiles,
        .mma = pairs * NW * 2 * (product_mma(D, BN) + product_mma(BN, D)),
        .ldmatrix_bytes = 512 * pairs * NW * (abt32_ldmatrix(D, BN) + pb_ldmatrix(BN, D)),
        .cp_async_bytes = 2.0 * D * (q_tiles * BM + pairs * 2 * BN),
        // tile_pos_bounds (10) and the merge's 4 row sums (8) per CTA, the online softmax's 4 row maxima (8) per pair
        .shuffles = NW * (18 * q_tiles + 8 * pairs),
        .barriers = q_tiles + 2 * pairs,
        .atomics = 0};
}

KernelCounts flash_backward_counts(int head_dim, double k_tiles, double pairs, double dq_rows, double keys) {
    const FlashTiles f = flash_tiles(head_dim);
    const int D = head_dim, BM = f.bwd_bm, BN = f.bwd_bn, NW = 8, QC = D / (NW / (BM / 32));
    return (KernelCounts){
        .launches = 1, .blocks = k_tiles,
        // per warp: S^T and dP^T (mma_abt32, 32 keys x BM / 2 queries), dV and dK (mma_ab32, 32 keys x D / 2
        // columns over BM queries), dQ (mma_ab32, 32 queries x QC columns over BN keys)
        .mma = pairs * NW * 2 * (2 * product_mma(D, BM / 2) + 2 * product_mma(BM, D / 2) + product_mma(BN, QC)),
        .ldmatrix_bytes = 512 * pairs * NW * (2 * abt32_ldmatrix(D, BM / 2) + 2 * abt32_ldmatrix(BM, D / 2) +
                                              abt32_ldmatrix(BN, QC)),
        .cp_async_bytes = 2.0 * D * (k_tiles * 2 * BN + pairs * 2 * BM),
        // the key tiles' and query tiles' bounds come from tile_bounds_kernel: no reduction in the CTA
        .shuffles = 0,
        .barriers = 3 * pairs,
        .atomics = (double)D * (dq_rows + 2 * keys)};
}

KernelCounts sparse_forward_counts(int head_dim, int block_size, double rows, double tiles) {
    const int D = head_dim, BM = block_size, BN = SPARSE_KEY_TILE, NW = BM / 32;   // 32 rows a warp
    return (KernelCounts){
        .launches = 1, .blocks = rows,
        .mma = tiles * NW * 2 * (product_mma(D, BN) + product_mma(BN, D)),
        .ldmatrix_bytes = 512 * tiles * NW * (abt32_ldmatrix(D, BN) + pb_ldmatrix(BN, D)),
        .cp_async_bytes = 2.0 * D * (rows * BM + tiles * 2 * BN),
        // the merge's 4 row sums (8) per CTA, the online softmax's 4 row maxima (8) per tile
        .shuffles = NW * 8 * (rows + tiles),
        .barriers = rows + 2 * tiles,
        .atomics = 0};
}

int sparse_backward_bm(int head_dim) { return head_dim == 64 ? 128 : 64; }

KernelCounts sparse_backward_block_counts(int head_dim, int block_size, double ctas, double active, double tiles,
                                          double dq_rows, double keys) {
    const int D = head_dim, BM = sparse_backward_bm(D), BN = block_size, NW = BN / 16, QC = D / (NW / (BM / 32));
    const int QP = QC < 32 ? QC : 32;   // dQ's columns a pass
    return (KernelCounts){
        .launches = 1, .blocks = ctas,
        // the dense backward's products per warp and query tile (flash_backward_counts) over a key tile of BN,
        // dQ in QC / QP passes
        .mma = tiles * NW * 2 * (2 * product_mma(D, BM / 2) + 2 * product_mma(BM, D / 2) + product_mma(BN, QC)),
        .ldmatrix_bytes = 512 * tiles * NW * (2 * abt32_ldmatrix(D, BM / 2) + 2 * abt32_ldmatrix(BM, D / 2) +
                                              QC / QP * abt32_ldmatrix(BN, QP)),
        .cp_async_bytes = 2.0 * D * (active * 2 * BN + tiles * 2 * BM),
        .shuffles = 0,
        .barriers = 3 * tiles,
        .atomics = (double)D * (dq_rows + 2 * keys)};
}

KernelCounts sparse_backward_column_counts(int head_dim, int block_size, double rows, double active, double tiles,
                                           double keys) {
    const int D = head_dim, BM = block_size, BN = SPARSE_KEY_TILE, NW = BM / 16, WC = NW / (BN / 16), DC = D / WC;
    return (KernelCounts){
        .launches = 1, .blocks = rows,
        // S and dP (mma_abt), dQ (mma_pb) per warp, dV and dK (mma_atb) over the WR x WC warps
        .mma = tiles * NW * (2 * product_mma(D, BN) + product_mma(BN, D) + 2 * product_mma(BM, DC)),
        .ldmatrix_bytes = 512 * tiles * NW * (2 * abt_ldmatrix(D, BN) + pb_ldmatrix(BN, D) + 2 * abt_ldmatrix(BM, DC)),
        .cp_async_bytes = 2.0 * D * (active * 2 * BM + tiles * 2 * BN),
        .shuffles = 0,
        .barriers = 3 * tiles,
        .atomics = 2.0 * D * keys};
}

double shared_bytes_per_mma(KernelCounts c) {
    return (c.ldmatrix_bytes + c.cp_async_bytes) / c.mma;
}

// Per CTA (a q head, 128 keys, 64 threads = 2 warps, P = queries rounded up
// to chunks of 64, D the head dim), per pass: the score tiles' P x 128 x D
// FMAs, their loads (per warp, d and chunk 16 key and 8 query loads, one
// wavefront each: 2 x P / 64 x 24 x D) and stores (per warp and chunk 128,
// conflict-free: 2 x P / 64 x 128), the queries and keys stored once
// (P x D / 32 + 4 x D). Pass 1's loop (a thread per query: per key the
// score and the key position, 2 x 128 wavefronts per warp of queries);
// pass 2's (a thread per key, two keys each: per query its position, first
// key and lse, the score (a key row 4 banks from the next: 4 wavefronts) and
// the window atomic, 8 wavefronts per warp of keys) and its window flush
// (256 global atomics).
EstimationCounts sparse_estimation_counts(int head_dim, int num_heads, int num_kv_heads, int64_t queries,
                                          int64_t keys) {
    const double D = head_dim, Lq = (double)queries, P = ceil(Lq / 64) * 64, keys_d = (double)keys;
    const double blocks = ceil(keys_d / 128) * num_heads;
    const double tile_wavefronts = 0.75 * P * D + 4 * P + P * D / 32 + 4 * D;
    const double wavefronts = 2 * tile_wavefronts + ceil(Lq / 32) * 2 * 128 + 4 * 8 * Lq;
    return (EstimationCounts){
        .blocks = 2 * blocks,
        .fma = 2 * blocks * P * 128 * D,
        .shared_bytes = 128 * blocks * wavefronts,
        .exps = 2 * blocks * Lq * 128,
        .atomics = blocks * 256,
        .hbm_bytes = 2 * (2 * keys_d * num_kv_heads * D + 2 * Lq * num_heads * D) + 2 * 8 * blocks * Lq +
                     2 * 8 * num_heads * keys_d};
}

double sparse_selection_bytes(int num_heads, int64_t seq_len) {
    const double elements = 2.0 * num_heads * (double)seq_len;
    // keys: the score read, the key written; the sort; take and mark read the keys; the marks set and read
    return elements * (4 + 8 + 16 * SELECTION_SORT_PASSES + 8 + 8 + 3);
}

double sparse_index_build_bytes(double rows, double vertical_lines, double slash_lines) {
    return rows * 8 * (2 * (slash_lines + vertical_lines / 2) + slash_lines + vertical_lines);
}
