// shard.c: writer and reader of token shards. The byte layout is specified in
// docs/FORMATS.md; every multi-byte field is little-endian.
#define _GNU_SOURCE
#include "shard.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../dist/util.h"

// Header field offsets (docs/FORMATS.md, "Header").
enum {
    H_MAGIC = 0,
    H_VERSION = 8,
    H_TOKEN_BYTES = 12,
    H_VOCAB_SIZE = 16,
    H_DOC_COUNT = 24,
    H_TOKEN_COUNT = 32,
    H_FRAME_TOKENS = 40,
    H_FRAME_COUNT = 48,
    H_FRAME_INDEX_OFFSET = 56,
    H_DOC_TABLE_OFFSET = 64,
    H_FILE_BYTES = 72,
    H_FRAME_INDEX_CHECKSUM = 80,
    H_DOC_TABLE_CHECKSUM = 88,
    H_TOKENIZER_KIND = 96,      // version 2: uint32 ShardTokenizerKind, then 4 zero bytes
    H_TOKENIZER_HASH = 104,     // version 2: uint64
    H_RESERVED = 112,           // zero (version 1: from byte 96)
    H_HEADER_CHECKSUM = 120,
};

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

// XXH64 of the header with its checksum field taken as zero.
static uint64_t header_checksum(const uint8_t *header) {
    uint8_t copy[SHARD_HEADER_BYTES];
    memcpy(copy, header, SHARD_HEADER_BYTES);
    put_u64(copy + H_HEADER_CHECKSUM, 0);
    return XXH64(copy, SHARD_HEADER_BYTES, 0);
}

static void seek_to(FILE *f, int64_t offset, const char *path) {
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0) fail("%s: cannot seek to byte %" PRId64 " (%s)", path, offset, strerror(errno));
}

// ----------------------------------------------------------------------------
// Writer

struct ShardWriter {
    char *path;
    char *tmp_path;
    FILE *file;
    int64_t vocab_size;
    int token_bytes;
    int64_t frame_tokens;
    uint8_t *frame_buf;       // frame_tokens encoded tokens
    int64_t frame_fill;       // tokens in frame_buf
    uint8_t *zbuf;
    size_t zbuf_bytes;
    ZSTD_CCtx *cctx;
    int64_t write_offset;     // file offset of the next frame
    int64_t token_count;
    ShardFrame *frames;
    int64_t frame_count, frame_cap;
    int64_t *doc_starts;
    int64_t doc_count, doc_cap;
    ShardTokenizer tokenizer;
};

ShardTokenizer shard_tokenizer_of(const char *name) {
    if (!strcmp(name, "bytes")) return (ShardTokenizer){SHARD_TOKENIZER_BYTES, 0};
    size_t bytes;
    char *text = read_file(name, &bytes);
    ShardTokenizer t = {SHARD_TOKENIZER_JSON, XXH64(text, bytes, 0)};
    free(text);
    return t;
}

bool shard_tokenizer_same(ShardTokenizer a, ShardTokenizer b) {
    return a.kind == b.kind && a.hash == b.hash;
}

void shard_tokenizer_describe(ShardTokenizer t, char *buf, size_t size) {
    if (t.kind == SHARD_TOKENIZER_BYTES) snprintf(buf, size, "bytes");
    else if (t.kind == SHARD_TOKENIZER_JSON) snprintf(buf, size, "tokenizer.json xxh64 %016" PRIx64, t.hash);
    else snprintf(buf, size, "unknown tokenizer");
}

void shard_writer_set_tokenizer(ShardWriter *w, ShardTokenizer t) {
    w->tokenizer = t;
}

// Remove the PATH.tmp.PID files of writers that were killed (PID no longer
// running), with a warning each; every other name is left alone.
static void remove_dead_temporaries(const char *path) {
    char *copy = xstrdup(path);
    char *slash = strrchr(copy, '/');
    if (slash) *slash = '\0';
    const char *dir = !slash ? "." : copy[0] ? copy : "/", *base = slash ? slash + 1 : copy;
    size_t n = strlen(base);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *digits = e->d_name + n + 5;
        if (strncmp(e->d_name, base, n) || strncmp(e->d_name + n, ".tmp.", 5) || digits[0] < '1' || digits[0] > '9')
            continue;
        char *end;
        long pid = strtol(digits, &end, 10);
        if (*end || pid > INT_MAX || other_process_alive((int)pid)) continue;
        char *leftover = path_join(dir, e->d_name);
        if (unlink(leftover) != 0) fail("%s: cannot remove (%s)", leftover, strerror(errno));
        fprintf(stderr, "warning: %s: removed (left by process %ld, which is gone)\n", leftover, pid);
        free(leftover);
    }
    if (d) closedir(d);
    free(copy);
}

ShardWriter *shard_writer_open(const char *path, int64_t vocab_size, int token_bytes, int64_t frame_tokens) {
    if (vocab_size < 1 || vocab_size > ((int64_t)1 << 32))
        fail("%s: vocabulary size %" PRId64 " is out of range (expected 1 .. 2^32)", path, vocab_size);
    if (token_bytes == 0) token_bytes = vocab_size <= 65536 ? 2 : 4;
    if (token_bytes != 2 && token_bytes != 4) fail("%s: token width %d bytes is not supported (expected 2 or 4)", path, token_bytes);
    if (token_bytes == 2 && vocab_size > 65536)
        fail("%s: vocabulary size %" PRId64 " does not fit uint16 tokens (expected <= 65536)", path, vocab_size);
    if (frame_tokens == 0) frame_tokens = SHARD_DEFAULT_FRAME_TOKENS;
    if (frame_tokens < 1 || frame_tokens > SHARD_MAX_FRAME_TOKENS)
        fail("%s: frame size %" PRId64 " tokens is out of range (expected 1 .. %d)", path, frame_tokens, SHARD_MAX_FRAME_TOKENS);

    remove_dead_temporaries(path);
    ShardWriter *w = xcalloc(1, sizeof(*w));
    w->path = xstrdup(path);
    size_t tmp_len = strlen(path) + 32;
    w->tmp_path = xmalloc(tmp_len);
    snprintf(w->tmp_path, tmp_len, "%s.tmp.%d", path, (int)getpid());
    w->file = xfopen(w->tmp_path, "wb");
    w->vocab_size = vocab_size;
    w->token_bytes = token_bytes;
    w->frame_tokens = frame_tokens;
    w->frame_buf = xmalloc((size_t)frame_tokens * (size_t)token_bytes);
    w->zbuf_bytes = ZSTD_compressBound((size_t)frame_tokens * (size_t)token_bytes);
    w->zbuf = xmalloc(w->zbuf_bytes);
    w->cctx = ZSTD_createCCtx();
    if (!w->cctx) fail("%s: cannot create a zstd compression context", path);
    // The header is written last, when every count and checksum is known.
    uint8_t zeros[SHARD_HEADER_BYTES] = {0};
    xfwrite(zeros, sizeof(zeros), w->file, w->tmp_path);
    w->write_offset = SHARD_HEADER_BYTES;
    return w;
}

static void writer_flush_frame(ShardWriter *w) {
    size_t raw_bytes = (size_t)w->frame_fill * (size_t)w->token_bytes;
    size_t n = ZSTD_compressCCtx(w->cctx, w->zbuf, w->zbuf_bytes, w->frame_buf, raw_bytes, SHARD_ZSTD_LEVEL);
    if (ZSTD_isError(n)) fail("%s: zstd compression failed (%s)", w->tmp_path, ZSTD_getErrorName(n));
    xfwrite(w->zbuf, n, w->file, w->tmp_path);
    if (w->frame_count == w->frame_cap) {
        w->frame_cap = w->frame_cap ? 2 * w->frame_cap : 64;
        w->frames = xrealloc(w->frames, (size_t)w->frame_cap * sizeof(ShardFrame));
    }
    w->frames[w->frame_count++] = (ShardFrame){
        .offset = w->write_offset,
        .compressed_bytes = (int64_t)n,
        .first_token = w->token_count - w->frame_fill,
        .token_count = w->frame_fill,
        .checksum = XXH64(w->zbuf, n, 0),
    };
    w->write_offset += (int64_t)n;
    w->frame_fill = 0;
}

void shard_writer_add_document(ShardWriter *w, const uint32_t *tokens, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        if ((int64_t)tokens[i] >= w->vocab_size) {
            char *path = xstrdup(w->path);
            int64_t doc = w->doc_count, vocab_size = w->vocab_size;
            shard_writer_abort(w);
            fail("%s: document %" PRId64 " token %" PRId64 " has id %" PRIu32 " (expected < vocabulary size %" PRId64 ")",
                 path, doc, i, tokens[i], vocab_size);
        }
    }
    if (w->doc_count == w->doc_cap) {
        w->doc_cap = w->doc_cap ? 2 * w->doc_cap : 1024;
        w->doc_starts = xrealloc(w->doc_starts, (size_t)w->doc_cap * sizeof(int64_t));
    }
    w->doc_starts[w->doc_count++] = w->token_count;
    for (int64_t i = 0; i < count; i++) {
        uint8_t *p = w->frame_buf + w->frame_fill * w->token_bytes;
        if (w->token_bytes == 2) { p[0] = (uint8_t)tokens[i]; p[1] = (uint8_t)(tokens[i] >> 8); }
        else put_u32(p, tokens[i]);
        w->frame_fill++;
        w->token_count++;
        if (w->frame_fill == w->frame_tokens) writer_flush_frame(w);
    }
}

static void writer_free(ShardWriter *w) {
    ZSTD_freeCCtx(w->cctx);
    free(w->frame_buf);
    free(w->zbuf);
    free(w->frames);
    free(w->doc_starts);
    free(w->tmp_path);
    free(w->path);
    free(w);
}

void shard_writer_abort(ShardWriter *w) {
    fclose(w->file);
    unlink(w->tmp_path);
    writer_free(w);
}

void shard_writer_close(ShardWriter *w) {
    if (w->frame_fill > 0) writer_flush_frame(w);

    int64_t index_bytes = w->frame_count * SHARD_FRAME_ENTRY_BYTES;
    uint8_t *index = xmalloc((size_t)index_bytes);
    for (int64_t i = 0; i < w->frame_count; i++) {
        uint8_t *e = index + i * SHARD_FRAME_ENTRY_BYTES;
        put_u64(e + 0, (uint64_t)w->frames[i].offset);
        put_u64(e + 8, (uint64_t)w->frames[i].compressed_bytes);
        put_u64(e + 16, (uint64_t)w->frames[i].first_token);
        put_u64(e + 24, (uint64_t)w->frames[i].token_count);
        put_u64(e + 32, w->frames[i].checksum);
    }
    int64_t doc_table_bytes = (w->doc_count + 1) * 8;
    uint8_t *doc_table = xmalloc((size_t)doc_table_bytes);
    for (int64_t d = 0; d < w->doc_count; d++) put_u64(doc_table + 8 * d, (uint64_t)w->doc_starts[d]);
    put_u64(doc_table + 8 * w->doc_count, (uint64_t)w->token_count);

    int64_t index_offset = w->write_offset;
    int64_t doc_table_offset = index_offset + index_bytes;
    xfwrite(index, (size_t)index_bytes, w->file, w->tmp_path);
    xfwrite(doc_table, (size_t)doc_table_bytes, w->file, w->tmp_path);

    uint8_t header[SHARD_HEADER_BYTES] = {0};
    memcpy(header + H_MAGIC, SHARD_MAGIC, 8);
    put_u32(header + H_VERSION, SHARD_VERSION);
    put_u32(header + H_TOKEN_BYTES, (uint32_t)w->token_bytes);
    put_u32(header + H_TOKENIZER_KIND, (uint32_t)w->tokenizer.kind);
    put_u64(header + H_TOKENIZER_HASH, w->tokenizer.hash);
    put_u64(header + H_VOCAB_SIZE, (uint64_t)w->vocab_size);
    put_u64(header + H_DOC_COUNT, (uint64_t)w->doc_count);
    put_u64(header + H_TOKEN_COUNT, (uint64_t)w->token_count);
    put_u64(header + H_FRAME_TOKENS, (uint64_t)w->frame_tokens);
    put_u64(header + H_FRAME_COUNT, (uint64_t)w->frame_count);
    put_u64(header + H_FRAME_INDEX_OFFSET, (uint64_t)index_offset);
    put_u64(header + H_DOC_TABLE_OFFSET, (uint64_t)doc_table_offset);
    put_u64(header + H_FILE_BYTES, (uint64_t)(doc_table_offset + doc_table_bytes));
    put_u64(header + H_FRAME_INDEX_CHECKSUM, XXH64(index, (size_t)index_bytes, 0));
    put_u64(header + H_DOC_TABLE_CHECKSUM, XXH64(doc_table, (size_t)doc_table_bytes, 0));
    put_u64(header + H_HEADER_CHECKSUM, header_checksum(header));
    seek_to(w->file, 0, w->tmp_path);
    xfwrite(header, sizeof(header), w->file, w->tmp_path);

    xfclose_sync(w->file, w->tmp_path);
    rename_into_place(w->tmp_path, w->path);
    free(index);
    free(doc_table);
    writer_free(w);
}

// ----------------------------------------------------------------------------
// Reader

// Reads bytes [offset, offset + bytes) of the shard into a new buffer.
static uint8_t *read_section(Shard *s, int64_t offset, int64_t bytes) {
    uint8_t *buf = xmalloc((size_t)bytes);
    seek_to(s->file, offset, s->path);
    xfread(buf, (size_t)bytes, s->file, s->path);
    return buf;
}

static void check_header(Shard *s, const uint8_t *h) {
    const char *path = s->path;
    s->version = (int)get_u32(h + H_VERSION);
    if (s->version != 1 && s->version != SHARD_VERSION)
        fail("%s: unsupported shard version %u (expected 1 or %d)", path, get_u32(h + H_VERSION), SHARD_VERSION);
    uint64_t stored = get_u64(h + H_HEADER_CHECKSUM), computed = header_checksum(h);
    if (stored != computed)
        fail("%s: header checksum mismatch, the header is corrupt (expected %016" PRIx64 ", computed %016" PRIx64 ")",
             path, stored, computed);
    for (int i = s->version == 1 ? H_TOKENIZER_KIND : H_RESERVED; i < H_HEADER_CHECKSUM; i++)
        if (h[i] != 0) fail("%s: reserved header byte %d is not zero (expected zero in version %d)", path, i, s->version);
    s->tokenizer = (ShardTokenizer){SHARD_TOKENIZER_UNKNOWN, 0};
    if (s->version != 1) {
        uint32_t kind = get_u32(h + H_TOKENIZER_KIND);
        uint64_t hash = get_u64(h + H_TOKENIZER_HASH);
        if (kind > SHARD_TOKENIZER_JSON || get_u32(h + H_TOKENIZER_KIND + 4) != 0 ||
            (kind != SHARD_TOKENIZER_JSON && hash != 0))
            fail("%s: tokenizer kind %u with hash %016" PRIx64 " is not valid (expected kind 0, 1 or 2, a hash only "
                 "with kind 2)", path, kind, hash);
        s->tokenizer = (ShardTokenizer){(ShardTokenizerKind)kind, hash};
    }

    uint64_t file_bytes = get_u64(h + H_FILE_BYTES);
    if ((uint64_t)s->file_bytes < file_bytes)
        fail("%s: truncated: file is %" PRId64 " bytes (expected %" PRIu64 " as the header says)", path, s->file_bytes, file_bytes);
    if ((uint64_t)s->file_bytes > file_bytes)
        fail("%s: %" PRId64 " bytes of trailing data (expected the file to end at byte %" PRIu64 ")", path,
             s->file_bytes - (int64_t)file_bytes, file_bytes);

    uint32_t token_bytes = get_u32(h + H_TOKEN_BYTES);
    if (token_bytes != 2 && token_bytes != 4) fail("%s: token width %u bytes is not supported (expected 2 or 4)", path, token_bytes);
    s->token_bytes = (int)token_bytes;
    uint64_t vocab = get_u64(h + H_VOCAB_SIZE);
    uint64_t vocab_limit = token_bytes == 2 ? 65536 : (uint64_t)1 << 32;
    if (vocab < 1 || vocab > vocab_limit)
        fail("%s: vocabulary size %" PRIu64 " does not fit %u-byte tokens (expected 1 .. %" PRIu64 ")", path, vocab, token_bytes, vocab_limit);
    s->vocab_size = (int64_t)vocab;
    uint64_t frame_tokens = get_u64(h + H_FRAME_TOKENS);
    if (frame_tokens < 1 || frame_tokens > SHARD_MAX_FRAME_TOKENS)
        fail("%s: frame size %" PRIu64 " tokens is out of range (expected 1 .. %d)", path, frame_tokens, SHARD_MAX_FRAME_TOKENS);
    s->frame_tokens = (int64_t)frame_tokens;

    // Every count is bounded by the file size before any arithmetic on it.
    uint64_t size = file_bytes;
    uint64_t doc_count = get_u64(h + H_DOC_COUNT), token_count = get_u64(h + H_TOKEN_COUNT);
    uint64_t frame_count = get_u64(h + H_FRAME_COUNT);
    uint64_t index_offset = get_u64(h + H_FRAME_INDEX_OFFSET), doc_table_offset = get_u64(h + H_DOC_TABLE_OFFSET);
    if (index_offset < SHARD_HEADER_BYTES || index_offset > size || frame_count > (size - index_offset) / SHARD_FRAME_ENTRY_BYTES)
        fail("%s: inconsistent header: the frame index (%" PRIu64 " entries at byte %" PRIu64 ") runs past the end of the file "
             "(expected it within bytes %d .. %" PRIu64 ")", path, frame_count, index_offset, SHARD_HEADER_BYTES, size);
    if (doc_table_offset > size || doc_count >= (size - doc_table_offset) / 8)
        fail("%s: inconsistent header: the document table (%" PRIu64 " documents at byte %" PRIu64 ") runs past the end of the file "
             "(expected it within %" PRIu64 " bytes)", path, doc_count, doc_table_offset, size);
    if (index_offset + frame_count * SHARD_FRAME_ENTRY_BYTES != doc_table_offset || doc_table_offset + (doc_count + 1) * 8 != size)
        fail("%s: inconsistent header: sections do not tile the file (expected frame index at %" PRIu64 " + %" PRIu64
             " entries, then the document table of %" PRIu64 " + 1 entries, ending at byte %" PRIu64 ")",
             path, index_offset, frame_count, doc_count, size);
    if (token_count > INT64_MAX || frame_count != token_count / frame_tokens + (token_count % frame_tokens != 0))
        fail("%s: inconsistent counts: %" PRIu64 " frames for %" PRIu64 " tokens (expected %" PRIu64 " frames of %" PRIu64 " tokens)",
             path, frame_count, token_count, token_count / frame_tokens + (token_count % frame_tokens != 0), frame_tokens);
    s->doc_count = (int64_t)doc_count;
    s->token_count = (int64_t)token_count;
    s->frame_count = (int64_t)frame_count;
}

static void load_frame_index(Shard *s, const uint8_t *h) {
    int64_t index_offset = (int64_t)get_u64(h + H_FRAME_INDEX_OFFSET);
    int64_t bytes = s->frame_count * SHARD_FRAME_ENTRY_BYTES;
    uint8_t *index = read_section(s, index_offset, bytes);
    uint64_t stored = get_u64(h + H_FRAME_INDEX_CHECKSUM), computed = XXH64(index, (size_t)bytes, 0);
    if (stored != computed)
        fail("%s: frame index checksum mismatch, the index is corrupt (expected %016" PRIx64 ", computed %016" PRIx64 ")",
             s->path, stored, computed);
    s->frames = xmalloc((size_t)(s->frame_count ? s->frame_count : 1) * sizeof(ShardFrame));
    uint64_t max_compressed = ZSTD_compressBound((size_t)s->frame_tokens * (size_t)s->token_bytes);
    uint64_t next_offset = SHARD_HEADER_BYTES;
    for (int64_t i = 0; i < s->frame_count; i++) {
        const uint8_t *e = index + i * SHARD_FRAME_ENTRY_BYTES;
        uint64_t offset = get_u64(e), compressed = get_u64(e + 8), first = get_u64(e + 16), count = get_u64(e + 24);
        uint64_t want_first = (uint64_t)(i * s->frame_tokens);
        uint64_t want_count = (uint64_t)(s->token_count - i * s->frame_tokens);
        if (want_count > (uint64_t)s->frame_tokens) want_count = (uint64_t)s->frame_tokens;
        if (first != want_first || count != want_count)
            fail("%s: inconsistent frame index: frame %" PRId64 " holds tokens %" PRIu64 " + %" PRIu64 " (expected %" PRIu64 " + %" PRIu64 ")",
                 s->path, i, first, count, want_first, want_count);
        if (offset != next_offset || compressed < 1 || compressed > max_compressed || compressed > (uint64_t)index_offset - offset)
            fail("%s: inconsistent frame index: frame %" PRId64 " is %" PRIu64 " bytes at byte %" PRIu64
                 " (expected to start at byte %" PRIu64 ", 1 .. %" PRIu64 " bytes, before the index at %" PRId64 ")",
                 s->path, i, compressed, offset, next_offset, max_compressed, index_offset);
        s->frames[i] = (ShardFrame){(int64_t)offset, (int64_t)compressed, (int64_t)first, (int64_t)count, get_u64(e + 32)};
        next_offset = offset + compressed;
    }
    if (next_offset != (uint64_t)index_offset)
        fail("%s: inconsistent frame index: frames end at byte %" PRIu64 " (expected the index to follow, at byte %" PRId64 ")",
             s->path, next_offset, index_offset);
    free(index);
}

static void load_doc_table(Shard *s, const uint8_t *h) {
    int64_t offset = (int64_t)get_u64(h + H_DOC_TABLE_OFFSET);
    int64_t bytes = (s->doc_count + 1) * 8;
    uint8_t *table = read_section(s, offset, bytes);
    uint64_t stored = get_u64(h + H_DOC_TABLE_CHECKSUM), computed = XXH64(table, (size_t)bytes, 0);
    if (stored != computed)
        fail("%s: document table checksum mismatch, the table is corrupt (expected %016" PRIx64 ", computed %016" PRIx64 ")",
             s->path, stored, computed);
    s->doc_starts = xmalloc((size_t)bytes);
    uint64_t previous = 0;
    for (int64_t d = 0; d <= s->doc_count; d++) {
        uint64_t start = get_u64(table + 8 * d);
        if (start < previous || start > (uint64_t)s->token_count || (d == 0 && start != 0) || (d == s->doc_count && start != (uint64_t)s->token_count))
            fail("%s: inconsistent document table: entry %" PRId64 " is %" PRIu64 " (expected non-decreasing from 0 to the token count %" PRId64 ")",
                 s->path, d, start, s->token_count);
        s->doc_starts[d] = (int64_t)start;
        previous = start;
    }
    free(table);
}

void shard_open(Shard *s, const char *path) {
    memset(s, 0, sizeof(*s));
    s->path = xstrdup(path);
    s->file = xfopen(path, "rb");
    s->cached_frame = -1;
    struct stat st;
    if (fstat(fileno(s->file), &st) != 0) fail("%s: cannot stat (%s)", path, strerror(errno));
    s->file_bytes = (int64_t)st.st_size;

    uint8_t header[SHARD_HEADER_BYTES];
    size_t have = s->file_bytes < SHARD_HEADER_BYTES ? (size_t)s->file_bytes : SHARD_HEADER_BYTES;
    xfread(header, have, s->file, path);
    if (memcmp(header, SHARD_MAGIC, have < 8 ? have : 8) != 0)
        fail("%s: not an mtrain shard (expected the magic bytes \"%s\\0\" at the start)", path, SHARD_MAGIC);
    if (have < SHARD_HEADER_BYTES)
        fail("%s: truncated: file is %" PRId64 " bytes (expected at least the %d-byte header)", path, s->file_bytes, SHARD_HEADER_BYTES);
    check_header(s, header);
    load_frame_index(s, header);
    load_doc_table(s, header);

    int64_t max_frame_tokens = s->token_count < s->frame_tokens ? s->token_count : s->frame_tokens;
    int64_t max_compressed = 1;
    for (int64_t i = 0; i < s->frame_count; i++)
        if (s->frames[i].compressed_bytes > max_compressed) max_compressed = s->frames[i].compressed_bytes;
    s->compressed = xmalloc((size_t)max_compressed);
    s->raw = xmalloc((size_t)max_frame_tokens * (size_t)s->token_bytes);
    s->decoded = xmalloc((size_t)max_frame_tokens * sizeof(uint32_t));
    s->dctx = ZSTD_createDCtx();
    if (!s->dctx) fail("%s: cannot create a zstd decompression context", path);
}

// The document holding token t: the last d with doc_starts[d] <= t (empty
// documents before it share its start).
static int64_t document_of(const Shard *s, int64_t t) {
    int64_t lo = 0, hi = s->doc_count - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (s->doc_starts[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Makes s->decoded hold frame i: reads it, checks its checksum, decodes it,
// and checks its length and token ids.
static void decode_frame(Shard *s, int64_t i) {
    if (s->cached_frame == i) return;
    s->cached_frame = -1;
    const ShardFrame *fr = &s->frames[i];
    seek_to(s->file, fr->offset, s->path);
    xfread(s->compressed, (size_t)fr->compressed_bytes, s->file, s->path);
    uint64_t computed = XXH64(s->compressed, (size_t)fr->compressed_bytes, 0);
    if (computed != fr->checksum)
        fail("%s: frame %" PRId64 " (tokens %" PRId64 " .. %" PRId64 ", bytes %" PRId64 " .. %" PRId64 ") checksum mismatch, "
             "the frame is corrupt (expected %016" PRIx64 ", computed %016" PRIx64 ")",
             s->path, i, fr->first_token, fr->first_token + fr->token_count - 1, fr->offset,
             fr->offset + fr->compressed_bytes - 1, fr->checksum, computed);
    size_t want = (size_t)fr->token_count * (size_t)s->token_bytes;
    size_t n = ZSTD_decompressDCtx(s->dctx, s->raw, want, s->compressed, (size_t)fr->compressed_bytes);
    if (ZSTD_isError(n))
        fail("%s: frame %" PRId64 " does not decode (zstd: %s; expected %" PRId64 " tokens)", s->path, i, ZSTD_getErrorName(n), fr->token_count);
    if (n != want)
        fail("%s: frame %" PRId64 " decodes to %zu bytes (expected %zu: %" PRId64 " tokens of %d bytes)",
             s->path, i, n, want, fr->token_count, s->token_bytes);
    for (int64_t t = 0; t < fr->token_count; t++) {
        const uint8_t *p = s->raw + t * s->token_bytes;
        uint32_t id = s->token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
        if ((int64_t)id >= s->vocab_size)
            fail("%s: document %" PRId64 ": token %" PRId64 " (frame %" PRId64 ") has id %" PRIu32
                 " (expected < vocabulary size %" PRId64 ")",
                 s->path, document_of(s, fr->first_token + t), fr->first_token + t, i, id, s->vocab_size);
        s->decoded[t] = id;
    }
    s->cached_frame = i;
}

void shard_read_tokens(Shard *s, int64_t start, int64_t count, uint32_t *dst) {
    if (start < 0 || count < 0 || start > s->token_count || count > s->token_count - start)
        fail("%s: token range %" PRId64 " + %" PRId64 " is outside the shard (expected within 0 .. %" PRId64 ")",
             s->path, start, count, s->token_count);
    int64_t end = start + count;
    for (int64_t pos = start; pos < end;) {
        int64_t i = pos / s->frame_tokens;
        decode_frame(s, i);
        const ShardFrame *fr = &s->frames[i];
        int64_t frame_end = fr->first_token + fr->token_count;
        int64_t n = (end < frame_end ? end : frame_end) - pos;
        memcpy(dst + (pos - start), s->decoded + (pos - fr->first_token), (size_t)n * sizeof(uint32_t));
        pos += n;
    }
}

int64_t shard_document_start(const Shard *s, int64_t doc) {
    CHECK(doc >= 0 && doc <= s->doc_count, "%s: document %" PRId64 " out of range 0 .. %" PRId64, s->path, doc, s->doc_count);
    return s->doc_starts[doc];
}

int64_t shard_document_length(const Shard *s, int64_t doc) {
    CHECK(doc >= 0 && doc < s->doc_count, "%s: document %" PRId64 " out of range 0 .. %" PRId64, s->path, doc, s->doc_count - 1);
    return s->doc_starts[doc + 1] - s->doc_starts[doc];
}

void shard_verify(Shard *s) {
    for (int64_t i = 0; i < s->frame_count; i++) {
        s->cached_frame = -1;  // decode again even if cached
        decode_frame(s, i);
    }
}

uint64_t shard_content_hash(const Shard *s) {
    XXH64_state_t *hash = XXH64_createState();
    if (!hash) fail("%s: out of memory for the checksum", s->path);
    XXH64_reset(hash, 0);
    int64_t counts[4] = {s->token_count, s->doc_count, s->vocab_size, s->token_bytes};
    XXH64_update(hash, counts, sizeof(counts));
    for (int64_t f = 0; f < s->frame_count; f++) XXH64_update(hash, &s->frames[f].checksum, sizeof(uint64_t));
    XXH64_update(hash, s->doc_starts, sizeof(int64_t) * (size_t)(s->doc_count + 1));
    uint64_t digest = XXH64_digest(hash);
    XXH64_freeState(hash);
    return digest;
}

void shard_close(Shard *s) {
    if (s->file) fclose(s->file);
    ZSTD_freeDCtx(s->dctx);
    free(s->frames);
    free(s->doc_starts);
    free(s->compressed);
    free(s->raw);
    free(s->decoded);
    free(s->path);
    memset(s, 0, sizeof(*s));
}
