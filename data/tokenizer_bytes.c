// tokenizer_bytes.c: the byte-level tokenizer (ids are bytes, plus two
// special tokens).
#include "tokenizer_bytes.h"

#include <inttypes.h>
#include <string.h>

#include "../dist/util.h"

void tokenizer_bytes_encode(const uint8_t *text, int64_t count, uint32_t *ids) {
    for (int64_t i = 0; i < count; i++) ids[i] = text[i];
}

int64_t tokenizer_bytes_decode(const uint32_t *ids, int64_t count, uint8_t *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < count; i++) {
        const char *special = NULL;
        if (ids[i] < 256) { out[n++] = (uint8_t)ids[i]; continue; }
        if (ids[i] == TOKEN_ENDOFTEXT) special = "<|endoftext|>";
        else if (ids[i] == TOKEN_PAD) special = "<|pad|>";
        else fail("byte tokenizer: token id %" PRIu32 " is not in its vocabulary (expected < %d)", ids[i], TOKENIZER_BYTES_VOCAB);
        size_t len = strlen(special);
        memcpy(out + n, special, len);
        n += (int64_t)len;
    }
    return n;
}
