// test_checkpoint_stream.c: the optimizer state a checkpoint streams. For a
// model of one piece (< 1M parameters) and one of three pieces, streamed from
// the model's moments: optimizer.zst is the magic, the parameter count, the
// XXH64 of the raw moments m then v, and one zstd frame that decompresses to
// exactly those moments; for one piece they equal a one-shot ZSTD_compress
// at level 3; and
// checkpoint_load reads the moments back bit for bit.
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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

static void check_model(const char *label, int hidden, int vocab, const char *dir) {
    ModelConfig c = {.vocab_size = vocab, .hidden_size = hidden, .intermediate_size = 2 * hidden, .num_layers = 2,
                     .num_heads = 4, .num_kv_heads = 2, .head_dim = hidden / 4, .rope_theta = 10000.0,
                     .rms_norm_eps = 1e-6, .tie_word_embeddings = false, .init_std = 0.02,
                     .max_position_embeddings = 256};
    Model m;
    model_init(&m, &c, backend_cpu(), NULL, 1024);
    model_init_weights(&m, 7);
    model_alloc_optimizer(&m);
    int64_t P = m.total_params;
    size_t bytes = sizeof(float) * (size_t)P;
    // Moments: smooth values with repeats, as real ones compress.
    float *host = xmalloc(2 * bytes);
    Rng rng;
    rng_seed(&rng, 11);
    for (int64_t i = 0; i < 2 * P; i++) host[i] = (float)(i % 977) * 1e-3f + (float)rng_normal(&rng) * 1e-6f;
    m.be->upload(m.adam_m, host, bytes);
    m.be->upload(m.adam_v, host + P, bytes);

    Config cfg;
    config_defaults(&cfg);
    cfg.model = c;
    snprintf(cfg.checkpoint.dir, sizeof(cfg.checkpoint.dir), "%s/%s", dir, label);
    TrainState streamed = {.step = 1};
    float *params = xmalloc(bytes);
    model_gather_params(&m, params);
    checkpoint_save(&cfg, &m, &streamed, params, NULL, NULL);
    free(params);
    char path[4096];
    snprintf(path, sizeof(path), "%s/step_00000001/optimizer.zst", cfg.checkpoint.dir);
    size_t file_bytes;
    char *file = read_file(path, &file_bytes);

    uint64_t header[2];
    memcpy(header, file + 8, sizeof(header));
    EXPECT(!memcmp(file, "MTADAMW2", 8) && header[0] == (uint64_t)P && header[1] == XXH64(host, 2 * bytes, 0),
           "%s: header holds the magic, the parameter count and the XXH64 of m then v", label);
    const char *frame = file + 24;
    size_t frame_bytes = file_bytes - 24;
    float *raw = xmalloc(2 * bytes);
    size_t got = ZSTD_decompress(raw, 2 * bytes, frame, frame_bytes);
    EXPECT(!ZSTD_isError(got) && got == 2 * bytes && !memcmp(raw, host, 2 * bytes) &&
               ZSTD_findFrameCompressedSize(frame, frame_bytes) == frame_bytes,
           "%s: one zstd frame that decompresses to exactly m then v", label);
    if (P < (1 << 20)) {
        size_t bound = ZSTD_compressBound(2 * bytes);
        char *oneshot = xmalloc(bound);
        size_t packed = ZSTD_compress(oneshot, bound, host, 2 * bytes, 3);
        EXPECT(packed == frame_bytes && !memcmp(oneshot, frame, packed),
               "%s: the frame equals a one-shot ZSTD_compress at level 3", label);
        free(oneshot);
    }

    Model back;
    model_init(&back, &c, backend_cpu(), NULL, 1024);
    TrainState state;
    snprintf(path, sizeof(path), "%s/step_00000001", cfg.checkpoint.dir);
    checkpoint_load(path, &back, &state);
    float *m_back = xmalloc(bytes), *v_back = xmalloc(bytes);
    back.be->download(m_back, back.adam_m, bytes);
    back.be->download(v_back, back.adam_v, bytes);
    EXPECT(!memcmp(m_back, host, bytes) && !memcmp(v_back, host + P, bytes) && state.step == 1,
           "%s: checkpoint_load reads the moments back bit for bit", label);
    free(m_back);
    free(v_back);
    free(raw);
    free(file);
    free(host);
    model_free(&back);
    model_free(&m);
}

int main(void) {
    char dir[] = "/tmp/mtrain_ckstream_XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp: cannot create a temporary folder");
    check_model("one piece", 64, 256, dir);
    check_model("three pieces per moment", 256, 2048, dir);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_exit();
}
