// test_shard.c: the token shard writer and reader. Round trips of random
// documents (both token widths, many small frames), random seeks, the document
// table, and every kind of bad input, each run in a fork()ed child whose
// one-line error message is checked.
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../../data/shard.h"
#include "../../dist/util.h"
#include "../lib/check.h"

static char dir[] = "/tmp/test_shard.XXXXXX";

static char *tmp_path(const char *name) {
    static char paths[64][256];
    static int next = 0;
    char *p = paths[next++ % 64];
    snprintf(p, sizeof(paths[0]), "%s/%s", dir, name);
    return p;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint8_t *load(const char *path, size_t *bytes) { return (uint8_t *)read_file(path, bytes); }

static void save(const char *path, const uint8_t *data, size_t bytes) {
    FILE *f = xfopen(path, "wb");
    xfwrite(data, bytes, f, path);
    fclose(f);
}

// Recomputes the header checksum (docs/FORMATS.md: bytes 120..127, XXH64 of
// the header with that field zeroed) after a test has patched the header.
static void reseal_header(uint8_t *data) {
    put_u64(data + 120, 0);
    put_u64(data + 120, XXH64(data, SHARD_HEADER_BYTES, 0));
}

static int tmp_files_left(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

// A corpus of random documents and its concatenation.
typedef struct {
    int64_t doc_count, token_count;
    int64_t *starts;   // doc_count + 1
    uint32_t *tokens;
} Corpus;

static Corpus make_corpus(Rng *rng, int64_t doc_count, int64_t vocab, int64_t long_doc) {
    Corpus c = {.doc_count = doc_count};
    c.starts = xmalloc((size_t)(doc_count + 1) * sizeof(int64_t));
    int64_t *lengths = xmalloc((size_t)(doc_count ? doc_count : 1) * sizeof(int64_t));
    for (int64_t d = 0; d < doc_count; d++) {
        uint64_t kind = rng_below(rng, 10);
        lengths[d] = kind == 0 ? 0 : kind == 1 ? 1 : (int64_t)rng_below(rng, 300);
        if (d == doc_count / 2) lengths[d] = long_doc;
        c.starts[d] = c.token_count;
        c.token_count += lengths[d];
    }
    c.starts[doc_count] = c.token_count;
    c.tokens = xmalloc((size_t)(c.token_count ? c.token_count : 1) * sizeof(uint32_t));
    for (int64_t i = 0; i < c.token_count; i++) c.tokens[i] = (uint32_t)rng_below(rng, (uint64_t)vocab);
    if (c.token_count) c.tokens[c.token_count - 1] = (uint32_t)(vocab - 1);  // the largest id survives
    free(lengths);
    return c;
}

static void write_corpus(const char *path, const Corpus *c, int64_t vocab, int token_bytes, int64_t frame_tokens) {
    ShardWriter *w = shard_writer_open(path, vocab, token_bytes, frame_tokens);
    for (int64_t d = 0; d < c->doc_count; d++)
        shard_writer_add_document(w, c->tokens + c->starts[d], c->starts[d + 1] - c->starts[d]);
    shard_writer_close(w);
}

static void free_corpus(Corpus *c) {
    free(c->starts);
    free(c->tokens);
}

static void test_round_trip(const char *name, int64_t vocab, int token_bytes, int expect_bytes, int64_t frame_tokens,
                            int64_t doc_count, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    Corpus c = make_corpus(&rng, doc_count, vocab, frame_tokens < 1000 ? 5 * frame_tokens + 3 : 5000);
    char file[64];
    snprintf(file, sizeof(file), "round_trip_%" PRIu64 ".shard", seed);
    const char *path = tmp_path(file);
    write_corpus(path, &c, vocab, token_bytes, frame_tokens);
    EXPECT(tmp_files_left() == 0, "%s: no temporary file left", name);

    Shard s;
    shard_open(&s, path);
    int64_t want_frames = (c.token_count + frame_tokens - 1) / frame_tokens;
    EXPECT(s.version == SHARD_VERSION && s.vocab_size == vocab && s.token_bytes == expect_bytes,
           "%s: header (version %d, vocab %" PRId64 ", %d-byte tokens)", name, s.version, s.vocab_size, s.token_bytes);
    EXPECT(s.doc_count == doc_count && s.token_count == c.token_count && s.frame_tokens == frame_tokens &&
               s.frame_count == want_frames,
           "%s: counts (%" PRId64 " documents, %" PRId64 " tokens, %" PRId64 " frames)", name, s.doc_count, s.token_count,
           s.frame_count);

    int doc_ok = 1;
    for (int64_t d = 0; d <= doc_count; d++) doc_ok &= shard_document_start(&s, d) == c.starts[d];
    for (int64_t d = 0; d < doc_count; d++) doc_ok &= shard_document_length(&s, d) == c.starts[d + 1] - c.starts[d];
    EXPECT(doc_ok, "%s: document table", name);

    uint32_t *got = xmalloc((size_t)(c.token_count + 1) * sizeof(uint32_t));
    shard_read_tokens(&s, 0, c.token_count, got);
    EXPECT(!memcmp(got, c.tokens, (size_t)c.token_count * sizeof(uint32_t)), "%s: all %" PRId64 " tokens read back", name,
           c.token_count);

    int seeks_ok = 1;
    for (int k = 0; k < 2000; k++) {
        int64_t start = (int64_t)rng_below(&rng, (uint64_t)c.token_count + 1);
        int64_t room = c.token_count - start, span = 3 * frame_tokens < room ? 3 * frame_tokens : room;
        int64_t count = (int64_t)rng_below(&rng, (uint64_t)span + 1);
        shard_read_tokens(&s, start, count, got);
        seeks_ok &= !memcmp(got, c.tokens + start, (size_t)count * sizeof(uint32_t));
    }
    EXPECT(seeks_ok, "%s: 2000 random token ranges", name);

    int docs_ok = 1;
    for (int64_t d = doc_count - 1; d >= 0; d--) {
        int64_t start = shard_document_start(&s, d), len = shard_document_length(&s, d);
        shard_read_tokens(&s, start, len, got);
        docs_ok &= !memcmp(got, c.tokens + c.starts[d], (size_t)len * sizeof(uint32_t));
    }
    EXPECT(docs_ok, "%s: every document read back (in reverse order)", name);

    // verify decodes every frame in order, leaving the last one decoded
    shard_verify(&s);
    int64_t last = s.frame_count - 1;
    EXPECT(s.cached_frame == last && !memcmp(s.decoded, c.tokens + last * frame_tokens,
                                             (size_t)(s.token_count - last * frame_tokens) * sizeof(uint32_t)),
           "%s: verify decodes every frame (the last, %" PRId64 ", left decoded)", name, last);
    shard_close(&s);
    free(got);
    free_corpus(&c);
}

static void test_empty_shard(void) {
    const char *path = tmp_path("empty.shard");
    shard_writer_close(shard_writer_open(path, 258, 0, 0));
    Shard s;
    shard_open(&s, path);
    EXPECT(s.doc_count == 0 && s.token_count == 0 && s.frame_count == 0 && s.frame_tokens == SHARD_DEFAULT_FRAME_TOKENS &&
               shard_document_start(&s, 0) == 0,
           "empty shard: no documents, tokens or frames");
    shard_verify(&s);
    shard_read_tokens(&s, 0, 0, NULL);
    EXPECT(s.cached_frame == -1, "empty shard: verify and an empty read decode no frame");
    shard_close(&s);

    const char *path2 = tmp_path("empty_docs.shard");
    ShardWriter *w = shard_writer_open(path2, 258, 0, 4);
    for (int i = 0; i < 3; i++) shard_writer_add_document(w, NULL, 0);
    shard_writer_close(w);
    shard_open(&s, path2);
    EXPECT(s.doc_count == 3 && s.token_count == 0 && shard_document_length(&s, 2) == 0, "three empty documents");
    shard_close(&s);

    const char *path3 = tmp_path("tokenizer.shard");
    w = shard_writer_open(path3, 258, 0, 4);
    shard_writer_set_tokenizer(w, (ShardTokenizer){SHARD_TOKENIZER_JSON, 0xfedcba9876543210ULL});
    shard_writer_close(w);
    shard_open(&s, path3);
    char text[64];
    shard_tokenizer_describe(s.tokenizer, text, sizeof(text));
    EXPECT(s.version == SHARD_VERSION && s.tokenizer.kind == SHARD_TOKENIZER_JSON &&
               !strcmp(text, "tokenizer.json xxh64 fedcba9876543210"),
           "the tokenizer identity round-trips (%s)", text);
    shard_close(&s);
}

static void test_dtype_choice(void) {
    struct { int64_t vocab; int asked, expect; } cases[] = {{258, 0, 2}, {65536, 0, 2}, {65537, 0, 4}, {258, 4, 4}, {151936, 0, 4}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *path = tmp_path("dtype.shard");
        ShardWriter *w = shard_writer_open(path, cases[i].vocab, cases[i].asked, 0);
        uint32_t ids[2] = {0, (uint32_t)(cases[i].vocab - 1)};
        shard_writer_add_document(w, ids, 2);
        shard_writer_close(w);
        Shard s;
        shard_open(&s, path);
        uint32_t got[2];
        shard_read_tokens(&s, 0, 2, got);
        EXPECT(s.token_bytes == cases[i].expect && got[1] == ids[1], "vocab %" PRId64 ", asked %d bytes: stored as %d bytes",
               cases[i].vocab, cases[i].asked, s.token_bytes);
        shard_close(&s);
    }
}

// ----------------------------------------------------------------------------
// Bad input: each case runs in a child; it must exit non-zero with one line on
// stderr naming the file and the problem.

typedef struct {
    const char *path;
    int64_t start, count;
} Job;

static void job_open(const Job *j) { Shard s; shard_open(&s, j->path); shard_close(&s); }
static void job_verify(const Job *j) { Shard s; shard_open(&s, j->path); shard_verify(&s); shard_close(&s); }
static void job_read(const Job *j) {
    Shard s;
    shard_open(&s, j->path);
    uint32_t *dst = xmalloc((size_t)(j->count + 1) * sizeof(uint32_t));
    shard_read_tokens(&s, j->start, j->count, dst);
    free(dst);
    shard_close(&s);
}
static void job_write_bad_token(const Job *j) {
    ShardWriter *w = shard_writer_open(j->path, 1000, 0, 8);
    uint32_t good[20] = {0}, bad[3] = {1, 2, 1000};
    shard_writer_add_document(w, good, 20);
    shard_writer_add_document(w, bad, 3);
    shard_writer_close(w);
}

static void expect_failure(const char *name, void (*job)(const Job *), Job j, const char *problem) {
    int pipe_fd[2];
    if (pipe(pipe_fd) != 0) FAIL("pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) FAIL("fork failed");
    if (pid == 0) {
        close(pipe_fd[0]);
        dup2(pipe_fd[1], 2);
        job(&j);
        _exit(0);
    }
    close(pipe_fd[1]);
    char err[4096];
    size_t n = 0;
    for (ssize_t r; n < sizeof(err) - 1 && (r = read(pipe_fd[0], err + n, sizeof(err) - 1 - n)) > 0;) n += (size_t)r;
    err[n] = 0;
    close(pipe_fd[0]);
    int status;
    waitpid(pid, &status, 0);
    int failed = WIFEXITED(status) && WEXITSTATUS(status) != 0;
    char *newline = strchr(err, '\n');
    int one_line = newline && newline[1] == 0 && !strncmp(err, "mtrain: ", 8);
    int names = strstr(err, j.path) && strstr(err, problem);
    EXPECT(failed && one_line && names, "%s: fails with \"%s\"", name, problem);
    if (!(failed && one_line && names)) printf("    stderr was: %s", err);
}

// Writes `data` (a patched copy of a good shard) to a new file and returns it.
static const char *save_case(const char *name, const uint8_t *data, size_t bytes) {
    const char *path = tmp_path(name);
    save(path, data, bytes);
    return path;
}

static void test_bad_input(void) {
    Rng rng;
    rng_seed(&rng, 7);
    Corpus c = make_corpus(&rng, 20, 1000, 100);
    const int64_t frame_tokens = 50;
    const char *good = tmp_path("good.shard");
    write_corpus(good, &c, 1000, 0, frame_tokens);
    size_t size;
    uint8_t *orig = load(good, &size);
    uint8_t *data = xmalloc(size + 16);
    int64_t index_offset = (int64_t)get_u64(orig + 56), doc_table_offset = (int64_t)get_u64(orig + 64);
    int64_t frame_count = (int64_t)get_u64(orig + 48);
    EXPECT(frame_count >= 8, "bad input: the good shard has %" PRId64 " frames", frame_count);
#define RESET() memcpy(data, orig, size)

    const char *prose = "hello, this is a text file and not a shard at all\n"
                        "hello, this is a text file and not a shard at all\n"
                        "hello, this is a text file and not a shard at all\n";
    const char *text = save_case("text.shard", (const uint8_t *)prose, strlen(prose));
    expect_failure("wrong magic", job_open, (Job){.path = text}, "not an mtrain shard");
    expect_failure("three-byte file", job_open, (Job){.path = save_case("abc.shard", (const uint8_t *)"abc", 3)},
                   "not an mtrain shard");
    expect_failure("missing file", job_open, (Job){.path = tmp_path("missing.shard")}, "cannot open");

    RESET();
    data[8] = 99;
    reseal_header(data);
    expect_failure("version 99", job_open, (Job){.path = save_case("v99.shard", data, size)}, "unsupported shard version 99");

    // Version 1 (bytes 96..119 reserved): reads, tokenizer unknown; a
    // version 1 header with a tokenizer field set is refused.
    RESET();
    put_u64(data + 8, 1);  // version 1 (and token_bytes 0 for a moment)
    memcpy(data + 12, orig + 12, 4);
    memset(data + 96, 0, 24);
    reseal_header(data);
    const char *v1 = save_case("v1.shard", data, size);
    Shard old;
    shard_open(&old, v1);
    uint32_t first[20];
    shard_read_tokens(&old, 0, 20, first);
    EXPECT(old.version == 1 && old.tokenizer.kind == SHARD_TOKENIZER_UNKNOWN && !memcmp(first, c.tokens, sizeof(first)),
           "version 1 shard reads, tokenizer unknown");
    shard_close(&old);
    data[96] = 1;
    reseal_header(data);
    expect_failure("version 1 with a tokenizer field", job_open, (Job){.path = save_case("v1tok.shard", data, size)},
                   "reserved header byte 96 is not zero (expected zero in version 1)");
    RESET();
    put_u64(data + 96, 7);
    reseal_header(data);
    expect_failure("tokenizer kind 7", job_open, (Job){.path = save_case("kind7.shard", data, size)},
                   "tokenizer kind 7 with hash");
    RESET();
    put_u64(data + 96, SHARD_TOKENIZER_BYTES);
    put_u64(data + 104, 0x1234);
    reseal_header(data);
    expect_failure("bytes tokenizer with a hash", job_open, (Job){.path = save_case("byteshash.shard", data, size)},
                   "a hash only with kind 2");

    int64_t cuts[] = {0, 4, 8, 64, 127, 128, 129, index_offset / 2, index_offset, index_offset + 17, doc_table_offset,
                      (int64_t)size - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        char name[64];
        snprintf(name, sizeof(name), "truncated at byte %" PRId64, cuts[i]);
        char file[64];
        snprintf(file, sizeof(file), "cut%zu.shard", i);
        expect_failure(name, job_open, (Job){.path = save_case(file, orig, (size_t)cuts[i])}, "truncated");
    }
    RESET();
    memset(data + size, 0, 16);
    expect_failure("trailing bytes", job_open, (Job){.path = save_case("trailing.shard", data, size + 16)}, "trailing data");

    int header_bytes[] = {12, 17, 30, 44, 60, 75, 100, 121};
    for (size_t i = 0; i < sizeof(header_bytes) / sizeof(header_bytes[0]); i++) {
        RESET();
        data[header_bytes[i]] ^= 0x10;
        char name[64], file[64];
        snprintf(name, sizeof(name), "flipped header byte %d", header_bytes[i]);
        snprintf(file, sizeof(file), "hdr%zu.shard", i);
        expect_failure(name, job_open, (Job){.path = save_case(file, data, size)}, "header checksum mismatch");
    }

    // A flipped byte inside frame 3: open succeeds, verify and reads of that
    // frame fail, reads elsewhere still work.
    RESET();
    data[get_u64(orig + index_offset + 3 * 40) + 5] ^= 0x01;
    const char *bad_frame = save_case("frame.shard", data, size);
    expect_failure("flipped frame byte: verify", job_verify, (Job){.path = bad_frame}, "frame 3 (tokens 150 .. 199");
    expect_failure("flipped frame byte: verify names checksum", job_verify, (Job){.path = bad_frame}, "checksum mismatch");
    expect_failure("flipped frame byte: read", job_read, (Job){.path = bad_frame, .start = 120, .count = 40}, "frame 3 (");
    Shard s;
    shard_open(&s, bad_frame);
    uint32_t got[150];
    shard_read_tokens(&s, 0, 150, got);
    EXPECT(!memcmp(got, c.tokens, sizeof(got)), "flipped frame byte: frames 0-2 still read back");
    shard_close(&s);

    RESET();
    data[index_offset + 40 + 3] ^= 0x01;
    expect_failure("flipped frame index byte", job_open, (Job){.path = save_case("index.shard", data, size)},
                   "frame index checksum mismatch");
    RESET();
    data[doc_table_offset + 8 * 5] ^= 0x01;
    expect_failure("flipped document table byte", job_open, (Job){.path = save_case("docs.shard", data, size)},
                   "document table checksum mismatch");

    // Frame 2 replaced by zeros with every checksum recomputed: only decoding
    // can tell.
    RESET();
    uint8_t *entry = data + index_offset + 2 * 40;
    memset(data + get_u64(entry), 0, get_u64(entry + 8));
    put_u64(entry + 32, XXH64(data + get_u64(entry), get_u64(entry + 8), 0));
    put_u64(data + 80, XXH64(data + index_offset, (size_t)(frame_count * 40), 0));
    reseal_header(data);
    expect_failure("undecodable frame", job_verify, (Job){.path = save_case("zeros.shard", data, size)}, "frame 2 does not decode");

    // Counts that disagree, under a valid header checksum.
    RESET();
    put_u64(data + 32, get_u64(orig + 32) + 3 * frame_tokens);
    reseal_header(data);
    expect_failure("token count too large", job_open, (Job){.path = save_case("count1.shard", data, size)}, "inconsistent");
    RESET();
    put_u64(data + 24, get_u64(orig + 24) + 1);
    reseal_header(data);
    expect_failure("document count too large", job_open, (Job){.path = save_case("count2.shard", data, size)}, "inconsistent");
    RESET();
    put_u64(data + 40, (uint64_t)frame_tokens + 1);
    reseal_header(data);
    expect_failure("frame size changed", job_open, (Job){.path = save_case("count3.shard", data, size)}, "inconsistent");

    // Stored ids beyond the vocabulary: the header claims vocab 900 for tokens
    // written under vocab 1000.
    int64_t first_big = -1;
    for (int64_t i = 0; i < c.token_count && first_big < 0; i++)
        if (c.tokens[i] >= 900) first_big = i;
    RESET();
    put_u64(data + 16, 900);
    reseal_header(data);
    const char *small_vocab = save_case("vocab.shard", data, size);
    char problem[128];
    snprintf(problem, sizeof(problem), "token %" PRId64 " (frame %" PRId64 ") has id %" PRIu32, first_big,
             first_big / frame_tokens, c.tokens[first_big]);
    expect_failure("stored token >= vocab: verify", job_verify, (Job){.path = small_vocab}, problem);
    expect_failure("stored token >= vocab: read", job_read, (Job){.path = small_vocab, .start = 0, .count = c.token_count},
                   "expected < vocabulary size 900");

    expect_failure("read past the end", job_read, (Job){.path = good, .start = c.token_count - 5, .count = 6},
                   "outside the shard");

    // Writing an id >= vocab fails, leaves no temporary file and leaves an
    // existing shard at that path untouched.
    const char *target = tmp_path("target.shard");
    save(target, orig, size);
    expect_failure("token >= vocab at write time", job_write_bad_token, (Job){.path = target},
                   "document 1 token 2 has id 1000 (expected < vocabulary size 1000)");
    size_t after_size;
    uint8_t *after = load(target, &after_size);
    EXPECT(after_size == size && !memcmp(after, orig, size) && tmp_files_left() == 0,
           "token >= vocab at write time: existing file untouched, no temporary file");
    free(after);
#undef RESET
    free(data);
    free(orig);
    free_corpus(&c);
}

int main(void) {
    if (!mkdtemp(dir)) FAIL("mkdtemp failed");
    test_round_trip("uint16, frames of 97", 50000, 0, 2, 97, 300, 1);
    test_round_trip("uint32, frames of 61", 151936, 0, 4, 61, 300, 2);
    test_round_trip("uint32 asked, vocab 258, frames of 1", 258, 4, 4, 1, 40, 3);
    test_round_trip("uint16, one big frame", 65536, 2, 2, 1 << 20, 200, 4);
    test_empty_shard();
    test_dtype_choice();
    test_bad_input();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
    return check_exit();
}
