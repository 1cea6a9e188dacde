// cmd_data.c: the data verbs. `mtrain tokenize` packs text files (.jsonl: the
// "text" field of each line; any other file: one document) into a token
// shard with any tokenizer (data/tokenizer.h); `mtrain shard info|verify|dump`
// inspects, checks and prints one; `mtrain detokenize` turns ids back into
// text; `mtrain data RUN.yaml` shows what the loader makes of a run's data.
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <omp.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "../data/packing.h"
#include "../data/shard.h"
#include "../data/tokenizer.h"
#include "../dist/progress.h"
#include "../dist/util.h"
#include "args.h"
#include "commands.h"
#include "run.h"

static const char *tokenize_usage =
    "usage: mtrain tokenize --tokenizer T --input FILE... --output OUT.shard [--threads N] [--text-field NAME]\n"
    "                       [--frame-tokens N] [--force]\n"
    "  T is bytes, a tokenizer.json (byte-level BPE, e.g. Qwen2.5's) or a model folder holding one.\n"
    "  FILE.jsonl holds one JSON object per line whose \"text\" (or NAME) is a document; any other FILE is one\n"
    "  document of text. Every document ends with <|endoftext|>. --threads N encodes documents on N threads\n"
    "  (default: OMP_NUM_THREADS or every CPU); the shard is the same for any N. An existing OUT.shard is\n"
    "  replaced only with --force. Compressed or binary input is refused.\n";

static const char *data_usage =
    "usage: mtrain data RUN.yaml [--read N] [--show G] [section.key=value ...]\n"
    "  prints the loader's view of data.train / data.val; --read N times reading training sequences 0..N-1;\n"
    "  --show G prints training sequence G as training forms it under data.packing: its document starts and\n"
    "  token ids (balanced: its inputs and targets; the step holds train.micro_batches x parallel.dp sequences,\n"
    "  parallel.dp 0 counting as 1; padded: its inputs and targets, -1 on the padding).\n";

static const char *shard_usage =
    "usage: mtrain shard info FILE          header, frames, documents, tokens, compression\n"
    "       mtrain shard verify FILE...     check every checksum and token; prints FILE: ok\n"
    "       mtrain shard dump FILE [--text [--tokenizer T]]\n"
    "                                       token ids (or text decoded with T, default bytes), one document per line\n";

static const char *detokenize_usage =
    "usage: mtrain detokenize --tokenizer T [FILE]\n"
    "  reads token ids (whole numbers separated by spaces) from FILE or stdin and writes their text;\n"
    "  each line of ids becomes its text (UTF-8; bytes that are not show as U+FFFD) followed by a newline.\n";

// Prints "mtrain: <message>" and the usage; returns the usage exit status 2.
// The whole number in value, into *out when it lies in [lo, hi]; else false.
static bool whole_number(const char *value, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    int64_t n = strtoll(value, &end, 10);
    if (errno || *end || end == value || n < lo || n > hi) return false;
    *out = n;
    return true;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

// ----------------------------------------------------------------------------
// tokenize
//
// The main thread reads documents in order into batches and queues each
// full batch for encoding; threads - 1 workers and the main thread encode
// the queued documents in order (each thread with its own handle on one
// loaded tokenizer: a handle keeps scratch space, the tables and the piece
// cache are shared). Once batch k + 1 is queued, the main thread adds
// batch k's documents to the shard in input order (compressing and writing
// its frames), encoding documents itself while it waits for the last ones,
// then reads batch k + 2 while the workers encode batch k + 1: reading and
// writing overlap the encoding, at most TOKENIZE_QUEUED batches are queued,
// and the shard's bytes are the same for any number of threads. The first bad document in input order fails.

#define TOKENIZE_BATCH_DOCS 4096
#define TOKENIZE_BATCH_BYTES (4 << 20)
#define TOKENIZE_QUEUED 2          // batches queued: the one being written and the next

typedef struct {
    char *raw;                 // the .jsonl line or the whole file (owned)
    int64_t raw_bytes;
    const char *path;
    int64_t line_no;           // its line in a .jsonl file; 0 = the whole file is the document
    TokenIds ids;              // its tokens, <|endoftext|> last
    int64_t text_bytes;        // bytes of its text
    char error[600];           // "" or what is wrong with it (follows "FILE[:LINE]: ")
} TokenizeDoc;

typedef struct {
    TokenizeDoc *docs;         // [TOKENIZE_BATCH_DOCS]
    int64_t count, bytes;
    int64_t encoded;           // documents encoded so far (under Tokenize.lock)
} TokenizeBatch;

typedef struct {
    Tokenizer **tokenizers;    // [threads]: handles on one tokenizer, [0] the main thread's, [i] worker i's
    int threads;
    const char *text_field;    // the field of a .jsonl line that holds the text
    ShardWriter *writer;
    TokenizeBatch ring[TOKENIZE_QUEUED];  // batch k is ring[k % TOKENIZE_QUEUED]
    int64_t written;           // batches added to the shard (main thread only)
    // Under lock: batches 0..queued-1 are queued (batch `queued` is being
    // read), document next_doc of batch next_batch is the next to encode.
    pthread_mutex_t lock;
    pthread_cond_t work;       // workers wait here for queued documents or stop
    pthread_cond_t encoded;    // the main thread waits here for a batch's last documents
    int64_t queued, next_batch, next_doc;
    bool stop;
    int64_t documents, text_bytes, tokens;
    Progress progress;         // over the bytes of the input files
} Tokenize;

typedef struct {
    Tokenize *t;
    Tokenizer *tokenizer;
    pthread_t thread;
} TokenizeWorker;

// Why data[0..n) is not text: the magic number of a compressed or binary
// format, or a NUL byte (never in text); NULL when it may be text.
static const char *binary_reason(const uint8_t *data, size_t n) {
    static const struct { const char *magic; size_t len; const char *what; } formats[] = {
        {"\x1f\x8b", 2, "a gzip file"}, {"\x28\xb5\x2f\xfd", 4, "a zstd file"}, {"BZh", 3, "a bzip2 file"},
        {"\xfd" "7zXZ", 6, "an xz file"}, {"PK\x03\x04", 4, "a zip file"}, {"PAR1", 4, "a parquet file"}};
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
        if (n >= formats[i].len && !memcmp(data, formats[i].magic, formats[i].len)) return formats[i].what;
    return memchr(data, 0, n) ? "binary (it holds NUL bytes)" : NULL;
}

// Refuses an input that is not text, from its first 64 KiB, before any work.
static void check_text_file(const char *path) {
    FILE *f = xfopen(path, "rb");
    uint8_t head[1 << 16];
    size_t n = fread(head, 1, sizeof(head), f);
    if (ferror(f)) fail("%s: read failed (%s)", path, strerror(errno));
    fclose(f);
    const char *why = binary_reason(head, n);
    if (why)
        fail("%s: %s, not text (expected UTF-8 text or .jsonl lines; decompress or convert it first, e.g. "
             "docs/RECIPE.md's parquet to .jsonl)", path, why);
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

// Encodes one document with tok (a .jsonl line: its text field first) and
// appends <|endoftext|>; a problem goes to d->error.
static void encode_document(const Tokenize *t, Tokenizer *tok, TokenizeDoc *d) {
    cJSON *obj = NULL;
    const char *text = d->raw;
    int64_t bytes = d->raw_bytes;
    if (d->line_no > 0) {
        obj = cJSON_ParseWithLength(d->raw, (size_t)d->raw_bytes);
        const cJSON *field = obj ? cJSON_GetObjectItemCaseSensitive(obj, t->text_field) : NULL;
        char problem[120] = "";
        if (!obj) snprintf(problem, sizeof(problem), "invalid JSON");
        else if (!cJSON_IsObject(obj)) snprintf(problem, sizeof(problem), "not a JSON object");
        else if (!cJSON_IsString(field)) snprintf(problem, sizeof(problem), "no string field \"%.80s\"", t->text_field);
        else if (has_nul_escape(d->raw, (size_t)d->raw_bytes))
            snprintf(problem, sizeof(problem), "a \\u0000 (NUL) escape is not supported");
        if (problem[0]) {
            snprintf(d->error, sizeof(d->error), "%s (expected one JSON object per line with a string field \"%.80s\")",
                     problem, t->text_field);
            cJSON_Delete(obj);
            return;
        }
        text = field->valuestring;
        bytes = (int64_t)strlen(text);
    }
    int64_t bad_at = tok->encode(tok, (const uint8_t *)text, bytes, &d->ids);
    cJSON_Delete(obj);
    if (bad_at >= 0) {
        snprintf(d->error, sizeof(d->error), "byte %" PRId64 " of the text is not valid UTF-8 (expected UTF-8 text: "
                 "tokenizer %s needs it)", bad_at, tok->name);
        return;
    }
    token_ids_reserve(&d->ids, 1);
    d->ids.ids[d->ids.count++] = (uint32_t)tok->end_of_text;
    d->text_bytes = bytes;
}

// Encodes the next queued document with tok, if there is one; called and
// returns under t->lock, which it releases while encoding. Returns whether
// there was one.
static bool encode_next(Tokenize *t, Tokenizer *tok) {
    if (t->next_batch == t->queued) return false;
    TokenizeBatch *b = &t->ring[t->next_batch % TOKENIZE_QUEUED];
    TokenizeDoc *d = &b->docs[t->next_doc];
    if (++t->next_doc == b->count) {
        t->next_batch++;
        t->next_doc = 0;
    }
    pthread_mutex_unlock(&t->lock);
    encode_document(t, tok, d);
    pthread_mutex_lock(&t->lock);
    if (++b->encoded == b->count) pthread_cond_signal(&t->encoded);
    return true;
}

// A worker thread: encodes queued documents until told to stop.
static void *tokenize_worker(void *arg) {
    TokenizeWorker *w = arg;
    Tokenize *t = w->t;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        if (encode_next(t, w->tokenizer)) continue;
        if (t->stop) break;
        pthread_cond_wait(&t->work, &t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

// Adds the oldest queued batch's documents to the shard in order, encoding
// queued documents on the main thread until the batch is encoded.
static void write_batch(Tokenize *t) {
    TokenizeBatch *b = &t->ring[t->written % TOKENIZE_QUEUED];
    pthread_mutex_lock(&t->lock);
    while (b->encoded < b->count)
        if (!encode_next(t, t->tokenizers[0])) pthread_cond_wait(&t->encoded, &t->lock);
    pthread_mutex_unlock(&t->lock);
    for (int64_t i = 0; i < b->count; i++) {
        TokenizeDoc *d = &b->docs[i];
        if (d->error[0]) {
            shard_writer_abort(t->writer);
            if (d->line_no > 0) fail("%s:%" PRId64 ": %s", d->path, d->line_no, d->error);
            fail("%s: %s", d->path, d->error);
        }
        shard_writer_add_document(t->writer, d->ids.ids, d->ids.count);
        t->documents++;
        t->text_bytes += d->text_bytes;
        t->tokens += d->ids.count;
        progress_add(&t->progress, d->raw_bytes);
        free(d->raw);
        free(d->ids.ids);
    }
    b->count = b->bytes = b->encoded = 0;
    t->written++;
}

// Queues the batch being read for encoding; writes the oldest batch when
// TOKENIZE_QUEUED are queued, so that the next batch's slot is free.
static void queue_batch(Tokenize *t) {
    pthread_mutex_lock(&t->lock);
    t->queued++;
    pthread_cond_broadcast(&t->work);
    pthread_mutex_unlock(&t->lock);
    if (t->queued - t->written == TOKENIZE_QUEUED) write_batch(t);
}

// Queues the last batch and writes every queued one: afterwards every
// document read so far is in the shard (or its problem has failed).
static void write_queued(Tokenize *t) {
    if (t->ring[t->queued % TOKENIZE_QUEUED].count) queue_batch(t);
    while (t->written < t->queued) write_batch(t);
}

// Queues one document (raw: owned from here on); a full batch is queued.
static void queue_document(Tokenize *t, char *raw, int64_t bytes, const char *path, int64_t line_no) {
    TokenizeBatch *b = &t->ring[t->queued % TOKENIZE_QUEUED];
    b->docs[b->count++] = (TokenizeDoc){.raw = raw, .raw_bytes = bytes, .path = path, .line_no = line_no};
    b->bytes += bytes;
    if (b->count == TOKENIZE_BATCH_DOCS || b->bytes >= TOKENIZE_BATCH_BYTES) queue_batch(t);
}

// Before failing on a problem found while reading: the documents read
// before it are written first (a bad one fails first: input order), then the
// shard is abandoned.
static void abort_after_queued(Tokenize *t) {
    write_queued(t);
    shard_writer_abort(t->writer);
}

// Starts the worker threads: w[i] encodes with tokenizer i (1..threads-1).
static TokenizeWorker *start_workers(Tokenize *t) {
    CHECK(!pthread_mutex_init(&t->lock, NULL) && !pthread_cond_init(&t->work, NULL) &&
          !pthread_cond_init(&t->encoded, NULL), "tokenize: cannot create the threads' lock");
    TokenizeWorker *w = xcalloc((size_t)t->threads, sizeof(TokenizeWorker));
    for (int i = 1; i < t->threads; i++) {
        w[i] = (TokenizeWorker){.t = t, .tokenizer = t->tokenizers[i]};
        int rc = pthread_create(&w[i].thread, NULL, tokenize_worker, &w[i]);
        if (rc) fail("tokenize: cannot start thread %d of %d (%s)", i + 1, t->threads, strerror(rc));
    }
    return w;
}

// Stops the worker threads (once nothing is queued).
static void stop_workers(Tokenize *t, TokenizeWorker *w) {
    pthread_mutex_lock(&t->lock);
    t->stop = true;
    pthread_cond_broadcast(&t->work);
    pthread_mutex_unlock(&t->lock);
    for (int i = 1; i < t->threads; i++) {
        int rc = pthread_join(w[i].thread, NULL);
        if (rc) fail("tokenize: cannot join thread %d of %d (%s)", i + 1, t->threads, strerror(rc));
    }
    free(w);
    pthread_cond_destroy(&t->encoded);
    pthread_cond_destroy(&t->work);
    pthread_mutex_destroy(&t->lock);
}

static void add_jsonl(Tokenize *t, const char *path) {
    FILE *f = xfopen(path, "rb");
    for (int64_t line_no = 1;; line_no++) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len = getline(&line, &cap, f);
        if (len < 0) {
            free(line);
            break;
        }
        if (strspn(line, " \t\r\n") == (size_t)len) {  // blank line
            free(line);
            progress_add(&t->progress, (int64_t)len);
            continue;
        }
        queue_document(t, line, (int64_t)len, path, line_no);
    }
    if (ferror(f)) {
        abort_after_queued(t);
        fail("%s: read failed (%s)", path, strerror(errno));
    }
    fclose(f);
}

// A whole file as one document.
static void add_file(Tokenize *t, const char *path) {
    size_t bytes;
    char *text = read_file(path, &bytes);
    const char *nul = memchr(text, 0, bytes);
    if (nul) {
        abort_after_queued(t);
        fail("%s: byte %td is NUL: binary, not text (expected UTF-8 text)", path, nul - text);
    }
    queue_document(t, text, (int64_t)bytes, path, 0);
}

// Opens the tokenizer once and gives each thread a handle on it.
static void open_tokenizers(Tokenize *t, const char *spec) {
    t->tokenizers = xcalloc((size_t)t->threads, sizeof(Tokenizer *));
    t->tokenizers[0] = tokenizer_open(spec);
    if (t->tokenizers[0]->end_of_text < 0)
        fail("%s: has no <|endoftext|> token (expected one: it ends every document)", t->tokenizers[0]->name);
    for (int i = 1; i < t->threads; i++) t->tokenizers[i] = t->tokenizers[0]->share(t->tokenizers[0]);
}

int cmd_tokenize(int argc, char **argv) {
    if (args_help(argc, argv)) { printf("%s", tokenize_usage); return 0; }
    const char *tokenizer = NULL, *output = NULL, *text_field = "text", *frames_text = NULL, *threads_text = NULL;
    bool force = false;
    ArgList input_list = {(const char **)argv, 0};  // gathered in place: nothing is kept
    const ArgOption options[] = {{"--tokenizer", ARG_VALUE, &tokenizer}, {"--input", ARG_LIST, &input_list},
                                 {"--output", ARG_VALUE, &output}, {"--threads", ARG_VALUE, &threads_text},
                                 {"--text-field", ARG_VALUE, &text_field}, {"--frame-tokens", ARG_VALUE, &frames_text},
                                 {"--force", ARG_FLAG, &force}};
    ArgsResult args = args_parse(options, (int)(sizeof(options) / sizeof(options[0])), argc, argv, 0);
    if (args.missing && !strcmp(args.missing, "--input"))
        return args_usage_error(tokenize_usage, "--input needs at least one file");
    if (args_refused(args, tokenize_usage)) return 2;
    if (args.rest < argc) return args_usage_error(tokenize_usage, "tokenize: unknown argument '%s'", argv[args.rest]);
    int64_t frame_tokens = 0, threads = 0;
    if (frames_text && !whole_number(frames_text, 1, SHARD_MAX_FRAME_TOKENS, &frame_tokens))
        return args_usage_error(tokenize_usage, "--frame-tokens '%s' is not a whole number in 1 .. %" PRId64, frames_text,
                           (int64_t)SHARD_MAX_FRAME_TOKENS);
    if (threads_text && !whole_number(threads_text, 1, 1024, &threads))
        return args_usage_error(tokenize_usage, "--threads '%s' is not a whole number in 1 .. 1024", threads_text);
    const char **inputs = input_list.values;
    const int input_count = input_list.count;
    const char *missing = !tokenizer ? "--tokenizer" : !input_count ? "--input" : !output ? "--output" : NULL;
    if (missing) return args_usage_error(tokenize_usage, "tokenize: %s is required", missing);
    for (int i = 0; i < input_count; i++) check_text_file(inputs[i]);  // a missing or binary input fails before any work
    for (int i = 0; i < input_count; i++)
        if (same_file(inputs[i], output))
            fail("%s: --output is the --input %s (expected another file: the input would be overwritten)", output,
                 inputs[i]);
    if (!force && access(output, F_OK) == 0)
        fail("%s: already exists (expected a new file; --force replaces it)", output);

    Tokenize t = {.threads = threads ? (int)threads : omp_get_max_threads(), .text_field = text_field};
    open_tokenizers(&t, tokenizer);
    const Tokenizer *tok = t.tokenizers[0];
    char *output_dir = xstrdup(output);
    char *slash = strrchr(output_dir, '/');
    if (slash && slash != output_dir) {
        *slash = 0;
        make_dirs(output_dir);
    }
    free(output_dir);
    t.writer = shard_writer_open(output, tok->vocab_size, 0, frame_tokens);
    shard_writer_set_tokenizer(t.writer, shard_tokenizer_of(tok->name));
    for (int i = 0; i < TOKENIZE_QUEUED; i++) t.ring[i].docs = xmalloc(sizeof(TokenizeDoc) * TOKENIZE_BATCH_DOCS);
    int64_t input_bytes = 0;
    for (int i = 0; i < input_count; i++) {
        struct stat st;
        if (stat(inputs[i], &st) != 0) fail("%s: cannot stat (%s)", inputs[i], strerror(errno));
        input_bytes += (int64_t)st.st_size;
    }
    progress_begin(&t.progress, "tokenizing", input_bytes, "MB", 1e6);
    double start = now_seconds();
    TokenizeWorker *workers = start_workers(&t);
    for (int i = 0; i < input_count; i++) {
        if (ends_with(inputs[i], ".jsonl")) add_jsonl(&t, inputs[i]);
        else add_file(&t, inputs[i]);
    }
    write_queued(&t);
    stop_workers(&t, workers);
    progress_end(&t.progress);
    shard_writer_close(t.writer);
    double seconds = now_seconds() - start;
    for (int i = 0; i < TOKENIZE_QUEUED; i++) free(t.ring[i].docs);
    for (int i = 0; i < t.threads; i++) tokenizer_close(t.tokenizers[i]);
    free(t.tokenizers);

    Shard s;
    shard_open(&s, output);
    int64_t raw_bytes = s.token_count * s.token_bytes;
    printf("tokenized %" PRId64 " documents (%" PRId64 " bytes of text) from %d files into %" PRId64 " tokens in %.3f s "
           "(%.2f MB/s of text, %d thread%s)\n", t.documents, t.text_bytes, input_count, t.tokens, seconds,
           (double)t.text_bytes / 1e6 / (seconds > 0 ? seconds : 1e-9), t.threads, t.threads == 1 ? "" : "s");
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
    char tokenizer[64];
    shard_tokenizer_describe(s.tokenizer, tokenizer, sizeof(tokenizer));
    printf("  version      %d\n", s.version);
    printf("  tokenizer    %s\n", tokenizer);
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

static void flush_stdout(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) fail("stdout: write failed (%s)", strerror(errno));
}

// Prints every document as its ids, or (with a tokenizer) as its text.
static void shard_dump(const char *path, Tokenizer *tokenizer) {
    Shard s;
    shard_open(&s, path);
    if (tokenizer && s.vocab_size != tokenizer->vocab_size)
        fail("%s: vocabulary size %" PRId64 " does not match tokenizer %s (expected %" PRId64 "; pass the tokenizer that "
             "made the shard with --tokenizer)", path, s.vocab_size, tokenizer->name, tokenizer->vocab_size);
    const int64_t chunk = 1 << 16;
    uint32_t *ids = xmalloc((size_t)chunk * sizeof(uint32_t));
    for (int64_t d = 0; d < s.doc_count; d++) {
        TextDecoder text = {0};
        int64_t start = shard_document_start(&s, d), end = shard_document_start(&s, d + 1);
        for (int64_t pos = start; pos < end; pos += chunk) {
            int64_t n = end - pos < chunk ? end - pos : chunk;
            shard_read_tokens(&s, pos, n, ids);
            if (!tokenizer) {
                for (int64_t i = 0; i < n; i++) printf("%s%" PRIu32, pos + i == start ? "" : " ", ids[i]);
                continue;
            }
            int64_t bad = tokenizer_write(tokenizer, &text, ids, n, stdout);
            if (bad >= 0)
                fail("%s: token %" PRId64 " has id %" PRIu32 ", which tokenizer %s does not have (expected an id of its "
                     "vocabulary)", path, pos + bad, ids[bad], tokenizer->name);
        }
        if (tokenizer) text_decoder_finish(&text, stdout);
        putchar('\n');
    }
    flush_stdout();
    free(ids);
    shard_close(&s);
}

int cmd_shard(int argc, char **argv) {
    if (argc < 1) return args_usage_error(shard_usage, "shard: which action? (info, verify or dump)");
    if (args_help(argc, argv)) { printf("%s", shard_usage); return 0; }
    const char *action = argv[0];
    char **files = argv + 1;
    bool text = false;
    const char *tokenizer = NULL;
    const ArgOption dump_options[] = {{"--text", ARG_FLAG, &text}, {"--tokenizer", ARG_VALUE, &tokenizer}};
    // --text and --tokenizer are dump's; every other "--" argument is unknown.
    const int option_count = strcmp(action, "dump") ? 0 : (int)(sizeof(dump_options) / sizeof(dump_options[0]));
    ArgsResult args = args_parse(dump_options, option_count, argc - 1, files, argc);
    if (args_refused(args, shard_usage)) return 2;
    const int file_count = args.kept;
    if (tokenizer && !text) return args_usage_error(shard_usage, "shard dump: --tokenizer decodes text: it needs --text");
    if (!strcmp(action, "verify")) {
        if (file_count < 1) return args_usage_error(shard_usage, "shard verify: which FILE?");
        for (int i = 0; i < file_count; i++) {
            Shard s;
            shard_open(&s, files[i]);
            shard_verify(&s);
            shard_close(&s);
            printf("%s: ok\n", files[i]);
        }
        return 0;
    }
    if (strcmp(action, "info") && strcmp(action, "dump")) return args_usage_error(shard_usage, "shard: unknown action '%s'", action);
    if (file_count != 1) return args_usage_error(shard_usage, "shard %s: expected exactly one FILE", action);
    if (!strcmp(action, "info")) {
        shard_info(files[0]);
        return 0;
    }
    Tokenizer *t = text ? tokenizer_open(tokenizer ? tokenizer : "bytes") : NULL;
    shard_dump(files[0], t);
    tokenizer_close(t);
    return 0;
}

// ----------------------------------------------------------------------------
// detokenize

int cmd_detokenize(int argc, char **argv) {
    if (args_help(argc, argv)) { printf("%s", detokenize_usage); return 0; }
    const char *tokenizer = NULL;
    const ArgOption options[] = {{"--tokenizer", ARG_VALUE, &tokenizer}};
    ArgsResult args = args_parse(options, 1, argc, argv, 1);
    if (args_refused(args, detokenize_usage)) return 2;
    if (args.rest < argc)
        return args_usage_error(detokenize_usage, "detokenize: unexpected argument '%s'", argv[args.rest]);
    const char *input = args.kept ? argv[0] : NULL;
    if (!tokenizer) return args_usage_error(detokenize_usage, "detokenize: --tokenizer is required");
    Tokenizer *t = tokenizer_open(tokenizer);
    FILE *f = input ? xfopen(input, "rb") : stdin;
    const char *name = input ? input : "stdin";
    TokenIds ids = {0};
    char *line = NULL;
    size_t cap = 0;
    for (int64_t line_no = 1; getline(&line, &cap, f) >= 0; line_no++) {
        ids.count = 0;
        for (char *p = line + strspn(line, " \t\r\n"); *p; p += strspn(p, " \t\r\n")) {
            char *end;
            errno = 0;
            unsigned long long id = strtoull(p, &end, 10);
            if (errno || end == p || *p == '-' || !strchr(" \t\r\n", *end) || id >= (unsigned long long)t->vocab_size)
                fail("%s:%" PRId64 ": '%.*s' is not a token id of %s (expected whole numbers below %" PRId64
                     " separated by spaces)", name, line_no, (int)strcspn(p, " \t\r\n"), p, t->name, t->vocab_size);
            token_ids_reserve(&ids, 1);
            ids.ids[ids.count++] = (uint32_t)id;
            p = end;
        }
        TextDecoder text = {0};
        int64_t bad = tokenizer_write(t, &text, ids.ids, ids.count, stdout);
        if (bad >= 0)
            fail("%s:%" PRId64 ": token id %" PRIu32 " is not in the vocabulary of %s (expected an id it has)", name,
                 line_no, ids.ids[bad], t->name);
        text_decoder_finish(&text, stdout);
        putchar('\n');
    }
    if (ferror(f)) fail("%s: read failed (%s)", name, strerror(errno));
    if (input) fclose(f);
    flush_stdout();
    free(line);
    free(ids.ids);
    tokenizer_close(t);
    return 0;
}

// ----------------------------------------------------------------------------
// data RUN.yaml

// Reads training sequences 0..n-1 (and this rank's slice of each, world 1) and
// prints the rate.
static void data_read(Loader *l, const Config *cfg, int64_t n) {
    PackedSequence seq;
    RankSlice slice;
    packed_sequence_alloc(&seq, cfg->train.seq_len);
    rank_slice_alloc(&slice, cfg->train.seq_len);
    LayoutKind layout = cfg->attention.layout;
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

// Training sequence g as training forms it: sequential and padded packing
// read it (padded: targets -1 on the padding); balanced packing reads its step (train.micro_batches x parallel.dp
// sequences, 1 dp rank when parallel.dp is 0) and deals it (data/packing.h).
static void data_show(Loader *l, const Config *cfg, int64_t g) {
    PackedSequence seq;
    packed_sequence_alloc(&seq, cfg->train.seq_len);
    const bool balanced = cfg->data.packing == PACKING_BALANCED;
    printf("sequence %" PRId64, g);
    if (balanced) {
        const int dp = cfg->parallel.dp > 0 ? cfg->parallel.dp : 1;
        const int64_t count = (int64_t)cfg->train.micro_batches * dp, cursor = g / count * count;
        PackedStep step;
        packed_step_alloc(&step, cfg->train.seq_len, cfg->train.micro_batches, dp);
        packed_step_read(l, cursor, &step);
        packed_step_sequence(&step, (int)(g - cursor), &seq);
        packed_step_free(&step);
        printf(" (balanced packing: sequence %" PRId64 " of the step of sequences %" PRId64 "..%" PRId64
               ", micro-batch %" PRId64 " on dp rank %" PRId64 " of %d)", g - cursor, cursor, cursor + count - 1,
               (g - cursor) / dp, (g - cursor) % dp, dp);
    } else {
        loader_train_sequence(l, g, &seq);
        int64_t per_epoch = l->cfg.synthetic ? 0 : l->seqs_per_epoch;
        if (per_epoch)
            printf(" (epoch %" PRId64 ", sequence %" PRId64 " of %" PRId64 ")", g / per_epoch, g % per_epoch,
                   per_epoch);
    }
    printf("\ndocument starts:");
    for (int64_t i = 0; i < seq.doc_start_count; i++) printf(" %" PRId64, seq.doc_starts[i]);
    if (cfg->data.packing != PACKING_SEQUENTIAL) {
        printf("\ninputs (%" PRId64 "):", seq.seq_len);
        for (int64_t t = 0; t < seq.seq_len; t++) printf(" %" PRId32, seq.tokens[t]);
        printf("\ntargets (%" PRId64 "):", seq.seq_len);
        for (int64_t t = 0; t < seq.seq_len; t++) printf(" %" PRId32, seq.targets[t]);
    } else {
        printf("\ntokens (%" PRId64 " inputs + 1 target):", seq.seq_len);
        for (int64_t t = 0; t <= seq.seq_len; t++) printf(" %" PRId32, seq.tokens[t]);
    }
    printf("\n");
    packed_sequence_free(&seq);
}

int cmd_data(int argc, char **argv) {
    if (args_help(argc, argv)) { printf("%s", data_usage); return 0; }
    if (argc < 1 || argv[0][0] == '-') return args_usage_error(data_usage, "data: which RUN.yaml?");
    const char *read_text = NULL, *show_text = NULL;
    const ArgOption options[] = {{"--read", ARG_VALUE, &read_text}, {"--show", ARG_VALUE, &show_text}};
    char **overrides = argv + 1;
    ArgsResult args = args_parse(options, 2, argc - 1, overrides, argc);
    if (args_refused(args, data_usage)) return 2;
    int64_t read = 0, show = -1;
    if (read_text && !whole_number(read_text, 0, INT64_MAX, &read))
        return args_usage_error(data_usage, "--read '%s' is not a whole number >= 0", read_text);
    if (show_text && !whole_number(show_text, 0, INT64_MAX, &show))
        return args_usage_error(data_usage, "--show '%s' is not a whole number >= 0", show_text);
    Config cfg;
    config_from_args(&cfg, argv[0], args.kept, overrides, false);
    Loader l;
    loader_from_config(&l, &cfg, cfg.log.val_every > 0);
    loader_print_summary(&l, stdout);
    if (read > 0) data_read(&l, &cfg, read);
    if (show >= 0) data_show(&l, &cfg, show);
    loader_close(&l);
    return 0;
}
