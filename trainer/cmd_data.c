// cmd_data.c: the data verbs. `mtrain tokenize` packs text files (.txt: one
// document per file; .jsonl: the "text" field of each line) into a token
// shard; `mtrain shard info|verify|dump` inspects, checks and prints one;
// `mtrain data RUN.yaml` shows what the loader makes of a run's data.
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../data/shard.h"
#include "../data/tokenizer_bytes.h"
#include "../dist/util.h"
#include "commands.h"
#include "train.h"

static const char *tokenize_usage =
    "usage: mtrain tokenize --tokenizer bytes --input FILE... --output OUT.shard [--frame-tokens N]\n"
    "  FILE.txt is one document; FILE.jsonl holds one JSON object per line whose \"text\" is a document.\n"
    "  Every document ends with <|endoftext|>.\n";

static const char *data_usage =
    "usage: mtrain data RUN.yaml [--read N] [--show G] [section.key=value ...]\n"
    "  prints the loader's view of data.train / data.val; --read N times reading training sequences 0..N-1;\n"
    "  --show G prints training sequence G: its document starts and token ids.\n";

static const char *shard_usage =
    "usage: mtrain shard info FILE          header, frames, documents, tokens, compression\n"
    "       mtrain shard verify FILE...     check every checksum and token; prints FILE: ok\n"
    "       mtrain shard dump FILE [--text] token ids (or decoded text), one document per line\n";

// Prints "mtrain: <message>" and the usage; returns the usage exit status 2.
static int usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mtrain: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n%s", usage);
    va_end(ap);
    return 2;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

// ----------------------------------------------------------------------------
// tokenize

typedef struct {
    ShardWriter *writer;
    uint32_t *ids;
    int64_t ids_cap;
    int64_t documents, text_bytes, tokens;
} Tokenize;

// Encodes one document with the byte tokenizer, appends <|endoftext|>, and
// adds it to the shard.
static void add_text(Tokenize *t, const uint8_t *text, int64_t bytes) {
    if (bytes + 1 > t->ids_cap) {
        t->ids_cap = 2 * (bytes + 1);
        free(t->ids);
        t->ids = xmalloc((size_t)t->ids_cap * sizeof(uint32_t));
    }
    tokenizer_bytes_encode(text, bytes, t->ids);
    t->ids[bytes] = TOKEN_ENDOFTEXT;
    shard_writer_add_document(t->writer, t->ids, bytes + 1);
    t->documents++;
    t->text_bytes += bytes;
    t->tokens += bytes + 1;
}

// Whether a JSON line holds a \u0000 escape: cJSON's strings end at a NUL, so
// such a text would be cut short silently.
static int has_nul_escape(const char *line, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (line[i] != '\\') continue;
        if (line[i + 1] == 'u' && i + 6 <= len && !strncmp(line + i + 2, "0000", 4)) return 1;
        i++;  // skip the escaped character
    }
    return 0;
}

static void add_jsonl(Tokenize *t, const char *path) {
    FILE *f = xfopen(path, "rb");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (int64_t line_no = 1; (len = getline(&line, &cap, f)) >= 0; line_no++) {
        if (strspn(line, " \t\r\n") == (size_t)len) continue;  // blank line
        cJSON *obj = cJSON_ParseWithLength(line, (size_t)len);
        const cJSON *text = obj ? cJSON_GetObjectItemCaseSensitive(obj, "text") : NULL;
        if (!cJSON_IsString(text) || has_nul_escape(line, (size_t)len)) {
            const char *problem = !obj ? "invalid JSON" : !cJSON_IsObject(obj) ? "not a JSON object"
                                : !cJSON_IsString(text) ? "no string field \"text\"" : "a \\u0000 (NUL) escape is not supported";
            cJSON_Delete(obj);
            shard_writer_abort(t->writer);
            fail("%s:%" PRId64 ": %s (expected one JSON object per line with a string field \"text\")", path, line_no, problem);
        }
        add_text(t, (const uint8_t *)text->valuestring, (int64_t)strlen(text->valuestring));
        cJSON_Delete(obj);
    }
    if (ferror(f)) {
        shard_writer_abort(t->writer);
        fail("%s: read failed (%s)", path, strerror(errno));
    }
    free(line);
    fclose(f);
}

int cmd_tokenize(int argc, char **argv) {
    const char *tokenizer = NULL, *output = NULL;
    int64_t frame_tokens = 0;
    char **inputs = argv;  // input names are gathered in place: input_count <= i
    int input_count = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) { printf("%s", tokenize_usage); return 0; }
        if (!strcmp(arg, "--input")) {
            int before = input_count;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) inputs[input_count++] = argv[++i];
            if (input_count == before) return usage_error(tokenize_usage, "%s needs at least one file", arg);
            continue;
        }
        if (strcmp(arg, "--tokenizer") && strcmp(arg, "--output") && strcmp(arg, "--frame-tokens"))
            return usage_error(tokenize_usage, "tokenize: unknown argument '%s'", arg);
        if (i + 1 >= argc) return usage_error(tokenize_usage, "%s needs a value", arg);
        const char *value = argv[++i];
        if (!strcmp(arg, "--tokenizer")) tokenizer = value;
        else if (!strcmp(arg, "--output")) output = value;
        else {
            char *end;
            errno = 0;
            frame_tokens = strtoll(value, &end, 10);
            if (errno || *end || end == value || frame_tokens < 1 || frame_tokens > SHARD_MAX_FRAME_TOKENS)
                return usage_error(tokenize_usage, "--frame-tokens '%s' is not a whole number in 1 .. %d", value, SHARD_MAX_FRAME_TOKENS);
        }
    }
    const char *missing = !tokenizer ? "--tokenizer" : !input_count ? "--input" : !output ? "--output" : NULL;
    if (missing) return usage_error(tokenize_usage, "tokenize: %s is required", missing);
    if (strcmp(tokenizer, "bytes"))
        return usage_error(tokenize_usage, "tokenizer '%s' is not supported (expected 'bytes': only 'bytes' for now; tokenizer.json comes later)", tokenizer);
    for (int i = 0; i < input_count; i++) {
        if (!ends_with(inputs[i], ".txt") && !ends_with(inputs[i], ".jsonl"))
            return usage_error(tokenize_usage, "%s: unknown input type (expected a .txt or .jsonl file)", inputs[i]);
        fclose(xfopen(inputs[i], "rb"));  // fail on a missing input before any work
    }

    char *output_dir = xstrdup(output);
    char *slash = strrchr(output_dir, '/');
    if (slash && slash != output_dir) {
        *slash = 0;
        make_dirs(output_dir);
    }
    free(output_dir);
    Tokenize t = {.writer = shard_writer_open(output, TOKENIZER_BYTES_VOCAB, 0, frame_tokens)};
    for (int i = 0; i < input_count; i++) {
        if (ends_with(inputs[i], ".jsonl")) { add_jsonl(&t, inputs[i]); continue; }
        size_t bytes;
        char *text = read_file(inputs[i], &bytes);
        add_text(&t, (const uint8_t *)text, (int64_t)bytes);
        free(text);
    }
    shard_writer_close(t.writer);
    free(t.ids);

    Shard s;
    shard_open(&s, output);
    int64_t raw_bytes = s.token_count * s.token_bytes;
    printf("tokenized %" PRId64 " documents (%" PRId64 " bytes of text) from %d files into %" PRId64 " tokens\n",
           t.documents, t.text_bytes, input_count, t.tokens);
    printf("wrote %s: %" PRId64 " bytes in %" PRId64 " frames, compression %.2fx over %" PRId64 " bytes of uint%d tokens\n",
           output, s.file_bytes, s.frame_count, (double)raw_bytes / (double)s.file_bytes, raw_bytes, 8 * s.token_bytes);
    shard_close(&s);
    return 0;
}

// ----------------------------------------------------------------------------
// shard info | verify | dump

static void shard_info(const char *path) {
    Shard s;
    shard_open(&s, path);
    int64_t min_len = 0, max_len = 0;
    for (int64_t d = 0; d < s.doc_count; d++) {
        int64_t len = shard_document_length(&s, d);
        if (d == 0 || len < min_len) min_len = len;
        if (len > max_len) max_len = len;
    }
    int64_t compressed = 0;
    for (int64_t i = 0; i < s.frame_count; i++) compressed += s.frames[i].compressed_bytes;
    int64_t raw_bytes = s.token_count * s.token_bytes;
    printf("%s\n", path);
    printf("  version      %d\n", s.version);
    printf("  vocab_size   %" PRId64 "\n", s.vocab_size);
    printf("  token dtype  uint%d\n", 8 * s.token_bytes);
    printf("  documents    %" PRId64 " (tokens per document: min %" PRId64 ", mean %.1f, max %" PRId64 ")\n", s.doc_count,
           min_len, s.doc_count ? (double)s.token_count / (double)s.doc_count : 0.0, max_len);
    printf("  tokens       %" PRId64 "\n", s.token_count);
    printf("  frames       %" PRId64 " of up to %" PRId64 " tokens, %" PRId64 " compressed bytes\n", s.frame_count,
           s.frame_tokens, compressed);
    printf("  file bytes   %" PRId64 "\n", s.file_bytes);
    printf("  compression  %.2fx over %" PRId64 " bytes of raw tokens\n",
           s.file_bytes ? (double)raw_bytes / (double)s.file_bytes : 0.0, raw_bytes);
    shard_close(&s);
}

static void shard_dump(const char *path, int text) {
    Shard s;
    shard_open(&s, path);
    if (text && s.vocab_size != TOKENIZER_BYTES_VOCAB)
        fail("%s: --text decodes byte-tokenizer shards only (expected vocabulary size %d, found %" PRId64 ")", path,
             TOKENIZER_BYTES_VOCAB, s.vocab_size);
    const int64_t chunk = 1 << 16;
    uint32_t *ids = xmalloc((size_t)chunk * sizeof(uint32_t));
    uint8_t *bytes = text ? xmalloc((size_t)chunk * TOKENIZER_BYTES_MAX_PIECE) : NULL;
    for (int64_t d = 0; d < s.doc_count; d++) {
        int64_t start = shard_document_start(&s, d), end = shard_document_start(&s, d + 1);
        for (int64_t pos = start; pos < end; pos += chunk) {
            int64_t n = end - pos < chunk ? end - pos : chunk;
            shard_read_tokens(&s, pos, n, ids);
            if (text) {
                fwrite(bytes, 1, (size_t)tokenizer_bytes_decode(ids, n, bytes), stdout);
                continue;
            }
            for (int64_t i = 0; i < n; i++) printf("%s%" PRIu32, pos + i == start ? "" : " ", ids[i]);
        }
        putchar('\n');
    }
    if (fflush(stdout) != 0 || ferror(stdout)) fail("stdout: write failed (%s)", strerror(errno));
    free(ids);
    free(bytes);
    shard_close(&s);
}

int cmd_shard(int argc, char **argv) {
    if (argc < 1) return usage_error(shard_usage, "shard: which action? (info, verify or dump)");
    const char *action = argv[0];
    if (!strcmp(action, "-h") || !strcmp(action, "--help")) { printf("%s", shard_usage); return 0; }
    int text = 0, file_count = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && !strcmp(action, "dump")) text = 1;
        else if (!strncmp(argv[i], "--", 2)) return usage_error(shard_usage, "shard: unknown option '%s'", argv[i]);
        else argv[1 + file_count++] = argv[i];
    }
    if (!strcmp(action, "verify")) {
        if (file_count < 1) return usage_error(shard_usage, "shard verify: which FILE?");
        for (int i = 0; i < file_count; i++) {
            Shard s;
            shard_open(&s, argv[1 + i]);
            shard_verify(&s);
            shard_close(&s);
            printf("%s: ok\n", argv[1 + i]);
        }
        return 0;
    }
    if (strcmp(action, "info") && strcmp(action, "dump")) return usage_error(shard_usage, "shard: unknown action '%s'", action);
    if (file_count != 1) return usage_error(shard_usage, "shard %s: expected exactly one FILE", action);
    if (!strcmp(action, "info")) shard_info(argv[1]);
    else shard_dump(argv[1], text);
    return 0;
}

// ----------------------------------------------------------------------------
// data RUN.yaml

// A non-negative count for a --flag; on error the usage exit status 2.
static int parse_count(const char *flag, const char *value, int64_t *out) {
    char *end;
    errno = 0;
    *out = strtoll(value, &end, 10);
    if (errno || *end || end == value || *out < 0)
        return usage_error(data_usage, "%s '%s' is not a whole number >= 0", flag, value);
    return 0;
}

// Reads training sequences 0..n-1 (and this rank's slice of each, world 1) and
// prints the rate.
static void data_read(Loader *l, const Config *cfg, int64_t n) {
    PackedSequence seq;
    RankSlice slice;
    packed_sequence_alloc(&seq, cfg->train.seq_len);
    rank_slice_alloc(&slice, cfg->train.seq_len);
    LayoutKind layout = (LayoutKind)layout_parse(cfg->attention.layout);
    double t0 = now_seconds();
    for (int64_t g = 0; g < n; g++) {
        loader_train_sequence(l, g, &seq);
        loader_rank_slice(&seq, layout, cfg->attention.block_size, 1, 0, &slice);
    }
    double s = now_seconds() - t0, tokens = (double)n * cfg->train.seq_len;
    printf("read %" PRId64 " sequences (%.0f tokens) in %.3f s: %.0f tokens/s, %.1f sequences/s\n", n, tokens, s,
           tokens / s, (double)n / s);
    packed_sequence_free(&seq);
    rank_slice_free(&slice);
}

static void data_show(Loader *l, const Config *cfg, int64_t g) {
    PackedSequence seq;
    packed_sequence_alloc(&seq, cfg->train.seq_len);
    loader_train_sequence(l, g, &seq);
    int64_t per_epoch = l->synthetic ? 0 : l->seqs_per_epoch;
    printf("sequence %" PRId64, g);
    if (per_epoch) printf(" (epoch %" PRId64 ", sequence %" PRId64 " of %" PRId64 ")", g / per_epoch, g % per_epoch, per_epoch);
    printf("\ndocument starts:");
    for (int64_t i = 0; i < seq.doc_start_count; i++) printf(" %" PRId64, seq.doc_starts[i]);
    printf("\ntokens (%" PRId64 " inputs + 1 target):", seq.seq_len);
    for (int64_t t = 0; t <= seq.seq_len; t++) printf(" %" PRId32, seq.tokens[t]);
    printf("\n");
    packed_sequence_free(&seq);
}

int cmd_data(int argc, char **argv) {
    if (argc < 1 || !strncmp(argv[0], "-", 1)) {
        if (argc == 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) { printf("%s", data_usage); return 0; }
        return usage_error(data_usage, "data: which RUN.yaml?");
    }
    int64_t read = 0, show = -1;
    char **overrides = argv + 1;  // gathered in place: override_count <= i
    int override_count = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--read") && strcmp(argv[i], "--show")) {
            if (!strncmp(argv[i], "--", 2)) return usage_error(data_usage, "data: unknown option '%s'", argv[i]);
            overrides[override_count++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) return usage_error(data_usage, "%s needs a value", argv[i]);
        int rc = parse_count(argv[i], argv[i + 1], !strcmp(argv[i], "--read") ? &read : &show);
        if (rc) return rc;
        i++;
    }
    Config cfg;
    config_from_args(&cfg, argv[0], override_count, overrides);
    Loader l;
    loader_from_config(&l, &cfg);
    loader_print_summary(&l, stdout);
    if (read > 0) data_read(&l, &cfg, read);
    if (show >= 0) data_show(&l, &cfg, show);
    loader_close(&l);
    return 0;
}
