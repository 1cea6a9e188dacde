// tokenizer_bpe.c: byte-level BPE as Hugging Face `tokenizers` runs it for
// Qwen2 / Qwen2.5 / Qwen3, loaded from tokenizer.json (cJSON).
//
// Encoding a text:
//   1. added tokens (special or not) are cut out of the raw text, leftmost
//      first and the longest at a position (those marked "normalized" are cut
//      out of the normalised text instead, as `tokenizers` does);
//   2. each stretch between them is checked to be UTF-8 and NFC-normalised
//      (utf8proc);
//   3. the file's split regex (PCRE2, UTF + UCP, JIT) cuts it into pieces,
//      behaviour "Isolated": every match and every gap between matches is a piece;
//   4. each piece starts as one symbol per byte (the GPT-2 byte <-> unicode map
//      names them in the file) and adjacent pairs are merged lowest rank first,
//      leftmost first among equal ranks (a heap over pairs), with a cache of
//      pieces already seen.
// One loaded tokenizer serves several threads: each thread encodes with its
// own handle (tokenizer.h's share: its own regex match data, merge scratch
// and piece cache, read without a lock), and the handles share the tables,
// read-only, and a second piece cache behind their own, with a lock per
// stripe, so each piece is merged once for all threads.
// Decoding maps an id to the bytes its byte-level string stands for (added
// tokens: their text).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_bpe.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../dist/util.h"

#define CACHE_MAX_PIECE 256        // longer pieces are not cached
#define CACHE_STRIPES 64            // the cache's locks: the top 6 bits of a piece's hash pick its stripe
#define CACHE_MAX_ENTRIES (1 << 18) // a stripe starts over when it holds more than its share of this
#define CACHE_LOCAL_ENTRIES (1 << 16) // a handle's own cache in front of the shared one
#define DEAD_SYMBOL UINT32_MAX

// ----------------------------------------------------------------------------
// Hash maps

// Byte string -> uint64 (open addressing, linear probing); keys live in one arena.
typedef struct {
    uint64_t hash;             // 0: empty slot
    uint32_t offset, len;      // the key is arena[offset .. offset + len)
    uint64_t value;
} StrSlot;

typedef struct {
    StrSlot *slots;
    int64_t cap, count;        // cap: a power of two, at least twice count
    uint8_t *arena;
    int64_t arena_bytes, arena_cap;
} StrMap;

static uint64_t str_hash(const uint8_t *key, size_t len) {
    return XXH3_64bits(key, len) | 1;
}

static StrSlot *strmap_slot(const StrMap *m, const uint8_t *key, size_t len, uint64_t hash) {
    for (uint64_t i = hash & (uint64_t)(m->cap - 1);; i = (i + 1) & (uint64_t)(m->cap - 1)) {
        StrSlot *s = &m->slots[i];
        if (!s->hash || (s->hash == hash && s->len == len && !memcmp(m->arena + s->offset, key, len))) return s;
    }
}

static const StrSlot *strmap_find_hashed(const StrMap *m, const uint8_t *key, size_t len, uint64_t hash) {
    if (!m->count) return NULL;
    const StrSlot *s = strmap_slot(m, key, len, hash);
    return s->hash ? s : NULL;
}

static const StrSlot *strmap_find(const StrMap *m, const uint8_t *key, size_t len) {
    return strmap_find_hashed(m, key, len, str_hash(key, len));
}

static void strmap_rehash(StrMap *m, int64_t cap) {
    StrSlot *old = m->slots;
    int64_t old_cap = m->cap;
    m->slots = xcalloc((size_t)cap, sizeof(StrSlot));
    m->cap = cap;
    for (int64_t i = 0; i < old_cap; i++) {
        if (!old[i].hash) continue;
        uint64_t j = old[i].hash & (uint64_t)(cap - 1);
        while (m->slots[j].hash) j = (j + 1) & (uint64_t)(cap - 1);
        m->slots[j] = old[i];
    }
    free(old);
}

// Sets key's value (hash: str_hash of the key); returns 0 when the key was
// new, 1 when it was there.
static int strmap_put_hashed(StrMap *m, const uint8_t *key, size_t len, uint64_t hash, uint64_t value) {
    if (2 * (m->count + 1) > m->cap) strmap_rehash(m, m->cap ? 2 * m->cap : 1024);
    StrSlot *s = strmap_slot(m, key, len, hash);
    int existed = s->hash != 0;
    if (!existed) {
        if (!m->arena || m->arena_bytes + (int64_t)len > m->arena_cap) {  // an empty first key needs an arena too
            m->arena_cap = 2 * (m->arena_bytes + (int64_t)len) + 4096;
            m->arena = xrealloc(m->arena, (size_t)m->arena_cap);
        }
        CHECK(m->arena_bytes + (int64_t)len <= UINT32_MAX, "string map arena over 4 GiB");
        memcpy(m->arena + m->arena_bytes, key, len);
        *s = (StrSlot){.hash = hash, .offset = (uint32_t)m->arena_bytes, .len = (uint32_t)len};
        m->arena_bytes += (int64_t)len;
        m->count++;
    }
    s->value = value;
    return existed;
}

static int strmap_put(StrMap *m, const uint8_t *key, size_t len, uint64_t value) {
    return strmap_put_hashed(m, key, len, str_hash(key, len), value);
}

static void strmap_clear(StrMap *m) {
    memset(m->slots, 0, (size_t)m->cap * sizeof(StrSlot));
    m->count = 0;
    m->arena_bytes = 0;
}

static void strmap_free(StrMap *m) {
    free(m->slots);
    free(m->arena);
}

// (left id, right id) -> rank << 32 | merged id.
typedef struct {
    uint64_t key;              // left << 32 | right; UINT64_MAX: empty slot
    uint64_t value;
} PairSlot;

static uint64_t pair_index(uint64_t key, int64_t cap) {
    return (key * 0x9E3779B97F4A7C15ull >> 17) & (uint64_t)(cap - 1);
}

static const PairSlot *pair_find(const PairSlot *slots, int64_t cap, uint32_t left, uint32_t right) {
    uint64_t key = (uint64_t)left << 32 | right;
    for (uint64_t i = pair_index(key, cap);; i = (i + 1) & (uint64_t)(cap - 1)) {
        if (slots[i].key == key) return &slots[i];
        if (slots[i].key == UINT64_MAX) return NULL;
    }
}

// ----------------------------------------------------------------------------
// The tokenizer

typedef struct {
    uint8_t *bytes;            // its text (UTF-8)
    uint32_t len, id;
} AddedToken;

// The added tokens matched in one pass, sorted by first byte and then longest
// first: those starting with byte b are tokens[start[b] .. start[b + 1]).
typedef struct {
    AddedToken *tokens;
    int count;
    int start[257];
} AddedSet;

// A piece cache: piece bytes -> offset << 16 | count in ids; a put starts it
// over when it holds `limit` pieces.
typedef struct {
    StrMap map;
    uint32_t *ids;
    int64_t ids_count, ids_cap;
} PieceCache;

// One stripe of the shared piece cache.
typedef struct {
    pthread_mutex_t lock;
    PieceCache cache;
} CacheStripe;

// What the handles of one loaded tokenizer share besides its tables: the
// piece cache and the count of open handles (the last one closed frees all).
typedef struct {
    CacheStripe stripe[CACHE_STRIPES];
    atomic_int handles;
} BpeShared;

// A handle: the fields before `match` (the tables and `shared`) are the same
// for every handle of one loaded tokenizer, read-only once loaded; `match` and
// the fields after it are the handle's own.
typedef struct {
    Tokenizer base;
    char *path;
    StrMap vocab;              // model.vocab: piece bytes -> id
    PairSlot *merges;          // model.merges by (left, right) id
    int64_t merge_cap;
    uint32_t byte_id[256];     // id of each one-byte piece
    const uint8_t **piece;     // [vocab_size] bytes of each id (NULL: no such id)
    uint32_t *piece_len;       // [vocab_size]
    AddedSet added[2];         // [0]: cut out of the raw text, [1]: of the normalised text
    int nfc;                   // normalizer: NFC
    int ignore_merges;         // a piece that is a whole vocabulary token is not merged
    pcre2_code *split;         // the pre-tokenizer's Split regex
    BpeShared *shared;
    pcre2_match_data *match;   // this handle's
    PieceCache local;          // this handle's pieces, read without a lock before the shared cache
    // This handle's BPE scratch, one entry per byte of the piece being merged
    uint32_t *sym_id;          // id of the symbol starting at this byte (DEAD_SYMBOL: merged away)
    uint32_t *sym_next, *sym_prev;  // linked list of live symbols (n / UINT32_MAX: none)
    uint64_t *heap;            // min-heap of rank << 32 | left symbol
    int64_t scratch_cap;
} TokenizerBpe;

// ----------------------------------------------------------------------------
// The GPT-2 byte <-> unicode map: printable Latin-1 bytes stand for
// themselves, the other 68 bytes for U+0100.. in byte order.

static int byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    int n = 0;
    for (int c = 0; c < b; c++) n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    return 256 + n;
}

// Maps a byte-level string (UTF-8) to the bytes it stands for; out has room
// for strlen(s) bytes. Returns their count, or -1 for a character outside the
// 256 of the map.
static int64_t byte_level_decode(const char *s, uint8_t *out) {
    static int16_t cp_to_byte[324];
    static int ready;
    if (!ready) {
        for (int c = 0; c < 324; c++) cp_to_byte[c] = -1;
        for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp(b)] = (int16_t)b;
        ready = 1;
    }
    int64_t n = 0;
    size_t len = strlen(s);
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 0 || cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[n++] = (uint8_t)cp_to_byte[cp];
        i += (size_t)k;
    }
    return n;
}

// Offset of the first byte of s[0..n) that is not valid UTF-8, or -1.
static int64_t utf8_invalid_at(const uint8_t *s, int64_t n) {
    for (int64_t i = 0; i < n;) {
        if (s[i] < 0x80) { i++; continue; }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, n - i, &cp);
        if (k < 0) return i;
        i += k;
    }
    return -1;
}

// ----------------------------------------------------------------------------
// Loading: every problem is one line naming the file and the field.

static void bad(const TokenizerBpe *t, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void bad(const TokenizerBpe *t, const char *field, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fail("%s: %s %s", t->path, field, msg);
}

// s in quotes for a message, at most 40 of its bytes, with each byte outside
// printable ASCII (and " and \\) as \\xNN: s may be any bytes.
static const char *quote_bytes(const char *s, char *buf, size_t cap) {
    size_t n = 0;
    buf[n++] = '"';
    for (int i = 0; s[i] && i < 40 && n + 6 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') n += (size_t)snprintf(buf + n, cap - n, "\\x%02X", c);
        else buf[n++] = (char)c;
    }
    buf[n++] = '"';
    buf[n] = 0;
    return buf;
}

// A JSON value in words, for messages: missing, null, "text", 12, an object ...
static const char *describe(const cJSON *v, char *buf, size_t cap) {
    if (!v) return "missing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v) ? "true" : "false";
    if (cJSON_IsString(v)) snprintf(buf, cap, "\"%.60s\"", v->valuestring);
    else if (cJSON_IsNumber(v)) snprintf(buf, cap, "%g", v->valuedouble);
    else return cJSON_IsArray(v) ? "an array" : "an object";
    return buf;
}

static const cJSON *field(const cJSON *obj, const char *name) {
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, name) : NULL;
}

// Fails unless obj[name] is the string want.
static void expect_string(const TokenizerBpe *t, const cJSON *obj, const char *where, const char *name,
                          const char *want, const char *expected) {
    const cJSON *v = field(obj, name);
    if (cJSON_IsString(v) && !strcmp(v->valuestring, want)) return;
    char buf[96], f[128];
    snprintf(f, sizeof(f), "%s.%s", where, name);
    bad(t, f, "is %s (expected %s)", describe(v, buf, sizeof(buf)), expected);
}

// Fails unless obj[name] is want (or missing, when the default is want).
static void expect_bool(const TokenizerBpe *t, const cJSON *obj, const char *where, const char *name, int want,
                        int dflt) {
    const cJSON *v = field(obj, name);
    if ((!v && dflt == want) || (cJSON_IsBool(v) && cJSON_IsTrue(v) == want)) return;
    char buf[96], f[128];
    snprintf(f, sizeof(f), "%s.%s", where, name);
    bad(t, f, "is %s (expected %s: only that is supported)", describe(v, buf, sizeof(buf)), want ? "true" : "false");
}

// Token ids index a table of pieces, so they are bounded: 2^24 is 64 times
// the largest vocabularies in use (Qwen2.5: 151 665 tokens).
#define BPE_MAX_IDS (1 << 24)

// A whole number in [0, BPE_MAX_IDS).
static int is_id(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < BPE_MAX_IDS &&
           v->valuedouble == (double)(int64_t)v->valuedouble;
}

static void load_vocab(TokenizerBpe *t, const cJSON *vocab) {
    char buf[96];
    if (!cJSON_IsObject(vocab))
        bad(t, "model.vocab", "is %s (expected an object mapping each token to its id)", describe(vocab, buf, sizeof(buf)));
    for (const cJSON *item = vocab->child; item; item = item->next) {
        if (!is_id(item)) bad(t, "model.vocab", "token \"%.60s\" has id %s (expected a whole number in [0, %d))", item->string,
                              describe(item, buf, sizeof(buf)), BPE_MAX_IDS);
        uint8_t *bytes = xmalloc(strlen(item->string) + 1);
        int64_t len = byte_level_decode(item->string, bytes);
        if (len < 0) bad(t, "model.vocab", "token \"%.60s\" has a character outside the byte-level alphabet (expected "
                         "GPT-2 byte-level tokens)", item->string);
        if (strmap_put(&t->vocab, bytes, (size_t)len, (uint64_t)item->valuedouble))
            bad(t, "model.vocab", "token \"%.60s\" appears twice", item->string);
        free(bytes);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        const StrSlot *s = strmap_find(&t->vocab, &byte, 1);
        if (!s) bad(t, "model.vocab", "has no token for byte 0x%02x (expected all 256 single-byte tokens)", b);
        t->byte_id[b] = (uint32_t)s->value;
    }
}

// A merge's two tokens, from "a b" or ["a", "b"]; NULL when it is neither.
static int merge_parts(const cJSON *m, char **a, char **b) {
    if (cJSON_IsString(m)) {
        char *space = strchr(m->valuestring, ' ');
        if (!space || strchr(space + 1, ' ')) return 0;
        *a = xstrdup(m->valuestring);
        (*a)[space - m->valuestring] = 0;
        *b = xstrdup(space + 1);
        return 1;
    }
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsString(m->child) || !cJSON_IsString(m->child->next))
        return 0;
    *a = xstrdup(m->child->valuestring);
    *b = xstrdup(m->child->next->valuestring);
    return 1;
}

// Id of a merge's token in model.vocab; fails naming the merge otherwise.
static uint32_t merge_token_id(const TokenizerBpe *t, int64_t rank, const char *a, const char *b, const char *token) {
    uint8_t *bytes = xmalloc(strlen(token) + 1);
    int64_t len = byte_level_decode(token, bytes);
    const StrSlot *s = len < 0 ? NULL : strmap_find(&t->vocab, bytes, (size_t)len);
    free(bytes);
    char f[64];
    snprintf(f, sizeof(f), "model.merges[%" PRId64 "]", rank);
    if (!s) bad(t, f, "(\"%.60s\" + \"%.60s\"): token \"%.60s\" is not in model.vocab (expected every merge's parts "
                "and result to be tokens)", a, b, token);
    return (uint32_t)s->value;
}

static void load_merges(TokenizerBpe *t, const cJSON *merges) {
    char buf[96], f[64];
    if (!cJSON_IsArray(merges))
        bad(t, "model.merges", "is %s (expected an array of merges, \"a b\" or [\"a\", \"b\"])", describe(merges, buf, sizeof(buf)));
    int64_t count = cJSON_GetArraySize(merges);
    t->merge_cap = 1024;
    while (t->merge_cap < 2 * count) t->merge_cap *= 2;
    t->merges = xmalloc((size_t)t->merge_cap * sizeof(PairSlot));
    for (int64_t i = 0; i < t->merge_cap; i++) t->merges[i].key = UINT64_MAX;
    int64_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        char *a, *b;
        snprintf(f, sizeof(f), "model.merges[%" PRId64 "]", rank);
        if (!merge_parts(m, &a, &b)) bad(t, f, "is %s (expected \"a b\" or [\"a\", \"b\"])", describe(m, buf, sizeof(buf)));
        char *ab = xmalloc(strlen(a) + strlen(b) + 1);
        strcat(strcpy(ab, a), b);
        uint32_t left = merge_token_id(t, rank, a, b, a), right = merge_token_id(t, rank, a, b, b);
        uint32_t merged = merge_token_id(t, rank, a, b, ab);
        free(a);
        free(b);
        free(ab);
        // A pair listed twice keeps its last rank, as `tokenizers` does.
        uint64_t key = (uint64_t)left << 32 | right, i = pair_index(key, t->merge_cap);
        while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key) i = (i + 1) & (uint64_t)(t->merge_cap - 1);
        t->merges[i] = (PairSlot){.key = key, .value = (uint64_t)rank << 32 | merged};
    }
}

static void load_model(TokenizerBpe *t, const cJSON *root) {
    char buf[96];
    const cJSON *model = field(root, "model");
    if (!cJSON_IsObject(model))
        bad(t, "model", "is %s (expected an object with type \"BPE\", vocab and merges)", describe(model, buf, sizeof(buf)));
    expect_string(t, model, "model", "type", "BPE", "\"BPE\"");
    const cJSON *dropout = field(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout)) bad(t, "model.dropout", "is %s (expected null: BPE dropout is not supported)",
                                                describe(dropout, buf, sizeof(buf)));
    expect_bool(t, model, "model", "byte_fallback", 0, 0);
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = field(model, affixes[i]);
        char f[64];
        snprintf(f, sizeof(f), "model.%s", affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            bad(t, f, "is %s (expected \"\" or null: only that is supported)", describe(v, buf, sizeof(buf)));
    }
    const cJSON *ignore = field(model, "ignore_merges");
    t->ignore_merges = cJSON_IsTrue(ignore);
    load_vocab(t, field(model, "vocab"));
    load_merges(t, field(model, "merges"));
}

static int added_order(const void *pa, const void *pb) {
    const AddedToken *a = pa, *b = pb;
    if (a->bytes[0] != b->bytes[0]) return a->bytes[0] < b->bytes[0] ? -1 : 1;
    return a->len > b->len ? -1 : a->len < b->len;
}

static void load_added(TokenizerBpe *t, const cJSON *root) {
    char buf[96], f[64];
    const cJSON *list = field(root, "added_tokens");
    if (!list || cJSON_IsNull(list)) return;
    if (!cJSON_IsArray(list)) bad(t, "added_tokens", "is %s (expected an array)", describe(list, buf, sizeof(buf)));
    int count = cJSON_GetArraySize(list);
    for (int pass = 0; pass < 2; pass++) t->added[pass].tokens = xcalloc((size_t)count + 1, sizeof(AddedToken));
    int i = 0;
    for (const cJSON *a = list->child; a; a = a->next, i++) {
        snprintf(f, sizeof(f), "added_tokens[%d]", i);
        const cJSON *id = field(a, "id"), *content = field(a, "content");
        if (!is_id(id)) bad(t, f, "id is %s (expected a whole number in [0, %d))", describe(id, buf, sizeof(buf)), BPE_MAX_IDS);
        if (!cJSON_IsString(content) || !content->valuestring[0])
            bad(t, f, "content is %s (expected the token's text)", describe(content, buf, sizeof(buf)));
        int64_t invalid = utf8_invalid_at((const uint8_t *)content->valuestring, (int64_t)strlen(content->valuestring));
        if (invalid >= 0)
            bad(t, f, "content %s is not valid UTF-8 (at byte %lld; expected the token's text in UTF-8)",
                quote_bytes(content->valuestring, buf, sizeof(buf)), (long long)invalid);
        const char *flags[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++) expect_bool(t, a, f, flags[k], 0, 0);
        AddedSet *set = &t->added[cJSON_IsTrue(field(a, "normalized"))];
        set->tokens[set->count++] = (AddedToken){.bytes = (uint8_t *)xstrdup(content->valuestring),
                                                 .len = (uint32_t)strlen(content->valuestring),
                                                 .id = (uint32_t)id->valuedouble};
    }
    for (int pass = 0; pass < 2; pass++) {
        AddedSet *set = &t->added[pass];
        qsort(set->tokens, (size_t)set->count, sizeof(AddedToken), added_order);
        for (int b = 0, k = 0; b <= 256; b++) {
            while (k < set->count && set->tokens[k].bytes[0] < b) k++;
            set->start[b] = k;
        }
    }
}

static void load_normalizer(TokenizerBpe *t, const cJSON *n, const char *where) {
    char buf[96], f[128];
    if (!n || cJSON_IsNull(n)) return;
    const cJSON *type = field(n, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "NFC")) {
        t->nfc = 1;
        return;
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "Sequence"))
        bad(t, where, "type %s is not supported (expected \"NFC\", a \"Sequence\" of NFC, or null)", describe(type, buf, sizeof(buf)));
    const cJSON *list = field(n, "normalizers");
    snprintf(f, sizeof(f), "%s.normalizers", where);
    if (!cJSON_IsArray(list)) bad(t, f, "is %s (expected an array)", describe(list, buf, sizeof(buf)));
    int i = 0;
    for (const cJSON *item = list->child; item; item = item->next, i++) {
        snprintf(f, sizeof(f), "%s.normalizers[%d]", where, i);
        load_normalizer(t, item, f);
    }
}

// The split regex as PCRE2 should see it: `tokenizers` runs it with
// Oniguruma, whose \s is Unicode White_Space, while PCRE2's \s also takes
// U+180E; so \s and \S become \p{White_Space} and \P{White_Space} (valid
// inside classes too). Escaped characters and \Q..\E quotes are kept as they are.
static char *pattern_for_pcre2(const char *regex) {
    size_t n = strlen(regex);
    char *out = xmalloc(8 * n + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        if (regex[i] != '\\' || i + 1 == n) { *o++ = regex[i]; continue; }
        char c = regex[++i];
        if (c == 's' || c == 'S') {
            o += sprintf(o, "\\%c{White_Space}", c == 's' ? 'p' : 'P');
            continue;
        }
        *o++ = '\\';
        *o++ = c;
        if (c != 'Q') continue;
        const char *end = strstr(regex + i + 1, "\\E");
        size_t quoted = end ? (size_t)(end - regex) - i - 1 : n - i - 1;
        memcpy(o, regex + i + 1, quoted);
        o += quoted;
        i += quoted;
    }
    *o = 0;
    return out;
}

// The one layout supported: Sequence [Split (Regex, Isolated), ByteLevel
// (no prefix space, no regex of its own)].
static void load_pre_tokenizer(TokenizerBpe *t, const cJSON *root) {
    const char *expected = "a Sequence of a Split (Regex, Isolated) and a ByteLevel (use_regex false), as Qwen2 uses";
    char buf[96];
    const cJSON *pt = field(root, "pre_tokenizer");
    if (!cJSON_IsObject(pt)) bad(t, "pre_tokenizer", "is %s (expected %s)", describe(pt, buf, sizeof(buf)), expected);
    expect_string(t, pt, "pre_tokenizer", "type", "Sequence", expected);
    const cJSON *list = field(pt, "pretokenizers");
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != 2)
        bad(t, "pre_tokenizer.pretokenizers", "is not a list of two (expected %s)", expected);
    const cJSON *split = list->child, *byte_level = split->next;
    const char *sw = "pre_tokenizer.pretokenizers[0]", *bw = "pre_tokenizer.pretokenizers[1]";
    expect_string(t, split, sw, "type", "Split", "\"Split\"");
    expect_string(t, split, sw, "behavior", "Isolated", "\"Isolated\"");
    expect_bool(t, split, sw, "invert", 0, 0);
    const cJSON *regex = field(field(split, "pattern"), "Regex");
    if (!cJSON_IsString(regex))
        bad(t, "pre_tokenizer.pretokenizers[0].pattern.Regex", "is %s (expected the split regex)", describe(regex, buf, sizeof(buf)));
    expect_string(t, byte_level, bw, "type", "ByteLevel", "\"ByteLevel\"");
    expect_bool(t, byte_level, bw, "add_prefix_space", 0, 1);
    expect_bool(t, byte_level, bw, "use_regex", 0, 1);

    int code;
    PCRE2_SIZE offset;
    char *pattern = pattern_for_pcre2(regex->valuestring);
    t->split = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &offset, NULL);
    free(pattern);
    if (!t->split) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof(msg));
        bad(t, "pre_tokenizer.pretokenizers[0].pattern.Regex", "does not compile: %s (at offset %zu of it with \\s as "
            "\\p{White_Space})", (char *)msg, (size_t)offset);
    }
    pcre2_jit_compile(t->split, PCRE2_JIT_COMPLETE);  // without JIT, pcre2_match interprets
    t->match = pcre2_match_data_create_from_pattern(t->split, NULL);
}

static void load_decoding(TokenizerBpe *t, const cJSON *root) {
    char buf[96];
    expect_string(t, field(root, "decoder"), "decoder", "type", "ByteLevel", "\"ByteLevel\"");
    const cJSON *post = field(root, "post_processor");
    const cJSON *type = field(post, "type");
    if (post && !cJSON_IsNull(post) && !(cJSON_IsString(type) && !strcmp(type->valuestring, "ByteLevel")))
        bad(t, "post_processor.type", "is %s (expected \"ByteLevel\" or no post_processor: templates that add tokens are "
            "not supported)", describe(type, buf, sizeof(buf)));
}

// Pieces by id (model.vocab, then added tokens), vocab_size, <|endoftext|>.
static void build_pieces(TokenizerBpe *t) {
    int64_t size = 0;
    for (int64_t i = 0; i < t->vocab.cap; i++)
        if (t->vocab.slots[i].hash && (int64_t)t->vocab.slots[i].value >= size) size = (int64_t)t->vocab.slots[i].value + 1;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < t->added[pass].count; k++)
            if (t->added[pass].tokens[k].id >= size) size = t->added[pass].tokens[k].id + 1;
    t->piece = xcalloc((size_t)size, sizeof(uint8_t *));
    t->piece_len = xcalloc((size_t)size, sizeof(uint32_t));
    for (int64_t i = 0; i < t->vocab.cap; i++) {
        const StrSlot *s = &t->vocab.slots[i];
        if (!s->hash) continue;
        if (t->piece[s->value]) bad(t, "model.vocab", "gives id %" PRIu64 " to two tokens (expected one id per token)", s->value);
        t->piece[s->value] = t->vocab.arena + s->offset;
        t->piece_len[s->value] = s->len;
    }
    t->base.end_of_text = -1;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < t->added[pass].count; k++) {
            const AddedToken *a = &t->added[pass].tokens[k];
            t->piece[a->id] = a->bytes;
            t->piece_len[a->id] = a->len;
            if (a->len == 13 && !memcmp(a->bytes, "<|endoftext|>", 13)) t->base.end_of_text = a->id;
        }
    const StrSlot *eot = strmap_find(&t->vocab, (const uint8_t *)"<|endoftext|>", 13);
    if (t->base.end_of_text < 0 && eot) t->base.end_of_text = (int64_t)eot->value;
    t->base.vocab_size = size;
}

// ----------------------------------------------------------------------------
// Encoding

static void heap_push(TokenizerBpe *t, int64_t *count, uint64_t v) {
    int64_t i = (*count)++;
    for (; i > 0 && t->heap[(i - 1) / 2] > v; i = (i - 1) / 2) t->heap[i] = t->heap[(i - 1) / 2];
    t->heap[i] = v;
}

static uint64_t heap_pop(TokenizerBpe *t, int64_t *count) {
    uint64_t top = t->heap[0], last = t->heap[--*count];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *count) break;
        if (c + 1 < *count && t->heap[c + 1] < t->heap[c]) c++;
        if (t->heap[c] >= last) break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    t->heap[i] = last;
    return top;
}

// Pushes the pair (symbol i, its right neighbour) when it is a merge.
static void push_pair(TokenizerBpe *t, int64_t *heap_count, uint32_t i) {
    const PairSlot *m = pair_find(t->merges, t->merge_cap, t->sym_id[i], t->sym_id[t->sym_next[i]]);
    if (m) heap_push(t, heap_count, (m->value >> 32) << 32 | i);
}

// Merges the bytes of p[0..n) by rank and appends the resulting ids.
// Symbol i starts at byte i; a merge keeps the left symbol and unlinks the right.
static void bpe_merge(TokenizerBpe *t, const uint8_t *p, int64_t n, TokenIds *out) {
    CHECK(n < UINT32_MAX, "piece of %" PRId64 " bytes is too long", n);
    if (n > t->scratch_cap) {
        t->scratch_cap = 2 * n;
        t->sym_id = xrealloc(t->sym_id, (size_t)t->scratch_cap * sizeof(uint32_t));
        t->sym_next = xrealloc(t->sym_next, (size_t)t->scratch_cap * sizeof(uint32_t));
        t->sym_prev = xrealloc(t->sym_prev, (size_t)t->scratch_cap * sizeof(uint32_t));
        // Each merge pops one pair and pushes at most two: at most 2n pairs wait.
        t->heap = xrealloc(t->heap, (size_t)t->scratch_cap * 2 * sizeof(uint64_t));
    }
    uint32_t end = (uint32_t)n;
    for (uint32_t i = 0; i < end; i++) {
        t->sym_id[i] = t->byte_id[p[i]];
        t->sym_next[i] = i + 1;
        t->sym_prev[i] = i - 1;  // UINT32_MAX for the first
    }
    int64_t heap_count = 0;
    for (uint32_t i = 0; i + 1 < end; i++) push_pair(t, &heap_count, i);
    while (heap_count) {
        uint64_t top = heap_pop(t, &heap_count);
        uint32_t i = (uint32_t)top, r = t->sym_next[i];
        if (t->sym_id[i] == DEAD_SYMBOL || r == end) continue;
        const PairSlot *m = pair_find(t->merges, t->merge_cap, t->sym_id[i], t->sym_id[r]);
        if (!m || m->value >> 32 != top >> 32) continue;  // stale: a side has merged since
        t->sym_id[i] = (uint32_t)m->value;
        t->sym_id[r] = DEAD_SYMBOL;
        t->sym_next[i] = t->sym_next[r];
        if (t->sym_next[r] != end) t->sym_prev[t->sym_next[r]] = i;
        if (t->sym_prev[i] != UINT32_MAX) push_pair(t, &heap_count, t->sym_prev[i]);
        if (t->sym_next[i] != end) push_pair(t, &heap_count, i);
    }
    int64_t count = 0;
    for (uint32_t i = 0; i < end; i = t->sym_next[i]) count++;
    token_ids_reserve(out, count);
    for (uint32_t i = 0; i < end; i = t->sym_next[i]) out->ids[out->count++] = t->sym_id[i];
}

// Appends the cached ids of piece p[0..n) (hash: its str_hash) to out;
// returns 0 when the cache does not hold it.
static int piece_cache_get(const PieceCache *c, const uint8_t *p, int64_t n, uint64_t hash, TokenIds *out) {
    const StrSlot *hit = strmap_find_hashed(&c->map, p, (size_t)n, hash);
    if (!hit) return 0;
    int64_t count = (int64_t)(hit->value & 0xFFFF);
    token_ids_reserve(out, count);
    memcpy(out->ids + out->count, c->ids + (hit->value >> 16), (size_t)count * sizeof(uint32_t));
    out->count += count;
    return 1;
}

static void piece_cache_put(PieceCache *c, int64_t limit, const uint8_t *p, int64_t n, uint64_t hash,
                            const uint32_t *ids, int64_t count) {
    if (c->map.count >= limit) {
        strmap_clear(&c->map);
        c->ids_count = 0;
    }
    if (c->ids_count + count > c->ids_cap) {
        c->ids_cap = 2 * (c->ids_count + count) + 4096;
        c->ids = xrealloc(c->ids, (size_t)c->ids_cap * sizeof(uint32_t));
    }
    memcpy(c->ids + c->ids_count, ids, (size_t)count * sizeof(uint32_t));
    strmap_put_hashed(&c->map, p, (size_t)n, hash, (uint64_t)c->ids_count << 16 | (uint64_t)count);
    c->ids_count += count;
}

static void piece_cache_free(PieceCache *c) {
    strmap_free(&c->map);
    free(c->ids);
}

// The shared cache's stripe of a piece (the top 6 bits of its hash), locked.
static int shared_get(BpeShared *c, const uint8_t *p, int64_t n, uint64_t hash, TokenIds *out) {
    CacheStripe *s = &c->stripe[hash >> 58];
    pthread_mutex_lock(&s->lock);
    int hit = piece_cache_get(&s->cache, p, n, hash, out);
    pthread_mutex_unlock(&s->lock);
    return hit;
}

static void shared_put(BpeShared *c, const uint8_t *p, int64_t n, uint64_t hash, const uint32_t *ids, int64_t count) {
    CacheStripe *s = &c->stripe[hash >> 58];
    pthread_mutex_lock(&s->lock);
    piece_cache_put(&s->cache, CACHE_MAX_ENTRIES / CACHE_STRIPES, p, n, hash, ids, count);
    pthread_mutex_unlock(&s->lock);
}

// Appends the ids of one piece of the split.
static void encode_piece(TokenizerBpe *t, const uint8_t *p, int64_t n, TokenIds *out) {
    if (n == 1) {
        token_ids_reserve(out, 1);
        out->ids[out->count++] = t->byte_id[p[0]];
        return;
    }
    uint64_t hash = n <= CACHE_MAX_PIECE ? str_hash(p, (size_t)n) : 0;
    int64_t start = out->count;
    if (hash && piece_cache_get(&t->local, p, n, hash, out)) return;
    if (hash && shared_get(t->shared, p, n, hash, out)) {
        piece_cache_put(&t->local, CACHE_LOCAL_ENTRIES, p, n, hash, out->ids + start, out->count - start);
        return;
    }
    const StrSlot *whole = t->ignore_merges ? strmap_find(&t->vocab, p, (size_t)n) : NULL;
    if (whole) {
        token_ids_reserve(out, 1);
        out->ids[out->count++] = (uint32_t)whole->value;
        return;
    }
    bpe_merge(t, p, n, out);
    if (!hash) return;
    shared_put(t->shared, p, n, hash, out->ids + start, out->count - start);
    piece_cache_put(&t->local, CACHE_LOCAL_ENTRIES, p, n, hash, out->ids + start, out->count - start);
}

// Splits normalised text s[0..n) with the regex ("Isolated": matches and the
// gaps between them are pieces) and encodes every piece.
static void encode_split(TokenizerBpe *t, const uint8_t *s, int64_t n, TokenIds *out) {
    int64_t pos = 0, done = 0;
    while (pos < n) {
        int rc = pcre2_match(t->split, s, (PCRE2_SIZE)n, (PCRE2_SIZE)pos, PCRE2_NO_UTF_CHECK, t->match, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            fail("%s: the split regex failed at byte %" PRId64 " of a text: %s", t->path, pos, (char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->match);
        int64_t start = (int64_t)ov[0], end = (int64_t)ov[1];
        if (start > done) encode_piece(t, s + done, start - done, out);
        if (end > start) encode_piece(t, s + start, end - start, out);
        done = pos = end;
        if (end == start)  // an empty match: move on one character
            for (pos++; pos < n && (s[pos] & 0xC0) == 0x80; pos++) {}
    }
    if (done < n) encode_piece(t, s + done, n - done, out);
}

// Leftmost-longest match of a token of set in text[from..n): returns its
// start and sets *match, or returns n.
static int64_t added_find(const AddedSet *set, const uint8_t *text, int64_t n, int64_t from, const AddedToken **match) {
    *match = NULL;
    if (!set->count) return n;
    for (int64_t i = from; i < n; i++)
        for (int k = set->start[text[i]]; k < set->start[text[i] + 1]; k++) {
            const AddedToken *a = &set->tokens[k];
            if ((int64_t)a->len <= n - i && !memcmp(a->bytes, text + i, a->len)) {
                *match = a;
                return i;
            }
        }
    return n;
}

// Encodes a stretch of raw text that holds no raw-matched added token:
// checks UTF-8, normalises, cuts out the normalised added tokens, splits.
// Returns -1 or the offset of the first invalid byte.
static int64_t encode_stretch(TokenizerBpe *t, const uint8_t *text, int64_t n, TokenIds *out) {
    int64_t i = 0;
    while (i < n && text[i] < 0x80) i++;
    const uint8_t *s = text;
    uint8_t *normalised = NULL;
    if (i < n) {
        int64_t bad_at = utf8_invalid_at(text + i, n - i);
        if (bad_at >= 0) return i + bad_at;
        if (t->nfc) {
            utf8proc_ssize_t len = utf8proc_map(text, n, &normalised, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (len < 0) fail("%s: NFC normalisation failed: %s", t->path, utf8proc_errmsg(len));
            s = normalised;
            n = len;
        }
    }
    for (int64_t pos = 0; pos <= n;) {
        const AddedToken *a;
        int64_t at = added_find(&t->added[1], s, n, pos, &a);
        encode_split(t, s + pos, at - pos, out);
        if (!a) break;
        token_ids_reserve(out, 1);
        out->ids[out->count++] = a->id;
        pos = at + a->len;
    }
    free(normalised);
    return -1;
}

static int64_t bpe_encode(Tokenizer *base, const uint8_t *text, int64_t bytes, TokenIds *ids) {
    TokenizerBpe *t = (TokenizerBpe *)base;
    int64_t count = ids->count;
    for (int64_t pos = 0; pos <= bytes;) {
        const AddedToken *a;
        int64_t at = added_find(&t->added[0], text, bytes, pos, &a);
        int64_t bad_at = encode_stretch(t, text + pos, at - pos, ids);
        if (bad_at >= 0) {
            ids->count = count;
            return pos + bad_at;
        }
        if (!a) break;
        token_ids_reserve(ids, 1);
        ids->ids[ids->count++] = a->id;
        pos = at + a->len;
    }
    return -1;
}

static const uint8_t *bpe_piece(const Tokenizer *base, uint32_t id, size_t *len) {
    const TokenizerBpe *t = (const TokenizerBpe *)base;
    if (id >= base->vocab_size) return NULL;
    *len = t->piece_len[id];
    return t->piece[id];
}

// Another handle on t's tables and cache, with its own match data and scratch
// (t's own fields are not read: t's thread may be encoding).
static Tokenizer *bpe_share(Tokenizer *base) {
    TokenizerBpe *t = (TokenizerBpe *)base, *h = xcalloc(1, sizeof(*h));
    memcpy(h, t, offsetof(TokenizerBpe, match));
    h->match = pcre2_match_data_create_from_pattern(t->split, NULL);
    CHECK(h->match, "%s: out of memory for the split regex's match data", t->path);
    atomic_fetch_add(&t->shared->handles, 1);
    return &h->base;
}

static void bpe_close(Tokenizer *base) {
    TokenizerBpe *t = (TokenizerBpe *)base;
    pcre2_match_data_free(t->match);
    free(t->sym_id);
    free(t->sym_next);
    free(t->sym_prev);
    free(t->heap);
    piece_cache_free(&t->local);
    if (atomic_fetch_sub(&t->shared->handles, 1) == 1) {
        for (int i = 0; i < CACHE_STRIPES; i++) {
            pthread_mutex_destroy(&t->shared->stripe[i].lock);
            piece_cache_free(&t->shared->stripe[i].cache);
        }
        free(t->shared);
        strmap_free(&t->vocab);
        free(t->merges);
        free(t->piece);
        free(t->piece_len);
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < t->added[pass].count; k++) free(t->added[pass].tokens[k].bytes);
            free(t->added[pass].tokens);
        }
        pcre2_code_free(t->split);
        free(t->path);
    }
    free(t);
}

// The JSON parser ends a string at an escaped NUL ("<\u0000>" would become
// "<"): refuse the escape, one that is not itself an escaped backslash, with
// one line.
static void refuse_nul_escapes(const char *path, const char *text) {
    for (const char *at = strstr(text, "\\u0000"); at; at = strstr(at + 1, "\\u0000")) {
        const char *first = at;
        while (first > text && first[-1] == '\\') first--;
        if ((at - first) % 2 == 0)
            fail("%s: a string holds \\u0000 (a NUL character, at byte %td), which mtrain cannot keep (expected "
                 "strings without NUL)", path, at - text);
    }
}

Tokenizer *tokenizer_bpe_open(const char *path) {
    TokenizerBpe *t = xcalloc(1, sizeof(*t));
    t->path = xstrdup(path);
    size_t size;
    char *text = read_file(path, &size);
    refuse_nul_escapes(path, text);
    cJSON *root = cJSON_ParseWithLength(text, size);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        fail("%s: not valid JSON (near byte %td; expected a Hugging Face tokenizer.json)", path, at ? at - text : (ptrdiff_t)0);
    }
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object (expected a Hugging Face tokenizer.json)", path);
    load_model(t, root);
    load_added(t, root);
    load_normalizer(t, field(root, "normalizer"), "normalizer");
    load_pre_tokenizer(t, root);
    load_decoding(t, root);
    build_pieces(t);
    t->shared = xcalloc(1, sizeof(BpeShared));
    for (int i = 0; i < CACHE_STRIPES; i++)
        CHECK(!pthread_mutex_init(&t->shared->stripe[i].lock, NULL), "%s: cannot create the piece cache's locks", path);
    atomic_init(&t->shared->handles, 1);
    cJSON_Delete(root);
    free(text);
    t->base.name = t->path;
    t->base.encode = bpe_encode;
    t->base.piece = bpe_piece;
    t->base.share = bpe_share;
    t->base.close = bpe_close;
    return &t->base;
}
