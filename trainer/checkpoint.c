// checkpoint.c: writing, finding, loading and pruning training checkpoints.
#define _GNU_SOURCE
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_estimateCStreamSize (exported by the shared library)
#include <zstd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../dist/progress.h"
#include "../model/hf_config.h"
#include "../model/hf_io.h"

#define OPTIMIZER_MAGIC "MTADAMW1"

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

// Floats [first, first + count) of moment `part` (0 = m, 1 = v) [total_params]:
// in host [2, total_params] when given, else downloaded from the model's
// unsharded adam_m / adam_v into buf.
static const float *moment_piece(const Model *m, const float *host, int part, int64_t first, int64_t count,
                                 float *buf) {
    if (host) return host + (int64_t)part * m->total_params + first;
    m->be->download(buf, (part ? m->adam_v : m->adam_m) + first, sizeof(float) * (size_t)count);
    return buf;
}

// optimizer.zst: magic, total floats, XXH64 of the raw moments, then m and v
// (full tensors, whatever the sharding) as one zstd stream, written piece by
// piece (the checksum is filled in last), so that no second copy of the
// moments is held.
static void write_optimizer(const char *path, const Model *m, const float *host, Progress *progress) {
    int64_t P = m->total_params;
    uint64_t header[2] = {(uint64_t)P, 0};
    FILE *f = xfopen(path, "wb");
    xfwrite(OPTIMIZER_MAGIC, 8, f, path);
    xfwrite(header, sizeof(header), f, path);
    ZSTD_CCtx *z = ZSTD_createCCtx();
    XXH64_state_t *hash = XXH64_createState();
    if (!z || !hash) fail("%s: out of memory for the compressor", path);
    zstd_check(ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, 3), path);
    zstd_check(ZSTD_CCtx_setPledgedSrcSize(z, 2 * sizeof(float) * (size_t)P), path);
    XXH64_reset(hash, 0);
    size_t out_size = ZSTD_CStreamOutSize();
    void *out = xmalloc(out_size);
    float *buf = host ? NULL : xmalloc(sizeof(float) * (size_t)OPTIMIZER_PIECE);
    for (int part = 0; part < 2; part++) {
        for (int64_t first = 0; first < P; first += OPTIMIZER_PIECE) {
            int64_t count = P - first < OPTIMIZER_PIECE ? P - first : OPTIMIZER_PIECE;
            const float *piece = moment_piece(m, host, part, first, count, buf);
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
    header[1] = XXH64_digest(hash);
    if (fseek(f, 8, SEEK_SET) != 0) fail("%s: cannot seek (%s)", path, strerror(errno));
    xfwrite(header, sizeof(header), f, path);
    xfclose_sync(f, path);
    free(buf);
    free(out);
    XXH64_freeState(hash);
    ZSTD_freeCCtx(z);
}

static void read_optimizer(const char *path, Model *m) {
    size_t file_bytes;
    char *file = read_file(path, &file_bytes);
    uint64_t header[2];
    if (file_bytes < 8 + sizeof(header) || memcmp(file, OPTIMIZER_MAGIC, 8))
        fail("%s: not an mtrain optimizer state (bad magic or truncated)", path);
    memcpy(header, file + 8, sizeof(header));
    if (header[0] != (uint64_t)m->total_params)
        fail("%s: holds %" PRIu64 " parameters' moments (expected %lld)", path, header[0], (long long)m->total_params);
    size_t bytes = sizeof(float) * (size_t)m->total_params;
    float *host = xmalloc(2 * bytes);
    size_t got = ZSTD_decompress(host, 2 * bytes, file + 8 + sizeof(header), file_bytes - 8 - sizeof(header));
    if (ZSTD_isError(got) || got != 2 * bytes)
        fail("%s: damaged (zstd: %s)", path, ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size");
    if (XXH64(host, 2 * bytes, 0) != header[1]) fail("%s: checksum mismatch (file is damaged)", path);
    // Keep this rank's range: a checkpoint of any sharding resumes under any other.
    model_alloc_optimizer(m);
    size_t shard_bytes = sizeof(float) * (size_t)m->opt_count;
    m->be->upload(m->adam_m, host + m->opt_begin, shard_bytes);
    m->be->upload(m->adam_v, host + m->total_params + m->opt_begin, shard_bytes);
    free(host);
    free(file);
}

static void write_state(const char *path, const TrainState *s) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)s->step);
    cJSON_AddNumberToObject(root, "tokens_seen", (double)s->tokens_seen);
    cJSON_AddNumberToObject(root, "data_cursor", (double)s->data_cursor);
    char word[4][24];
    for (int i = 0; i < 4; i++) snprintf(word[i], sizeof(word[i]), "%016" PRIx64, s->rng.s[i]);
    const char *words[4] = {word[0], word[1], word[2], word[3]};
    cJSON_AddItemToObject(root, "rng", cJSON_CreateStringArray(words, 4));
    char *text = cJSON_Print(root);
    write_file_atomic(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
}

static int64_t state_int(const cJSON *root, const char *key, const char *path) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(item) || item->valuedouble < 0) fail("%s: field '%s' is missing or not a count", path, key);
    return (int64_t)item->valuedouble;
}

static void read_state(const char *path, TrainState *s) {
    char *text = read_file(path, NULL);
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object", path);
    s->step = state_int(root, "step", path);
    s->tokens_seen = state_int(root, "tokens_seen", path);
    s->data_cursor = state_int(root, "data_cursor", path);
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4) fail("%s: field 'rng' must be 4 hex words", path);
    for (int i = 0; i < 4; i++) {
        const cJSON *w = cJSON_GetArrayItem(rng, i);
        char *end;
        if (!cJSON_IsString(w) || (s->rng.s[i] = strtoull(w->valuestring, &end, 16), *end))
            fail("%s: field 'rng' must be 4 hex words", path);
    }
    cJSON_Delete(root);
    free(text);
}

// "step_00001234" -> 1234; -1 for any other name (temporaries included).
static int64_t step_of(const char *name) {
    if (strncmp(name, "step_", 5) || strlen(name) != 13) return -1;
    for (int i = 5; i < 13; i++)
        if (name[i] < '0' || name[i] > '9') return -1;
    return strtoll(name + 5, NULL, 10);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    if (remove(path) != 0) fail("%s: cannot remove (%s)", path, strerror(errno));
    return 0;
}

// Keep the newest `keep` checkpoints and every one whose step is a multiple
// of keep_every (when > 0); remove the rest.
static void prune(const CheckpointConfig *c) {
    DIR *d = opendir(c->dir);
    if (!d) fail("%s: cannot open directory (%s)", c->dir, strerror(errno));
    int64_t *steps = NULL;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of(e->d_name);
        if (s < 0) continue;
        steps = xrealloc(steps, sizeof(int64_t) * (size_t)(n + 1));
        steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        bool permanent = c->keep_every > 0 && steps[i] % c->keep_every == 0;
        if (newer < c->keep || permanent) continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/step_%08lld", c->dir, (long long)steps[i]);
        if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) fail("%s: cannot remove", path);
    }
    free(steps);
}

void checkpoint_save(const Config *cfg, const Model *m, const TrainState *state, const float *moments) {
    const char *dir = cfg->checkpoint.dir;
    char name[32], final_dir[4096], tmp_dir[4096], path[4096];
    snprintf(name, sizeof(name), "step_%08lld", (long long)state->step);
    join(final_dir, sizeof(final_dir), dir, name);
    if ((size_t)snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp.%d", final_dir, (int)getpid()) >= sizeof(tmp_dir))
        fail("%s: path too long", final_dir);
    make_dirs(tmp_dir);
    Progress progress;
    char what[4200];
    snprintf(what, sizeof(what), "writing checkpoint %s", final_dir);
    int64_t param_bytes = (int64_t)sizeof(float) * m->total_params;
    progress_begin(&progress, what, 3 * param_bytes, "MiB", 1 << 20);
    join(path, sizeof(path), tmp_dir, "model.safetensors");
    model_write_safetensors(m, m->param_mem, path, ST_F32);
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
    join(path, sizeof(path), tmp_dir, "optimizer.zst");
    write_optimizer(path, m, moments, &progress);
    join(path, sizeof(path), tmp_dir, "state.json");
    write_state(path, state);
    fsync_dir(tmp_dir);
    if (access(final_dir, F_OK) == 0 && nftw(final_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fail("%s: cannot replace", final_dir);
    rename_into_place(tmp_dir, final_dir);
    fsync_dir(dir);
    join(path, sizeof(path), dir, "latest");
    char text[64];
    snprintf(text, sizeof(text), "%s\n", name);
    write_file_atomic(path, text, strlen(text));
    prune(&cfg->checkpoint);
    progress_end(&progress);
}

int checkpoint_find_latest(const char *dir, char *out, size_t out_bytes) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        fail("%s: cannot open directory (%s)", dir, strerror(errno));
    }
    int64_t best = -1;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of(e->d_name);
        if (s > best) best = s;
    }
    closedir(d);
    if (best < 0) return 0;
    snprintf(out, out_bytes, "%s/step_%08lld", dir, (long long)best);
    return 1;
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

void model_load_hf_folder(Model *m, const char *dir) {
    char path[4096];
    ModelConfig got;
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
    char path[4096];
    model_load_hf_folder(m, dir);
    join(path, sizeof(path), dir, "optimizer.zst");
    read_optimizer(path, m);
    join(path, sizeof(path), dir, "state.json");
    read_state(path, state);
}
