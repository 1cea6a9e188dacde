// tokenizer_bpe.h: byte-level BPE from a Hugging Face tokenizer.json, as the
// `tokenizers` library runs it for Qwen2 / Qwen2.5 / Qwen3: added tokens cut
// out first, NFC, the file's split regex, the GPT-2 byte <-> unicode map and
// merges by rank. Everything else a file may ask for fails with one clear line.
#ifndef MTRAIN_TOKENIZER_BPE_H
#define MTRAIN_TOKENIZER_BPE_H

#include "tokenizer.h"

// Loads path (a tokenizer.json); fails naming the file and the field on
// anything missing, malformed or not supported.
Tokenizer *tokenizer_bpe_open(const char *path);

#endif
