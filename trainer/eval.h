// eval.h: the scoring of `mtrain eval` (trainer/eval.c), exposed for tests.
// A task sample is correct when greedy decoding reproduces its answer. Under
// teacher forcing that is one forward pass over prompt + answer[0..A-1): the
// argmax at the last prompt position and at each answer position but the last
// must equal the next answer token. Greedy decoding feeds back its own
// argmax; while it matches the answer it feeds exactly the answer tokens, so
// both agree on every position up to the first mismatch, and exact match
// (no mismatch at all) is the same verdict.
#ifndef MTRAIN_EVAL_H
#define MTRAIN_EVAL_H

#include <stdbool.h>
#include <stdint.h>

#include "../data/tasks.h"
#include "../model/model.h"

// Every row r of logits [A, V] has its argmax (lowest id on ties) equal to answer[r].
bool answer_exact_match(const float *logits, int64_t V, const int32_t *answer, int64_t A);
// One forward pass over s->tokens[0 .. length + answer_len - 1) and the exact
// match of its answer; logits is room for [answer_len, V] floats.
bool eval_sample_correct(Model *m, const TaskSample *s, float *logits);

#endif
