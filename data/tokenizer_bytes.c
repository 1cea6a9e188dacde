// tokenizer_bytes.c: the byte-level tokenizer (ids are bytes, plus two
// special tokens) behind the Tokenizer interface.
#include "tokenizer_bytes.h"

#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"

typedef struct {
    Tokenizer base;
    uint8_t bytes[256];        // bytes[b] = b: the piece of id b
} TokenizerBytes;

static int64_t bytes_encode(Tokenizer *t, const uint8_t *text, int64_t bytes, TokenIds *ids) {
    (void)t;
    token_ids_reserve(ids, bytes);
    for (int64_t i = 0; i < bytes; i++) ids->ids[ids->count++] = text[i];
    return -1;
}

static const uint8_t *bytes_piece(const Tokenizer *t, uint32_t id, size_t *len) {
    static const char *special[] = {[TOKEN_ENDOFTEXT - 256] = "<|endoftext|>", [TOKEN_PAD - 256] = "<|pad|>"};
    if (id < 256) {
        *len = 1;
        return &((const TokenizerBytes *)t)->bytes[id];
    }
    if (id >= TOKENIZER_BYTES_VOCAB) return NULL;
    *len = strlen(special[id - 256]);
    return (const uint8_t *)special[id - 256];
}

static Tokenizer *bytes_share(Tokenizer *t) {
    (void)t;
    return tokenizer_bytes_open();
}

static void bytes_close(Tokenizer *t) {
    free(t);
}

Tokenizer *tokenizer_bytes_open(void) {
    TokenizerBytes *t = xcalloc(1, sizeof(*t));
    t->base = (Tokenizer){.name = "bytes", .vocab_size = TOKENIZER_BYTES_VOCAB, .end_of_text = TOKEN_ENDOFTEXT,
                          .encode = bytes_encode, .piece = bytes_piece, .share = bytes_share,
                          .close = bytes_close};
    for (int b = 0; b < 256; b++) t->bytes[b] = (uint8_t)b;
    return &t->base;
}
