// hf_io.c: parameters from and to Hugging Face folders: single-file or
// sharded safetensors under HF tensor names, with the shard index.
#define _GNU_SOURCE
#include "hf_io.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

// Tensors a HF folder may hold that are not parameters here: the head of a
// tied model (transformers ties it to the embedding) and the rotary buffers
// that old exports saved.
static bool ignorable(const Model *m, const char *name) {
    const char *suffix = ".rotary_emb.inv_freq";
    size_t n = strlen(name), k = strlen(suffix);
    return (m->cfg.tie_word_embeddings && !strcmp(name, "lm_head.weight")) || (n > k && !strcmp(name + n - k, suffix));
}

static void fail_missing(const char *path, const ParamInfo *p, const char *where) {
    char shape[64];
    if (p->ndim == 2) snprintf(shape, sizeof(shape), "[%" PRId64 ", %" PRId64 "]", p->shape[0], p->shape[1]);
    else snprintf(shape, sizeof(shape), "[%" PRId64 "]", p->shape[0]);
    fail("%s: tensor '%s' is missing%s (expected shape %s)", path, p->name, where, shape);
}

// Read from one safetensors file every parameter whose file_of entry is
// `file` (all of them when file_of is NULL), after checking that the file
// holds nothing else: no tensor of another shard, no foreign tensor.
static void load_file(Model *m, const char *path, const char *const *file_of, const char *file, const char *index,
                      Progress *progress) {
    SafeTensors st;
    st_open(&st, path);
    for (int t = 0; t < st.count; t++) {
        const char *name = st.tensors[t].name;
        int i = model_param_index(m, name);
        if (i < 0 && ignorable(m, name)) continue;
        if (i < 0) fail("%s: tensor '%s' is not a parameter of this model (a checkpoint of another model?)", path, name);
        if (file_of && strcmp(file_of[i], file))
            fail("%s: holds tensor '%s', which %s maps to '%s' (expected each tensor in one file)", path, name, index,
                 file_of[i]);
    }
    int64_t largest = 0;
    for (int i = 0; i < m->num_params; i++) largest = m->params[i].numel > largest ? m->params[i].numel : largest;
    float *host = xmalloc(sizeof(float) * (size_t)largest);
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        if (file_of && strcmp(file_of[i], file)) continue;
        if (!st_find(&st, p->name)) fail_missing(path, p, file_of ? " (the index maps it to this file)" : "");
        st_read_f32(&st, p->name, p->ndim, p->shape, host);
        model_set_params(m, p->offset, host, p->numel);
        progress_add(progress, (int64_t)sizeof(float) * p->numel);
    }
    free(host);
    st_close(&st);
}

// The weight_map of an index: file_of[i] for every parameter i (pointing
// into root), each named exactly once.
static const char **read_weight_map(const Model *m, const char *index, const cJSON *root) {
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object (expected {\"metadata\": ..., \"weight_map\": ...})", index);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) fail("%s: field 'weight_map' is missing or not an object (expected tensor: file)", index);
    const char **file_of = xcalloc((size_t)m->num_params, sizeof(char *));
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..") ||
            !strcmp(e->valuestring, "."))
            fail("%s: weight_map entry '%s' is not a file name in the same folder", index, e->string);
        int i = model_param_index(m, e->string);
        if (i < 0 && ignorable(m, e->string)) continue;
        if (i < 0)
            fail("%s: weight_map names tensor '%s', which this model does not have (a checkpoint of another model?)",
                 index, e->string);
        if (file_of[i]) fail("%s: weight_map lists tensor '%s' twice", index, e->string);
        file_of[i] = e->valuestring;
    }
    for (int i = 0; i < m->num_params; i++)
        if (!file_of[i]) fail_missing(index, &m->params[i], " from weight_map");
    return file_of;
}

static void load_sharded(Model *m, const char *dir, const char *index, Progress *progress) {
    char *text = read_file(index, NULL);
    cJSON *root = cJSON_Parse(text);
    if (!root) fail("%s: not valid JSON", index);
    const char **file_of = read_weight_map(m, index, root);
    // Each shard once, in the order the parameters first name it.
    for (int i = 0; i < m->num_params; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(file_of[j], file_of[i]);
        if (seen) continue;
        char *path = path_join(dir, file_of[i]);
        if (access(path, F_OK) != 0)
            fail("%s: shard '%s' (holding '%s') does not exist in %s", index, file_of[i], m->params[i].name, dir);
        load_file(m, path, file_of, file_of[i], index, progress);
        free(path);
    }
    free(file_of);
    cJSON_Delete(root);
    free(text);
}

void model_load_hf_weights(Model *m, const char *dir, Progress *progress) {
    char *index = path_join(dir, INDEX_NAME), *single = path_join(dir, SINGLE_NAME);
    if (access(index, F_OK) == 0) load_sharded(m, dir, index, progress);
    else load_file(m, single, NULL, NULL, NULL, progress);
    model_weights_changed(m);
    free(index);
    free(single);
}

// ----------------------------------------------------------------------------
// writing

// Write parameters [first, last) of the whole arena host [total_params] as one safetensors file.
static void write_params(const Model *m, const float *host, int first, int last, const char *path, StDtype dtype) {
    StWriteTensor *tensors = xcalloc((size_t)(last - first), sizeof(StWriteTensor));
    for (int i = first; i < last; i++) {
        const ParamInfo *p = &m->params[i];
        StWriteTensor *t = &tensors[i - first];
        t->name = p->name;
        t->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) t->shape[d] = p->shape[d];
        t->data = host + p->offset;
    }
    st_write(path, tensors, last - first, dtype);
    free(tensors);
}

void model_write_safetensors(const Model *m, float *arena, const char *path, StDtype dtype) {
    float *host = xmalloc(sizeof(float) * (size_t)m->total_params);
    m->be->download(host, arena, sizeof(float) * (size_t)m->total_params);
    write_params(m, host, 0, m->num_params, path, dtype);
    free(host);
}

void model_write_grads(const Model *m, const char *path) { model_write_safetensors(m, m->grad_mem, path, ST_F32); }

// "model-00002-of-00005.safetensors" for shard k (from 0) of n.
static void shard_name(char *out, size_t size, int k, int n) {
    snprintf(out, size, "model-%05d-of-%05d.safetensors", k + 1, n);
}

static int compare_strings(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// model.safetensors.index.json as transformers writes it: total_size is the
// bytes of tensor data, weight_map sorted by tensor name.
static void write_index(const Model *m, const char *dir, const int *shard_of, int shards, uint64_t total_bytes) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total_bytes);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    const char **names = xmalloc(sizeof(char *) * (size_t)m->num_params);
    for (int i = 0; i < m->num_params; i++) names[i] = m->params[i].name;
    qsort(names, (size_t)m->num_params, sizeof(char *), compare_strings);
    for (int k = 0; k < m->num_params; k++) {
        int i = model_param_index(m, names[k]);
        char file[64];
        shard_name(file, sizeof(file), shard_of[i], shards);
        cJSON_AddStringToObject(map, names[k], file);
    }
    char *text = cJSON_Print(root), *path = path_join(dir, INDEX_NAME);
    write_file_atomic(path, text, strlen(text));
    free(path);
    free(text);
    free(names);
    cJSON_Delete(root);
}

int model_write_hf_weights(const Model *m, const float *params, const char *dir, StDtype dtype,
                           uint64_t max_shard_bytes) {
    size_t esize = dtype == ST_F32 ? 4 : 2;
    // Greedy in table order: a shard closes when the next tensor would overflow it.
    int *shard_of = xmalloc(sizeof(int) * (size_t)m->num_params);
    int shards = 0;
    uint64_t in_shard = 0, total_bytes = 0;
    for (int i = 0; i < m->num_params; i++) {
        uint64_t bytes = (uint64_t)m->params[i].numel * esize;
        if (i == 0 || (max_shard_bytes && in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
            shards++;
            in_shard = 0;
        }
        shard_of[i] = shards - 1;
        in_shard += bytes;
        total_bytes += bytes;
    }
    // Each file: one run of the table.
    for (int first = 0; first < m->num_params;) {
        int last = first + 1;
        while (last < m->num_params && shard_of[last] == shard_of[first]) last++;
        char file[64];
        if (shards == 1) snprintf(file, sizeof(file), SINGLE_NAME);
        else shard_name(file, sizeof(file), shard_of[first], shards);
        char *path = path_join(dir, file);
        write_params(m, params, first, last, path, dtype);
        free(path);
        first = last;
    }
    if (shards > 1) write_index(m, dir, shard_of, shards, total_bytes);
    free(shard_of);
    return shards;
}

// Files of a Hugging Face folder that travel with the weights unchanged.
static const char *side_files[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                                   "special_tokens_map.json", "added_tokens.json", "generation_config.json"};

void hf_copy_side_files(const char *from, const char *to) {
    for (size_t i = 0; i < sizeof(side_files) / sizeof(side_files[0]); i++) {
        char *src = path_join(from, side_files[i]), *dst = path_join(to, side_files[i]);
        if (access(src, F_OK) == 0) {
            size_t bytes;
            char *data = read_file(src, &bytes);
            write_file_atomic(dst, data, bytes);
            free(data);
        }
        free(src);
        free(dst);
    }
}
