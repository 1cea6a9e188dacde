// test_eval_score.c: the exact-match scorer of `mtrain eval` (trainer/eval.h).
// Planted logits: the scorer must accept exactly the rows whose argmax is the
// answer (lowest id on ties). A real model: an answer planted as the model's
// own greedy decoding (one token at a time) must be accepted by the one-pass
// teacher-forced scorer, and the same answer with any one token changed
// rejected. model_logits_range must agree with the rows of model_logits.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../../data/tasks.h"
#include "../../trainer/eval.h"
#include "../lib/check.h"

static void test_planted_logits(void) {
    enum { A = 3, V = 10 };
    float logits[A * V];
    int32_t answer[A] = {4, 0, 9};
    Rng rng;
    rng_seed(&rng, 5);
    for (int i = 0; i < A * V; i++) logits[i] = (float)(rng_uniform(&rng) * 2 - 1);
    for (int r = 0; r < A; r++) logits[r * V + answer[r]] = 3.0f;
    EXPECT(answer_exact_match(logits, V, answer, A), "planted argmax on every row is accepted");
    for (int r = 0; r < A; r++) {
        int other = (answer[r] + 3) % V;
        float keep = logits[r * V + other];
        logits[r * V + other] = 3.5f;
        EXPECT(!answer_exact_match(logits, V, answer, A), "a wrong argmax in row %d is rejected", r);
        logits[r * V + other] = keep;
    }
    logits[0 * V + 2] = 3.0f;  // tie at ids 2 and 4 in row 0: the lowest id (2) is the argmax
    EXPECT(!answer_exact_match(logits, V, answer, A), "a tie goes to the lowest id (answer 4 loses to 2)");
    int32_t low[A] = {2, 0, 9};
    EXPECT(answer_exact_match(logits, V, low, A), "a tie goes to the lowest id (answer 2 wins)");
    EXPECT(answer_exact_match(logits, V, answer, 0), "an empty answer matches");
}

static int64_t argmax(const float *row, int64_t V) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (row[v] > row[best]) best = v;
    return best;
}

static void test_model_greedy(void) {
    ModelConfig c = {.vocab_size = 128, .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                     .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .rope_theta = 10000.0,
                     .rms_norm_eps = 1e-6, .tie_word_embeddings = false, .init_std = 0.5,
                     .max_position_embeddings = 4096};
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 3);
    m.attention.block_size = 16;
    m.loss_chunk = 7;
    int64_t V = c.vocab_size;
    Tokenizer *tok = tokenizer_open("bytes");
    EvalSplit one = {NULL, LAYOUT_CONTIGUOUS, 16};
    for (TaskKind k = 0; k < TASK_COUNT; k++) {
        TaskSpec spec = {k, 400, 0.5, 11, 0};
        TaskSample s;
        task_generate(&spec, &(Haystack){NULL, 0}, tok, &s);
        int64_t L = s.length, A = s.answer_len;
        // Greedy decoding, one token at a time, from the prompt alone.
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)(L + A));
        memcpy(seq, s.tokens, sizeof(int32_t) * (size_t)L);
        float *row = malloc(sizeof(float) * (size_t)V), *logits = malloc(sizeof(float) * (size_t)(A * V));
        for (int64_t j = 0; j < A; j++) {
            model_logits_range(&m, seq, NULL, L + j, L + j - 1, 1, row);
            seq[L + j] = (int32_t)argmax(row, V);
        }
        bool truth = !memcmp(seq + L, s.tokens + L, sizeof(int32_t) * (size_t)A);
        EXPECT(eval_sample_correct(&m, &s, &one, logits) == truth, "%s: the task's own answer scored as greedy decoding "
               "says (%s)", task_name(k), truth ? "correct" : "wrong");
        int32_t *answer = s.tokens + L;
        memcpy(answer, seq + L, sizeof(int32_t) * (size_t)A);
        EXPECT(eval_sample_correct(&m, &s, &one, logits), "%s: the greedy decoding planted as answer (%lld tokens) is "
               "accepted", task_name(k), (long long)A);
        int rejected = 1;
        for (int64_t j = 0; j < A; j++) {
            answer[j] = (answer[j] + 1) % (int32_t)V;
            rejected &= !eval_sample_correct(&m, &s, &one, logits);
            answer[j] = seq[L + j];
        }
        EXPECT(rejected, "%s: the planted answer with any one token changed is rejected", task_name(k));
        free(seq);
        free(row);
        free(logits);
        task_sample_free(&s);
    }
    tokenizer_close(tok);

    int64_t T = 50;
    int32_t tokens[50];
    for (int i = 0; i < T; i++) tokens[i] = (int32_t)((i * 37 + 5) % V);
    float *all = malloc(sizeof(float) * (size_t)(T * V)), *part = malloc(sizeof(float) * (size_t)(9 * V));
    model_logits(&m, tokens, NULL, T, all);
    model_logits_range(&m, tokens, NULL, T, 40, 9, part);
    EXPECT(max_rel_diff(part, all + 40 * V, 9 * V) < 1e-6, "model_logits_range [40, 49) equals rows 40..48 of "
           "model_logits");
    free(all);
    free(part);
    model_free(&m);
}

int main(void) {
    omp_set_num_threads(1);  // tiny tensors: threads would only wait on each other
    test_planted_logits();
    test_model_greedy();
    return check_exit();
}
