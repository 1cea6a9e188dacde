// export.c: `mtrain export CKPT_DIR OUT_DIR [--dtype bf16|f32]
// [--max-shard-size SIZE] [model.key=value ...]`: a checkpoint folder
// (step_XXXXXXXX/) or any Hugging Face folder becomes a Hugging Face folder:
// config.json (with the model's context settings: max_position_embeddings,
// rope_theta, rope_scaling, after any overrides), the weights as BF16 (rounded
// to nearest even) or F32 in one model.safetensors or in shards with
// model.safetensors.index.json, and the tokenizer files of CKPT_DIR if it has
// them. config.json keeps the keys of CKPT_DIR's config.json that mtrain does
// not write (bos_token_id, eos_token_id, ...). Written as OUT_DIR.tmp.<pid>/, every file fsynced, then renamed; an
// existing OUT_DIR is replaced only when it is empty.
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/hf_config.h"
#include "../model/hf_io.h"
#include "../model/rope.h"
#include "args.h"
#include "checkpoint.h"
#include "commands.h"
#include "config.h"

static const char *export_usage = "usage: mtrain export CKPT_DIR OUT_DIR [--dtype bf16|f32] [--max-shard-size SIZE] "
                                  "[model.key=value ...]\n  SIZE: bytes, or with a unit: 5GB, 500MB, 2GiB (default 5GB)\n";

// "5GB" = 5·10^9, "2GiB" = 2·2^30, "123" = 123 bytes (units as transformers
// reads them, case-insensitive); fails on anything else.
static uint64_t parse_size(const char *text) {
    static const struct { const char *unit; uint64_t scale; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"TB", 1000000000000},
        {"KIB", 1ull << 10}, {"MIB", 1ull << 20}, {"GIB", 1ull << 30}, {"TIB", 1ull << 40}};
    char *end;
    errno = 0;
    uint64_t n = isdigit((unsigned char)text[0]) ? strtoull(text, &end, 10) : 0;
    if (!isdigit((unsigned char)text[0]) || errno || n == 0)
        fail("--max-shard-size '%s': not a positive size (expected e.g. 5GB, 500MB, 2GiB or a byte count)", text);
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].unit)) continue;
        if (n > UINT64_MAX / units[i].scale) fail("--max-shard-size '%s': too large", text);
        return n * units[i].scale;
    }
    fail("--max-shard-size '%s': unknown unit '%s' (expected B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", text, end);
}

// OUT_DIR must not exist, or be an empty directory.
static void check_out_dir(const char *out) {
    struct stat info;
    if (stat(out, &info) != 0) {
        if (errno == ENOENT) return;
        fail("%s: cannot stat (%s)", out, strerror(errno));
    }
    if (!S_ISDIR(info.st_mode)) fail("%s: exists and is not a directory (refusing to overwrite it)", out);
    DIR *d = opendir(out);
    if (!d) fail("%s: cannot open directory (%s)", out, strerror(errno));
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            fail("%s: exists and is not empty (holds '%s'; refusing to overwrite, expected a new or empty folder)",
                 out, e->d_name);
    closedir(d);
}

// With --dtype bf16, the share of the weights that training moved away from
// train.init_from (named in CKPT_DIR/run.yaml) which the rounding puts back
// at their init_from values: a short or low-lr fine-tune can vanish in bf16.
// A warning on stderr when that is 1% or more. params: the weights
// [total_params] being exported (host memory).
static void warn_rounded_back(const float *params, const ModelConfig *mc, const char *src) {
    char *run_file = path_join(src, "run.yaml");
    Config run;
    config_defaults(&run);
    bool has_run = access(run_file, R_OK) == 0;
    if (has_run) config_load_yaml(&run, run_file);
    free(run_file);
    char *init_config = path_join(run.train.init_from_path, "config.json");
    bool has_init = has_run && run.train.init_from == INIT_FOLDER && access(init_config, R_OK) == 0;
    free(init_config);
    if (!has_init) return;
    Model init;
    model_init(&init, mc, backend_cpu(), NULL, 1024);
    model_load_hf_folder(&init, run.train.init_from_path);
    float *init_params = xmalloc(sizeof(float) * (size_t)init.total_params);
    model_gather_params(&init, init_params);
    int64_t changed = 0, back = 0;
    for (int64_t i = 0; i < init.total_params; i++) {
        float now = params[i], before = init_params[i];
        if (now == before) continue;
        changed++;
        back += f32_to_bf16(now) == f32_to_bf16(before);
    }
    free(init_params);
    model_free(&init);
    if (changed > 0 && back * 100 >= changed)
        fprintf(stderr, "mtrain: warning: bf16 rounding puts %.1f%% of the weights that training changed (%lld of %lld) "
                "back at their train.init_from values (%s); --dtype f32 keeps them\n", 100.0 * (double)back / (double)changed,
                (long long)back, (long long)changed, run.train.init_from_path);
}

int cmd_export(int argc, char **argv) {
    const char *dtype_name = "bf16", *shard_text = "5GB";
    const ArgOption options[] = {{"--dtype", ARG_VALUE, &dtype_name}, {"--max-shard-size", ARG_VALUE, &shard_text}};
    ArgsResult args = args_parse(options, (int)(sizeof(options) / sizeof(options[0])), argc, argv, 2);
    if (args_refused(args, export_usage)) return 2;
    if (args.kept < 2) return args_usage_error(export_usage, "export: expected CKPT_DIR and OUT_DIR");
    const char *src = argv[0], *out = argv[1];
    int first_override = args.rest;
    StDtype dtype = ST_BF16;
    if (!strcmp(dtype_name, "f32")) dtype = ST_F32;
    else if (strcmp(dtype_name, "bf16")) fail("--dtype '%s': not supported (expected bf16 or f32)", dtype_name);
    uint64_t max_shard = parse_size(shard_text);
    check_out_dir(out);

    // The model section: the folder's config.json, then the overrides.
    Config cfg;
    config_defaults(&cfg);
    char *path = path_join(src, "config.json");
    hf_config_read(path, &cfg.model);
    for (int i = first_override; i < argc; i++) {
        if (strncmp(argv[i], "model.", 6)) fail("export: override '%s': only model.* keys apply to an export", argv[i]);
        config_override(&cfg, argv[i]);
    }
    config_validate(&cfg, first_override < argc ? "export (with overrides)" : path);
    free(path);
    Model m;
    model_init(&m, &cfg.model, backend_cpu(), NULL, 1024);
    model_load_hf_folder(&m, src);
    float *params = xmalloc(sizeof(float) * (size_t)m.total_params);
    model_gather_params(&m, params);
    if (dtype == ST_BF16) warn_rounded_back(params, &cfg.model, src);

    char *tmp = xmalloc(strlen(out) + 32);
    sprintf(tmp, "%s.tmp.%d", out, (int)getpid());
    make_dirs(tmp);
    int files = model_write_hf_weights(&m, params, tmp, dtype, max_shard);
    free(params);
    path = path_join(tmp, "config.json");
    char *src_config = path_join(src, "config.json");
    hf_config_write(path, &m.cfg, dtype == ST_F32 ? "float32" : "bfloat16", src_config);
    free(src_config);
    free(path);
    hf_copy_side_files(src, tmp);
    fsync_dir(tmp);
    rename_into_place(tmp, out);  // replaces an empty OUT_DIR
    char *parent = xstrdup(out);
    fsync_dir(dirname(parent));
    free(parent);
    free(tmp);
    printf("exported %s to %s: %lld parameters as %s in %d file%s; max_position_embeddings %d, rope_theta %.17g, "
           "rope_scaling %s\n", src, out, (long long)m.total_params, dtype == ST_F32 ? "F32" : "BF16", files,
           files == 1 ? "" : "s", m.cfg.max_position_embeddings, m.cfg.rope_theta,
           rope_is_yarn(&m.cfg.rope_scaling) ? "yarn" : "none");
    model_free(&m);
    return 0;
}
