// tokenizer_bytes.h: the byte-level tokenizer. Ids 0..255 are the bytes
// themselves; 256 is <|endoftext|>, which ends every document in a shard made
// by `mtrain tokenize`; 257 is <|pad|>. Vocabulary size 258.
#ifndef MTRAIN_TOKENIZER_BYTES_H
#define MTRAIN_TOKENIZER_BYTES_H

#include <stdint.h>

#define TOKENIZER_BYTES_VOCAB 258
#define TOKEN_ENDOFTEXT 256
#define TOKEN_PAD 257
#define TOKENIZER_BYTES_MAX_PIECE 13   // strlen("<|endoftext|>")

// ids[0..count) = the bytes of text[0..count).
void tokenizer_bytes_encode(const uint8_t *text, int64_t count, uint32_t *ids);
// Writes the text of ids[0..count) to out (room for count *
// TOKENIZER_BYTES_MAX_PIECE bytes); special tokens appear as their names.
// Returns the number of bytes written; fails on an id >= 258.
int64_t tokenizer_bytes_decode(const uint32_t *ids, int64_t count, uint8_t *out);

#endif
