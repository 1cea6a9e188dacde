// shard.h: the token shard format (docs/FORMATS.md): a checksummed header,
// token ids in independently decodable zstd frames, a frame index and a
// document table. The writer streams documents into a temporary file and
// renames it into place when complete; the reader validates every section it
// loads and decodes only the frames that cover a requested token range.
//
// Every token a reader returns is checked to be below the shard's vocab_size,
// so a loader only needs vocab_size <= the model's vocabulary to know that
// every id is a valid row of the embedding.
#ifndef MTRAIN_SHARD_H
#define MTRAIN_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHARD_MAGIC "MTSHARD"             // 8 bytes on disk, with the NUL
#define SHARD_VERSION 2                   // version 1 (no tokenizer identity) still reads
#define SHARD_HEADER_BYTES 128
#define SHARD_FRAME_ENTRY_BYTES 40
#define SHARD_DEFAULT_FRAME_TOKENS (1 << 20)
#define SHARD_MAX_FRAME_TOKENS (1 << 26)  // bounds a reader's frame buffer
#define SHARD_ZSTD_LEVEL 3

// Which tokenizer made a shard (header bytes 96..111 of version 2).
typedef enum {
    SHARD_TOKENIZER_UNKNOWN = 0,  // a version 1 shard, or a writer that was not told
    SHARD_TOKENIZER_BYTES = 1,    // the byte tokenizer (data/tokenizer_bytes.h)
    SHARD_TOKENIZER_JSON = 2,     // a Hugging Face tokenizer.json, identified by the XXH64 of its bytes
} ShardTokenizerKind;

typedef struct {
    ShardTokenizerKind kind;
    uint64_t hash;                // SHARD_TOKENIZER_JSON: XXH64 (seed 0) of tokenizer.json; else 0
} ShardTokenizer;

// The identity of tokenizer `name`: "bytes", or the path of a tokenizer.json
// (Tokenizer.name of data/tokenizer.h).
ShardTokenizer shard_tokenizer_of(const char *name);
bool shard_tokenizer_same(ShardTokenizer a, ShardTokenizer b);
// "bytes", "tokenizer.json xxh64 0123456789abcdef" or "unknown tokenizer".
void shard_tokenizer_describe(ShardTokenizer t, char *buf, size_t size);

// Writer. The destination is only ever replaced by a complete shard; a token
// id >= vocab_size removes the temporary file before it fails. Opening a
// writer removes the PATH.tmp.PID files of killed writers (PID gone).
typedef struct ShardWriter ShardWriter;

// token_bytes: 2 (uint16) or 4 (uint32); 0 picks 2 when vocab_size <= 65536.
// frame_tokens: tokens per zstd frame; 0 = SHARD_DEFAULT_FRAME_TOKENS.
ShardWriter *shard_writer_open(const char *path, int64_t vocab_size, int token_bytes, int64_t frame_tokens);
// Records the tokenizer that made the tokens (default: unknown).
void shard_writer_set_tokenizer(ShardWriter *w, ShardTokenizer t);
// Appends one document (count may be 0).
void shard_writer_add_document(ShardWriter *w, const uint32_t *tokens, int64_t count);
// Writes the last frame, the index, the document table and the header to
// PATH.tmp.<pid>, fsyncs it and renames it to PATH. Frees w.
void shard_writer_close(ShardWriter *w);
// Gives up: removes the temporary file, leaves PATH untouched, frees w.
void shard_writer_abort(ShardWriter *w);

// One entry of the frame index.
typedef struct {
    int64_t offset;            // file offset of the zstd frame
    int64_t compressed_bytes;
    int64_t first_token;       // index of its first token in the shard
    int64_t token_count;
    uint64_t checksum;         // XXH64 (seed 0) of the compressed bytes
} ShardFrame;

// Reader. Not thread-safe (it caches the last decoded frame): open one Shard
// per thread.
typedef struct {
    char *path;
    FILE *file;
    int64_t file_bytes;
    int version;
    ShardTokenizer tokenizer;  // unknown for version 1
    int token_bytes;           // 2 or 4
    int64_t vocab_size;        // every token id is < vocab_size
    int64_t doc_count;
    int64_t token_count;
    int64_t frame_tokens;      // tokens per frame (the last may hold fewer)
    int64_t frame_count;
    ShardFrame *frames;        // frame_count entries
    int64_t *doc_starts;       // doc_count + 1 entries; the last is token_count
    // decode state
    void *dctx;                // ZSTD_DCtx
    uint8_t *compressed;       // one frame's compressed bytes
    uint8_t *raw;              // one frame's decompressed bytes
    uint32_t *decoded;         // tokens of frame cached_frame
    int64_t cached_frame;      // -1 when none
} Shard;

// Reads and validates the header, the frame index and the document table.
void shard_open(Shard *s, const char *path);
// dst[0..count) = tokens [start, start + count); decodes (and checks the
// checksum and ids of) every frame that covers the range.
void shard_read_tokens(Shard *s, int64_t start, int64_t count, uint32_t *dst);
// First token of document doc; doc == doc_count gives token_count.
int64_t shard_document_start(const Shard *s, int64_t doc);
int64_t shard_document_length(const Shard *s, int64_t doc);
// Checks every frame: checksum, decodes to its stated count, ids < vocab.
void shard_verify(Shard *s);
// The identity of the shard's contents without reading its frames: XXH64 of
// its counts, vocab_size, token width, every frame's checksum (of its
// compressed bytes) and the document table.
uint64_t shard_content_hash(const Shard *s);
void shard_close(Shard *s);

#endif
