// tasks.h: synthetic long-context evaluation tasks, generated from a seed:
// passkey retrieval, needle in a haystack (NIAH) and the RULER-style single
// key, multi-key, multi-value and variable-tracking tasks.
//
// A sample is a prompt of exactly `length` tokens followed by its answer:
//   prompt = haystack with the needles spliced in, then the question
//   answer = the tokens a correct model continues the prompt with.
// The haystack is built-in filler sentences (cycled; cut at a token at the
// front, so it ends with a whole sentence) or a token stream (cycled from a
// seeded start). A needle at depth d
// goes to the sentence boundary of the haystack nearest to d·H (H = haystack
// tokens), so it sits within `depth_slack` tokens (half the longest filler
// sentence; 0 for a stream, which is cut at any token) of d·H and never
// inside a sentence. Needles that land on the same boundary keep their order.
//
// Text meets the tokenizer (data/tokenizer.h) only through encode: prompt pieces
// (sentences, needles, question, answer) are encoded separately and their ids
// concatenated, as NIAH implementations do with BPE tokenizers.
#ifndef MTRAIN_TASKS_H
#define MTRAIN_TASKS_H

#include <stdint.h>

#include "tokenizer.h"

typedef enum {
    TASK_PASSKEY,          // "The pass key is 12345. Remember it. ..." in noise sentences
    TASK_NIAH,             // one "magic number for KEY" needle in essay filler or a text stream
    TASK_RULER_SINGLE,     // one key-value needle in noise sentences
    TASK_RULER_MULTIKEY,   // TASK_MULTIKEY_KEYS needles with distinct keys; one is asked
    TASK_RULER_MULTIVALUE, // TASK_MULTIVALUE_VALUES needles of one key; all values are asked, in prompt order
    TASK_RULER_VT,         // VAR X1 = 12345, VAR X2 = VAR X1, ...: which variables hold 12345
    TASK_COUNT
} TaskKind;

#define TASK_MULTIKEY_KEYS 4
#define TASK_MULTIVALUE_VALUES 4
#define TASK_VT_VARIABLES 5     // one chain: a value and 4 hops
#define TASK_MAX_NEEDLES 8

// "passkey", "niah", "ruler_single", "ruler_multikey", "ruler_multivalue", "ruler_vt".
const char *task_name(TaskKind kind);


// A token stream to cut haystacks from; NULL stream = the built-in filler.
typedef struct {
    const int32_t *stream;
    int64_t stream_len;
} Haystack;

typedef struct {
    TaskKind kind;
    int64_t length;        // prompt tokens
    double depth;          // where the asked needle (TASK_NIAH...) or the first value / link goes, in [0, 1]
    uint64_t seed;
    int key_digits;        // TASK_PASSKEY: digits of the key, 1 to 9 (0: 5)
} TaskSpec;

// One inserted sentence: prompt tokens [offset, offset + len); `at` is its
// insertion point in the haystack (haystack tokens before it).
typedef struct {
    int64_t offset, len, at;
    double depth;          // the depth it was asked for
} TaskNeedle;

typedef struct {
    TaskKind kind;
    int64_t length;        // prompt tokens (exactly spec.length)
    int64_t answer_len;    // answer tokens, at tokens[length ...]
    int32_t *tokens;       // [length + answer_len]
    int64_t haystack_len;  // H
    int64_t depth_slack;   // max |at - depth·H| of any needle
    int needle_count;
    TaskNeedle needles[TASK_MAX_NEEDLES];  // in prompt order
    int asked;             // index of the needle the question is about (the first value / link)
    int64_t question_offset; // the question starts here and runs to the prompt's end
    char answer[128];      // the answer as text
} TaskSample;

// The shortest length spec's sample fits in: its needles and question plus
// one haystack token. It depends on the drawn keys, not on spec.length.
int64_t task_min_length(const TaskSpec *spec, Tokenizer *tok);
// Build the sample of spec. Fails with one line when spec.length is below
// task_min_length.
void task_generate(const TaskSpec *spec, const Haystack *hay, Tokenizer *tok, TaskSample *out);
void task_sample_free(TaskSample *s);

#endif
