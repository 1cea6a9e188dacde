// hf_config.c: Hugging Face config.json of a Qwen2 model <-> ModelConfig.
// Reading uses cJSON; writing formats the file itself because cJSON's number
// printer does not round-trip every double (0.1 + 0.2 prints as 0.3).
#define _GNU_SOURCE
#include "hf_config.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../dist/util.h"
#include "rope.h"

// ----------------------------------------------------------------------------
// reading

// The field, or NULL when absent or null (transformers treats null as unset).
static const cJSON *field(const cJSON *root, const char *name) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    return cJSON_IsNull(item) ? NULL : item;
}

static const char *json_kind(const cJSON *item) {
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsObject(item)) return "an object";
    return "something else";
}

// The read_* helpers take `in`: "" for top-level fields, "rope_scaling." for
// the fields of that object (messages name the field with it).
static int read_int(const char *path, const cJSON *root, const char *in, const char *name, bool required,
                    int fallback) {
    const cJSON *item = field(root, name);
    if (!item) {
        if (required) fail("%s: field '%s%s' is missing (expected an integer)", path, in, name);
        return fallback;
    }
    if (!cJSON_IsNumber(item)) fail("%s: field '%s%s' must be an integer, not %s", path, in, name, json_kind(item));
    double value = item->valuedouble;
    if (value != floor(value) || value < INT_MIN || value > INT_MAX)
        fail("%s: field '%s%s' must be an integer, not %.17g", path, in, name, value);
    if (value <= 0) fail("%s: field '%s%s' must be positive, not %d", path, in, name, (int)value);
    return (int)value;
}

static double read_double(const char *path, const cJSON *root, const char *in, const char *name, double fallback) {
    const cJSON *item = field(root, name);
    if (!item) return fallback;
    if (!cJSON_IsNumber(item)) fail("%s: field '%s%s' must be a number, not %s", path, in, name, json_kind(item));
    double value = item->valuedouble;
    if (!isfinite(value) || value <= 0)
        fail("%s: field '%s%s' must be a positive number, not %.17g", path, in, name, value);
    return value;
}

static bool read_bool(const char *path, const cJSON *root, const char *in, const char *name, bool fallback) {
    const cJSON *item = field(root, name);
    if (!item) return fallback;
    if (!cJSON_IsBool(item)) fail("%s: field '%s%s' must be true or false, not %s", path, in, name, json_kind(item));
    return cJSON_IsTrue(item);
}

// NULL when absent; a string otherwise.
static const char *read_string(const char *path, const cJSON *root, const char *in, const char *name) {
    const cJSON *item = field(root, name);
    if (!item) return NULL;
    if (!cJSON_IsString(item)) fail("%s: field '%s%s' must be a string, not %s", path, in, name, json_kind(item));
    return item->valuestring;
}

// rope_scaling (transformers <= 4.x) or rope_parameters (5.x, which also holds
// rope_theta): absent, null or type "default" = plain RoPE; "yarn" with its
// parameters; any other type or key is refused rather than ignored.
static void read_rope_scaling(const char *path, const cJSON *root, ModelConfig *mc) {
    RopeScaling *rs = &mc->rope_scaling;
    *rs = (RopeScaling){.type = ROPE_NONE, .factor = 1.0, .beta_fast = 32.0, .beta_slow = 1.0, .truncate = true};
    const char *name = field(root, "rope_scaling") ? "rope_scaling" : "rope_parameters";
    const cJSON *obj = field(root, name);
    if (!obj) return;
    if (!cJSON_IsObject(obj)) fail("%s: field '%s' must be an object or null, not %s", path, name, json_kind(obj));
    static const char *known[] = {"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                                  "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate",
                                  "rope_theta"};
    for (const cJSON *kv = obj->child; kv; kv = kv->next) {
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) ok |= !strcmp(kv->string, known[i]);
        if (!ok)
            fail("%s: %s key '%s' is not supported (expected type, factor, original_max_position_embeddings, "
                 "beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, truncate)", path, name, kv->string);
    }
    char in[32];
    snprintf(in, sizeof(in), "%s.", name);
    const char *type = read_string(path, obj, in, "rope_type"), *old_type = read_string(path, obj, in, "type");
    if (type && old_type && strcmp(type, old_type))
        fail("%s: %s has rope_type '%s' and type '%s' (expected one type)", path, name, type, old_type);
    if (!type) type = old_type;
    if (!type) fail("%s: %s has no 'type' (expected \"yarn\" or \"default\")", path, name);
    mc->rope_theta = read_double(path, obj, in, "rope_theta", mc->rope_theta);
    if (!strcmp(type, "default")) return;
    if (strcmp(type, "yarn"))
        fail("%s: %s type '%s' is not supported (expected \"yarn\" or \"default\")", path, name, type);
    rs->type = ROPE_YARN;
    if (!field(obj, "factor")) fail("%s: %s of type yarn has no 'factor' (expected a number >= 1)", path, name);
    rs->factor = read_double(path, obj, in, "factor", 1.0);
    if (rs->factor < 1) fail("%s: field '%sfactor' is %.17g (expected a number >= 1)", path, in, rs->factor);
    rs->original_max_position_embeddings = read_int(path, obj, in, "original_max_position_embeddings", false, 0);
    rs->beta_fast = read_double(path, obj, in, "beta_fast", 32.0);
    rs->beta_slow = read_double(path, obj, in, "beta_slow", 1.0);
    rs->attention_factor = read_double(path, obj, in, "attention_factor", 0.0);
    rs->mscale = read_double(path, obj, in, "mscale", 0.0);
    rs->mscale_all_dim = read_double(path, obj, in, "mscale_all_dim", 0.0);
    rs->truncate = read_bool(path, obj, in, "truncate", true);
    if (rs->beta_fast <= rs->beta_slow)
        fail("%s: %s beta_fast %.17g is not above beta_slow %.17g (expected beta_fast > beta_slow)", path, name,
             rs->beta_fast, rs->beta_slow);
}

void hf_config_read(const char *path, ModelConfig *mc) {
    char *text = read_file(path, NULL);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        int line = 1;
        for (const char *p = text; end && p < end; p++) line += *p == '\n';
        fail("%s: not valid JSON (error on line %d)", path, line);
    }
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object", path);

    const char *model_type = read_string(path, root, "", "model_type");
    if (model_type && strcmp(model_type, "qwen2") != 0)
        fail("%s: model_type '%s' is not supported (expected qwen2)", path, model_type);
    const char *hidden_act = read_string(path, root, "", "hidden_act");
    if (hidden_act && strcmp(hidden_act, "silu") != 0)
        fail("%s: hidden_act '%s' is not supported (expected silu)", path, hidden_act);
    if (read_bool(path, root, "", "use_sliding_window", false))
        fail("%s: use_sliding_window true is not supported (Qwen2.5 attends to the full context)", path);

    memset(mc, 0, sizeof(*mc));
    mc->vocab_size = read_int(path, root, "", "vocab_size", true, 0);
    mc->hidden_size = read_int(path, root, "", "hidden_size", true, 0);
    mc->intermediate_size = read_int(path, root, "", "intermediate_size", true, 0);
    mc->num_layers = read_int(path, root, "", "num_hidden_layers", true, 0);
    mc->num_heads = read_int(path, root, "", "num_attention_heads", true, 0);
    mc->num_kv_heads = read_int(path, root, "", "num_key_value_heads", false, mc->num_heads);
    mc->rope_theta = read_double(path, root, "", "rope_theta", 10000.0);
    mc->rms_norm_eps = read_double(path, root, "", "rms_norm_eps", 1e-6);
    mc->tie_word_embeddings = read_bool(path, root, "", "tie_word_embeddings", false);
    mc->init_std = read_double(path, root, "", "initializer_range", 0.02);
    mc->max_position_embeddings = read_int(path, root, "", "max_position_embeddings", false, 32768);
    read_rope_scaling(path, root, mc);

    if (mc->hidden_size % mc->num_heads != 0)
        fail("%s: hidden_size %d is not divisible by num_attention_heads %d", path, mc->hidden_size, mc->num_heads);
    if (mc->num_heads % mc->num_kv_heads != 0)
        fail("%s: num_attention_heads %d is not divisible by num_key_value_heads %d", path, mc->num_heads, mc->num_kv_heads);
    mc->head_dim = mc->hidden_size / mc->num_heads;
    int head_dim = read_int(path, root, "", "head_dim", false, mc->head_dim);
    if (head_dim != mc->head_dim)
        fail("%s: head_dim %d differs from hidden_size / num_attention_heads = %d (not supported)", path, head_dim, mc->head_dim);

    cJSON_Delete(root);
    free(text);
}

// ----------------------------------------------------------------------------
// writing

// The shortest decimal that reads back as exactly x, with ".0" on whole
// numbers so that Python reads a float ("1000000.0", "1e-06", "0.30000000000000004").
static void format_double(char *buf, size_t cap, double x) {
    CHECK(isfinite(x), "config value %g is not finite", x);
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(buf, cap, "%.1f", x);
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) return;
    }
}

// "null", or the YaRN object with keys sorted; `type` is written next to
// `rope_type` for transformers versions that read only the older name.
static void format_rope_scaling(char *buf, size_t cap, const ModelConfig *mc) {
    const RopeScaling *rs = &mc->rope_scaling;
    if (!rope_is_yarn(rs)) {
        snprintf(buf, cap, "null");
        return;
    }
    char num[32];
    size_t len = (size_t)snprintf(buf, cap, "{\n");
#define NUMBER(key, value) \
    (format_double(num, sizeof(num), value), len += (size_t)snprintf(buf + len, cap - len, "    \"" key "\": %s,\n", num))
    if (rs->attention_factor > 0) NUMBER("attention_factor", rs->attention_factor);
    NUMBER("beta_fast", rs->beta_fast);
    NUMBER("beta_slow", rs->beta_slow);
    NUMBER("factor", rs->factor);
    if (rs->mscale > 0) NUMBER("mscale", rs->mscale);
    if (rs->mscale_all_dim > 0) NUMBER("mscale_all_dim", rs->mscale_all_dim);
#undef NUMBER
    len += (size_t)snprintf(buf + len, cap - len, "    \"original_max_position_embeddings\": %d,\n"
                            "    \"rope_type\": \"yarn\",\n%s    \"type\": \"yarn\"\n  }",
                            rope_original_context(mc), rs->truncate ? "" : "    \"truncate\": false,\n");
    CHECK(len < cap, "rope_scaling text does not fit");
}

// Keys of another config.json that the written one replaces although it does
// not write them: they describe what the written keys already say.
static const char *replaced_keys[] = {"rope_parameters", "head_dim", "dtype"};

// The keys of `keep_from` (a config.json) that `owned` (the JSON object
// mtrain writes, text ending in "\n}\n") does not have, appended to it.
// Returns a new string.
static char *keep_foreign_keys(const char *owned, const char *keep_from) {
    size_t bytes;
    char *text = read_file(keep_from, &bytes);
    cJSON *root = cJSON_ParseWithLength(text, bytes), *mine = cJSON_Parse(owned);
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object (expected a Hugging Face config.json)", keep_from);
    CHECK(mine, "config.json text does not parse");
    size_t len = strlen(owned) - 3, cap = len + 16;  // without "\n}\n"
    char *out = xmalloc(cap);
    memcpy(out, owned, len);
    for (const cJSON *item = root->child; item; item = item->next) {
        bool replaced = cJSON_HasObjectItem(mine, item->string);
        for (size_t i = 0; i < sizeof(replaced_keys) / sizeof(replaced_keys[0]); i++)
            replaced = replaced || !strcmp(item->string, replaced_keys[i]);
        if (replaced) continue;
        cJSON *key = cJSON_CreateStringReference(item->string);
        char *value = cJSON_PrintUnformatted(item), *name = cJSON_PrintUnformatted(key);
        CHECK(value && name, "out of memory printing %s", keep_from);
        cJSON_Delete(key);
        size_t add = strlen(name) + strlen(value) + 8;
        out = xrealloc(out, cap += add);
        len += (size_t)snprintf(out + len, cap - len, ",\n  %s: %s", name, value);
        free(value);
        free(name);
    }
    snprintf(out + len, cap - len, "\n}\n");
    cJSON_Delete(mine);
    cJSON_Delete(root);
    free(text);
    return out;
}

void hf_config_write(const char *path, const ModelConfig *mc, const char *torch_dtype, const char *keep_from) {
    CHECK(mc->head_dim * mc->num_heads == mc->hidden_size, "head_dim %d x num_heads %d != hidden_size %d",
          mc->head_dim, mc->num_heads, mc->hidden_size);
    char init_std[32], rms_norm_eps[32], rope_theta[32], rope_scaling[1024], text[8192];
    format_double(init_std, sizeof(init_std), mc->init_std);
    format_double(rms_norm_eps, sizeof(rms_norm_eps), mc->rms_norm_eps);
    format_double(rope_theta, sizeof(rope_theta), mc->rope_theta);
    format_rope_scaling(rope_scaling, sizeof(rope_scaling), mc);
    // Keys sorted, as transformers writes them.
    int len = snprintf(text, sizeof(text),
        "{\n"
        "  \"architectures\": [\n"
        "    \"Qwen2ForCausalLM\"\n"
        "  ],\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"initializer_range\": %s,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"max_window_layers\": %d,\n"
        "  \"model_type\": \"qwen2\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"rms_norm_eps\": %s,\n"
        "  \"rope_scaling\": %s,\n"
        "  \"rope_theta\": %s,\n"
        "  \"sliding_window\": %d,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"torch_dtype\": \"%s\",\n"
        "  \"use_cache\": true,\n"
        "  \"use_sliding_window\": false,\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        mc->hidden_size, init_std, mc->intermediate_size, mc->max_position_embeddings, mc->num_layers,
        mc->num_heads, mc->num_layers, mc->num_kv_heads, rms_norm_eps, rope_scaling, rope_theta,
        mc->max_position_embeddings, mc->tie_word_embeddings ? "true" : "false", torch_dtype, mc->vocab_size);
    CHECK(len > 0 && (size_t)len < sizeof(text), "config.json text does not fit");
    if (!keep_from) {
        write_file_atomic(path, text, (size_t)len);
        return;
    }
    char *merged = keep_foreign_keys(text, keep_from);
    write_file_atomic(path, merged, strlen(merged));
    free(merged);
}
