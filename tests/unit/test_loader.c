// test_loader.c: the data loader (data/loader.h) over shards written here.
// Every token encodes its document and its place in it (id = doc * 128 + t),
// so the test knows the content of any stream independently of the loader:
// packing reproduces the permuted document stream, boundaries, held-out
// documents never trained on, determinism, random access, epoch wrap, more
// shards than stay open, per-rank slices in every layout, and padded packing.
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../data/loader.h"
#include "../../data/synthetic.h"
#include "../../dist/util.h"
#include "../lib/check.h"

#define SHARDS 10               // more than LOADER_OPEN_SHARDS
#define DOCS_PER_SHARD 6
#define DOCS (SHARDS * DOCS_PER_SHARD)
#define MAX_DOC 128             // tokens; id = doc * MAX_DOC + t
#define SEQ_LEN 16
#define VAL_SEQUENCES 3

static char dir[] = "/tmp/test_loader.XXXXXX";
static int64_t doc_len[DOCS];   // by global id (shards in glob order)

// Ten shards a0..a8.shard and b.shard: random lengths (empty ones, ones
// longer than a sequence), frames of 13 tokens so documents cross frames.
static void write_shards(void) {
    Rng rng;
    rng_seed(&rng, 7);
    uint32_t tokens[MAX_DOC];
    for (int s = 0; s < SHARDS; s++) {
        char path[256];
        if (s < SHARDS - 1) snprintf(path, sizeof(path), "%s/a%d.shard", dir, s);
        else snprintf(path, sizeof(path), "%s/b.shard", dir);
        ShardWriter *w = shard_writer_open(path, DOCS * MAX_DOC, 0, 13);
        for (int d = 0; d < DOCS_PER_SHARD; d++) {
            int64_t id = s * DOCS_PER_SHARD + d, kind = (int64_t)rng_below(&rng, 6);
            doc_len[id] = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? 40 + (int64_t)rng_below(&rng, MAX_DOC - 40)
                                                                : 2 + (int64_t)rng_below(&rng, 20);
            for (int64_t t = 0; t < doc_len[id]; t++) tokens[t] = (uint32_t)(id * MAX_DOC + t);
            shard_writer_add_document(w, tokens, doc_len[id]);
        }
        shard_writer_close(w);
    }
}

static void open_loader(Loader *l, uint64_t seed) {
    char train[512];
    snprintf(train, sizeof(train), "%s/a*.shard,%s/b.shard", dir, dir);
    LoaderConfig c = {.train = train, .val_held_out = true, .vocab_size = DOCS * MAX_DOC, .seq_len = SEQ_LEN,
                      .val_sequences = VAL_SEQUENCES, .seed = seed, .tokenizer = {SHARD_TOKENIZER_UNKNOWN, 0}};
    loader_open(l, &c);
}

// The stream of a document order, built from the test's own knowledge.
static int32_t *expected_stream(const DocStream *st, int64_t *length) {
    int64_t n = 0;
    for (int64_t k = 0; k < st->count; k++) n += doc_len[st->docs[k]];
    int32_t *out = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    n = 0;
    for (int64_t k = 0; k < st->count; k++)
        for (int64_t t = 0; t < doc_len[st->docs[k]]; t++) out[n++] = (int32_t)(st->docs[k] * MAX_DOC + t);
    *length = n;
    return out;
}

// Does sequence i of a stream match: tokens and document starts?
static bool sequence_matches(const PackedSequence *s, const DocStream *st, const int32_t *stream, int64_t i) {
    if (memcmp(s->tokens, stream + i * SEQ_LEN, sizeof(int32_t) * (SEQ_LEN + 1))) return false;
    int64_t n = 0;
    for (int64_t k = 0, pos = 0; k < st->count; pos += doc_len[st->docs[k]], k++) {
        if (pos < i * SEQ_LEN || pos >= (i + 1) * SEQ_LEN) continue;
        if (n >= s->doc_start_count || s->doc_starts[n] != pos - i * SEQ_LEN) return false;
        n++;
    }
    return n == s->doc_start_count;
}

static int compare_id(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// Held-out and training documents split the non-empty documents exactly;
// the validation stream is the held-out documents, no more than it needs.
static void test_split(Loader *l, bool *held_out) {
    int64_t all[DOCS + 1], n = 0;
    memset(held_out, 0, sizeof(bool) * DOCS);
    for (int64_t k = 0; k < l->val.count; k++) all[n++] = l->val.docs[k], held_out[l->val.docs[k]] = true;
    const DocStream *e0 = loader_epoch_order(l, 0);
    for (int64_t k = 0; k < e0->count; k++) all[n++] = e0->docs[k];
    qsort(all, (size_t)n, sizeof(int64_t), compare_id);
    int64_t want = 0;
    bool partition = true;
    for (int64_t id = 0; id < DOCS; id++)
        if (doc_len[id] > 0) partition &= want < n && all[want++] == id;
    EXPECT(partition && want == n, "held-out and epoch-0 documents partition the %" PRId64 " non-empty documents", want);

    int64_t need = VAL_SEQUENCES * SEQ_LEN + 1, have = 0;
    for (int64_t k = 0; k < l->val.count; k++) have += doc_len[l->val.docs[k]];
    int64_t last = doc_len[l->val.docs[l->val.count - 1]];
    EXPECT(have >= need && have - last < need, "held out %" PRId64 " documents, %" PRId64 " tokens: enough for %d sequences, "
           "and not one document more", l->val.count, have, VAL_SEQUENCES);
    int64_t length;
    int32_t *stream = expected_stream(&l->val, &length);
    PackedSequence s;
    packed_sequence_alloc(&s, SEQ_LEN);
    bool ok = true;
    for (int64_t i = 0; i < VAL_SEQUENCES; i++) {
        loader_val_sequence(l, i, &s);
        ok &= sequence_matches(&s, &l->val, stream, i);
    }
    EXPECT(ok, "validation sequences are the held-out documents packed in order");
    packed_sequence_free(&s);
    free(stream);
}

// Epochs 0..2: each epoch's sequences reproduce its permuted stream exactly
// (documents cut at a sequence end continue in the next one), with the right
// document starts, and never hold a held-out document.
static void test_packing(Loader *l, const bool *held_out) {
    int64_t train_tokens = 0;
    for (int64_t k = 0; k < l->train_count; k++) train_tokens += doc_len[l->train_docs[k]];
    EXPECT(l->seqs_per_epoch == (train_tokens - 1) / SEQ_LEN, "%" PRId64 " sequences per epoch from %" PRId64 " tokens",
           l->seqs_per_epoch, train_tokens);
    PackedSequence s;
    packed_sequence_alloc(&s, SEQ_LEN);
    int64_t *first_order = xmalloc(sizeof(int64_t) * (size_t)l->train_count);
    for (int64_t e = 0; e < 3; e++) {
        DocStream st = *loader_epoch_order(l, e);  // copy: reading sequences keeps this epoch cached
        int64_t length;
        int32_t *stream = expected_stream(&st, &length);
        int64_t *sorted = xmalloc(sizeof(int64_t) * (size_t)st.count);
        memcpy(sorted, st.docs, sizeof(int64_t) * (size_t)st.count);
        qsort(sorted, (size_t)st.count, sizeof(int64_t), compare_id);
        EXPECT(st.count == l->train_count && !memcmp(sorted, l->train_docs, sizeof(int64_t) * (size_t)st.count),
               "epoch %" PRId64 ": the order is a permutation of the training documents", e);
        free(sorted);
        bool match = length == train_tokens, never_held = true;
        for (int64_t i = 0; i < l->seqs_per_epoch; i++) {
            loader_train_sequence(l, e * l->seqs_per_epoch + i, &s);
            match &= sequence_matches(&s, &st, stream, i);
            for (int t = 0; t <= SEQ_LEN; t++) never_held &= !held_out[s.tokens[t] / MAX_DOC];
        }
        EXPECT(match, "epoch %" PRId64 ": sequences concatenate to the permuted document stream, boundaries right", e);
        EXPECT(never_held, "epoch %" PRId64 ": no held-out document in a training sequence", e);
        if (e == 0) memcpy(first_order, st.docs, sizeof(int64_t) * (size_t)st.count);
        else EXPECT(memcmp(first_order, loader_epoch_order(l, e)->docs, sizeof(int64_t) * (size_t)st.count),
                    "epoch %" PRId64 " has another order than epoch 0", e);
        free(stream);
    }
    free(first_order);
    packed_sequence_free(&s);
}

// Same seed: same sequences, in any access order; another seed: another order.
static void test_determinism(Loader *l) {
    int64_t total = 3 * l->seqs_per_epoch + 2;
    int32_t *seq_tokens = xmalloc(sizeof(int32_t) * (size_t)(total * (SEQ_LEN + 1)));
    PackedSequence s;
    packed_sequence_alloc(&s, SEQ_LEN);
    for (int64_t g = 0; g < total; g++) {
        loader_train_sequence(l, g, &s);
        memcpy(seq_tokens + g * (SEQ_LEN + 1), s.tokens, sizeof(int32_t) * (SEQ_LEN + 1));
    }
    Loader again;
    open_loader(&again, 1234);
    Rng rng;
    rng_seed(&rng, 99);
    bool same = true;
    for (int64_t j = 0; j < 2 * total; j++) {
        int64_t g = (int64_t)rng_below(&rng, (uint64_t)total);
        loader_train_sequence(&again, g, &s);
        same &= !memcmp(seq_tokens + g * (SEQ_LEN + 1), s.tokens, sizeof(int32_t) * (SEQ_LEN + 1));
    }
    EXPECT(same, "a second loader with the same seed, read in random order, gives the same %" PRId64 " sequences", total);
    loader_close(&again);

    Loader other;
    open_loader(&other, 4321);
    loader_train_sequence(&other, 0, &s);
    bool differs = memcmp(seq_tokens, s.tokens, sizeof(int32_t) * (SEQ_LEN + 1)) != 0;
    for (int64_t k = 0; k < other.val.count && k < l->val.count; k++) differs |= other.val.docs[k] != l->val.docs[k];
    EXPECT(differs, "another seed gives another first sequence or held-out choice");
    loader_close(&other);
    packed_sequence_free(&s);
    free(seq_tokens);
}

// The rank that holds position p, from the layout rules of attention/layout.h.
static int owner(LayoutKind kind, int64_t p, int block, int world) {
    int64_t b = p / block, blocks = (SEQ_LEN + block - 1) / block;
    if (kind == LAYOUT_STRIPED) return (int)(b % world);
    int runs = kind == LAYOUT_ZIGZAG ? 2 * world : world, run = 0;
    while (b >= blocks * (run + 1) / runs) run++;
    return run < world ? run : runs - 1 - run;
}

// For W = 1, 2, 4 in every layout (blocks of 3 and 4 tokens): the ranks'
// slices cover every position once, with its token and next-token target.
static void test_rank_slices(Loader *l) {
    PackedSequence s;
    packed_sequence_alloc(&s, SEQ_LEN);
    loader_train_sequence(l, 5, &s);
    RankSlice r;
    rank_slice_alloc(&r, SEQ_LEN);
    const LayoutKind kinds[] = {LAYOUT_CONTIGUOUS, LAYOUT_ZIGZAG, LAYOUT_STRIPED};
    for (int k = 0; k < 3; k++)
        for (int block = 3; block <= 4; block++)
            for (int world = 1; world <= 4; world *= 2) {
                int covered[SEQ_LEN] = {0};
                bool right = true;
                int64_t total = 0;
                for (int rank = 0; rank < world; rank++) {
                    loader_rank_slice(&s, kinds[k], block, world, rank, &r);
                    total += r.count;
                    for (int64_t j = 0; j < r.count; j++) {
                        int64_t p = r.positions[j];
                        if (p < 0 || p >= SEQ_LEN) { right = false; continue; }
                        covered[p]++;
                        right &= owner(kinds[k], p, block, world) == rank;
                        right &= r.tokens[j] == s.tokens[p] && r.targets[j] == s.tokens[p + 1];
                        right &= j == 0 || p > r.positions[j - 1] || p % block == 0;  // ascending inside blocks
                    }
                }
                for (int p = 0; p < SEQ_LEN; p++) right &= covered[p] == 1;
                EXPECT(right && total == SEQ_LEN, "%s, block %d, W=%d: each rank holds its blocks; slices reassemble the sequence with positions and targets",
                       layout_name(kinds[k]), block, world);
            }
    rank_slice_free(&r);
    packed_sequence_free(&s);
}

// Padded packing (same shards, SEQ_LEN 16: documents of 2..21 tokens and of
// 40..127, cut into pieces): epochs 0 and 1 in the order sequential packing
// would use; each document's pieces j = 0, 1, ... in turn, each from position
// 0: its tokens j*16 .. j*16 + 16 (fewer at its end), next-token targets
// inside the document, -1 and token 0 after it, a document start at 0 only
// on piece 0; so every (input, target) pair of every training document once
// per epoch, and no sequence holding two documents. Validation stays packed.
static void test_padded(Loader *sequential) {
    char train[512];
    snprintf(train, sizeof(train), "%s/a*.shard,%s/b.shard", dir, dir);
    LoaderConfig c = {.train = train, .val_held_out = true, .vocab_size = DOCS * MAX_DOC, .seq_len = SEQ_LEN,
                      .val_sequences = VAL_SEQUENCES, .seed = 1234, .padded = true,
                      .tokenizer = {SHARD_TOKENIZER_UNKNOWN, 0}};
    Loader l;
    loader_open(&l, &c);
    int64_t pieces = 0;
    for (int64_t k = 0; k < l.train_count; k++)
        for (int64_t j = 0; j * SEQ_LEN < doc_len[l.train_docs[k]] - 1; j++) pieces++;
    EXPECT(l.seqs_per_epoch == pieces, "padded: %" PRId64 " sequences per epoch, one per %d targets of each document "
           "(%" PRId64 " expected)", l.seqs_per_epoch, SEQ_LEN, pieces);
    PackedSequence s;
    packed_sequence_alloc(&s, SEQ_LEN);
    for (int64_t e = 0; e < 2; e++) {
        DocStream st = *loader_epoch_order(&l, e);
        int64_t order_count = st.count, *order = xmalloc(sizeof(int64_t) * (size_t)(st.count + 1));
        memcpy(order, st.docs, sizeof(int64_t) * (size_t)st.count);
        const DocStream *packed = loader_epoch_order(sequential, e);
        EXPECT(packed->count == order_count && !memcmp(packed->docs, order, sizeof(int64_t) * (size_t)order_count),
               "padded: epoch %" PRId64 " takes the documents in sequential packing's order", e);
        bool pieces_right = true;
        int64_t g = e * l.seqs_per_epoch;
        for (int64_t k = 0; k < order_count; k++) {
            int64_t id = order[k], length = doc_len[id];
            for (int64_t j = 0; j * SEQ_LEN < length - 1; j++, g++) {
                loader_train_sequence(&l, g, &s);
                for (int64_t i = 0; i <= SEQ_LEN; i++) {
                    int64_t t = j * SEQ_LEN + i;
                    pieces_right &= s.tokens[i] == (t < length ? id * MAX_DOC + t : 0);
                    if (i < SEQ_LEN) pieces_right &= s.targets[i] == (t + 1 < length ? id * MAX_DOC + t + 1 : -1);
                }
                pieces_right &= j == 0 ? s.doc_start_count == 1 && s.doc_starts[0] == 0 : s.doc_start_count == 0;
            }
        }
        EXPECT(pieces_right && g == (e + 1) * l.seqs_per_epoch, "padded: epoch %" PRId64 ": each document's pieces in "
               "order from position 0, targets -1 and token 0 after its end, a start only on its first piece", e);
        free(order);
    }
    bool val_same = true;
    PackedSequence v;
    packed_sequence_alloc(&v, SEQ_LEN);
    for (int64_t i = 0; i < VAL_SEQUENCES; i++) {
        loader_val_sequence(&l, i, &s);
        loader_val_sequence(sequential, i, &v);
        val_same &= !memcmp(s.tokens, v.tokens, sizeof(int32_t) * (SEQ_LEN + 1)) && s.doc_start_count == v.doc_start_count;
    }
    EXPECT(val_same, "padded: validation sequences are packed as under sequential packing");
    packed_sequence_free(&v);
    packed_sequence_free(&s);
    loader_close(&l);
}

static void test_synthetic(void) {
    Loader l;
    LoaderConfig c = {.synthetic = true, .val_held_out = true, .vocab_size = 97, .seq_len = SEQ_LEN, .val_sequences = 2,
                      .seed = 5, .tokenizer = {SHARD_TOKENIZER_UNKNOWN, 0}};
    loader_open(&l, &c);
    PackedSequence s;
    packed_sequence_alloc(&s, SEQ_LEN);
    int32_t want[SEQ_LEN + 1];
    loader_train_sequence(&l, 7, &s);
    synthetic_sequence(5, 7, 97, want, SEQ_LEN + 1);
    bool train = !memcmp(s.tokens, want, sizeof(want));
    loader_val_sequence(&l, 1, &s);
    synthetic_sequence(5, -2, 97, want, SEQ_LEN + 1);
    EXPECT(train && !memcmp(s.tokens, want, sizeof(want)), "synthetic: training sequence g and validation sequence -1-i");
    packed_sequence_free(&s);
    loader_close(&l);
}

int main(void) {
    if (!mkdtemp(dir)) FAIL("mkdtemp %s failed", dir);
    write_shards();
    Loader l;
    open_loader(&l, 1234);
    EXPECT(l.shard_count == SHARDS && l.doc_count == DOCS, "the glob list opens %d shards, %d documents", l.shard_count,
           (int)l.doc_count);
    bool held_out[DOCS];
    test_split(&l, held_out);
    test_packing(&l, held_out);
    test_determinism(&l);
    test_rank_slices(&l);
    test_padded(&l);
    loader_close(&l);
    test_synthetic();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
    return check_exit();
}
