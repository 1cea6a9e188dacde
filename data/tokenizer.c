// tokenizer.c: picks a tokenizer from its spec ("bytes", a tokenizer.json or a
// folder holding one) and the parts of the interface every tokenizer shares.
#include "tokenizer.h"

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

int64_t tokenizer_write(const Tokenizer *t, const uint32_t *ids, int64_t count, FILE *out) {
    for (int64_t i = 0; i < count; i++) {
        size_t len;
        const uint8_t *piece = t->piece(t, ids[i], &len);
        if (!piece) return i;
        fwrite(piece, 1, len, out);
    }
    return -1;
}
