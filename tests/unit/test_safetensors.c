// test_safetensors.c: safetensors and config.json I/O. Round trips (F32 bit
// exact; BF16 against an independent round-to-nearest-even oracle), F16
// decoding of hand-made bit patterns, shape checks, and every malformed input:
// each bad case runs in a fork()ed child, which must exit non-zero with one
// line "mtrain: ..." naming the file and the problem.
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../dist/util.h"
#include "../../model/hf_config.h"
#include "../../model/safetensors.h"
#include "../lib/check.h"

static char tmpdir[64];

// path of `name` inside the test's temporary folder (one static buffer per slot).
static const char *tmp_path(const char *name) {
    static char bufs[4][512];
    static int slot = 0;
    char *buf = bufs[slot++ % 4];
    snprintf(buf, 512, "%s/%s", tmpdir, name);
    return buf;
}

static float bits_f32(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t bits; memcpy(&bits, &f, 4); return bits; }

// A file of: 8-byte little-endian `header_len`, the header text, `data_bytes` of data.
static void write_raw(const char *path, uint64_t header_len, const char *header, const void *data, size_t data_bytes) {
    FILE *f = xfopen(path, "wb");
    unsigned char len[8];
    for (int b = 0; b < 8; b++) len[b] = (unsigned char)(header_len >> (8 * b));
    xfwrite(len, 8, f, path);
    xfwrite(header, strlen(header), f, path);
    xfwrite(data, data_bytes, f, path);
    xfclose_sync(f, path);
}

// ----------------------------------------------------------------------------
// failure cases in a child process

typedef void (*Action)(const void *arg);

// Run action(arg) in a child; expect a non-zero exit and exactly one stderr line
// "mtrain: ..." that contains `path` and `problem`.
static void expect_failure(const char *what, Action action, const void *arg, const char *path, const char *problem) {
    fflush(stdout);
    fflush(stderr);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe failed");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        action(arg);
        _exit(0);  // reached only if the action did not fail
    }
    close(fds[1]);
    char msg[4096];
    size_t len = 0;
    ssize_t got;
    while ((got = read(fds[0], msg + len, sizeof(msg) - 1 - len)) > 0) len += (size_t)got;
    close(fds[0]);
    msg[len] = 0;
    int status;
    waitpid(pid, &status, 0);
    bool exited_nonzero = WIFEXITED(status) && WEXITSTATUS(status) != 0;
    bool one_line = len > 0 && msg[len - 1] == '\n' && !memchr(msg, '\n', len - 1);
    if (len && msg[len - 1] == '\n') msg[len - 1] = 0;
    EXPECT(exited_nonzero && one_line && strncmp(msg, "mtrain: ", 8) == 0 && strstr(msg, path) && strstr(msg, problem),
           "%s -> \"%s\"", what, msg);
}

static void open_action(const void *arg) {
    SafeTensors st;
    st_open(&st, (const char *)arg);
    st_close(&st);
}

typedef struct { const char *path, *name; int ndim; int64_t shape[ST_MAX_DIMS]; } ReadArgs;

static void read_action(const void *arg) {
    const ReadArgs *a = arg;
    SafeTensors st;
    st_open(&st, a->path);
    float dst[64];
    st_read_f32(&st, a->name, a->ndim, a->shape, dst);
    st_close(&st);
}

static void hf_read_action(const void *arg) {
    ModelConfig mc;
    hf_config_read((const char *)arg, &mc);
}

// ----------------------------------------------------------------------------
// safetensors: malformed files

typedef struct { const char *what, *header, *problem; } BadHeader;

static void test_bad_headers(void) {
    static const BadHeader cases[] = {
        {"empty header", "", "header is not valid JSON"},
        {"truncated JSON", "{\"a\": {\"dtype\": ", "header is not valid JSON"},
        {"header is an array", "[1, 2]", "header is not a JSON object"},
        {"garbage after JSON", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} xx", "stray bytes after the JSON"},
        {"entry not an object", "{\"a\": 5}", "tensor 'a': header entry is not a JSON object"},
        {"dtype missing", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", "tensor 'a': field 'dtype' is missing"},
        {"dtype not string", "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", "tensor 'a': field 'dtype' is not a string"},
        {"dtype I64", "{\"a\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
         "tensor 'a': unsupported dtype 'I64' (supported: F32, F16, BF16)"},
        {"shape missing", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", "tensor 'a': field 'shape' is missing"},
        {"shape not array", "{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", "tensor 'a': field 'shape' is not an array"},
        {"shape negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}",
         "tensor 'a': shape[1] is not a non-negative integer"},
        {"shape fractional", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}",
         "tensor 'a': shape[0] is not a non-negative integer"},
        {"shape string dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}",
         "tensor 'a': shape[0] is not a non-negative integer"},
        {"shape 9 dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
         "tensor 'a': shape has 9 dimensions (at most 8 supported)"},
        {"numel overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
         "tensor 'a': shape [4294967296, 4294967296] has too many elements"},
        {"bytes overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,1024],\"data_offsets\":[0,8]}}",
         "has too many bytes"},
        {"offsets missing", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", "tensor 'a': field 'data_offsets' is missing"},
        {"offsets one value", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}",
         "tensor 'a': field 'data_offsets' is not [begin, end]"},
        {"offsets three values", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}",
         "tensor 'a': field 'data_offsets' is not [begin, end]"},
        {"offsets string", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}",
         "tensor 'a': field 'data_offsets' is not [begin, end]"},
        {"offsets negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}",
         "tensor 'a': field 'data_offsets' is not [begin, end]"},
        {"offsets not array", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":8}}",
         "tensor 'a': field 'data_offsets' is not [begin, end]"},
        {"begin after end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
         "tensor 'a': data_offsets [8, 0] begin is after end"},
        {"end beyond buffer", "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}",
         "tensor 'a': data_offsets [0, 32] end beyond the data buffer (16 bytes"},
        {"end far beyond buffer", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9007199254740984,9007199254740992]}}",
         "end beyond the data buffer"},
        {"bytes != numel * size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
         "tensor 'a': data_offsets [0, 8] hold 8 bytes, but F32 [3] needs 12"},
        {"bf16 bytes mismatch", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
         "hold 16 bytes, but BF16 [2, 2] needs 8"},
        {"duplicate name", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         "tensor 'a' appears twice in the header"},
        {"overlapping offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         "tensors 'a' and 'b' overlap in the data buffer"},
        {"metadata not object", "{\"__metadata__\": 5}", "header field '__metadata__' is not a JSON object"},
        {"metadata value not string", "{\"__metadata__\": {\"format\": 1}}", "'__metadata__' entry 'format' is not a string"},
    };
    const char *path = tmp_path("bad.safetensors");
    unsigned char data[16] = {0};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_raw(path, strlen(cases[i].header), cases[i].header, data, sizeof(data));
        expect_failure(cases[i].what, open_action, path, path, cases[i].problem);
    }

    // Broken framing: the 8-byte length itself.
    FILE *f = xfopen(path, "wb");
    xfwrite("\x10\0\0\0\0", 5, f, path);
    xfclose_sync(f, path);
    expect_failure("file shorter than 8 bytes", open_action, path, path, "file is 5 bytes, shorter than the 8-byte");
    write_raw(path, 200000000, "{}", NULL, 0);
    expect_failure("header length 200 MB", open_action, path, path, "header length 200000000 exceeds the 100 MB limit");
    write_raw(path, UINT64_MAX, "{}", NULL, 0);
    expect_failure("header length 2^64-1", open_action, path, path, "header length 18446744073709551615 exceeds the 100 MB limit");
    write_raw(path, 1000, "{}", data, sizeof(data));
    expect_failure("header length past end of file", open_action, path, path,
                   "header length 1000 is larger than the rest of the file (18 bytes");

    // A valid file that lost its tail.
    float values[6] = {1, 2, 3, 4, 5, 6};
    StWriteTensor t = {"w", 2, {2, 3}, values};
    st_write(path, &t, 1, ST_F32);
    struct stat info;
    stat(path, &info);
    CHECK(truncate(path, info.st_size - 4) == 0, "truncate failed");
    expect_failure("truncated file", open_action, path, path, "tensor 'w': data_offsets [0, 24] end beyond the data buffer (20 bytes");

    const char *missing = tmp_path("does_not_exist.safetensors");
    expect_failure("missing file", open_action, missing, missing, "cannot open (No such file or directory)");
    expect_failure("directory", open_action, tmpdir, tmpdir, "not a regular file");
}

static void test_shape_mismatch(void) {
    const char *path = tmp_path("shapes.safetensors");
    float values[6] = {1, 2, 3, 4, 5, 6};
    StWriteTensor t = {"model.norm.weight", 2, {2, 3}, values};
    st_write(path, &t, 1, ST_F32);
    ReadArgs transposed = {path, "model.norm.weight", 2, {3, 2}};
    expect_failure("shape [2,3] read as [3,2]", read_action, &transposed, path,
                   "tensor 'model.norm.weight' has shape [2, 3], expected [3, 2]");
    ReadArgs flat = {path, "model.norm.weight", 1, {6}};
    expect_failure("shape [2,3] read as [6]", read_action, &flat, path, "tensor 'model.norm.weight' has shape [2, 3], expected [6]");
    ReadArgs absent = {path, "lm_head.weight", 2, {2, 3}};
    expect_failure("absent tensor", read_action, &absent, path, "tensor 'lm_head.weight' is missing");

    SafeTensors st;
    st_open(&st, path);
    EXPECT(st_find(&st, "lm_head.weight") == NULL && st_find(&st, "model.norm.weight") == &st.tensors[0], "st_find");
    st_close(&st);
}

// ----------------------------------------------------------------------------
// safetensors: round trips and decoding

static void test_f32_round_trip(void) {
    Rng rng;
    rng_seed(&rng, 7);
    float a[2 * 3 * 4], w[5 * 7], scalar = -3.25f;
    for (int i = 0; i < 24; i++) a[i] = (float)rng_normal(&rng);
    for (int i = 0; i < 35; i++) w[i] = bits_f32((uint32_t)rng_next(&rng));  // any bits, NaNs included
    a[0] = INFINITY; a[1] = -0.0f; a[2] = bits_f32(1); a[3] = NAN;
    StWriteTensor tensors[] = {
        {"a", 3, {2, 3, 4}, a},
        {"model.layers.0.self_attn.q_proj.weight", 2, {5, 7}, w},
        {"scalar", 0, {0}, &scalar},
        {"empty", 2, {0, 5}, NULL},
        {"odd \"name\" \\ here", 1, {1}, &scalar},
    };
    int count = (int)(sizeof(tensors) / sizeof(tensors[0]));
    const char *path = tmp_path("f32.safetensors");
    st_write(path, tensors, count, ST_F32);

    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    EXPECT(access(tmp, F_OK) != 0, "f32: no temporary file left behind");

    SafeTensors st;
    st_open(&st, path);
    EXPECT(st.count == count, "f32: %d tensors", st.count);
    EXPECT(st.data_start % 8 == 0, "f32: header padded to a multiple of 8 (data at %zu)", st.data_start);
    EXPECT(memmem(st.map, st.data_start, "\"__metadata__\":{\"format\":\"pt\"}", 30) != NULL, "f32: metadata format pt");
    bool order = true;
    for (int i = 0; i < count && i < st.count; i++) order = order && strcmp(st.tensors[i].name, tensors[i].name) == 0;
    EXPECT(order, "f32: tensors in the given order, names escaped and read back");
    const StTensor *ta = st_find(&st, "a");
    EXPECT(ta && ta->dtype == ST_F32 && ta->ndim == 3 && ta->shape[0] == 2 && ta->shape[1] == 3 && ta->shape[2] == 4 &&
           ta->numel == 24 && ta->offset == 0 && ta->bytes == 96, "f32: tensor 'a' metadata");
    const StTensor *ts = st_find(&st, "scalar");
    EXPECT(ts && ts->ndim == 0 && ts->numel == 1 && ts->bytes == 4, "f32: scalar has ndim 0, numel 1");
    const StTensor *te = st_find(&st, "empty");
    EXPECT(te && te->numel == 0 && te->bytes == 0, "f32: empty tensor");
    EXPECT(st.map_bytes == st.data_start + 4 * (24 + 35 + 1 + 1), "f32: file size is header + data");

    float ra[24], rw[35], rs = 0, rq = 0;
    st_read_f32(&st, "a", 3, (const int64_t[]){2, 3, 4}, ra);
    st_read_f32(&st, "model.layers.0.self_attn.q_proj.weight", 2, (const int64_t[]){5, 7}, rw);
    st_read_f32(&st, "scalar", 0, NULL, &rs);
    st_read_f32(&st, "empty", 2, (const int64_t[]){0, 5}, NULL);
    st_read_f32(&st, "odd \"name\" \\ here", 1, (const int64_t[]){1}, &rq);
    EXPECT(memcmp(ra, a, sizeof(a)) == 0 && memcmp(rw, w, sizeof(w)) == 0 && f32_bits(rs) == f32_bits(scalar) &&
           f32_bits(rq) == f32_bits(scalar), "f32: read back bit-exact");
    st_close(&st);

    // Writing over an existing file replaces it whole.
    StWriteTensor one = {"b", 1, {2}, a + 4};
    st_write(path, &one, 1, ST_F32);
    st_open(&st, path);
    float rb[2];
    st_read_f32(&st, "b", 1, (const int64_t[]){2}, rb);
    EXPECT(st.count == 1 && memcmp(rb, a + 4, sizeof(rb)) == 0, "f32: overwrite replaces the file");
    st_close(&st);
}

// Independent of the bit trick in safetensors.c: take the two bf16 neighbours
// of |x| in double arithmetic and pick the nearer one (the even one on a tie).
static uint16_t bf16_oracle(float x) {
    uint32_t bits = f32_bits(x);
    uint16_t sign = (uint16_t)(bits >> 16 & 0x8000);
    if (isinf(x)) return sign | 0x7f80;
    uint32_t magnitude = bits & 0x7fffffff;
    uint32_t lo_bits = magnitude & 0xffff0000u;
    double lo = (double)bits_f32(lo_bits);
    int exponent = (int)(magnitude >> 23);
    double ulp = exponent == 0 ? ldexp(1, -133) : ldexp(1, exponent - 127 - 7);
    double below = fabs((double)x) - lo, above = lo + ulp - fabs((double)x);
    bool take_lo = below < above || (below == above && ((lo_bits >> 16) & 1) == 0);
    return sign | (uint16_t)((lo_bits >> 16) + (take_lo ? 0 : 1));
}

static void test_bf16_round_trip(void) {
    enum { N = 100000 };
    static const uint32_t crafted[] = {
        0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff,  // ties to even down/up, just above/below a tie
        0x7f7fffff, 0x7f7f7fff, 0x7f7f8000, 0xff7fffff,  // rounds to inf / stays finite / tie to inf
        0x00000001, 0x00008000, 0x00018000, 0x007fffff,  // subnormals, incl. ties and rounding into normals
        0x80000000, 0x00000000, 0x7f800000, 0xff800000,  // zeros, infinities
        0x7fc00000, 0x7f800001, 0xffffffff, 0x7f80ffff,  // NaNs (one that naive rounding would turn into inf)
    };
    int ncrafted = (int)(sizeof(crafted) / sizeof(crafted[0]));
    float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
    Rng rng;
    rng_seed(&rng, 11);
    for (int i = 0; i < N; i++) x[i] = i < ncrafted ? bits_f32(crafted[i]) : bits_f32((uint32_t)rng_next(&rng));
    for (int i = ncrafted; i < N / 2; i++) x[i] = (float)rng_normal(&rng);  // typical weights too

    StWriteTensor t = {"x", 2, {N / 1000, 1000}, x};
    const char *path = tmp_path("bf16.safetensors");
    st_write(path, &t, 1, ST_BF16);
    SafeTensors st;
    st_open(&st, path);
    EXPECT(st.count == 1 && st.tensors[0].dtype == ST_BF16 && st.tensors[0].bytes == 2 * N, "bf16: stored as BF16, 2 bytes each");
    st_read_f32(&st, "x", 2, (const int64_t[]){N / 1000, 1000}, y);
    st_close(&st);

    int wrong = 0, first_wrong = -1;
    for (int i = 0; i < N; i++) {
        uint32_t got = f32_bits(y[i]);
        bool ok;
        if (isnan(x[i])) ok = isnan(y[i]) && (got >> 31) == (f32_bits(x[i]) >> 31);
        else ok = (got & 0xffff) == 0 && (got >> 16) == bf16_oracle(x[i]);
        if (!ok && wrong++ == 0) first_wrong = i;
    }
    EXPECT(wrong == 0, "bf16: %d values round to nearest even (%d wrong, first at %d)", N, wrong, first_wrong);
    // A few by hand, so that the oracle itself is checked too.
    EXPECT(f32_bits(y[0]) == 0x3f800000 && f32_bits(y[1]) == 0x3f820000 && f32_bits(y[2]) == 0x3f810000 &&
           f32_bits(y[4]) == 0x7f800000 && f32_bits(y[5]) == 0x7f7f0000 && f32_bits(y[8]) == 0 &&
           f32_bits(y[11]) == 0x00800000 && f32_bits(y[12]) == 0x80000000 && isnan(y[17]),
           "bf16: hand-checked ties, overflow, subnormals, NaN");
    free(x);
    free(y);
}

static void test_f16_read(void) {
    static const uint16_t half[] = {0x0000, 0x8000, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff,
                                    0x8001, 0x0400, 0x3555, 0x3800, 0x7c00, 0xfc00, 0x7e00};
    static const float expected[] = {0.0f, -0.0f, 1.0f, -2.0f, 65504.0f, 0x1p-24f, 0x1.ff8p-15f,
                                     -0x1p-24f, 0x1p-14f, 0x1.554p-2f, 0.5f, INFINITY, -INFINITY, NAN};
    enum { N = sizeof(half) / sizeof(half[0]) };
    // 2 x 7, after an odd-length header so that the data sits at an odd address.
    char header[256];
    snprintf(header, sizeof(header), "{\"h\":{\"dtype\":\"F16\",\"shape\":[2,7],\"data_offsets\":[0,%d]}}", 2 * N);
    if (strlen(header) % 2 == 0) strcat(header, " ");
    const char *path = tmp_path("f16.safetensors");
    write_raw(path, strlen(header), header, half, sizeof(half));

    SafeTensors st;
    st_open(&st, path);
    EXPECT(st.data_start % 2 == 1, "f16: data at an odd offset (%zu)", st.data_start);
    float got[N];
    st_read_f32(&st, "h", 2, (const int64_t[]){2, 7}, got);
    st_close(&st);
    for (int i = 0; i < N; i++) {
        bool ok = isnan(expected[i]) ? isnan(got[i]) : f32_bits(got[i]) == f32_bits(expected[i]);
        EXPECT(ok, "f16: 0x%04x -> %a (want %a)", half[i], (double)got[i], (double)expected[i]);
    }
}

// ----------------------------------------------------------------------------
// config.json

// What hf_config_read gives when there is no rope_scaling.
#define NO_SCALING {ROPE_NONE, 1.0, 0, 32.0, 1.0, 0, 0, 0, true}

static bool same_rope_scaling(const RopeScaling *a, const RopeScaling *b) {
    return a->type == b->type && a->factor == b->factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->attention_factor == b->attention_factor && a->mscale == b->mscale &&
           a->mscale_all_dim == b->mscale_all_dim && a->truncate == b->truncate;
}

static bool same_config(const ModelConfig *a, const ModelConfig *b) {
    return a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
           a->rope_theta == b->rope_theta && a->rms_norm_eps == b->rms_norm_eps &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->init_std == b->init_std &&
           a->max_position_embeddings == b->max_position_embeddings && same_rope_scaling(&a->rope_scaling, &b->rope_scaling);
}

static void write_text(const char *path, const char *text) {
    FILE *f = xfopen(path, "w");
    xfwrite(text, strlen(text), f, path);
    xfclose_sync(f, path);
}

static void test_hf_config_round_trip(void) {
    const ModelConfig configs[] = {
        {151936, 896, 4864, 24, 14, 2, 64, 1000000.0, 1e-6, true, 0.1 + 0.2, 32768, NO_SCALING},
        {1000, 96, 200, 3, 6, 3, 16, 123456.789, 1.0 / 3.0, false, 0.02, 524288,
         {ROPE_YARN, 16.0, 32768, 32.0, 1.0, 0, 0, 0, true}},
        {32, 8, 8, 1, 1, 1, 8, 5e15 + 1, 1e-300, false, 1.7976931348623157e308, 1,
         {ROPE_YARN, 1.0 / 3.0 + 1, 7, 0.1 + 0.2, 0.1, 1.25, 0.7, 1.0 / 7.0, false}},
    };
    const char *path = tmp_path("config.json");
    for (int i = 0; i < 3; i++) {
        hf_config_write(path, &configs[i], "float32", NULL);
        ModelConfig back;
        hf_config_read(path, &back);
        EXPECT(same_config(&back, &configs[i]), "config.json round trip %d is exact", i);
    }
    hf_config_write(path, &configs[0], "float32", NULL);
    char *text = read_file(path, NULL);
    EXPECT(strstr(text, "\"model_type\": \"qwen2\"") && strstr(text, "\"Qwen2ForCausalLM\"") &&
           strstr(text, "\"rope_theta\": 1000000.0,") && strstr(text, "\"rms_norm_eps\": 1e-06,") &&
           strstr(text, "\"initializer_range\": 0.30000000000000004,") && strstr(text, "\"num_hidden_layers\": 24,") &&
           strstr(text, "\"max_window_layers\": 24,") && strstr(text, "\"sliding_window\": 32768,") &&
           strstr(text, "\"tie_word_embeddings\": true,") && strstr(text, "\"use_sliding_window\": false,"),
           "config.json text has HF names and shortest exact numbers");
    free(text);

    // The config.json of Qwen2.5-0.5B as published.
    write_text(path,
        "{\n  \"architectures\": [\"Qwen2ForCausalLM\"],\n  \"attention_dropout\": 0.0,\n"
        "  \"bos_token_id\": 151643,\n  \"eos_token_id\": 151643,\n  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": 896,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": 4864,\n"
        "  \"max_position_embeddings\": 32768,\n  \"max_window_layers\": 24,\n  \"model_type\": \"qwen2\",\n"
        "  \"num_attention_heads\": 14,\n  \"num_hidden_layers\": 24,\n  \"num_key_value_heads\": 2,\n"
        "  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 1000000.0,\n  \"sliding_window\": 32768,\n"
        "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.40.1\",\n"
        "  \"use_cache\": true,\n  \"use_sliding_window\": false,\n  \"vocab_size\": 151936\n}\n");
    ModelConfig qwen, want = {151936, 896, 4864, 24, 14, 2, 64, 1000000.0, 1e-6, true, 0.02, 32768, NO_SCALING};
    hf_config_read(path, &qwen);
    EXPECT(same_config(&qwen, &want), "Qwen2.5-0.5B config.json");

    write_text(path, "{\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, "
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": null}");
    ModelConfig minimal, defaults = {1000, 64, 128, 2, 4, 4, 16, 10000.0, 1e-6, false, 0.02, 32768, NO_SCALING};
    hf_config_read(path, &minimal);
    EXPECT(same_config(&minimal, &defaults), "config.json defaults (null counts as absent)");

    // YaRN as the Qwen2.5 model cards say to enable it (old key `type`), and
    // as transformers 5 writes it (`rope_parameters` with rope_type and rope_theta).
#define BASE "{\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, " \
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"rope_theta\": 1000000.0, "
    write_text(path, BASE "\"rope_scaling\": {\"factor\": 4.0, \"original_max_position_embeddings\": 32768, "
                          "\"type\": \"yarn\"}}");
    ModelConfig yarn, want_yarn = {1000, 64, 128, 2, 4, 4, 16, 1e6, 1e-6, false, 0.02, 32768,
                                   {ROPE_YARN, 4.0, 32768, 32.0, 1.0, 0, 0, 0, true}};
    hf_config_read(path, &yarn);
    EXPECT(same_config(&yarn, &want_yarn), "Qwen2.5 model-card rope_scaling (type yarn)");
    write_text(path, BASE "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 5e5, "
                          "\"original_max_position_embeddings\": 32768, \"beta_fast\": 16, \"truncate\": false}}");
    want_yarn.rope_theta = 5e5;
    want_yarn.rope_scaling.beta_fast = 16;
    want_yarn.rope_scaling.truncate = false;
    hf_config_read(path, &yarn);
    EXPECT(same_config(&yarn, &want_yarn), "transformers 5 rope_parameters (rope_type yarn, rope_theta inside)");
    write_text(path, BASE "\"rope_scaling\": {\"rope_type\": \"default\"}}");
    hf_config_read(path, &yarn);
    EXPECT(yarn.rope_scaling.type == ROPE_NONE, "rope_type default is plain RoPE");
#undef BASE
    hf_config_write(path, &configs[1], "bfloat16", NULL);
    text = read_file(path, NULL);
    EXPECT(strstr(text, "  \"rope_scaling\": {\n    \"beta_fast\": 32.0,\n    \"beta_slow\": 1.0,\n"
                        "    \"factor\": 16.0,\n    \"original_max_position_embeddings\": 32768,\n"
                        "    \"rope_type\": \"yarn\",\n    \"type\": \"yarn\"\n  },\n") &&
           strstr(text, "\"torch_dtype\": \"bfloat16\""),
           "config.json rope_scaling object in HF's schema, torch_dtype as given");
    free(text);
    hf_config_write(path, &configs[0], "float32", NULL);
    text = read_file(path, NULL);
    EXPECT(strstr(text, "  \"rope_scaling\": null,\n") != NULL, "config.json rope_scaling null without scaling");
    free(text);
}

typedef struct { const char *what, *json, *problem; } BadConfig;

static void test_hf_config_bad(void) {
#define REQ "\"vocab_size\": 1000, \"intermediate_size\": 128, \"num_hidden_layers\": 2"
    static const BadConfig cases[] = {
        {"missing hidden_size", "{" REQ ", \"num_attention_heads\": 4}", "field 'hidden_size' is missing (expected an integer)"},
        {"missing vocab_size", "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}",
         "field 'vocab_size' is missing (expected an integer)"},
        {"hidden_size string", "{" REQ ", \"hidden_size\": \"64\", \"num_attention_heads\": 4}",
         "field 'hidden_size' must be an integer, not a string"},
        {"hidden_size fractional", "{" REQ ", \"hidden_size\": 64.5, \"num_attention_heads\": 4}",
         "field 'hidden_size' must be an integer, not 64.5"},
        {"hidden_size huge", "{" REQ ", \"hidden_size\": 1e12, \"num_attention_heads\": 4}",
         "field 'hidden_size' must be an integer, not 1000000000000"},
        {"hidden_size negative", "{" REQ ", \"hidden_size\": -64, \"num_attention_heads\": 4}",
         "field 'hidden_size' must be positive, not -64"},
        {"model_type llama", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"model_type\": \"llama\"}",
         "model_type 'llama' is not supported (expected qwen2)"},
        {"model_type number", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"model_type\": 2}",
         "field 'model_type' must be a string, not a number"},
        {"hidden_act gelu", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"hidden_act\": \"gelu\"}",
         "hidden_act 'gelu' is not supported (expected silu)"},
        {"sliding window on", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"use_sliding_window\": true}",
         "use_sliding_window true is not supported"},
        {"not JSON", "{\n  \"vocab_size\": 1000,\n  \"hidden_size\": 64\n  \"num_attention_heads\": 4\n}", "not valid JSON (error on line 4)"},
        {"trailing garbage", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4} x", "not valid JSON"},
        {"empty file", "", "not valid JSON"},
        {"array", "[1, 2]", "not a JSON object"},
        {"heads do not divide hidden", "{" REQ ", \"hidden_size\": 100, \"num_attention_heads\": 3}",
         "hidden_size 100 is not divisible by num_attention_heads 3"},
        {"kv heads do not divide heads", "{" REQ ", \"hidden_size\": 112, \"num_attention_heads\": 14, \"num_key_value_heads\": 4}",
         "num_attention_heads 14 is not divisible by num_key_value_heads 4"},
        {"rope_theta string", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_theta\": \"1e6\"}",
         "field 'rope_theta' must be a number, not a string"},
        {"rms_norm_eps zero", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rms_norm_eps\": 0}",
         "field 'rms_norm_eps' must be a positive number, not 0"},
        {"rope_theta infinite", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_theta\": 1e999}",
         "field 'rope_theta' must be a positive number, not inf"},
        {"tie not bool", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"tie_word_embeddings\": 1}",
         "field 'tie_word_embeddings' must be true or false, not a number"},
        {"head_dim differs", "{" REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32}",
         "head_dim 32 differs from hidden_size / num_attention_heads = 16"},
#define ROPE REQ ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_scaling\": "
        {"rope_scaling linear", "{" ROPE "{\"type\": \"linear\", \"factor\": 2}}",
         "rope_scaling type 'linear' is not supported (expected \"yarn\" or \"default\")"},
        {"rope_scaling no type", "{" ROPE "{\"factor\": 2}}", "rope_scaling has no 'type'"},
        {"rope_scaling two types", "{" ROPE "{\"type\": \"yarn\", \"rope_type\": \"default\", \"factor\": 2}}",
         "rope_scaling has rope_type 'default' and type 'yarn'"},
        {"rope_scaling no factor", "{" ROPE "{\"type\": \"yarn\"}}", "rope_scaling of type yarn has no 'factor'"},
        {"rope_scaling factor below 1", "{" ROPE "{\"type\": \"yarn\", \"factor\": 0.5}}",
         "field 'rope_scaling.factor' is 0.5 (expected a number >= 1)"},
        {"rope_scaling factor string", "{" ROPE "{\"type\": \"yarn\", \"factor\": \"4\"}}",
         "field 'rope_scaling.factor' must be a number, not a string"},
        {"rope_scaling original fractional", "{" ROPE "{\"type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 1.5}}",
         "field 'rope_scaling.original_max_position_embeddings' must be an integer, not 1.5"},
        {"rope_scaling unknown key", "{" ROPE "{\"type\": \"yarn\", \"factor\": 4, \"low_freq_factor\": 1}}",
         "rope_scaling key 'low_freq_factor' is not supported"},
        {"rope_scaling betas reversed", "{" ROPE "{\"type\": \"yarn\", \"factor\": 4, \"beta_fast\": 1, \"beta_slow\": 32}}",
         "beta_fast 1 is not above beta_slow 32"},
        {"rope_scaling a number", "{" ROPE "4}", "field 'rope_scaling' must be an object or null, not a number"},
#undef ROPE
    };
#undef REQ
    const char *path = tmp_path("bad_config.json");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_text(path, cases[i].json);
        expect_failure(cases[i].what, hf_read_action, path, path, cases[i].problem);
    }
    const char *missing = tmp_path("no_such_dir/config.json");
    expect_failure("config.json missing", hf_read_action, missing, missing, "cannot open");
}

// ----------------------------------------------------------------------------

static int remove_entry(const char *path, const struct stat *info, int flag, struct FTW *ftw) {
    (void)info; (void)flag; (void)ftw;
    return remove(path);
}

int main(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mtrain_test_safetensors_XXXXXX");
    CHECK(mkdtemp(tmpdir), "mkdtemp failed");
    // Failure cases first: the children then never inherit a started OpenMP pool.
    test_bad_headers();
    test_shape_mismatch();
    test_hf_config_bad();
    test_f32_round_trip();
    test_bf16_round_trip();
    test_f16_read();
    test_hf_config_round_trip();
    nftw(tmpdir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    return check_exit();
}
