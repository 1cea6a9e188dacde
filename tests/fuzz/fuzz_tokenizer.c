// fuzz_tokenizer.c: libFuzzer target for a Hugging Face tokenizer.json: the
// file is loaded, a fixed text (ASCII, an added token, non-ASCII) is encoded
// and every id it gives is decoded back.
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "../../data/tokenizer.h"
#include "../../data/tokenizer_bpe.h"

static void load_and_encode(const char *path) {
    static const char text[] = "Hello world <|endoftext|> 123 caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87!";
    Tokenizer *t = tokenizer_bpe_open(path);
    TokenIds ids = {0};
    t->encode(t, (const uint8_t *)text, (int64_t)strlen(text), &ids);
    for (int64_t i = 0; i < ids.count; i++) {
        size_t len;
        t->piece(t, ids.ids[i], &len);
    }
    free(ids.ids);
    tokenizer_close(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_read(data, size, ".json", load_and_encode);
    return 0;
}
