// tokenizer.c: picks a tokenizer from its spec ("bytes", a tokenizer.json or a
// folder holding one) and the parts of the interface every tokenizer shares.
#include "tokenizer.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../dist/util.h"
#include "tokenizer_bpe.h"
#include "tokenizer_bytes.h"

void token_ids_reserve(TokenIds *ids, int64_t more) {
    if (ids->count + more <= ids->cap) return;
    ids->cap = 2 * (ids->count + more);
    ids->ids = xrealloc(ids->ids, (size_t)ids->cap * sizeof(uint32_t));
}

Tokenizer *tokenizer_open(const char *spec) {
    if (!strcmp(spec, "bytes")) return tokenizer_bytes_open();
    struct stat st;
    if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(spec) + sizeof("/tokenizer.json");
        char *path = xmalloc(n);
        snprintf(path, n, "%s/tokenizer.json", spec);
        Tokenizer *t = tokenizer_bpe_open(path);
        free(path);
        return t;
    }
    return tokenizer_bpe_open(spec);
}

void tokenizer_close(Tokenizer *t) {
    if (t) t->close(t);
}

static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD};  // U+FFFD

// The range byte b of a character must fall in when it is the byte at
// position pos (1..3) after first byte lead (Unicode table 3-7).
static bool continues(uint8_t lead, int pos, uint8_t b) {
    uint8_t lo = 0x80, hi = 0xBF;
    if (pos == 1 && lead == 0xE0) lo = 0xA0;
    if (pos == 1 && lead == 0xED) hi = 0x9F;
    if (pos == 1 && lead == 0xF0) lo = 0x90;
    if (pos == 1 && lead == 0xF4) hi = 0x8F;
    return b >= lo && b <= hi;
}

// Feeds byte b to d: writes a finished character, or U+FFFD for a byte that
// cannot start one or for the held part of a character b breaks (then b
// starts afresh).
static void text_decoder_byte(TextDecoder *d, uint8_t b, FILE *out) {
    if (d->held_len > 0) {
        if (continues(d->held[0], d->held_len, b)) {
            d->held[d->held_len++] = b;
            if (d->held_len == d->need) {
                fwrite(d->held, 1, (size_t)d->need, out);
                d->held_len = 0;
            }
            return;
        }
        fwrite(replacement, 1, sizeof(replacement), out);
        d->held_len = 0;
    }
    if (b < 0x80) {
        fputc(b, out);
        return;
    }
    d->need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (d->need == 0) fwrite(replacement, 1, sizeof(replacement), out);
    else d->held[d->held_len++] = b;
}

int64_t tokenizer_write(const Tokenizer *t, TextDecoder *d, const uint32_t *ids, int64_t count, FILE *out) {
    for (int64_t i = 0; i < count; i++) {
        size_t len;
        const uint8_t *piece = t->piece(t, ids[i], &len);
        if (!piece) return i;
        for (size_t k = 0; k < len; k++) text_decoder_byte(d, piece[k], out);
    }
    return -1;
}

void text_decoder_finish(TextDecoder *d, FILE *out) {
    if (d->held_len > 0) fwrite(replacement, 1, sizeof(replacement), out);
    d->held_len = 0;
}
