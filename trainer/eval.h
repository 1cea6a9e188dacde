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
#include <stdio.h>

#include "../attention/attention_api.h"
#include "../data/tasks.h"
#include "../dist/comm.h"
#include "../model/model.h"

// Every row r of logits [A, V] has its argmax (lowest id on ties) equal to answer[r].
bool answer_exact_match(const float *logits, int64_t V, const int32_t *answer, int64_t A);
// How a sequence is split over the context-parallel ranks of comm (the
// model's ring) in the layout; comm NULL: one rank holds all of it.
typedef struct {
    const Comm *comm;
    LayoutKind layout;
    int block_size;
} EvalSplit;

// One forward pass over s->tokens[0 .. length + answer_len - 1), split as
// `split` says (collective over split->comm), and the exact match of its
// answer: each rank checks the answer rows it holds, the verdicts are ANDed
// over the ranks. logits is room for [answer_len, V] floats.
bool eval_sample_correct(Model *m, const TaskSample *s, const EvalSplit *split, float *logits);

// gnuplot (the PNG plots of eval and of `mtrain plot`): a single-quoted
// string ('' stands for '), and `set output` to out_dir/name.tmp (renamed
// into place once gnuplot succeeded).
void gp_string(FILE *gp, const char *s);
void gp_output(FILE *gp, const char *out_dir, const char *name);

#endif
