// checkpoint.c: writing, finding, loading and pruning training checkpoints.
#define _GNU_SOURCE
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_estimateCStreamSize (exported by the shared library)
#include <zstd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../dist/comm.h"
#include "../dist/progress.h"
#include "../dist/test_hooks.h"
#include "../model/hf_config.h"
#include "../model/hf_io.h"

// The moments are in arena order (model.c's layer_arena_order). Version 1
// files hold them in the parameter table's order (each layer's tensors in
// LayerTensor order, each right after the one before); a resume converts them.
#define OPTIMIZER_MAGIC "MTADAMW2"
#define SHARD_MAGIC "MTADAMS2"
#define OPTIMIZER_MAGIC_V1 "MTADAMW1"
#define SHARD_MAGIC_V1 "MTADAMS1"

static void join(char *out, size_t n, const char *dir, const char *name) {
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n) fail("%s/%s: path too long", dir, name);
}

// Floats of the moments compressed at once when they are streamed from the
// model (4 MiB).
#define OPTIMIZER_PIECE ((int64_t)1 << 20)

size_t checkpoint_stream_bytes(void) {
    return sizeof(float) * (size_t)OPTIMIZER_PIECE + ZSTD_CStreamOutSize() + ZSTD_estimateCStreamSize(3);
}

static void zstd_check(size_t rc, const char *path) {
    if (ZSTD_isError(rc)) fail("%s: zstd: %s", path, ZSTD_getErrorName(rc));
}

// Floats [first, first + count) of this rank's moment `part` (0 = m, 1 =
// v) [opt_count], read from the model into buf.
static const float *moment_piece(const Model *m, int part, int64_t first, int64_t count, float *buf) {
    model_read_moment(m, part, first, count, buf);
    return buf;
}

// A moments file: the 8-byte magic, the header words words [n_words], the
// XXH64 of the raw moments, then this rank's m and v [2, opt_count] as one
// zstd stream, written piece by piece (the checksum is filled in last), so
// that no second copy of the moments is held. Returns the XXH64.
static uint64_t write_moments(const char *path, const char *magic, const uint64_t *words, int n_words,
                              const Model *m, Progress *progress) {
    int64_t P = m->opt_count;
    uint64_t header[4];
    memcpy(header, words, sizeof(uint64_t) * (size_t)n_words);
    header[n_words] = 0;
    size_t header_bytes = sizeof(uint64_t) * (size_t)(n_words + 1);
    FILE *f = xfopen(path, "wb");
    xfwrite(magic, 8, f, path);
    xfwrite(header, header_bytes, f, path);
    ZSTD_CCtx *z = ZSTD_createCCtx();
    XXH64_state_t *hash = XXH64_createState();
    if (!z || !hash) fail("%s: out of memory for the compressor", path);
    zstd_check(ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, 3), path);
    zstd_check(ZSTD_CCtx_setPledgedSrcSize(z, 2 * sizeof(float) * (size_t)P), path);
    XXH64_reset(hash, 0);
    size_t out_size = ZSTD_CStreamOutSize();
    void *out = xmalloc(out_size);
    float *buf = xmalloc(sizeof(float) * (size_t)OPTIMIZER_PIECE);
    for (int part = 0; part < 2; part++) {
        for (int64_t first = 0; first < P || (part == 1 && first == 0 && P == 0); first += OPTIMIZER_PIECE) {
            int64_t count = P - first < OPTIMIZER_PIECE ? P - first : OPTIMIZER_PIECE;
            const float *piece = moment_piece(m, part, first, count, buf);
            size_t bytes = sizeof(float) * (size_t)count;
            XXH64_update(hash, piece, bytes);
            ZSTD_EndDirective mode = part == 1 && first + count == P ? ZSTD_e_end : ZSTD_e_continue;
            ZSTD_inBuffer in = {piece, bytes, 0};
            size_t left;
            do {
                ZSTD_outBuffer o = {out, out_size, 0};
                left = ZSTD_compressStream2(z, &o, &in, mode);
                zstd_check(left, path);
                xfwrite(out, o.pos, f, path);
            } while (mode == ZSTD_e_end ? left != 0 : in.pos < in.size);
            progress_add(progress, (int64_t)bytes);
        }
    }
    uint64_t digest = XXH64_digest(hash);
    header[n_words] = digest;
    if (fseek(f, 8, SEEK_SET) != 0) fail("%s: cannot seek (%s)", path, strerror(errno));
    xfwrite(header, header_bytes, f, path);
    xfclose_sync(f, path);
    free(buf);
    free(out);
    XXH64_freeState(hash);
    ZSTD_freeCCtx(z);
    return digest;
}

// The raw moments m then v [2, floats] of a moments file (write_moments)
// whose header words must equal expect [n_words] (named by `what`, e.g.
// "parameter count, first, count"); *digest gets its XXH64, checked.
static float *read_moments(const char *path, const char *magic, const uint64_t *expect, int n_words,
                           const char *what, int64_t floats, uint64_t *digest) {
    size_t file_bytes;
    char *file = read_file(path, &file_bytes);
    uint64_t header[4];
    size_t header_bytes = sizeof(uint64_t) * (size_t)(n_words + 1);
    if (file_bytes < 8 + header_bytes || memcmp(file, magic, 8))
        fail("%s: not an mtrain optimizer state of the expected version (bad magic or truncated; expected %s)", path,
             magic);
    memcpy(header, file + 8, header_bytes);
    if (memcmp(header, expect, sizeof(uint64_t) * (size_t)n_words))
        fail("%s: header (%s) is %" PRIu64 "%s (expected %" PRIu64 "%s: another model or sharding)", path, what,
             header[0], n_words > 1 ? ", ..." : "", expect[0], n_words > 1 ? ", ..." : "");
    size_t bytes = 2 * sizeof(float) * (size_t)floats;
    float *host = xmalloc(bytes ? bytes : 1);
    size_t got = ZSTD_decompress(host, bytes, file + 8 + header_bytes, file_bytes - 8 - header_bytes);
    if (ZSTD_isError(got) || got != bytes)
        fail("%s: damaged (zstd: %s)", path, ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size");
    *digest = header[n_words];
    if (XXH64(host, bytes, 0) != *digest) fail("%s: checksum mismatch (file is damaged)", path);
    free(file);
    return host;
}

// The optimizer file at path has the XXH64 (got) that state.json records: the
// optimizer state of the same checkpoint.
// recorded: NULL for a checkpoint whose state.json records no optimizer
// digest (written by an mtrain before it did): nothing to check against.
static void check_optimizer_digest(const char *path, uint64_t got, const uint64_t *recorded) {
    if (recorded && got != *recorded)
        fail("%s: XXH64 %016" PRIx64 ", state.json records %016" PRIx64 " (the optimizer state of another "
             "checkpoint)", path, got, *recorded);
}

// Whether the moments file at path is of version 1 (its magic ends in '1').
static bool moments_version1(const char *path) {
    char magic[8] = {0};
    FILE *f = xfopen(path, "rb");
    size_t got = fread(magic, 1, sizeof(magic), f);
    if (ferror(f)) fail("%s: read error (%s)", path, strerror(errno));
    fclose(f);
    return got == sizeof(magic) && magic[7] == '1';
}

// The moments m and v [total_params] of a version 1 file (the parameter
// table's order, each tensor right after the one before it), each tensor's
// moved to its arena offset; path names the file in the note.
static void set_moments_version1(Model *m, const float *host_m, const float *host_v, const char *path) {
    int64_t old_offset = 0;
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        model_set_moments(m, p->offset, host_m + old_offset, host_v + old_offset, p->numel);
        old_offset += p->numel;
    }
    CHECK(old_offset == m->total_params, "version 1 moments: %lld floats laid out, %lld expected",
          (long long)old_offset, (long long)m->total_params);
    printf("note: %s: the optimizer state was converted from version 1 (moments moved to the arena order)\n", path);
}

// optimizer.zst, whose moments must have the XXH64 state.json records.
static void read_optimizer(const char *path, Model *m, const uint64_t *recorded) {
    uint64_t P = (uint64_t)m->total_params, digest;
    bool version1 = moments_version1(path);
    float *host = read_moments(path, version1 ? OPTIMIZER_MAGIC_V1 : OPTIMIZER_MAGIC, &P, 1, "parameter count",
                               m->total_params, &digest);
    check_optimizer_digest(path, digest, recorded);
    model_alloc_optimizer(m);
    if (version1) {
        set_moments_version1(m, host, host + m->total_params, path);
    } else {
        model_set_moments(m, 0, host, host + m->total_params, m->total_params);
    }
    free(host);
}

// XXH64 of a whole file, read in pieces of 1 MiB.
static uint64_t file_xxh64(const char *path) {
    FILE *f = xfopen(path, "rb");
    XXH64_state_t *hash = XXH64_createState();
    if (!hash) fail("%s: out of memory for the checksum", path);
    XXH64_reset(hash, 0);
    size_t piece = (size_t)1 << 20;
    char *buf = xmalloc(piece);
    for (size_t got; (got = fread(buf, 1, piece, f)) > 0;) XXH64_update(hash, buf, got);
    if (ferror(f)) fail("%s: read error (%s)", path, strerror(errno));
    fclose(f);
    uint64_t digest = XXH64_digest(hash);
    XXH64_freeState(hash);
    free(buf);
    return digest;
}

// The run fingerprint: XXH64 of config_run_keys' text (run_keys [RUN_KEYS_BYTES]).
#define RUN_KEYS_BYTES 16384
static uint64_t run_fingerprint(const Config *cfg, char *run_keys) {
    size_t n = config_run_keys(cfg, run_keys, RUN_KEYS_BYTES);
    return XXH64(run_keys, n, 0);
}

static void add_hex(cJSON *root, const char *key, uint64_t value) {
    char text[24];
    snprintf(text, sizeof(text), "%016" PRIx64, value);
    cJSON_AddStringToObject(root, key, text);
}

// state.json: the TrainState, the XXH64 of model.safetensors, the optimizer
// file's name (optimizer.zst or optimizer.index.json) and digest, and the
// run's fingerprint with the keys it hashes.
static void write_state(const char *path, const TrainState *s, uint64_t model_hash, const char *optimizer,
                        uint64_t optimizer_hash, const Config *cfg) {
    char *run_keys = xmalloc(RUN_KEYS_BYTES);
    uint64_t fingerprint = run_fingerprint(cfg, run_keys);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)s->step);
    add_hex(root, "run_id", s->run_id);
    cJSON_AddNumberToObject(root, "tokens_seen", (double)s->tokens_seen);
    cJSON_AddNumberToObject(root, "data_cursor", (double)s->data_cursor);
    cJSON_AddNumberToObject(root, "bad_steps_in_a_row", (double)s->bad_in_a_row);
    cJSON_AddStringToObject(root, "grid", s->grid);
    char word[4][24];
    for (int i = 0; i < 4; i++) snprintf(word[i], sizeof(word[i]), "%016" PRIx64, s->rng.s[i]);
    const char *words[4] = {word[0], word[1], word[2], word[3]};
    cJSON_AddItemToObject(root, "rng", cJSON_CreateStringArray(words, 4));
    add_hex(root, "model_xxh64", model_hash);
    cJSON_AddStringToObject(root, "optimizer", optimizer);
    add_hex(root, "optimizer_xxh64", optimizer_hash);
    add_hex(root, "fingerprint", fingerprint);
    cJSON_AddStringToObject(root, "run_keys", run_keys);
    char *text = cJSON_Print(root);
    write_file_atomic(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
    free(run_keys);
}

// Counts are exact in a JSON double up to 2^53.
#define STATE_COUNT_MAX 9007199254740992.0

static int64_t state_int(const cJSON *root, const char *key, const char *path) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(item)) fail("%s: field '%s' is missing or not a number (expected a count)", path, key);
    double v = item->valuedouble;
    if (!(v >= 0 && v <= STATE_COUNT_MAX) || v != floor(v))
        fail("%s: field '%s' is %g (expected a whole count in [0, 2^53])", path, key, v);
    return (int64_t)v;
}

// A JSON item that is a string of 1 to 16 hex digits into *value (strtoull
// alone would take "-1" and leading blanks).
static bool hex_word(const cJSON *item, uint64_t *value) {
    if (!cJSON_IsString(item)) return false;
    size_t n = strspn(item->valuestring, "0123456789abcdefABCDEF");
    if (n == 0 || n > 16 || item->valuestring[n]) return false;
    *value = strtoull(item->valuestring, NULL, 16);
    return true;
}

static uint64_t state_hex(const cJSON *root, const char *key, const char *path) {
    uint64_t value;
    if (!hex_word(cJSON_GetObjectItemCaseSensitive(root, key), &value))
        fail("%s: field '%s' is missing or not a hex word (expected 1 to 16 hex digits)", path, key);
    return value;
}

// The JSON object in the file at path, or NULL when it is not a readable file
// holding one.
static cJSON *parse_json_file(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || access(path, R_OK) != 0) return NULL;
    char *text = read_file(path, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (cJSON_IsObject(root)) return root;
    cJSON_Delete(root);
    return NULL;
}

static cJSON *read_state_json(const char *path) {
    if (access(path, F_OK) != 0) fail("%s: cannot open (%s)", path, strerror(errno));
    cJSON *root = parse_json_file(path);
    if (!root) fail("%s: not a JSON object (expected a file holding one)", path);
    return root;
}

// optimizer.SHARD-of-SHARDS.zst (shard counted from 0, 5 digits each).
static void shard_file(char *out, size_t n, int shard, int shards) {
    snprintf(out, n, "optimizer.%05d-of-%05d.zst", shard, shards);
}

// optimizer.index.json: the parameter count and, per shard in arena order,
// its file, first float, float count and XXH64 (digests [shards]). Returns
// the XXH64 of the file.
static uint64_t write_shard_index(const char *path, const Model *m, int shards, const uint64_t *digests) {
    int64_t size = model_shard_size(m, shards);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "parameters", (double)m->total_params);
    cJSON *list = cJSON_AddArrayToObject(root, "shards");
    for (int k = 0; k < shards; k++) {
        int64_t first = size * k < m->total_params ? size * k : m->total_params;
        int64_t count = m->total_params - first < size ? m->total_params - first : size;
        char name[64];
        shard_file(name, sizeof(name), k, shards);
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "file", name);
        cJSON_AddNumberToObject(item, "first", (double)first);
        cJSON_AddNumberToObject(item, "count", (double)count);
        add_hex(item, "xxh64", digests[k]);
        cJSON_AddItemToArray(list, item);
    }
    char *text = cJSON_Print(root);
    write_file_atomic(path, text, strlen(text));
    uint64_t digest = XXH64(text, strlen(text), 0);
    free(text);
    cJSON_Delete(root);
    return digest;
}

// The moments of a sharded checkpoint (optimizer.index.json in dir): the
// shards must tile [0, total_params) in order; each rank reads, checks and
// keeps only the shards that overlap its own range. Version 1 shards (the
// first one's magic says) hold another order: each rank reads them all into
// whole m and v [total_params] and converts them (set_moments_version1).
static void read_sharded_optimizer(const char *dir, const char *index_path, Model *m) {
    cJSON *root = read_state_json(index_path);
    if (state_int(root, "parameters", index_path) != m->total_params)
        fail("%s: holds %lld parameters' moments (expected %lld)", index_path,
             (long long)state_int(root, "parameters", index_path), (long long)m->total_params);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "shards");
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < 1)
        fail("%s: field 'shards' is missing or empty (expected a list of shard files)", index_path);
    model_alloc_optimizer(m);
    int64_t next = 0;
    bool version1 = false;
    float *whole = NULL;   // version 1: m then v [2, total_params]
    const cJSON *item;
    cJSON_ArrayForEach(item, list) {
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(item, "file");
        if (!cJSON_IsObject(item) || !cJSON_IsString(file) || strchr(file->valuestring, '/') || !file->valuestring[0])
            fail("%s: a shard without a plain 'file' name", index_path);
        int64_t first = state_int(item, "first", index_path), count = state_int(item, "count", index_path);
        uint64_t listed = state_hex(item, "xxh64", index_path), digest;
        if (first != next || count > m->total_params - first)
            fail("%s: shard %s covers [%lld, %lld) (expected to start at %lld, within %lld parameters)", index_path,
                 file->valuestring, (long long)first, (long long)(first + count), (long long)next,
                 (long long)m->total_params);
        next = first + count;
        char path[4096];
        join(path, sizeof(path), dir, file->valuestring);
        if (first == 0 && moments_version1(path)) {
            version1 = true;
            whole = xmalloc(2 * sizeof(float) * (size_t)m->total_params + 1);
        }
        if (!version1 && (next <= m->opt_begin || first >= m->opt_begin + m->opt_count)) continue;
        uint64_t expect[3] = {(uint64_t)m->total_params, (uint64_t)first, (uint64_t)count};
        float *host = read_moments(path, version1 ? SHARD_MAGIC_V1 : SHARD_MAGIC, expect, 3,
                                   "parameter count, first, count", count, &digest);
        if (digest != listed)
            fail("%s: XXH64 %016" PRIx64 ", %s records %016" PRIx64 " (a shard of another checkpoint)", path, digest,
                 index_path, listed);
        if (version1) {
            memcpy(whole + first, host, sizeof(float) * (size_t)count);
            memcpy(whole + m->total_params + first, host + count, sizeof(float) * (size_t)count);
        } else {
            model_set_moments(m, first, host, host + count, count);
        }
        free(host);
    }
    if (next != m->total_params)
        fail("%s: the shards cover %lld of %lld parameters", index_path, (long long)next, (long long)m->total_params);
    if (version1) set_moments_version1(m, whole, whole + m->total_params, index_path);
    free(whole);
    cJSON_Delete(root);
}

// The sequence length in a state.json's run_keys text (its train.seq_len
// line), 0 when it has none.
static int64_t run_keys_seq_len(const char *run_keys) {
    static const char key[] = "train.seq_len=";
    for (const char *line = run_keys; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (!strncmp(line, key, sizeof(key) - 1)) return strtoll(line + sizeof(key) - 1, NULL, 10);
    return 0;
}

// The TrainState in state.json, and the optimizer file it records (optimizer
// [32]: optimizer.zst or optimizer.index.json) with that file's digest. The
// fields must agree with each other: tokens_seen = data_cursor x
// train.seq_len (of its run_keys), bad_steps_in_a_row <= step.
static void read_state(const char *path, TrainState *s, char *optimizer, uint64_t *optimizer_hash) {
    cJSON *root = read_state_json(path);
    s->step = state_int(root, "step", path);
    s->tokens_seen = state_int(root, "tokens_seen", path);
    s->data_cursor = state_int(root, "data_cursor", path);
    s->bad_in_a_row = state_int(root, "bad_steps_in_a_row", path);
    s->run_id = state_hex(root, "run_id", path);
    const cJSON *grid = cJSON_GetObjectItemCaseSensitive(root, "grid");
    snprintf(s->grid, sizeof(s->grid), "%s", cJSON_IsString(grid) ? grid->valuestring : "");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4) fail("%s: field 'rng' must be 4 hex words", path);
    for (int i = 0; i < 4; i++)
        if (!hex_word(cJSON_GetArrayItem(rng, i), &s->rng.s[i]))
            fail("%s: field 'rng' must be 4 hex words (1 to 16 hex digits each)", path);
    state_hex(root, "model_xxh64", path);
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    if (!file && !cJSON_GetObjectItemCaseSensitive(root, "optimizer_xxh64")) {
        optimizer[0] = '\0';   // an older checkpoint's: no optimizer file named, nothing to verify it by
    } else if (!cJSON_IsString(file) ||
               (strcmp(file->valuestring, "optimizer.zst") && strcmp(file->valuestring, "optimizer.index.json"))) {
        fail("%s: field 'optimizer' is missing or another name (expected \"optimizer.zst\" or "
             "\"optimizer.index.json\")", path);
    } else {
        snprintf(optimizer, 32, "%s", file->valuestring);
        *optimizer_hash = state_hex(root, "optimizer_xxh64", path);
    }
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(root, "run_keys");
    int64_t seq_len = cJSON_IsString(keys) ? run_keys_seq_len(keys->valuestring) : 0;
    if (seq_len > 0 && s->tokens_seen != s->data_cursor * seq_len)
        fail("%s: tokens_seen %lld is not data_cursor %lld x train.seq_len %lld (expected fields written together: "
             "the file was edited or damaged)", path, (long long)s->tokens_seen, (long long)s->data_cursor,
             (long long)seq_len);
    if (s->bad_in_a_row > s->step)
        fail("%s: bad_steps_in_a_row %lld is more than step %lld (expected at most the steps made)", path,
             (long long)s->bad_in_a_row, (long long)s->step);
    cJSON_Delete(root);
}

// The value of line's key ("key=" of key_len bytes) in `lines` ("key=value\n"
// lines), or NULL.
static const char *key_value(const char *lines, const char *line, size_t key_len) {
    for (const char *t = lines; t && *t; t = strchr(t, '\n') ? strchr(t, '\n') + 1 : NULL)
        if (!strncmp(t, line, key_len)) return t + key_len;
    return NULL;
}

// Appends to diff "key CHECKPOINT -> RUN" for every line of `ours` whose key
// has another value (or none) in `theirs` ("key=value\n" lines). A key that
// `theirs` lacks (a key of a later mtrain) is no change when ours holds its
// default (the line as in `defaults`); a key only `theirs` has (a key this
// mtrain no longer hashes) is none either.
static void describe_key_changes(const char *theirs, const char *ours, const char *defaults, char *diff,
                                 size_t diff_size) {
    size_t used = strlen(diff);
    for (const char *line = ours; *line;) {
        const char *eq = strchr(line, '='), *nl = strchr(line, '\n');
        if (!eq || !nl) break;
        size_t key_len = (size_t)(eq - line) + 1, value_len = (size_t)(nl - eq) - 1;
        const char *other = key_value(theirs, line, key_len), *fallback = key_value(defaults, line, key_len);
        if (!other && fallback && strcspn(fallback, "\n") == value_len && !strncmp(fallback, eq + 1, value_len)) {
            line = nl + 1;
            continue;
        }
        size_t other_len = other ? strcspn(other, "\n") : 0;
        if ((!other || other_len != value_len || strncmp(other, eq + 1, value_len)) && used < diff_size)
            used += (size_t)snprintf(diff + used, diff_size - used, "%s%.*s %.*s -> %.*s", used ? ", " : "",
                                     (int)(key_len - 1), line, other ? (int)other_len : 6, other ? other : "(none)",
                                     (int)value_len, eq + 1);
        line = nl + 1;
    }
}

bool checkpoint_same_run(const char *dir, const Config *cfg, char *diff, size_t diff_size) {
    char path[4096];
    join(path, sizeof(path), dir, "state.json");
    cJSON *root = read_state_json(path);
    char *ours = xmalloc(RUN_KEYS_BYTES);
    uint64_t fingerprint = run_fingerprint(cfg, ours);
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(root, "run_keys");
    bool same = state_hex(root, "fingerprint", path) == fingerprint;
    diff[0] = '\0';
    if (!same) {   // written by another mtrain version: the same run when no key of it changed
        if (!cJSON_IsString(keys)) fail("%s: field 'run_keys' is missing or not a string", path);
        Config *base = xmalloc(sizeof(Config));
        config_defaults(base);
        char *defaults = xmalloc(RUN_KEYS_BYTES);
        config_run_keys(base, defaults, RUN_KEYS_BYTES);
        describe_key_changes(keys->valuestring, ours, defaults, diff, diff_size);
        same = !diff[0];
        free(defaults);
        free(base);
    }
    free(ours);
    cJSON_Delete(root);
    return same;
}

// "step_00001234" -> 1234, "step_123456789" -> 123456789 (the names
// step_path makes: at least 8 digits, no leading zero beyond them, at most 18);
// -1 for any other name (temporaries included).
static int64_t step_of(const char *name) {
    size_t digits = strlen(name) - 5;
    if (strncmp(name, "step_", 5) || digits < 8 || digits > 18 || strspn(name + 5, "0123456789") != digits ||
        (digits > 8 && name[5] == '0'))
        return -1;
    return strtoll(name + 5, NULL, 10);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    if (remove(path) != 0) fail("%s: cannot remove (%s)", path, strerror(errno));
    return 0;
}

static void remove_tree(const char *path) {
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) fail("%s: cannot remove", path);
}

// Remove a checkpoint folder so that a kill midway never leaves part of it
// under its final name: renamed to NAME.del.PID first (removed by
// checkpoint_recover_dir if this process dies), then deleted (the fault
// point prune in between).
static void remove_checkpoint(const char *path, double timeout_s) {
    char doomed[4200];
    snprintf(doomed, sizeof(doomed), "%s.del.%d", path, (int)getpid());
    rename_into_place(path, doomed);
    test_fault("prune", 0, timeout_s);
    remove_tree(doomed);
}

// The steps of dir's step_XXXXXXXX folders [*count], unsorted (malloc'd).
static int64_t *list_steps(const char *dir, int *count) {
    DIR *d = opendir(dir);
    *count = 0;
    if (!d) {
        if (errno == ENOENT) return NULL;
        fail("%s: cannot open directory (%s)", dir, strerror(errno));
    }
    int64_t *steps = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of(e->d_name);
        if (s < 0) continue;
        steps = xrealloc(steps, sizeof(int64_t) * (size_t)(*count + 1));
        steps[(*count)++] = s;
    }
    closedir(d);
    return steps;
}

static void step_path(char *out, size_t size, const char *dir, int64_t step) {
    if ((size_t)snprintf(out, size, "%s/step_%08lld", dir, (long long)step) >= size) fail("%s: path too long", dir);
}

// A checkpoint folder is complete when it holds every file the writer puts
// in it (state.json last), with optimizer.zst or, sharded, optimizer.index.json
// (written after every shard); the renamed-in folder always is, unless damaged.
static bool checkpoint_complete(const char *dir) {
    static const char *const files[] = {"model.safetensors", "config.json", "run.yaml", "state.json"};
    char path[4096];
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        join(path, sizeof(path), dir, files[i]);
        if (access(path, R_OK) != 0) return false;
    }
    join(path, sizeof(path), dir, "optimizer.zst");
    if (access(path, R_OK) == 0) return true;
    join(path, sizeof(path), dir, "optimizer.index.json");
    return access(path, R_OK) == 0;
}

// The run id in the state.json of checkpoint folder dir into *run; false
// when state.json is not a JSON object with one (damaged).
static bool checkpoint_run(const char *dir, uint64_t *run) {
    char path[4096];
    join(path, sizeof(path), dir, "state.json");
    cJSON *root = parse_json_file(path);
    bool readable = root && hex_word(cJSON_GetObjectItemCaseSensitive(root, "run_id"), run);
    cJSON_Delete(root);
    return readable;
}

static void warn_unreadable(const char *dir) {
    fprintf(stderr, "warning: %s: state.json is not a JSON object with a run_id (a damaged checkpoint): skipped\n",
            dir);
}

// Keep the run's newest `keep` complete checkpoints and every one whose step
// is a multiple of keep_every (when > 0); remove the rest, but never the
// checkpoint just written (step `written`) nor the folder the run resumed
// from. Incomplete folders, damaged ones (a warning, once a process) and other
// runs' checkpoints are neither counted nor removed.
static void prune(const CheckpointConfig *c, uint64_t run, int64_t written, const char *resumed_from,
                  double timeout_s) {
    static bool warned;
    int n;
    int64_t *steps = list_steps(c->dir, &n);
    char path[4096];
    for (int i = 0; i < n; i++) {
        step_path(path, sizeof(path), c->dir, steps[i]);
        uint64_t theirs = 0;
        bool complete = checkpoint_complete(path), readable = complete && checkpoint_run(path, &theirs);
        if (complete && !readable && !warned) {
            warn_unreadable(path);
            warned = true;
        }
        if (!readable || theirs != run) steps[i--] = steps[--n];
    }
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        bool permanent = c->keep_every > 0 && steps[i] % c->keep_every == 0;
        if (newer < c->keep || permanent || steps[i] == written) continue;
        step_path(path, sizeof(path), c->dir, steps[i]);
        if (!same_file(path, resumed_from)) remove_checkpoint(path, timeout_s);
    }
    free(steps);
}

// Whether `name` is NAME.KIND.PID of a temporary that mtrain itself makes in
// a checkpoint.dir (checkpoints: step_N.tmp|old|del.PID, latest.tmp.PID) or
// in a log.dir (metrics.jsonl.tmp.PID); *kind gets KIND ("tmp", "old" or
// "del") and *pid the PID.
static bool own_leftover(const char *name, bool checkpoints, const char **kind, int *pid) {
    static const char *const kinds[] = {"tmp", "old", "del"};
    const char *dot = strrchr(name, '.');
    if (!dot || dot - name < 5 || dot[-4] != '.') return false;
    char *end;
    long id = strtol(dot + 1, &end, 10);
    if (*end || end == dot + 1 || dot[1] == '0' || id <= 0 || id > INT_MAX) return false;
    char base[4096];
    size_t base_len = (size_t)(dot - 4 - name);
    if (base_len >= sizeof(base)) return false;
    memcpy(base, name, base_len);
    base[base_len] = '\0';
    *pid = (int)id;
    for (int k = 0; k < 3; k++) {
        if (strncmp(dot - 3, kinds[k], 3)) continue;
        *kind = kinds[k];
        if (checkpoints) return step_of(base) >= 0 || (k == 0 && !strcmp(base, "latest"));
        return k == 0 && !strcmp(base, "metrics.jsonl");
    }
    return false;
}

void checkpoint_recover_dir(const char *dir, bool checkpoints) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return;
        fail("%s: cannot open directory (%s)", dir, strerror(errno));
    }
    for (struct dirent *e; (e = readdir(d));) {
        const char *kind;
        int pid;
        // (This process has not written yet: a leftover with its own id is an earlier process's.)
        if (!own_leftover(e->d_name, checkpoints, &kind, &pid) || other_process_alive(pid)) continue;
        char path[4096], final_path[4096];
        join(path, sizeof(path), dir, e->d_name);
        join(final_path, sizeof(final_path), dir, e->d_name);
        *strrchr(final_path, '.') = '\0';  // NAME.KIND.PID -> NAME
        *strrchr(final_path, '.') = '\0';
        if (!strcmp(kind, "old") && access(final_path, F_OK) != 0) {
            rename_into_place(path, final_path);
            fprintf(stderr, "warning: %s: restored from %s (a replacement was interrupted)\n", final_path, path);
        } else {
            remove_tree(path);
            fprintf(stderr, "warning: %s: removed (left by process %d, which is gone)\n", path, pid);
        }
    }
    closedir(d);
    fsync_dir(dir);
}

// Take the exclusive lock dir/mtrain.lock (flock, held until the process
// exits) and write the holder's "pid PID on HOST" into it; fail with one line
// naming the holder when another process has it.
static void lock_dir(const char *dir) {
    char path[4096], holder[256] = "", host[128] = "?";
    make_dirs(dir);
    join(path, sizeof(path), dir, "mtrain.lock");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail("%s: cannot open (%s)", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) fail("%s: cannot lock (%s)", path, strerror(errno));
        ssize_t got = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[got > 0 ? got : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        fail("%s: in use by another mtrain run (%s, holding %s): wait for it to end, or use another folder", dir,
             holder[0] ? holder : "holder unknown", path);
    }
    gethostname(host, sizeof(host) - 1);
    int n = snprintf(holder, sizeof(holder), "pid %d on %s\n", (int)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, (size_t)n, 0) != n)
        fail("%s: cannot write (%s)", path, strerror(errno));
}

void checkpoint_lock_dirs(const Config *cfg) {
    lock_dir(cfg->checkpoint.dir);
    make_dirs(cfg->log.dir);
    if (!same_file(cfg->log.dir, cfg->checkpoint.dir)) lock_dir(cfg->log.dir);
}

uint64_t checkpoint_new_run_id(void) {
    uint64_t id = 0;
    while (id == 0)
        if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) fail("getrandom: %s", strerror(errno));
    return id;
}

// Write dir/latest naming the checkpoint folder `name`.
static void write_latest(const char *dir, const char *name) {
    char path[4096], text[64];
    join(path, sizeof(path), dir, "latest");
    int n = snprintf(text, sizeof(text), "%s\n", name);
    write_file_atomic(path, text, (size_t)n);
}

// This rank's moments into tmp_dir: under ZeRO-1 (over) its shard file,
// then every rank's XXH64 gathered into digests [over->size] (the wait for
// every shard, under over's time limit); else optimizer.zst, returning the
// XXH64 of its moments.
static uint64_t write_optimizer(const char *tmp_dir, const Model *m, const Comm *over, uint64_t *digests,
                            Progress *progress) {
    char name[64], path[4096];
    if (!over) {
        uint64_t P = (uint64_t)m->total_params;
        join(path, sizeof(path), tmp_dir, "optimizer.zst");
        return write_moments(path, OPTIMIZER_MAGIC, &P, 1, m, progress);
    }
    shard_file(name, sizeof(name), over->rank, over->size);
    join(path, sizeof(path), tmp_dir, name);
    uint64_t words[3] = {(uint64_t)m->total_params, (uint64_t)m->opt_begin, (uint64_t)m->opt_count};
    uint64_t digest = write_moments(path, SHARD_MAGIC, words, 3, m, progress);
    test_fault("shard", over->rank, over->timeout_s);
    comm_allgather(over, &digest, digests, 1, DT_INT64);
    return 0;
}

void checkpoint_save(const Config *cfg, const Model *m, const TrainState *state, const float *params,
                     const Comm *over, const char *resumed_from) {
    const char *dir = cfg->checkpoint.dir;
    double timeout_s = cfg->parallel.timeout_s;
    bool writer = !over || over->rank == 0;
    char name[32], final_dir[4096], tmp_dir[4096], old_dir[4200], path[4096];
    snprintf(name, sizeof(name), "step_%08lld", (long long)state->step);
    join(final_dir, sizeof(final_dir), dir, name);
    // The folder is named for rank 0's process id; every rank makes it
    // (checkpoint.dir is one shared file system) before writing into it.
    int64_t pid = getpid();
    if (over) comm_broadcast(over, &pid, 1, DT_INT64, 0);
    if ((size_t)snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp.%d", final_dir, (int)pid) >= sizeof(tmp_dir))
        fail("%s: path too long", final_dir);
    make_dirs(tmp_dir);
    snprintf(old_dir, sizeof(old_dir), "%s.old.%d", final_dir, (int)pid);
    Progress progress;
    char what[4200];
    snprintf(what, sizeof(what), "writing checkpoint %s", final_dir);
    int64_t param_bytes = (int64_t)sizeof(float) * m->total_params;
    progress_begin(&progress, what, param_bytes + 2 * (int64_t)sizeof(float) * m->opt_count, "MiB", 1 << 20);
    uint64_t model_hash = 0, *digests = xmalloc(sizeof(uint64_t) * (size_t)(over ? over->size : 1));
    if (writer) {
        model_write_hf_weights(m, params, tmp_dir, ST_F32, 0);
        test_fault("write", 0, timeout_s);
        join(path, sizeof(path), tmp_dir, "model.safetensors");
        model_hash = file_xxh64(path);
        progress_add(&progress, param_bytes);
        join(path, sizeof(path), tmp_dir, "config.json");
        char init_config[CONFIG_STR + 16];
        bool from_folder = cfg->train.init_from == INIT_FOLDER;
        snprintf(init_config, sizeof(init_config), "%s/config.json", cfg->train.init_from_path);
        hf_config_write(path, &m->cfg, "float32", from_folder ? init_config : NULL);
        if (from_folder) hf_copy_side_files(cfg->train.init_from_path, tmp_dir);
        join(path, sizeof(path), tmp_dir, "run.yaml");
        FILE *f = xfopen(path, "w");
        config_print(cfg, f);
        xfclose_sync(f, path);
    }
    uint64_t optimizer_hash = write_optimizer(tmp_dir, m, over, digests, &progress);
    if (!writer) {
        free(digests);
        progress_end(&progress);
        return;
    }
    if (over) {
        join(path, sizeof(path), tmp_dir, "optimizer.index.json");
        optimizer_hash = write_shard_index(path, m, over->size, digests);
    }
    free(digests);
    join(path, sizeof(path), tmp_dir, "state.json");
    write_state(path, state, model_hash, over ? "optimizer.index.json" : "optimizer.zst", optimizer_hash, cfg);
    fsync_dir(tmp_dir);
    // An existing step_N/ is moved aside, not deleted, until the new one is in
    // place: a kill in between leaves step_N.old.PID/, which
    // checkpoint_recover_dir renames back.
    bool replacing = access(final_dir, F_OK) == 0;
    if (replacing) rename_into_place(final_dir, old_dir);
    rename_into_place(tmp_dir, final_dir);
    fsync_dir(dir);
    if (replacing) remove_tree(old_dir);
    test_fault("rename", 0, timeout_s);
    write_latest(dir, name);
    test_fault("latest", 0, timeout_s);
    prune(&cfg->checkpoint, state->run_id, state->step, resumed_from, timeout_s);
    progress_end(&progress);
}

// The newest complete checkpoint folder in dir into out, of run `run` only
// when `one_run` (warning about newer incomplete or damaged ones it skips); 0
// if none.
static int newest_checkpoint(const char *dir, bool one_run, uint64_t run, char *out, size_t out_bytes) {
    int n;
    int64_t *steps = list_steps(dir, &n);
    int64_t best = -1;
    for (;;) {
        int64_t newest = -1;
        for (int i = 0; i < n; i++)
            if (steps[i] > newest && (best < 0 || steps[i] < best)) newest = steps[i];
        if (newest < 0) break;
        step_path(out, out_bytes, dir, newest);
        best = newest;
        if (!checkpoint_complete(out)) {
            fprintf(stderr, "warning: %s is incomplete (a file is missing): skipped, looking for an older "
                    "checkpoint\n", out);
            continue;
        }
        uint64_t theirs;
        if (!checkpoint_run(out, &theirs)) {
            warn_unreadable(out);
            continue;
        }
        if (one_run && theirs != run) continue;
        free(steps);
        return 1;
    }
    free(steps);
    return 0;
}

// The complete checkpoint folder that dir/latest names into out (its name
// into name [64], its run id into *run); 0 when `latest` is missing or names
// none.
static int latest_named(const char *dir, char *name, char *out, size_t out_bytes, uint64_t *run) {
    char path[4096];
    join(path, sizeof(path), dir, "latest");
    name[0] = '\0';
    if (access(path, F_OK) != 0) return 0;
    char *text = read_file(path, NULL);
    snprintf(name, 64, "%.*s", (int)strcspn(text, "\n"), text);
    free(text);
    if (step_of(name) < 0) return 0;
    join(out, out_bytes, dir, name);
    return checkpoint_complete(out) && checkpoint_run(out, run);
}

int checkpoint_find_latest(const char *dir, char *out, size_t out_bytes) {
    char name[64];
    uint64_t run;
    if (latest_named(dir, name, out, out_bytes, &run)) return newest_checkpoint(dir, true, run, out, out_bytes);
    return newest_checkpoint(dir, false, 0, out, out_bytes);
}

int checkpoint_repair_latest(const char *dir, char *out, size_t out_bytes) {
    char name[64];
    uint64_t run;
    latest_named(dir, name, out, out_bytes, &run);
    if (!checkpoint_find_latest(dir, out, out_bytes)) return 0;
    const char *found = strrchr(out, '/') + 1;
    if (strcmp(found, name)) {
        write_latest(dir, found);
        fprintf(stderr, "warning: %s/latest named %s: repaired to %s, its run's newest complete checkpoint\n", dir,
                name[0] ? name : "nothing", found);
    }
    return 1;
}

void checkpoint_clear_other_runs(const Config *cfg) {
    const char *dir = cfg->checkpoint.dir;
    int n;
    int64_t *steps = list_steps(dir, &n);
    char path[4096], diff[2048];
    for (int i = 0; i < n; i++) {
        step_path(path, sizeof(path), dir, steps[i]);
        uint64_t run;
        if (!checkpoint_complete(path)) continue;
        if (!checkpoint_run(path, &run)) {
            warn_unreadable(path);
            continue;
        }
        if (checkpoint_same_run(path, cfg, diff, sizeof(diff))) continue;
        if (!cfg->checkpoint.overwrite)
            fail("%s: a checkpoint of another run (%s) and checkpoint.resume is never: use another "
                 "checkpoint.dir, or checkpoint.overwrite=true to remove that run's checkpoints",
                 path, diff);
        remove_checkpoint(path, cfg->parallel.timeout_s);
        printf("removed %s: a checkpoint of another run (checkpoint.overwrite)\n", path);
    }
    free(steps);
}

void checkpoint_check_roll_back(const Config *cfg, const char *from, int64_t from_step) {
    const char *dir = cfg->checkpoint.dir;
    int n;
    int64_t *steps = list_steps(dir, &n);
    char taken[512] = "";
    size_t used = 0;
    int count = 0;
    // The steps in (from_step, train.steps], in ascending order.
    for (int64_t last = from_step; used < sizeof(taken);) {
        int64_t next = -1;
        for (int i = 0; i < n; i++)
            if (steps[i] > last && steps[i] <= cfg->train.steps && (next < 0 || steps[i] < next)) next = steps[i];
        if (next < 0) break;
        used += (size_t)snprintf(taken + used, sizeof(taken) - used, "%s%lld", count++ ? ", " : "", (long long)next);
        last = next;
    }
    free(steps);
    if (count > 0 && !cfg->checkpoint.overwrite)
        fail("%s: a roll-back to step %lld, and %s holds another run's step%s %s up to train.steps, which it would "
             "overwrite: use another checkpoint.dir, or checkpoint.overwrite=true to replace them", from,
             (long long)from_step, dir, count == 1 ? "" : "s", taken);
}

// Refuse weights of another architecture, naming the first differing field.
static void check_same_model(const ModelConfig *want, const ModelConfig *got, const char *path) {
#define SAME(field)                                                                                    \
    if (want->field != got->field)                                                                    \
        fail("%s: checkpoint has " #field " %lld but the run has %lld (a checkpoint of another model)", path, \
             (long long)got->field, (long long)want->field)
    SAME(vocab_size); SAME(hidden_size); SAME(intermediate_size); SAME(num_layers); SAME(num_heads);
    SAME(num_kv_heads); SAME(head_dim); SAME(tie_word_embeddings);
#undef SAME
}

// A checkpoint's step folder (one holding state.json): its model.safetensors
// must have the XXH64 that state.json records.
static void check_weights_digest(const char *dir) {
    char path[4096], weights[4096];
    join(path, sizeof(path), dir, "state.json");
    if (access(path, F_OK) != 0) return;
    cJSON *root = read_state_json(path);
    uint64_t recorded = state_hex(root, "model_xxh64", path);
    cJSON_Delete(root);
    join(weights, sizeof(weights), dir, "model.safetensors");
    uint64_t got = file_xxh64(weights);
    if (got != recorded)
        fail("%s: checksum mismatch: XXH64 %016" PRIx64 ", state.json records %016" PRIx64 " (file is damaged)",
             weights, got, recorded);
}

void model_load_hf_folder(Model *m, const char *dir) {
    char path[4096];
    ModelConfig got;
    check_weights_digest(dir);
    join(path, sizeof(path), dir, "config.json");
    hf_config_read(path, &got);
    check_same_model(&m->cfg, &got, path);
    Progress progress;
    char what[4200];
    snprintf(what, sizeof(what), "loading %s", dir);
    progress_begin(&progress, what, (int64_t)sizeof(float) * m->total_params, "MiB", 1 << 20);
    model_load_hf_weights(m, dir, &progress);
    progress_end(&progress);
}

void checkpoint_load(const char *dir, Model *m, TrainState *state) {
    char path[4096], optimizer[32];
    uint64_t optimizer_hash;
    join(path, sizeof(path), dir, "state.json");
    read_state(path, state, optimizer, &optimizer_hash);
    const char *slash = strrchr(dir, '/');
    int64_t named = step_of(slash ? slash + 1 : dir);
    if (named >= 0 && named != state->step)
        fail("%s: step %lld, but the folder is named for step %lld (a folder renamed or copied by hand)", path,
             (long long)state->step, (long long)named);
    model_load_hf_folder(m, dir);
    const uint64_t *recorded = &optimizer_hash;
    if (!optimizer[0]) {   // written before state.json named its optimizer: the file that is there, unverified
        join(path, sizeof(path), dir, "optimizer.index.json");
        snprintf(optimizer, sizeof(optimizer), "%s", access(path, F_OK) == 0 ? "optimizer.index.json" : "optimizer.zst");
        printf("note: %s/state.json records no optimizer digest (an older checkpoint): %s is read unverified\n", dir,
               optimizer);
        recorded = NULL;
    }
    join(path, sizeof(path), dir, optimizer);
    if (!strcmp(optimizer, "optimizer.zst")) {
        read_optimizer(path, m, recorded);
        return;
    }
    check_optimizer_digest(path, file_xxh64(path), recorded);
    read_sharded_optimizer(dir, path, m);
}
