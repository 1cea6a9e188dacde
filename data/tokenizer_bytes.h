// tokenizer_bytes.h: the byte-level tokenizer. Ids 0..255 are the bytes
// themselves; 256 is <|endoftext|>, which ends every document in a shard made
// by `mtrain tokenize`; 257 is <|pad|>. Vocabulary size 258.
#ifndef MTRAIN_TOKENIZER_BYTES_H
#define MTRAIN_TOKENIZER_BYTES_H

#include "tokenizer.h"

#define TOKENIZER_BYTES_VOCAB 258
#define TOKEN_ENDOFTEXT 256
#define TOKEN_PAD 257

// The byte tokenizer (any bytes encode; special tokens decode to their names).
Tokenizer *tokenizer_bytes_open(void);

#endif
