// test_tasks.c: the evaluation task generators (data/tasks.h) generate what
// they claim: prompt exactly the asked length, needles at the asked depth on
// a sentence boundary and spelled as the task says, answer tokens equal to
// the needle's value, filler around them, determinism by seed, distinct keys
// (multi-key), values in prompt order (multi-value), a correct chain
// (variable tracking), a text-stream haystack cut exactly, and passkeys of
// 1 to 9 digits (key_digits) that take every first digit.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../data/tasks.h"
#include "../lib/check.h"

// Prompt tokens [from, to) as text (byte tokenizer: ids are bytes).
static void text_of(const TaskSample *s, int64_t from, int64_t to, char *out) {
    for (int64_t i = from; i < to; i++) out[i - from] = (char)s->tokens[i];
    out[to - from] = 0;
}

static void needle_text(const TaskSample *s, int i, char *out) {
    text_of(s, s->needles[i].offset, s->needles[i].offset + s->needles[i].len, out);
}

// The text after "for " up to " is" in a magic-number needle or question.
static void key_of(const char *text, char *key) {
    const char *k = strstr(text, "for ") + 4;
    size_t n = strcspn(k, " ?");
    memcpy(key, k, n);
    key[n] = 0;
}

// Checks that hold for every task: length, depth, needle spans, answer tokens.
static void check_common(const TaskSample *s, const TaskSpec *spec, bool filler, const char *what) {
    char buf[4096];
    EXPECT(s->length == spec->length, "%s: prompt is %lld tokens (asked %lld)", what, (long long)s->length,
           (long long)spec->length);
    int64_t needle_tokens = 0, before = 0;
    int depth_ok = 1, offsets_ok = 1, boundary_ok = 1;
    for (int i = 0; i < s->needle_count; i++) {
        const TaskNeedle *n = &s->needles[i];
        double want = n->depth * (double)s->haystack_len;
        depth_ok &= (double)n->at >= want - (double)s->depth_slack && (double)n->at <= want + (double)s->depth_slack;
        offsets_ok &= n->offset == n->at + before && (i == 0 || n->offset >= s->needles[i - 1].offset + s->needles[i - 1].len);
        // A needle never splits a filler sentence: the token before it ends one (". ").
        boundary_ok &= !filler || n->offset == 0 || s->tokens[n->offset - 1] == ' ';
        before += n->len;
        needle_tokens += n->len;
    }
    EXPECT(depth_ok, "%s: every needle within %lld tokens (half a filler sentence) of depth x %lld haystack tokens",
           what, (long long)s->depth_slack, (long long)s->haystack_len);
    EXPECT(s->depth_slack <= 48, "%s: depth slack %lld is at most half of a filler sentence", what,
           (long long)s->depth_slack);
    EXPECT(offsets_ok, "%s: needle offsets = haystack tokens before + earlier needles, in prompt order", what);
    EXPECT(boundary_ok, "%s: needles sit on sentence boundaries", what);
    int64_t question_len = s->length - s->question_offset;
    EXPECT(s->haystack_len + needle_tokens + question_len == s->length && s->haystack_len >= 1,
           "%s: haystack %lld + needles %lld + question %lld = length", what, (long long)s->haystack_len,
           (long long)needle_tokens, (long long)question_len);
    text_of(s, s->length, s->length + s->answer_len, buf);
    EXPECT(!strcmp(buf, s->answer) && s->answer_len == (int64_t)strlen(s->answer),
           "%s: answer tokens spell the answer '%s'", what, s->answer);
    EXPECT(s->asked >= 0 && s->asked < s->needle_count && s->needles[s->asked].depth == spec->depth,
           "%s: the asked needle is the one placed at the asked depth", what);
}

// The prompt minus needles and question is the filler, cycled and cut.
static void check_filler(const TaskSample *s, const char *const *sentences, int count, const char *what) {
    char *hay = malloc((size_t)s->length + 1), *want = malloc((size_t)s->length + 256);
    int64_t n = 0, from = 0;
    for (int i = 0; i <= s->needle_count; i++) {
        int64_t to = i < s->needle_count ? s->needles[i].offset : s->question_offset;
        for (int64_t t = from; t < to; t++) hay[n++] = (char)s->tokens[t];
        if (i < s->needle_count) from = s->needles[i].offset + s->needles[i].len;
    }
    hay[n] = 0;
    // Sentences from any one of them on, cut at the front: hay is the end of such a run.
    int found = 0;
    for (int first = 0; first < count && !found; first++) {
        int64_t m = 0;
        for (int k = first; m < n; k = (k + 1) % count) m += sprintf(want + m, "%s", sentences[k]);
        found = !strcmp(hay, want + (m - n));
    }
    EXPECT(found && n == s->haystack_len, "%s: the haystack is the filler sentences cycled, ending with a whole one (%lld tokens)", what,
           (long long)n);
    free(hay);
    free(want);
}

static const char *noise[] = {"The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ",
                              "There and back again. "};

// Generate a sample on the built-in filler and run the common checks; what
// (room for 96) names it in messages.
static TaskSample generated(Tokenizer *tok, TaskKind kind, int64_t L, double depth, uint64_t seed,
                            char *what) {
    snprintf(what, 96, "%s L=%lld d=%.2f", task_name(kind), (long long)L, depth);
    TaskSpec spec = {kind, L, depth, seed, 0};
    TaskSample s;
    task_generate(&spec, &(Haystack){NULL, 0}, tok, &s);
    check_common(&s, &spec, true, what);
    if (kind != TASK_NIAH) check_filler(&s, noise, 5, what);
    return s;
}

static void test_passkey(Tokenizer *tok, int64_t L, double depth, uint64_t seed) {
    char what[96], buf[512], want[384];
    TaskSample s = generated(tok, TASK_PASSKEY, L, depth, seed, what);
    needle_text(&s, 0, buf);
    snprintf(want, sizeof(want), "The pass key is %s. Remember it. %s is the pass key. ", s.answer, s.answer);
    EXPECT(s.needle_count == 1 && !strcmp(buf, want) && strlen(s.answer) == 5, "%s: needle '%s' holds the answer",
           what, buf);
    text_of(&s, s.question_offset, s.length, buf);
    EXPECT(!strcmp(buf, "What is the pass key? The pass key is "), "%s: question ends the prompt", what);
    task_sample_free(&s);
}

static void test_single(Tokenizer *tok, TaskKind kind, int64_t L, double depth, uint64_t seed) {
    char what[96], buf[512], key[64], qkey[64], want[256];
    TaskSample s = generated(tok, kind, L, depth, seed, what);
    int want_needles = kind == TASK_RULER_MULTIKEY ? TASK_MULTIKEY_KEYS : 1;
    EXPECT(s.needle_count == want_needles, "%s: %d needles", what, s.needle_count);
    needle_text(&s, s.asked, buf);
    key_of(buf, key);
    snprintf(want, sizeof(want), "The magic number for %s is %s. ", key, s.answer);
    EXPECT(!strcmp(buf, want) && strlen(s.answer) == 7, "%s: asked needle '%s' holds the 7-digit answer", what, buf);
    text_of(&s, s.question_offset, s.length, buf);
    key_of(buf, qkey);
    EXPECT(!strcmp(key, qkey), "%s: the question asks for the asked needle's key '%s'", what, key);
    if (kind == TASK_RULER_MULTIKEY) {
        char keys[TASK_MAX_NEEDLES][64];
        int distinct = 1;
        for (int i = 0; i < s.needle_count; i++) {
            needle_text(&s, i, buf);
            key_of(buf, keys[i]);
            for (int j = 0; j < i; j++) distinct &= strcmp(keys[i], keys[j]) != 0;
        }
        EXPECT(distinct, "%s: %d distinct keys", what, s.needle_count);
    }
    task_sample_free(&s);
}

static void test_multivalue(Tokenizer *tok, int64_t L, double depth, uint64_t seed) {
    char what[96], buf[512], key[64], first_key[64], joined[256];
    TaskSample s = generated(tok, TASK_RULER_MULTIVALUE, L, depth, seed, what);
    size_t n = 0;
    int same_key = 1, distinct = 1;
    char values[TASK_MAX_NEEDLES][16];
    for (int i = 0; i < s.needle_count; i++) {
        needle_text(&s, i, buf);
        key_of(buf, i ? key : first_key);
        if (i) same_key &= !strcmp(key, first_key);
        snprintf(values[i], sizeof(values[i]), "%.*s", 7, strstr(buf, " is ") + 4);
        for (int j = 0; j < i; j++) distinct &= strcmp(values[i], values[j]) != 0;
        n += (size_t)snprintf(joined + n, sizeof(joined) - n, "%s%s", i ? ", " : "", values[i]);
    }
    EXPECT(s.needle_count == TASK_MULTIVALUE_VALUES && same_key && distinct,
           "%s: %d needles of one key with distinct values", what, s.needle_count);
    EXPECT(!strcmp(joined, s.answer), "%s: answer '%s' = all values in prompt order", what, s.answer);
    task_sample_free(&s);
}

static void test_vt(Tokenizer *tok, int64_t L, double depth, uint64_t seed) {
    char what[96], buf[512], value[16] = "", names[TASK_VT_VARIABLES][8], want[64];
    TaskSample s = generated(tok, TASK_RULER_VT, L, depth, seed, what);
    int chain_ok = s.needle_count == TASK_VT_VARIABLES && s.asked == 0;
    size_t n = 0;
    char answer[128];
    for (int i = 0; chain_ok && i < s.needle_count; i++) {
        needle_text(&s, i, buf);
        if (i == 0) chain_ok &= sscanf(buf, "VAR %5s = %15[0-9]. ", names[0], value) == 2;
        else {
            char from[8];
            chain_ok &= sscanf(buf, "VAR %5s = VAR %5s. ", names[i], from) == 2 && !strcmp(from, names[i - 1]);
        }
        n += (size_t)snprintf(answer + n, sizeof(answer) - n, "%s%s", i ? " " : "", names[i]);
    }
    EXPECT(chain_ok, "%s: VAR X1 = value, then each VAR Xi = VAR Xi-1, in prompt order", what);
    EXPECT(chain_ok && !strcmp(answer, s.answer), "%s: answer '%s' lists the chain's variables", what, s.answer);
    text_of(&s, s.question_offset, s.length, buf);
    snprintf(want, sizeof(want), "assigned the value %s.", value);
    EXPECT(strstr(buf, want) != NULL, "%s: the question asks for the chain's value %s", what, value);
    task_sample_free(&s);
}

// NIAH in a token stream: the needle goes to round(depth·H) exactly and the
// haystack is consecutive stream tokens (cycled).
static void test_niah_stream(Tokenizer *tok, const Haystack *hay, int64_t L, double depth) {
    char what[96];
    snprintf(what, sizeof(what), "niah stream L=%lld d=%.2f", (long long)L, depth);
    TaskSpec spec = {TASK_NIAH, L, depth, 7, 0};
    TaskSample s;
    task_generate(&spec, hay, tok, &s);
    check_common(&s, &spec, false, what);
    int64_t want = (int64_t)(depth * (double)s.haystack_len + 0.5);
    EXPECT(s.needles[0].at == want, "%s: needle at haystack token %lld (expected %lld)", what,
           (long long)s.needles[0].at, (long long)want);
    int consecutive = 1;
    int64_t prev = -1;
    for (int64_t t = 0; t < s.question_offset; t++) {
        if (t >= s.needles[0].offset && t < s.needles[0].offset + s.needles[0].len) continue;
        int64_t pos = s.tokens[t] - 1000;  // stream token k is 1000 + k
        if (prev >= 0) consecutive &= pos == (prev + 1) % hay->stream_len;
        prev = pos;
    }
    EXPECT(consecutive, "%s: haystack tokens are consecutive stream tokens", what);
    task_sample_free(&s);
}

static int same_sample(const TaskSample *a, const TaskSample *b) {
    return a->length == b->length && a->answer_len == b->answer_len &&
           !memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)(a->length + a->answer_len));
}

int main(void) {
    Tokenizer *tok = tokenizer_open("bytes");
    const double depths[] = {0, 0.1, 0.25, 0.5, 0.77, 1};
    const int64_t lengths[] = {300, 1000, 4096};
    for (int li = 0; li < 3; li++)
        for (int di = 0; di < 6; di++) {
            uint64_t seed = 100 + (uint64_t)(li * 6 + di);
            test_passkey(tok, lengths[li], depths[di], seed);
            test_single(tok, TASK_NIAH, lengths[li], depths[di], seed);
            test_single(tok, TASK_RULER_SINGLE, lengths[li], depths[di], seed);
            test_single(tok, TASK_RULER_MULTIKEY, lengths[li], depths[di], seed);
            test_multivalue(tok, lengths[li], depths[di], seed);
            test_vt(tok, lengths[li], depths[di], seed);
        }

    int32_t stream[777];
    for (int i = 0; i < 777; i++) stream[i] = 1000 + i;
    Haystack hay = {stream, 777};
    for (int di = 0; di < 6; di++) test_niah_stream(tok, &hay, 2000, depths[di]);

    Haystack none = {NULL, 0};
    for (TaskKind k = 0; k < TASK_COUNT; k++) {
        TaskSample a, b, c;
        TaskSpec spec = {k, 600, 0.5, 42, 0}, other = {k, 600, 0.5, 43, 0};
        task_generate(&spec, &none, tok, &a);
        task_generate(&spec, &none, tok, &b);
        task_generate(&other, &none, tok, &c);
        EXPECT(same_sample(&a, &b), "%s: the same seed gives the same sample", task_name(k));
        EXPECT(!same_sample(&a, &c) && strcmp(a.answer, c.answer), "%s: another seed gives another sample and answer",
               task_name(k));
        // The shortest length leaves exactly one haystack token.
        TaskSpec tight = spec;
        tight.length = task_min_length(&spec, tok);
        TaskSample t;
        task_generate(&tight, &none, tok, &t);
        // (multi-value answers follow the prompt order, which the placement decides)
        EXPECT(t.haystack_len == 1 && (k == TASK_RULER_MULTIVALUE || !strcmp(t.answer, a.answer)),
               "%s: task_min_length %lld leaves one haystack token, same needles", task_name(k),
               (long long)tight.length);
        task_sample_free(&a);
        task_sample_free(&b);
        task_sample_free(&c);
        task_sample_free(&t);
    }
    // Keys of 1..9 digits: every digit count spelled in full, first digit 1-9
    // (all nine seen over 200 seeds), the needle holding it; 0 means 5.
    for (int digits = 0; digits <= 9; digits++) {
        int firsts = 0, right = 0;
        for (uint64_t seed = 0; seed < 200; seed++) {
            TaskSpec spec = {TASK_PASSKEY, 200, 0, seed, digits};
            TaskSample s;
            task_generate(&spec, &none, tok, &s);
            char buf[512], want[384];
            needle_text(&s, 0, buf);
            snprintf(want, sizeof(want), "The pass key is %s. Remember it. %s is the pass key. ", s.answer, s.answer);
            right += (int)strlen(s.answer) == (digits ? digits : 5) && s.answer[0] >= '1' &&
                     s.answer[strspn(s.answer, "0123456789")] == 0 && !strcmp(buf, want) && s.needles[0].offset == 0;
            firsts |= 1 << (s.answer[0] - '0');
            task_sample_free(&s);
        }
        EXPECT(right == 200 && firsts == 0x3fe,
               "passkey of %d digits: %d of 200 keys spelled right at the start, first digits %#x", digits, right, firsts);
    }
    tokenizer_close(tok);
    return check_exit();
}
