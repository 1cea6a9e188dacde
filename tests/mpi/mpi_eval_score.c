// mpi_eval_score.c: the exact-match scorer of `mtrain eval` over a ring of
// context-parallel ranks (trainer/eval.h), run under mpirun by
// tests/cli/test_eval.sh; all ranks form one cp group. For every task kind and
// layout, on a random model: the answer planted as the model's own greedy
// decoding (one rank, token by token) is accepted by eval_sample_correct on
// the ring, and the same answer with its first, middle or last token changed
// is rejected — on every rank, so each rank's verdict on the answer rows it
// holds is ANDed with the others'. Rank 0 prints "ok NAME" / "FAIL NAME: why".
#include <stdlib.h>
#include <string.h>

#include "../../data/tasks.h"
#include "../../trainer/eval.h"
#include "../lib/mpi_check.h"

static void model_random(Model *m, const ModelConfig *c) {
    model_init(m, c, backend_cpu(), NULL, 1024);
    model_init_weights(m, 3);
    m->attention.block_size = 16;
    m->loss_chunk = 7;
}

// The answer of s replaced by ref's greedy decoding of its prompt.
static void plant_greedy(Model *ref, TaskSample *s, float *row) {
    int64_t L = s->length, V = ref->cfg.vocab_size;
    for (int64_t j = 0; j < s->answer_len; j++) {
        model_logits_range(ref, s->tokens, NULL, L + j, L + j - 1, 1, row);
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        s->tokens[L + j] = (int32_t)best;
    }
}

int main(int argc, char **argv) {
    const char *timeout = getenv("MTRAIN_TIMEOUT_S");
    dist_init(&dist, &argc, &argv, timeout ? atof(timeout) : 60.0);
    dist_setup(&dist, 1, dist.world_size, 0, "mpi_eval_score");
    ModelConfig c = {.vocab_size = 128, .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                     .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .rope_theta = 10000.0,
                     .rms_norm_eps = 1e-6, .tie_word_embeddings = false, .init_std = 0.5,
                     .max_position_embeddings = 4096};
    Model ref, ring;
    model_random(&ref, &c);
    model_random(&ring, &c);
    model_set_ring(&ring, &dist.cp, dist.cp.size);
    Tokenizer *tok = tokenizer_open("bytes");
    float *logits = NULL;
    for (LayoutKind layout = LAYOUT_CONTIGUOUS; layout <= LAYOUT_STRIPED; layout++) {
        EvalSplit split = {&dist.cp, layout, 16};
        for (TaskKind k = 0; k < TASK_COUNT; k++) {
            TaskSpec spec = {k, 400, 0.5, 11, 0};
            TaskSample s;
            task_generate(&spec, &(Haystack){NULL, 0}, tok, &s);
            int64_t A = s.answer_len, V = c.vocab_size;
            logits = xrealloc(logits, sizeof(float) * (size_t)(A * V));
            plant_greedy(&ref, &s, logits);
            const char *name = task_name(k), *lay = layout_name(layout);
            expect_all(eval_sample_correct(&ring, &s, &split, logits), "%s %s cp=%d: the greedy answer (%lld tokens) "
                       "is accepted", name, lay, dist.cp.size, (long long)A);
            int64_t changed[3] = {0, A / 2, A - 1};
            for (int i = 0; i < 3; i++) {
                int32_t *t = &s.tokens[s.length + changed[i]], keep = *t;
                *t = (keep + 1) % (int32_t)V;
                expect_all(!eval_sample_correct(&ring, &s, &split, logits), "%s %s cp=%d: answer token %lld of %lld "
                           "changed is rejected", name, lay, dist.cp.size, (long long)changed[i], (long long)A);
                *t = keep;
            }
            task_sample_free(&s);
        }
    }
    free(logits);
    tokenizer_close(tok);
    model_free(&ring);
    model_free(&ref);
    dist_finalize(&dist);
    return check_exit();
}
