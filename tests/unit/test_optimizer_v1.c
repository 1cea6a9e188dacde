// test_optimizer_v1.c: version 1 optimizer files (MTADAMW1, MTADAMS1: the
// moments in the parameter table's order) are read and converted. A
// checkpoint's optimizer state is replaced by a version 1 file whose every
// float names its own table-order position (m: the position, v: minus it);
// checkpoint_load must put each tensor's floats at its arena offset, both from
// optimizer.zst and from two shards, for a rank holding all the moments and
// for one holding a range of them (ZeRO-1), with the state.json digests checked.
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../../dist/util.h"
#include "../../model/model.h"
#include "../../trainer/checkpoint.h"
#include "../lib/check.h"

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

// A version 1 moments file: magic, the header words [n_words], the XXH64 of
// m then v [2, count], one zstd frame of them. Returns the XXH64.
static uint64_t write_v1_moments(const char *path, const char *magic, const uint64_t *words, int n_words,
                                 const float *m, const float *v, int64_t count) {
    size_t bytes = sizeof(float) * (size_t)count;
    float *raw = xmalloc(2 * bytes);
    memcpy(raw, m, bytes);
    memcpy(raw + count, v, bytes);
    uint64_t header[4];
    memcpy(header, words, sizeof(uint64_t) * (size_t)n_words);
    header[n_words] = XXH64(raw, 2 * bytes, 0);
    size_t bound = ZSTD_compressBound(2 * bytes);
    char *packed = xmalloc(bound);
    size_t packed_bytes = ZSTD_compress(packed, bound, raw, 2 * bytes, 3);
    CHECK(!ZSTD_isError(packed_bytes), "%s: zstd failed", path);
    FILE *f = xfopen(path, "wb");
    xfwrite(magic, 8, f, path);
    xfwrite(header, sizeof(uint64_t) * (size_t)(n_words + 1), f, path);
    xfwrite(packed, packed_bytes, f, path);
    xfclose_sync(f, path);
    free(packed);
    free(raw);
    return header[n_words];
}

static void write_json(const char *path, cJSON *root) {
    char *text = cJSON_Print(root);
    FILE *f = xfopen(path, "wb");
    xfwrite(text, strlen(text), f, path);
    xfclose_sync(f, path);
    free(text);
}

static uint64_t file_digest(const char *path) {
    size_t bytes;
    char *text = read_file(path, &bytes);
    uint64_t digest = XXH64(text, bytes, 0);
    free(text);
    return digest;
}

// state.json in dir records optimizer (its name) with the given digest.
static void set_state_optimizer(const char *dir, const char *optimizer, uint64_t digest) {
    char path[4096], hex[24];
    snprintf(path, sizeof(path), "%s/state.json", dir);
    size_t bytes;
    char *text = read_file(path, &bytes);
    cJSON *root = cJSON_Parse(text);
    CHECK(root, "%s: not JSON", path);
    snprintf(hex, sizeof(hex), "%016" PRIx64, digest);
    cJSON_ReplaceItemInObject(root, "optimizer", cJSON_CreateString(optimizer));
    cJSON_ReplaceItemInObject(root, "optimizer_xxh64", cJSON_CreateString(hex));
    write_json(path, root);
    cJSON_Delete(root);
    free(text);
}

// The checkpoint in dir's optimizer state as two version 1 shards (split at
// split) and their optimizer.index.json, which state.json records.
static void write_v1_shards(const char *dir, const float *m, const float *v, int64_t P, int64_t split) {
    cJSON *index = cJSON_CreateObject(), *shards = cJSON_CreateArray();
    cJSON_AddNumberToObject(index, "parameters", (double)P);
    for (int k = 0; k < 2; k++) {
        int64_t first = k ? split : 0, count = k ? P - split : split;
        char name[64], path[4096], hex[24];
        snprintf(name, sizeof(name), "optimizer.%05d-of-00002.zst", k);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        uint64_t words[3] = {(uint64_t)P, (uint64_t)first, (uint64_t)count};
        uint64_t digest = write_v1_moments(path, "MTADAMS1", words, 3, m + first, v + first, count);
        snprintf(hex, sizeof(hex), "%016" PRIx64, digest);
        cJSON *shard = cJSON_CreateObject();
        cJSON_AddStringToObject(shard, "file", name);
        cJSON_AddNumberToObject(shard, "first", (double)first);
        cJSON_AddNumberToObject(shard, "count", (double)count);
        cJSON_AddStringToObject(shard, "xxh64", hex);
        cJSON_AddItemToArray(shards, shard);
    }
    cJSON_AddItemToObject(index, "shards", shards);
    char path[4096];
    snprintf(path, sizeof(path), "%s/optimizer.index.json", dir);
    write_json(path, index);
    cJSON_Delete(index);
    set_state_optimizer(dir, "optimizer.index.json", file_digest(path));
}

// checkpoint_load of dir into a fresh model of c holding arena moments
// [begin, begin + count): every tensor's floats at its arena offset hold its
// table-order positions (m) and their negatives (v).
static void check_load(const char *label, const ModelConfig *c, const char *dir, int64_t begin, int64_t count) {
    Model back;
    model_init(&back, c, backend_cpu(), NULL, 1024);
    back.opt_begin = begin;
    back.opt_count = count;
    TrainState state;
    checkpoint_load(dir, &back, &state);
    size_t bytes = sizeof(float) * (size_t)count;
    float *got_m = xmalloc(bytes), *got_v = xmalloc(bytes);
    back.be->download(got_m, back.adam_m, bytes);
    back.be->download(got_v, back.adam_v, bytes);
    int64_t table_offset = 0, wrong = 0, moved = 0;
    for (int i = 0; i < back.num_params; i++) {
        const ParamInfo *p = &back.params[i];
        moved += p->offset != table_offset;
        for (int64_t j = 0; j < p->numel; j++) {
            int64_t at = p->offset + j - begin;
            if (at < 0 || at >= count) continue;
            float want = (float)(table_offset + j);
            wrong += got_m[at] != want || got_v[at] != -want;
        }
        table_offset += p->numel;
    }
    EXPECT(moved > 0 && wrong == 0 && state.step == 1,
           "%s: every tensor's moments at its arena offset (%lld tensors moved, %lld floats wrong)", label,
           (long long)moved, (long long)wrong);
    free(got_m);
    free(got_v);
    model_free(&back);
}

int main(void) {
    char dir[] = "/tmp/mtrain_optv1_XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp: cannot create a temporary folder");
    ModelConfig c = {.vocab_size = 256, .hidden_size = 64, .intermediate_size = 128, .num_layers = 2,
                     .num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .rope_theta = 10000.0,
                     .rms_norm_eps = 1e-6, .tie_word_embeddings = false, .init_std = 0.02,
                     .max_position_embeddings = 256};
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 7);
    model_alloc_optimizer(&m);
    int64_t P = m.total_params;
    size_t bytes = sizeof(float) * (size_t)P;
    Config cfg;
    config_defaults(&cfg);
    cfg.model = c;
    snprintf(cfg.checkpoint.dir, sizeof(cfg.checkpoint.dir), "%s", dir);
    TrainState state = {.step = 1};
    float *params = xmalloc(bytes);
    model_gather_params(&m, params);
    checkpoint_save(&cfg, &m, &state, params, NULL, NULL);

    // The version 1 moments: float k of the table order is k (m) and -k (v).
    float *v1_m = xmalloc(bytes), *v1_v = xmalloc(bytes);
    for (int64_t k = 0; k < P; k++) v1_m[k] = (float)k, v1_v[k] = -(float)k;
    char step_dir[256], path[4096];
    snprintf(step_dir, sizeof(step_dir), "%s/step_00000001", dir);
    snprintf(path, sizeof(path), "%s/optimizer.zst", step_dir);
    uint64_t P_word = (uint64_t)P;
    set_state_optimizer(step_dir, "optimizer.zst", write_v1_moments(path, "MTADAMW1", &P_word, 1, v1_m, v1_v, P));
    check_load("optimizer.zst of version 1", &c, step_dir, 0, P);
    check_load("optimizer.zst of version 1, a rank's range", &c, step_dir, P / 3, P / 2);

    remove(path);
    write_v1_shards(step_dir, v1_m, v1_v, P, P / 2 + 5);
    check_load("two version 1 shards", &c, step_dir, 0, P);
    check_load("two version 1 shards, a rank's range inside the first", &c, step_dir, 100, P / 4);

    free(v1_m);
    free(v1_v);
    free(params);
    model_free(&m);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_exit();
}
