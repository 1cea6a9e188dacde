// balance.c: per rank and ring step attention work of a sparse index under a
// token layout, and the resulting imbalance (see balance.h).
#include "balance.h"

#include <stdlib.h>
#include <string.h>

#include "../../dist/util.h"

// Tokens in global block b of a sequence of N tokens.
static int64_t block_tokens(int64_t b, int B, int64_t N) {
    int64_t end = (b + 1) * B < N ? (b + 1) * B : N;
    return end - b * B;
}

void balance_work(const SparseIndex *index, LayoutKind layout, int world, bool gathered_columns,
                  double *work) {
    int64_t N = index->seq_len, B = index->block_size;
    int64_t num_blocks = (N + B - 1) / B, nq = index->num_q_blocks;
    CHECK(nq == num_blocks, "balance_work: the index must cover all %lld query blocks (has %lld)",
          (long long)num_blocks, (long long)nq);
    int *owner = xmalloc(sizeof(int) * (size_t)num_blocks);  // rank holding each block
    int64_t *blocks = xmalloc(sizeof(int64_t) * (size_t)num_blocks);
    for (int r = 0; r < world; r++) {
        int64_t count = layout_rank_blocks(layout, N, (int)B, world, r, blocks);
        for (int64_t i = 0; i < count; i++) owner[blocks[i]] = r;
    }
    memset(work, 0, sizeof(double) * (size_t)world * world);
    for (int h = 0; h < index->num_heads; h++) {
        for (int64_t i = 0; i < nq; i++) {
            int64_t qb = index->q_blocks[i], row = h * nq + i;
            int64_t q_first = qb * B, q_count = block_tokens(qb, (int)B, N);
            int r = owner[qb];
            for (int64_t j = index->block_start[row]; j < index->block_start[row + 1]; j++) {
                int64_t kb = index->blocks[j];
                int64_t k_count = block_tokens(kb, (int)B, N);
                double elements = kb < qb ? (double)(q_count * k_count) : (double)(q_count * (q_count + 1) / 2);
                work[r * world + (r - owner[kb] + world) % world] += elements;
            }
            for (int64_t j = index->column_start[row]; j < index->column_start[row + 1]; j++) {
                int64_t p = index->columns[j];
                int64_t later = q_first + q_count - (p > q_first ? p : q_first);  // queries q >= p
                int step = gathered_columns ? 0 : (r - owner[p / B] + world) % world;
                work[r * world + step] += (double)later;
            }
        }
    }
    free(owner);
    free(blocks);
}

void balance_document_work(LayoutKind layout, int64_t N, int B, int world, const int64_t *doc_starts,
                           int64_t count, double *work) {
    int64_t *pos = xmalloc(sizeof(int64_t) * (size_t)N);
    for (int r = 0; r < world; r++) {
        int64_t n = layout_rank_positions(layout, N, B, world, r, pos), next = 0;
        work[r] = 0;
        for (int64_t i = 0; i < n; i++) {  // positions ascend
            while (next < count && doc_starts[next] <= pos[i]) next++;
            work[r] += (double)(pos[i] - (next > 0 ? doc_starts[next - 1] : 0) + 1);
        }
    }
    free(pos);
}

double balance_max_over_mean(const double *work, int world) {
    double busiest = 0, total = 0;
    for (int r = 0; r < world; r++) {
        if (work[r] > busiest) busiest = work[r];
        total += work[r];
    }
    return total > 0 ? busiest / (total / world) : 1.0;
}

double balance_rank_imbalance(const double *work, int world) {
    double *rank = xcalloc((size_t)world, sizeof(double));
    for (int r = 0; r < world; r++)
        for (int s = 0; s < world; s++) rank[r] += work[r * world + s];
    double result = balance_max_over_mean(rank, world);
    free(rank);
    return result;
}

double balance_step_imbalance(const double *work, int world) {
    double slowest = 0, total = 0;
    for (int s = 0; s < world; s++) {
        double step_max = 0;
        for (int r = 0; r < world; r++) {
            double w = work[r * world + s];
            if (w > step_max) step_max = w;
            total += w;
        }
        slowest += step_max;
    }
    return total > 0 ? slowest / (total / world) : 1.0;
}
