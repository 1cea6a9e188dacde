// packing.c: work-balanced packing of one step's documents into its
// sequences (see packing.h for the rule).
#include "packing.h"

#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"

// Longest first; equal lengths in stream order (a total order: starts differ).
static int longest_first(const void *a, const void *b) {
    const PackPiece *x = a, *y = b;
    if (x->length != y->length) return x->length > y->length ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

static int by_bin_then_start(const void *a, const void *b) {
    const PackPiece *x = a, *y = b;
    if (x->bin != y->bin) return x->bin < y->bin ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

static double piece_work(int64_t length) { return 0.5 * (double)length * (double)(length + 1); }

int64_t pack_balanced(const int64_t *doc_starts, int64_t count, int bins, int ranks, int64_t capacity,
                      PackPiece *pieces) {
    int64_t total = (int64_t)bins * capacity, docs = 0;
    CHECK(bins > 0 && ranks > 0 && bins % ranks == 0 && capacity > 0, "pack_balanced: %d bins over %d ranks of %lld "
          "tokens", bins, ranks, (long long)capacity);
    // The documents, longest first, in the tail of pieces (room for the splits before them).
    PackPiece *order = pieces + bins;
    for (int64_t k = 0; k <= count; k++) {
        int64_t start = k == 0 ? 0 : doc_starts[k - 1], end = k < count ? doc_starts[k] : total;
        CHECK(start <= end && end <= total, "pack_balanced: document start %lld after %lld or past %lld",
              (long long)end, (long long)start, (long long)total);
        if (end > start) order[docs++] = (PackPiece){start, end - start, -1};
    }
    qsort(order, (size_t)docs, sizeof(PackPiece), longest_first);
    int64_t *room = xmalloc(sizeof(int64_t) * (size_t)bins);
    double *work = xcalloc((size_t)bins, sizeof(double)), *rank_work = xcalloc((size_t)ranks, sizeof(double));
    for (int b = 0; b < bins; b++) room[b] = capacity;
    int64_t placed = 0;  // pieces[0, placed) are placed; each lands at or before its document's slot
    for (int64_t k = 0; k < docs; k++) {
        int64_t start = order[k].start, length = order[k].length;
        while (length > 0) {
            int best = -1, roomiest = 0;
            for (int b = 0; b < bins; b++) {
                bool lighter = best < 0 || rank_work[b % ranks] < rank_work[best % ranks] ||
                               (rank_work[b % ranks] == rank_work[best % ranks] && work[b] < work[best]);
                if (room[b] >= length && lighter) best = b;
                if (room[b] > room[roomiest]) roomiest = b;
            }
            int b = best >= 0 ? best : roomiest;
            int64_t n = best >= 0 ? length : room[b];
            pieces[placed++] = (PackPiece){start, n, b};
            room[b] -= n;
            work[b] += piece_work(n);
            rank_work[b % ranks] += piece_work(n);
            start += n;
            length -= n;
        }
    }
    for (int b = 0; b < bins; b++)
        CHECK(room[b] == 0, "pack_balanced: bin %d left %lld of %lld tokens empty", b, (long long)room[b],
              (long long)capacity);
    free(room);
    free(work);
    free(rank_work);
    qsort(pieces, (size_t)placed, sizeof(PackPiece), by_bin_then_start);
    return placed;
}

void pack_work(const PackPiece *pieces, int64_t count, int bins, double *work) {
    memset(work, 0, sizeof(double) * (size_t)bins);
    for (int64_t i = 0; i < count; i++) work[pieces[i].bin] += piece_work(pieces[i].length);
}

void packed_step_alloc(PackedStep *s, int64_t seq_len, int micro_batches, int ranks) {
    int64_t count = (int64_t)micro_batches * ranks, total = seq_len * count;
    s->seq_len = seq_len;
    s->count = count;
    s->ranks = ranks;
    s->inputs = xmalloc(sizeof(int32_t) * (size_t)total);
    s->targets = xmalloc(sizeof(int32_t) * (size_t)total);
    s->doc_starts = NULL;
    s->pieces = NULL;
    s->doc_count = s->doc_capacity = s->piece_count = 0;
}

void packed_step_free(PackedStep *s) {
    free(s->inputs);
    free(s->targets);
    free(s->doc_starts);
    free(s->pieces);
}

void packed_step_read(Loader *l, int64_t cursor, PackedStep *s) {
    int64_t N = s->seq_len;
    PackedSequence seq;
    packed_sequence_alloc(&seq, N);
    s->doc_count = 0;
    for (int64_t i = 0; i < s->count; i++) {
        loader_train_sequence(l, cursor + i, &seq);
        memcpy(s->inputs + i * N, seq.tokens, sizeof(int32_t) * (size_t)N);
        memcpy(s->targets + i * N, seq.targets, sizeof(int32_t) * (size_t)N);
        if (s->doc_count + seq.doc_start_count > s->doc_capacity) {
            s->doc_capacity = 2 * (s->doc_count + seq.doc_start_count);
            s->doc_starts = xrealloc(s->doc_starts, sizeof(int64_t) * (size_t)s->doc_capacity);
            s->pieces = xrealloc(s->pieces, sizeof(PackPiece) * (size_t)(s->doc_capacity + 1 + s->count));
        }
        for (int64_t k = 0; k < seq.doc_start_count; k++) s->doc_starts[s->doc_count++] = i * N + seq.doc_starts[k];
    }
    packed_sequence_free(&seq);
    s->piece_count = pack_balanced(s->doc_starts, s->doc_count, (int)s->count, s->ranks, N, s->pieces);
}

void packed_step_sequence(const PackedStep *s, int bin, PackedSequence *out) {
    CHECK(bin >= 0 && bin < s->count && out->seq_len == s->seq_len, "packed_step_sequence: sequence %d of %lld",
          bin, (long long)s->count);
    int64_t filled = 0;
    out->doc_start_count = 0;
    for (int64_t i = 0; i < s->piece_count; i++) {
        const PackPiece *p = &s->pieces[i];
        if (p->bin != bin) continue;
        out->doc_starts[out->doc_start_count++] = filled;
        memcpy(out->tokens + filled, s->inputs + p->start, sizeof(int32_t) * (size_t)p->length);
        memcpy(out->targets + filled, s->targets + p->start, sizeof(int32_t) * (size_t)p->length);
        filled += p->length;
    }
    out->tokens[s->seq_len] = out->targets[s->seq_len - 1];
}
