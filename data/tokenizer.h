// tokenizer.h: the tokenizer interface shared by every tokenizer mtrain knows:
// the byte tokenizer (`bytes`, data/tokenizer_bytes.c) and byte-level BPE from
// a Hugging Face tokenizer.json (data/tokenizer_bpe.c). Encoding appends ids
// to a growable list; decoding maps each id to the bytes of its piece, and
// writing ids as text decodes those bytes as UTF-8 (tokenizer_write).
#ifndef MTRAIN_TOKENIZER_H
#define MTRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// A growable list of token ids.
typedef struct {
    uint32_t *ids;
    int64_t count, cap;
} TokenIds;

// Makes room for `more` ids after ids->count.
void token_ids_reserve(TokenIds *ids, int64_t more);

typedef struct Tokenizer Tokenizer;
struct Tokenizer {
    const char *name;          // "bytes" or the tokenizer.json path
    int64_t vocab_size;        // every id it produces or decodes is < vocab_size
    int64_t end_of_text;       // id of <|endoftext|>, which ends every document; -1 if it has none
    // Appends the ids of text[0..bytes) to ids. Returns -1, or (when the
    // tokenizer needs UTF-8 and the text is not) the offset of the first
    // invalid byte, with ids->count as it was.
    int64_t (*encode)(Tokenizer *t, const uint8_t *text, int64_t bytes, TokenIds *ids);
    // The bytes of token id's piece (special tokens: their text) and their
    // count in *len; NULL when id is not in the vocabulary.
    const uint8_t *(*piece)(const Tokenizer *t, uint32_t id, size_t *len);
    // Another handle on the same loaded tokenizer, for another thread: the
    // same encoding, tables shared read-only (BPE: its piece cache too, under
    // locks), its own scratch. A handle is used by one thread at a time;
    // every handle is closed, in any order.
    Tokenizer *(*share)(Tokenizer *t);
    void (*close)(Tokenizer *t);
};

// spec: "bytes", a tokenizer.json file, or a folder holding tokenizer.json
// (a Hugging Face model folder). Fails with one clear line on a bad file.
Tokenizer *tokenizer_open(const char *spec);
void tokenizer_close(Tokenizer *t);
// Token ids as text: the bytes of their pieces read as UTF-8, each maximal
// part of an invalid or cut-short sequence written as U+FFFD (EF BF BD), as
// Python's bytes.decode("utf-8", "replace") does, so that what is written is
// always valid UTF-8. A character split between pieces, or between calls,
// waits in the decoder for its last bytes; text_decoder_finish ends the text.
typedef struct {
    uint8_t held[4];       // the bytes of an unfinished character
    int held_len, need;    // bytes held, and the length its first byte announces
} TextDecoder;

// Writes the text of ids[0..count) to out through d (zeroed at the start of a
// text). Returns -1, or the index of the first id that is not in the
// vocabulary (nothing of it is written).
int64_t tokenizer_write(const Tokenizer *t, TextDecoder *d, const uint32_t *ids, int64_t count, FILE *out);
// Ends the text: an unfinished character held in d is written as U+FFFD.
void text_decoder_finish(TextDecoder *d, FILE *out);

#endif
