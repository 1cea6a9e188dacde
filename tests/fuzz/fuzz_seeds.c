// fuzz_seeds.c: writes the seed inputs of the shard, safetensors and
// config.json fuzz targets with mtrain's own writers (small, valid files).
//   fuzz_seeds DIR    -> DIR/shard/*.shard, DIR/safetensors/*.safetensors, DIR/hf_config/*.json
#include <stdio.h>
#include <string.h>

#include "../../dist/util.h"
#include "../../data/shard.h"
#include "../../model/hf_config.h"
#include "../../model/safetensors.h"

static void write_shard_seed(const char *path, int token_bytes, int64_t frame_tokens, ShardTokenizer tokenizer) {
    ShardWriter *w = shard_writer_open(path, token_bytes == 2 ? 300 : 70000, token_bytes, frame_tokens);
    shard_writer_set_tokenizer(w, tokenizer);
    uint32_t doc[40];
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < 40; i++) doc[i] = (uint32_t)((d * 97 + i * 31) % (token_bytes == 2 ? 300 : 70000));
        shard_writer_add_document(w, doc, 10 + 15 * d);
    }
    shard_writer_close(w);
}

static void write_safetensors_seed(const char *path, StDtype dtype) {
    static const float a[6] = {1, -2, 0.5f, 3e-3f, 1e30f, -0.0f}, b[4] = {7, 8, 9, 10}, c[1] = {42};
    StWriteTensor tensors[3] = {
        {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "model.norm.weight", .ndim = 1, .shape = {4}, .data = b},
        {.name = "scalar", .ndim = 0, .data = c},
    };
    st_write(path, tensors, 3, dtype);
}

static void write_config_seed(const char *path, bool yarn) {
    ModelConfig mc = {.vocab_size = 151936, .hidden_size = 896, .intermediate_size = 4864, .num_layers = 24,
                      .num_heads = 14, .num_kv_heads = 2, .head_dim = 64, .rope_theta = 1e6, .rms_norm_eps = 1e-6,
                      .tie_word_embeddings = true, .init_std = 0.02, .max_position_embeddings = 32768};
    if (yarn)
        mc.rope_scaling = (RopeScaling){.type = ROPE_YARN, .factor = 4, .original_max_position_embeddings = 32768,
                                        .beta_fast = 32, .beta_slow = 1, .truncate = true};
    hf_config_write(path, &mc, "bfloat16", NULL);
}

int main(int argc, char **argv) {
    if (argc != 2) fail("usage: fuzz_seeds DIR");
    const char *folders[] = {"shard", "safetensors", "hf_config"};
    char path[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", argv[1], folders[i]);
        make_dirs(path);
    }
    ShardTokenizer json = {.kind = SHARD_TOKENIZER_JSON, .hash = 0x0123456789abcdefull};
    snprintf(path, sizeof(path), "%s/shard/u16.shard", argv[1]);
    write_shard_seed(path, 2, 16, shard_tokenizer_of("bytes"));
    snprintf(path, sizeof(path), "%s/shard/u32.shard", argv[1]);
    write_shard_seed(path, 4, 64, json);
    snprintf(path, sizeof(path), "%s/safetensors/f32.safetensors", argv[1]);
    write_safetensors_seed(path, ST_F32);
    snprintf(path, sizeof(path), "%s/safetensors/bf16.safetensors", argv[1]);
    write_safetensors_seed(path, ST_BF16);
    snprintf(path, sizeof(path), "%s/hf_config/plain.json", argv[1]);
    write_config_seed(path, false);
    snprintf(path, sizeof(path), "%s/hf_config/yarn.json", argv[1]);
    write_config_seed(path, true);
    return 0;
}
