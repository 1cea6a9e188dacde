// fuzz_shard.c: libFuzzer target for token shards: header, frame index and
// document table are validated on open, then every frame is decoded
// (checksums and token ids checked) and every document read.
#include "fuzz.h"

#include <stdlib.h>

#include "../../dist/util.h"
#include "../../data/shard.h"

static void read_shard(const char *path) {
    Shard s;
    shard_open(&s, path);
    shard_verify(&s);
    for (int64_t d = 0; d < s.doc_count; d++) {
        int64_t start = shard_document_start(&s, d), length = shard_document_length(&s, d);
        uint32_t *tokens = xmalloc((size_t)(length ? length : 1) * sizeof(uint32_t));
        shard_read_tokens(&s, start, length, tokens);
        free(tokens);
    }
    shard_close(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_read(data, size, ".shard", read_shard);
    return 0;
}
