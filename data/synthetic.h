// synthetic.h: the built-in training data (`data.train: synthetic`): token
// sequences with structure a small model can learn, made from a seed with no
// files. Sequence i is a pure function of (seed, i, vocab), so the data
// cursor is just the sequence index. Training uses indices 0, 1, 2, ...;
// the held-out validation stream uses -1, -2, ... (same distribution).
#ifndef MTRAIN_SYNTHETIC_H
#define MTRAIN_SYNTHETIC_H

#include <stdint.h>

// out[n]: segments of 8..32 tokens drawn from a sparse Markov chain (each
// token has 4 likely successors), each segment repeated 2..4 times. Local
// statistics reward the MLP; the repeats reward attention (copying).
void synthetic_sequence(uint64_t seed, int64_t index, int vocab_size, int32_t *out, int64_t n);

// Packed documents for measurements and tests: lengths drawn log-normal
// (median e^mu, shape sigma), >= 1, until they cover total tokens (the last
// one cut); starts [total] out (starts[0] = 0); returns how many documents.
int64_t synthetic_document_starts(uint64_t seed, double mu, double sigma, int64_t total, int64_t *starts);

#endif
