// loader.c: shards -> shuffled document streams -> packed sequences -> rank
// slices (see loader.h for the packing rules).
#define _GNU_SOURCE
#include "loader.h"

#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../dist/util.h"
#include "synthetic.h"

// Salts that keep the held-out choice and each epoch's order independent.
#define VAL_ORDER_SALT 0x76616c69646174ULL   // "validat"
#define EPOCH_ORDER_SALT 0x9e3779b97f4a7c15ULL

// ----------------------------------------------------------------------------
// Shards: expand the globs, validate, keep metadata, reopen on demand

// Opens a shard and checks that the model can embed every id in it.
static void open_for_model(Shard *s, const char *path, int64_t model_vocab) {
    shard_open(s, path);
    if (s->vocab_size > model_vocab)
        fail("%s: vocabulary size %" PRId64 " is larger than the model's (expected <= model.vocab_size = %" PRId64 ")",
             path, s->vocab_size, model_vocab);
}

// A shard of a known tokenizer must come from the model's (when that is known).
static void check_tokenizer(const Shard *s, const LoaderConfig *cfg) {
    ShardTokenizer want = cfg->tokenizer, got = s->tokenizer;
    if (want.kind == SHARD_TOKENIZER_UNKNOWN || got.kind == SHARD_TOKENIZER_UNKNOWN || shard_tokenizer_same(want, got))
        return;
    char want_text[64], got_text[64];
    shard_tokenizer_describe(want, want_text, sizeof(want_text));
    shard_tokenizer_describe(got, got_text, sizeof(got_text));
    fail("%s: made by tokenizer %s, but the model's is %s from %s (expected shards tokenized with the model's "
         "tokenizer; data.check_tokenizer=false trains anyway)", s->path, got_text, want_text, cfg->tokenizer_source);
}

static void add_shard(Loader *l, const char *path) {
    for (int i = 0; i < l->shard_count; i++)
        if (!strcmp(l->shards[i].path, path)) fail("%s: named twice by data.train / data.val (expected each shard once)", path);
    Shard s;
    open_for_model(&s, path, l->cfg.vocab_size);
    check_tokenizer(&s, &l->cfg);
    l->shards = xrealloc(l->shards, sizeof(ShardInfo) * (size_t)(l->shard_count + 1));
    ShardInfo *info = &l->shards[l->shard_count++];
    info->path = xstrdup(path);
    info->first_doc = l->doc_count;
    info->doc_count = s.doc_count;
    info->doc_starts = xmalloc(sizeof(int64_t) * (size_t)(s.doc_count + 1));
    memcpy(info->doc_starts, s.doc_starts, sizeof(int64_t) * (size_t)(s.doc_count + 1));
    l->doc_count += s.doc_count;
    uint64_t chain[2] = {l->content_hash, shard_content_hash(&s)};
    l->content_hash = XXH64(chain, sizeof(chain), 0);
    shard_close(&s);
}

// Adds the shards that `spec` (glob[,glob...]) names, in order; a pattern
// that matches nothing is an error. `key` names the config key for messages.
static void add_shards(Loader *l, const char *spec, const char *key) {
    char *copy = xstrdup(spec), *save = NULL;
    for (char *pattern = strtok_r(copy, ",", &save); pattern; pattern = strtok_r(NULL, ",", &save)) {
        glob_t g;
        int rc = glob(pattern, 0, NULL, &g);
        if (rc == GLOB_NOMATCH) fail("%s: '%s' matches no file (expected one or more shard files)", key, pattern);
        if (rc != 0) fail("%s: '%s' cannot be expanded (glob error %d: a folder cannot be read)", key, pattern, rc);
        for (size_t i = 0; i < g.gl_pathc; i++) add_shard(l, g.gl_pathv[i]);
        globfree(&g);
    }
    free(copy);
}

static int64_t doc_length(const Loader *l, int64_t id) {
    int s;
    int64_t d;
    loader_document(l, id, &s, &d);
    return l->shards[s].doc_starts[d + 1] - l->shards[s].doc_starts[d];
}

void loader_document(const Loader *l, int64_t id, int *shard, int64_t *doc) {
    CHECK(id >= 0 && id < l->doc_count, "document %" PRId64 " out of range 0 .. %" PRId64, id, l->doc_count - 1);
    int lo = 0, hi = l->shard_count - 1;  // the last shard whose first_doc <= id
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->shards[mid].first_doc <= id) lo = mid;
        else hi = mid - 1;
    }
    *shard = lo;
    *doc = id - l->shards[lo].first_doc;
}

// The open Shard for shards[s], opening it (and closing the least recently
// used one) when needed. A file that changed since loader_open is refused.
static Shard *open_shard(Loader *l, int s) {
    int slot = 0;
    for (int i = 0; i < LOADER_OPEN_SHARDS; i++) {
        if (l->open_shard[i] == s) { slot = i; goto found; }
        if (l->open_used[i] < l->open_used[slot]) slot = i;
    }
    if (l->open_shard[slot] >= 0) shard_close(&l->open[slot]);
    const ShardInfo *info = &l->shards[s];
    open_for_model(&l->open[slot], info->path, l->cfg.vocab_size);
    if (l->open[slot].doc_count != info->doc_count ||
        memcmp(l->open[slot].doc_starts, info->doc_starts, sizeof(int64_t) * (size_t)(info->doc_count + 1)))
        fail("%s: the shard changed while the run was using it (expected the file it had at start-up)", info->path);
    l->open_shard[slot] = s;
found:
    l->open_used[slot] = ++l->use_clock;
    return &l->open[slot];
}

// ----------------------------------------------------------------------------
// Document streams

static void shuffle(int64_t *a, int64_t n, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&rng, (uint64_t)(i + 1));
        int64_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

// Fills st->prefix from st->docs.
static void stream_prefix(const Loader *l, DocStream *st) {
    st->prefix = xrealloc(st->prefix, sizeof(int64_t) * (size_t)(st->count + 1));
    st->prefix[0] = 0;
    for (int64_t k = 0; k < st->count; k++) st->prefix[k + 1] = st->prefix[k] + doc_length(l, st->docs[k]);
}

// Padded packing: the sequences a document of `length` tokens fills, one per
// N (input, target) pairs (loader.h).
static int64_t padded_sequences(int64_t length, int64_t N) { return (length - 1 + N - 1) / N; }

// Fills st->seq_prefix from st->docs (padded packing).
static void stream_sequence_prefix(const Loader *l, DocStream *st) {
    st->seq_prefix = xrealloc(st->seq_prefix, sizeof(int64_t) * (size_t)(st->count + 1));
    st->seq_prefix[0] = 0;
    for (int64_t k = 0; k < st->count; k++)
        st->seq_prefix[k + 1] = st->seq_prefix[k] + padded_sequences(doc_length(l, st->docs[k]), l->cfg.seq_len);
}

// The non-empty documents with ids in [first, last), in id order.
static int64_t non_empty_docs(const Loader *l, int64_t first, int64_t last, int64_t *out) {
    int64_t n = 0;
    for (int64_t id = first; id < last; id++)
        if (doc_length(l, id) > 0) out[n++] = id;
    return n;
}

// Validation: the first documents of a seeded shuffle of the candidates, as
// many as the stream needs (val_sequences * N + 1 tokens; none without
// validation). With held_out, those documents are removed from the
// candidates (which stay in id order).
static void pick_validation(Loader *l, int64_t *candidates, int64_t *count, bool held_out, const char *key) {
    int64_t need = l->cfg.val_sequences > 0 ? l->cfg.val_sequences * l->cfg.seq_len + 1 : 0;
    int64_t *order = xmalloc(sizeof(int64_t) * (size_t)(*count + 1));
    memcpy(order, candidates, sizeof(int64_t) * (size_t)*count);
    shuffle(order, *count, l->cfg.seed ^ VAL_ORDER_SALT);
    int64_t taken = 0, tokens = 0;
    while (taken < *count && tokens < need) tokens += doc_length(l, order[taken++]);
    if (tokens < need)
        fail("%s: %s has %" PRId64 " tokens in %" PRId64 " non-empty documents, fewer than the %" PRId64
             " of data.val_sequences = %" PRId64 " validation sequences of train.seq_len = %" PRId64
             " (expected more data, fewer or shorter sequences%s)", held_out ? l->cfg.train : l->cfg.val, key, tokens,
             *count, need, l->cfg.val_sequences, l->cfg.seq_len, held_out ? ", or data.val naming other shards" : "");
    l->val.count = taken;
    l->val.docs = xmalloc(sizeof(int64_t) * (size_t)(taken + 1));
    memcpy(l->val.docs, order, sizeof(int64_t) * (size_t)taken);
    stream_prefix(l, &l->val);
    if (held_out) {
        bool *held = xcalloc((size_t)l->doc_count + 1, sizeof(bool));
        for (int64_t i = 0; i < taken; i++) held[order[i]] = true;
        int64_t kept = 0;
        for (int64_t i = 0; i < *count; i++)
            if (!held[candidates[i]]) candidates[kept++] = candidates[i];
        *count = kept;
        free(held);
    }
    free(order);
}

const DocStream *loader_epoch_order(Loader *l, int64_t e) {
    CHECK(!l->cfg.synthetic && e >= 0, "loader_epoch_order: epoch %" PRId64 " of a shard loader", e);
    if (l->epoch_index == e) return &l->epoch;
    l->epoch.count = l->train_count;
    memcpy(l->epoch.docs, l->train_docs, sizeof(int64_t) * (size_t)l->train_count);
    shuffle(l->epoch.docs, l->train_count, l->cfg.seed + EPOCH_ORDER_SALT * (uint64_t)(e + 1));
    stream_prefix(l, &l->epoch);
    if (l->cfg.padded) stream_sequence_prefix(l, &l->epoch);
    l->epoch_index = e;
    return &l->epoch;
}

// ----------------------------------------------------------------------------
// Open / close

void loader_open(Loader *l, const LoaderConfig *cfg) {
    memset(l, 0, sizeof(*l));
    l->cfg = *cfg;
    l->epoch_index = -1;
    for (int i = 0; i < LOADER_OPEN_SHARDS; i++) l->open_shard[i] = -1;
    if (cfg->synthetic) return;
    bool held_out = cfg->val_held_out;
    add_shards(l, cfg->train, "data.train");
    int64_t train_doc_end = l->doc_count;
    l->train_shard_count = l->shard_count;
    if (!held_out) add_shards(l, cfg->val, "data.val");

    l->train_docs = xmalloc(sizeof(int64_t) * (size_t)(l->doc_count + 1));
    l->train_count = non_empty_docs(l, 0, train_doc_end, l->train_docs);
    if (held_out) {
        pick_validation(l, l->train_docs, &l->train_count, true, "data.train");
    } else {
        int64_t *val_docs = xmalloc(sizeof(int64_t) * (size_t)(l->doc_count - train_doc_end + 1));
        int64_t val_count = non_empty_docs(l, train_doc_end, l->doc_count, val_docs);
        pick_validation(l, val_docs, &val_count, false, "data.val");
        free(val_docs);
    }
    for (int64_t k = 0; k < l->train_count; k++) l->train_tokens += doc_length(l, l->train_docs[k]);
    int64_t N = cfg->seq_len;
    if (cfg->padded) {
        for (int64_t k = 0; k < l->train_count; k++)
            l->seqs_per_epoch += padded_sequences(doc_length(l, l->train_docs[k]), N);
        if (l->seqs_per_epoch == 0)
            fail("%s: data.train has %" PRId64 " non-empty documents%s, none of 2 tokens or more (expected a document "
                 "with a next-token target for data.packing: padded)", cfg->train, l->train_count,
                 held_out ? " after holding out the validation documents" : "");
    } else {
        if (l->train_tokens < N + 1)
            fail("%s: data.train has %" PRId64 " training tokens in %" PRId64 " non-empty documents%s, fewer than one "
                 "sequence of train.seq_len + 1 = %" PRId64 " tokens (expected more data or a shorter train.seq_len)",
                 cfg->train, l->train_tokens, l->train_count,
                 held_out ? " after holding out the validation documents" : "", N + 1);
        l->seqs_per_epoch = (l->train_tokens - 1) / N;
    }
    l->epoch.docs = xmalloc(sizeof(int64_t) * (size_t)(l->train_count + 1));
}

void loader_close(Loader *l) {
    for (int i = 0; i < LOADER_OPEN_SHARDS; i++)
        if (l->open_shard[i] >= 0) shard_close(&l->open[i]);
    for (int s = 0; s < l->shard_count; s++) {
        free(l->shards[s].path);
        free(l->shards[s].doc_starts);
    }
    free(l->shards);
    free(l->train_docs);
    free(l->epoch.docs);
    free(l->epoch.prefix);
    free(l->epoch.seq_prefix);
    free(l->val.docs);
    free(l->val.prefix);
    memset(l, 0, sizeof(*l));
}

void loader_print_summary(const Loader *l, FILE *out) {
    bool validation = l->cfg.val_sequences > 0;
    if (l->cfg.synthetic) {
        fprintf(out, "data: synthetic (seed %llu) | validation: ", (unsigned long long)l->cfg.seed);
        if (validation) fprintf(out, "%lld held-out sequences\n", (long long)l->cfg.val_sequences);
        else fprintf(out, "off\n");
        return;
    }
    int val_shards = l->shard_count - l->train_shard_count;
    fprintf(out, "data: %d shards, %lld training documents, %lld tokens = %lld %ssequences of %lld per epoch | "
            "validation: ", l->train_shard_count, (long long)l->train_count, (long long)l->train_tokens,
            (long long)l->seqs_per_epoch, l->cfg.padded ? "padded " : "", (long long)l->cfg.seq_len);
    if (!validation) fprintf(out, "off, nothing held out\n");
    else if (val_shards)
        fprintf(out, "%lld sequences from %lld document%s of data.val (%d shard%s)\n", (long long)l->cfg.val_sequences,
                (long long)l->val.count, l->val.count == 1 ? "" : "s", val_shards, val_shards == 1 ? "" : "s");
    else
        fprintf(out, "%lld sequences from %lld document%s held out of data.train\n", (long long)l->cfg.val_sequences,
                (long long)l->val.count, l->val.count == 1 ? "" : "s");
}

// ----------------------------------------------------------------------------
// Sequences

void packed_sequence_alloc(PackedSequence *s, int64_t seq_len) {
    s->seq_len = seq_len;
    s->tokens = xmalloc(sizeof(int32_t) * (size_t)(seq_len + 1));
    s->targets = xmalloc(sizeof(int32_t) * (size_t)seq_len);
    s->doc_starts = xmalloc(sizeof(int64_t) * (size_t)seq_len);
    s->doc_start_count = 0;
}

void packed_sequence_free(PackedSequence *s) {
    free(s->tokens);
    free(s->targets);
    free(s->doc_starts);
}

// out = stream tokens [start, start + N + 1) and the documents that begin at
// input positions.
static void read_stream(Loader *l, const DocStream *st, int64_t start, PackedSequence *out) {
    int64_t want = out->seq_len + 1;
    CHECK(start >= 0 && start + want <= st->prefix[st->count], "stream range %" PRId64 " + %" PRId64 " past its end %" PRId64,
          start, want, st->prefix[st->count]);
    int64_t lo = 0, hi = st->count - 1;  // the document holding token `start`
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (st->prefix[mid] <= start) lo = mid;
        else hi = mid - 1;
    }
    out->doc_start_count = 0;
    for (int64_t k = lo, filled = 0; filled < want; k++) {
        int64_t offset = start + filled - st->prefix[k];
        int64_t n = st->prefix[k + 1] - st->prefix[k] - offset;
        if (n > want - filled) n = want - filled;
        if (offset == 0 && filled < out->seq_len) out->doc_starts[out->doc_start_count++] = filled;
        int s;
        int64_t d;
        loader_document(l, st->docs[k], &s, &d);
        // Ids are < the shard's vocab_size <= the model's <= 2^24: they fit int32.
        shard_read_tokens(open_shard(l, s), l->shards[s].doc_starts[d] + offset, n, (uint32_t *)out->tokens + filled);
        filled += n;
    }
    memcpy(out->targets, out->tokens + 1, sizeof(int32_t) * (size_t)out->seq_len);
}

// Padded packing: the piece of sequence r of the epoch's order st: the
// document's index k in st, the piece's first token, its tokens (at most N + 1).
static void padded_piece(const DocStream *st, int64_t r, int64_t N, int64_t *k, int64_t *offset, int64_t *n) {
    int64_t lo = 0, hi = st->count - 1;  // the document whose sequences hold r
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (st->seq_prefix[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    int64_t length = st->prefix[lo + 1] - st->prefix[lo];
    *k = lo;
    *offset = (r - st->seq_prefix[lo]) * N;
    *n = length - *offset < N + 1 ? length - *offset : N + 1;
}

// Padded packing: sequence r of the epoch's order st, a piece of one
// document from position 0, padding after it (loader.h).
static void read_padded(Loader *l, const DocStream *st, int64_t r, PackedSequence *out) {
    int64_t N = out->seq_len, k, offset, n;
    padded_piece(st, r, N, &k, &offset, &n);
    int s;
    int64_t d;
    loader_document(l, st->docs[k], &s, &d);
    shard_read_tokens(open_shard(l, s), l->shards[s].doc_starts[d] + offset, n, (uint32_t *)out->tokens);
    for (int64_t i = n; i <= N; i++) out->tokens[i] = 0;
    for (int64_t i = 0; i < N; i++) out->targets[i] = i + 1 < n ? out->tokens[i + 1] : -1;
    out->doc_start_count = 0;
    if (offset == 0) out->doc_starts[out->doc_start_count++] = 0;
}

// Synthetic data is one document per sequence.
static void synthetic_packed(const Loader *l, int64_t index, PackedSequence *out) {
    synthetic_sequence(l->cfg.seed, index, (int)l->cfg.vocab_size, out->tokens, out->seq_len + 1);
    memcpy(out->targets, out->tokens + 1, sizeof(int32_t) * (size_t)out->seq_len);
    out->doc_starts[0] = 0;
    out->doc_start_count = 1;
}

void loader_train_sequence(Loader *l, int64_t g, PackedSequence *out) {
    CHECK(g >= 0 && out->seq_len == l->cfg.seq_len, "loader_train_sequence: sequence %" PRId64 " of length %" PRId64, g,
          out->seq_len);
    if (l->cfg.synthetic) { synthetic_packed(l, g, out); return; }
    const DocStream *st = loader_epoch_order(l, g / l->seqs_per_epoch);
    if (l->cfg.padded) read_padded(l, st, g % l->seqs_per_epoch, out);
    else read_stream(l, st, (g % l->seqs_per_epoch) * l->cfg.seq_len, out);
}

int64_t loader_train_targets(Loader *l, int64_t g) {
    if (l->cfg.synthetic || !l->cfg.padded) return l->cfg.seq_len;   // synthetic: one whole document a sequence
    int64_t k, offset, n;
    padded_piece(loader_epoch_order(l, g / l->seqs_per_epoch), g % l->seqs_per_epoch, l->cfg.seq_len, &k, &offset, &n);
    return n - 1;
}

void loader_val_sequence(Loader *l, int64_t i, PackedSequence *out) {
    CHECK(i >= 0 && i < l->cfg.val_sequences && out->seq_len == l->cfg.seq_len,
          "loader_val_sequence: sequence %" PRId64 " of %" PRId64, i, l->cfg.val_sequences);
    if (l->cfg.synthetic) { synthetic_packed(l, -1 - i, out); return; }
    read_stream(l, &l->val, i * l->cfg.seq_len, out);
}

// ----------------------------------------------------------------------------
// Rank slices

void rank_slice_alloc(RankSlice *s, int64_t seq_len) {
    s->count = 0;
    s->tokens = xmalloc(sizeof(int32_t) * (size_t)seq_len);
    s->targets = xmalloc(sizeof(int32_t) * (size_t)seq_len);
    s->positions = xmalloc(sizeof(int64_t) * (size_t)seq_len);
}

void rank_slice_free(RankSlice *s) {
    free(s->tokens);
    free(s->targets);
    free(s->positions);
}

void loader_rank_slice(const PackedSequence *seq, LayoutKind kind, int block_size, int world, int rank,
                       RankSlice *out) {
    out->count = layout_rank_positions(kind, seq->seq_len, block_size, world, rank, out->positions);
    for (int64_t j = 0; j < out->count; j++) {
        int64_t p = out->positions[j];
        out->tokens[j] = seq->tokens[p];
        out->targets[j] = seq->targets[p];
    }
}
