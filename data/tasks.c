// tasks.c: the evaluation task generators (passkey, NIAH, RULER-style).
#include "tasks.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"

// The passkey / RULER noise haystack (Mohtashami & Jaggi; RULER's "noise").
static const char *noise_sentences[] = {
    "The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ", "There and back again. ",
};

// The NIAH haystack when no text stream is given: plain essay-like prose.
static const char *essay_sentences[] = {
    "Most of the work in any craft is done long before anyone sees the result. ",
    "A good tool disappears in the hand and leaves only the task in view. ",
    "The river was low that summer, and the old bridge showed its stones. ",
    "People tend to overrate what they can do in a day and underrate what they can do in a year. ",
    "The library kept its maps in wide flat drawers that smelled of dust and cedar. ",
    "When the wind turned east the harbour filled with small boats waiting for the tide. ",
    "Writing a program twice is often faster than debugging the first version for a week. ",
    "The market opened at dawn, and by noon only the bruised apples were left. ",
    "Every city has a street that used to be a stream and still floods when it rains. ",
    "A habit is easier to keep than to start, and easier to start than to explain. ",
    "The train crossed the plain for hours without passing a single town. ",
    "Good questions are rarer than good answers, and usually more useful. ",
};

static const char *key_adjectives[] = {"quiet", "amber", "rapid", "hollow", "bright", "silent", "frozen", "gentle",
                                       "crimson", "narrow", "golden", "distant", "humble", "wild", "ancient", "lucky"};
static const char *key_nouns[] = {"falcon", "harbor", "meadow", "lantern", "river", "cactus", "violin", "glacier",
                                  "compass", "orchard", "pebble", "comet", "tunnel", "willow", "beacon", "saddle"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const char *task_name(TaskKind kind) {
    static const char *names[TASK_COUNT] = {"passkey",        "niah",           "ruler_single",
                                            "ruler_multikey", "ruler_multivalue", "ruler_vt"};
    CHECK(kind >= 0 && kind < TASK_COUNT, "task kind %d", (int)kind);
    return names[kind];
}

// Token ids of one piece of text.
typedef struct {
    int32_t *ids;
    int64_t n;
} Piece;

static Piece encode(Tokenizer *tok, const char *text) {
    TokenIds ids = {0};
    int64_t bad = tok->encode(tok, (const uint8_t *)text, (int64_t)strlen(text), &ids);
    CHECK(bad < 0, "task text is not valid UTF-8 at byte %lld: %s", (long long)bad, text);
    Piece p = {xmalloc(sizeof(int32_t) * (size_t)(ids.count + 1)), ids.count};
    for (int64_t i = 0; i < ids.count; i++) p.ids[i] = (int32_t)ids.ids[i];
    free(ids.ids);
    return p;
}

// One sentence to splice into the haystack.
typedef struct {
    char text[96];
    double depth;
    Piece piece;
    int64_t at;
    int index;             // order of creation (ties at one boundary keep it)
} Insert;

typedef struct {
    Insert ins[TASK_MAX_NEEDLES];
    int count;
    char question[256];
    char answer[128];
    Rng rng;
} Draft;

static Insert *add_insert(Draft *d, double depth) {
    CHECK(d->count < TASK_MAX_NEEDLES, "too many needles");
    Insert *in = &d->ins[d->count];
    in->depth = depth;
    in->index = d->count++;
    return in;
}

// "quiet-falcon", distinct from the first `taken` keys in keys[].
static void draw_key(Rng *rng, char keys[][32], int taken) {
    for (;;) {
        snprintf(keys[taken], 32, "%s-%s", key_adjectives[rng_below(rng, COUNT(key_adjectives))],
                 key_nouns[rng_below(rng, COUNT(key_nouns))]);
        int fresh = 1;
        for (int i = 0; i < taken; i++) fresh &= strcmp(keys[i], keys[taken]) != 0;
        if (fresh) return;
    }
}

// A 7-digit number distinct from values[0..taken).
static int64_t draw_value(Rng *rng, const int64_t *values, int taken) {
    for (;;) {
        int64_t v = 1000000 + (int64_t)rng_below(rng, 9000000);
        int fresh = 1;
        for (int i = 0; i < taken; i++) fresh &= values[i] != v;
        if (fresh) return v;
    }
}

// Five capital letters, distinct from names[0..taken).
static void draw_variable(Rng *rng, char names[][8], int taken) {
    for (;;) {
        for (int c = 0; c < 5; c++) names[taken][c] = (char)('A' + rng_below(rng, 26));
        names[taken][5] = 0;
        int fresh = 1;
        for (int i = 0; i < taken; i++) fresh &= strcmp(names[i], names[taken]) != 0;
        if (fresh) return;
    }
}

// The needles, question and answer of each task (answers that depend on the
// prompt order are finished by finish_answer once the needles are placed).
static void draft_task(const TaskSpec *spec, Draft *d) {
    Rng *rng = &d->rng;
    char keys[TASK_MAX_NEEDLES][32];
    int64_t values[TASK_MAX_NEEDLES];
    switch (spec->kind) {
    case TASK_PASSKEY: {
        int digits = spec->key_digits ? spec->key_digits : 5;
        CHECK(digits >= 1 && digits <= 9, "passkey of %d digits", digits);
        int64_t lowest = 1;
        for (int i = 1; i < digits; i++) lowest *= 10;
        int64_t v = lowest + (int64_t)rng_below(rng, (uint64_t)(9 * lowest));
        snprintf(add_insert(d, spec->depth)->text, 96, "The pass key is %" PRId64 ". Remember it. %" PRId64
                 " is the pass key. ", v, v);
        snprintf(d->question, sizeof(d->question), "What is the pass key? The pass key is ");
        snprintf(d->answer, sizeof(d->answer), "%" PRId64, v);
        break;
    }
    case TASK_NIAH: case TASK_RULER_SINGLE: case TASK_RULER_MULTIKEY: {
        int n = spec->kind == TASK_RULER_MULTIKEY ? TASK_MULTIKEY_KEYS : 1;
        for (int i = 0; i < n; i++) {
            draw_key(rng, keys, i);
            values[i] = draw_value(rng, values, i);
            double depth = i == 0 ? spec->depth : rng_uniform(rng);
            snprintf(add_insert(d, depth)->text, 96, "The magic number for %s is %" PRId64 ". ", keys[i], values[i]);
        }
        snprintf(d->question, sizeof(d->question), "What is the magic number for %s? The magic number for %s is ",
                 keys[0], keys[0]);
        snprintf(d->answer, sizeof(d->answer), "%" PRId64, values[0]);
        break;
    }
    case TASK_RULER_MULTIVALUE:
        draw_key(rng, keys, 0);
        for (int i = 0; i < TASK_MULTIVALUE_VALUES; i++) {
            values[i] = draw_value(rng, values, i);
            double depth = i == 0 ? spec->depth : rng_uniform(rng);
            snprintf(add_insert(d, depth)->text, 96, "The magic number for %s is %" PRId64 ". ", keys[0], values[i]);
        }
        snprintf(d->question, sizeof(d->question),
                 "What are all the magic numbers for %s? The magic numbers for %s are ", keys[0], keys[0]);
        break;
    case TASK_RULER_VT: {
        char names[TASK_VT_VARIABLES][8];
        double depths[TASK_VT_VARIABLES];
        int64_t v = 10000 + (int64_t)rng_below(rng, 90000);
        depths[0] = spec->depth;
        for (int i = 0; i < TASK_VT_VARIABLES; i++) {
            draw_variable(rng, names, i);
            if (i) depths[i] = spec->depth + (1 - spec->depth) * rng_uniform(rng);
        }
        // Links in chain order at rising depths, so each assignment follows its source.
        for (int i = 1; i < TASK_VT_VARIABLES; i++)
            for (int j = i; j > 1 && depths[j] < depths[j - 1]; j--) {
                double t = depths[j]; depths[j] = depths[j - 1]; depths[j - 1] = t;
            }
        snprintf(add_insert(d, depths[0])->text, 96, "VAR %s = %" PRId64 ". ", names[0], v);
        for (int i = 1; i < TASK_VT_VARIABLES; i++)
            snprintf(add_insert(d, depths[i])->text, 96, "VAR %s = VAR %s. ", names[i], names[i - 1]);
        snprintf(d->question, sizeof(d->question), "Find all variables that are assigned the value %" PRId64
                 ". Answer: they are ", v);
        size_t n = 0;
        for (int i = 0; i < TASK_VT_VARIABLES; i++)
            n += (size_t)snprintf(d->answer + n, sizeof(d->answer) - n, "%s%s", i ? " " : "", names[i]);
        break;
    }
    default:
        FAIL("task kind %d", (int)spec->kind);
    }
}

// Multi-value: the values in the order the prompt shows them.
static void finish_answer(const TaskSpec *spec, Draft *d, Insert *const *order) {
    if (spec->kind != TASK_RULER_MULTIVALUE) return;
    size_t n = 0;
    for (int i = 0; i < d->count; i++) {
        const char *v = strstr(order[i]->text, " is ") + 4;
        n += (size_t)snprintf(d->answer + n, sizeof(d->answer) - n, "%s%.*s", i ? ", " : "", (int)strcspn(v, "."), v);
    }
}

// The haystack: H tokens and the sentence boundaries where needles may go
// (bounds NULL: every token boundary).
typedef struct {
    int32_t *ids;
    int64_t *bounds;
    int64_t bound_count;
    int64_t slack;
} Hay;

static void build_filler(Hay *h, int64_t H, const char **sentences, int count, int first,
                         Tokenizer *tok) {
    Piece *p = xmalloc(sizeof(Piece) * (size_t)count);
    int64_t shortest = INT64_MAX, longest = 0;
    for (int i = 0; i < count; i++) {
        p[i] = encode(tok, sentences[i]);
        if (p[i].n < shortest) shortest = p[i].n;
        if (p[i].n > longest) longest = p[i].n;
    }
    CHECK(shortest > 0, "empty filler sentence");
    // Sentences from `first` on until there are H tokens; the excess is cut
    // from the front, so every sentence ends whole and the only partial one
    // opens the prompt.
    int64_t total = 0, k = 0;
    while (total < H) total += p[(first + k++) % count].n;
    h->bounds = xmalloc(sizeof(int64_t) * (size_t)(H / shortest + 3));
    h->bound_count = 0;
    for (int64_t j = 0, pos = H - total; j < k; j++) {
        const Piece *q = &p[(first + j) % count];
        int64_t from = pos < 0 ? -pos : 0;  // tokens of q cut off
        if (from < q->n) {
            h->bounds[h->bound_count++] = pos + from;
            memcpy(h->ids + pos + from, q->ids + from, sizeof(int32_t) * (size_t)(q->n - from));
        }
        pos += q->n;
    }
    h->bounds[h->bound_count++] = H;
    h->slack = (longest + 1) / 2;
    for (int i = 0; i < count; i++) free(p[i].ids);
    free(p);
}

static void build_haystack(Hay *h, int64_t H, TaskKind kind, const Haystack *hay, Tokenizer *tok,
                           Rng *rng) {
    h->ids = xmalloc(sizeof(int32_t) * (size_t)H);
    if (kind == TASK_NIAH && hay->stream) {
        CHECK(hay->stream_len > 0, "empty haystack stream");
        int64_t start = (int64_t)rng_below(rng, (uint64_t)hay->stream_len);
        for (int64_t i = 0; i < H; i++) h->ids[i] = hay->stream[(start + i) % hay->stream_len];
        h->bounds = NULL;
        h->slack = 1;
    } else if (kind == TASK_NIAH) {
        build_filler(h, H, essay_sentences, COUNT(essay_sentences), (int)rng_below(rng, COUNT(essay_sentences)), tok);
    } else {
        build_filler(h, H, noise_sentences, COUNT(noise_sentences), 0, tok);
    }
}

// The boundary nearest to depth·H (the earlier one on a tie).
static int64_t insertion_point(const Hay *h, int64_t H, double depth) {
    double want = depth * (double)H;
    if (!h->bounds) return (int64_t)floor(want + 0.5);
    int64_t lo = 0, hi = h->bound_count - 1;  // bounds[lo] <= want < bounds[hi] after the search
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if ((double)h->bounds[mid] <= want) lo = mid;
        else hi = mid;
    }
    return want - (double)h->bounds[lo] <= (double)h->bounds[hi] - want ? h->bounds[lo] : h->bounds[hi];
}

static int by_place(const void *a, const void *b) {
    const Insert *x = *(Insert *const *)a, *y = *(Insert *const *)b;
    if (x->at != y->at) return x->at < y->at ? -1 : 1;
    return x->index - y->index;
}

// Draft spec's needles, question and answer and encode the needles and the
// question; returns how many tokens they take.
static int64_t draft_encoded(const TaskSpec *spec, Tokenizer *tok, Draft *d, Piece *question) {
    memset(d, 0, sizeof(*d));
    rng_seed(&d->rng, spec->seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(spec->kind + 1)));
    draft_task(spec, d);
    int64_t fixed = 0;
    for (int i = 0; i < d->count; i++) fixed += (d->ins[i].piece = encode(tok, d->ins[i].text)).n;
    *question = encode(tok, d->question);
    return fixed + question->n;
}

static void draft_free(Draft *d, Piece *question) {
    for (int i = 0; i < d->count; i++) free(d->ins[i].piece.ids);
    free(question->ids);
}

int64_t task_min_length(const TaskSpec *spec, Tokenizer *tok) {
    Draft d;
    Piece question;
    int64_t fixed = draft_encoded(spec, tok, &d, &question);
    draft_free(&d, &question);
    return fixed + 1;
}

void task_generate(const TaskSpec *spec, const Haystack *hay, Tokenizer *tok, TaskSample *out) {
    CHECK(spec->depth >= 0 && spec->depth <= 1, "depth %g", spec->depth);
    Draft d;
    Piece question;
    int64_t fixed = draft_encoded(spec, tok, &d, &question);
    int64_t L = spec->length, H = L - fixed;
    if (H < 1)
        fail("task %s: length %lld is too short: its needles and question take %lld tokens (expected a length of "
             "at least %lld)", task_name(spec->kind), (long long)L, (long long)fixed, (long long)fixed + 1);
    Hay h;
    build_haystack(&h, H, spec->kind, hay, tok, &d.rng);
    Insert *order[TASK_MAX_NEEDLES];
    for (int i = 0; i < d.count; i++) {
        d.ins[i].at = insertion_point(&h, H, d.ins[i].depth);
        order[i] = &d.ins[i];
    }
    qsort(order, (size_t)d.count, sizeof(order[0]), by_place);
    finish_answer(spec, &d, order);
    Piece answer = encode(tok, d.answer);

    memset(out, 0, sizeof(*out));
    out->kind = spec->kind;
    out->length = L;
    out->answer_len = answer.n;
    out->tokens = xmalloc(sizeof(int32_t) * (size_t)(L + answer.n));
    out->haystack_len = H;
    out->depth_slack = h.slack;
    out->needle_count = d.count;
    snprintf(out->answer, sizeof(out->answer), "%s", d.answer);
    int64_t pos = 0, from = 0;  // prompt tokens written, haystack tokens used
    for (int i = 0; i < d.count; i++) {
        Insert *in = order[i];
        memcpy(out->tokens + pos, h.ids + from, sizeof(int32_t) * (size_t)(in->at - from));
        pos += in->at - from;
        from = in->at;
        TaskNeedle nd = {pos, in->piece.n, in->at, in->depth};
        out->needles[i] = nd;
        if (in->index == 0) out->asked = i;
        memcpy(out->tokens + pos, in->piece.ids, sizeof(int32_t) * (size_t)in->piece.n);
        pos += in->piece.n;
    }
    memcpy(out->tokens + pos, h.ids + from, sizeof(int32_t) * (size_t)(H - from));
    pos += H - from;
    out->question_offset = pos;
    memcpy(out->tokens + pos, question.ids, sizeof(int32_t) * (size_t)question.n);
    memcpy(out->tokens + L, answer.ids, sizeof(int32_t) * (size_t)answer.n);
    CHECK(pos + question.n == L, "prompt is %lld tokens (expected %lld)", (long long)(pos + question.n), (long long)L);

    draft_free(&d, &question);
    free(answer.ids);
    free(h.ids);
    free(h.bounds);
}

void task_sample_free(TaskSample *s) {
    free(s->tokens);
    s->tokens = NULL;
}
