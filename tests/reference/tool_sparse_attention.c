// tool_sparse_attention.c: helper program of tests/reference/test_sparse_reference.py
// (named tool_*, so the runner does not run it on its own). Reads
// DIR/index.json, a SparseIndex in CSR form with the call's shape:
//   {"heads", "kv_heads", "head_dim", "block", "seq_len", "scale",
//    "q_blocks": [...], "block_start": [...], "blocks": [...],
//    "column_start": [...], "columns": [...]}
// and DIR/inputs.safetensors (q, dout [Tq, Hq, D]; k, v [N, Hkv, D]) where
// the queries are the tokens of q_blocks (block-aligned) and the keys are all
// N positions in one chunk; runs attn_sparse_forward_cpu and
// attn_sparse_backward_cpu and writes DIR/outputs.safetensors (o, dq
// [Tq, Hq, D]; lse [Hq, Tq]; dk, dv [N, Hkv, D]).
//   tool_sparse_attention DIR
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../attention/kernels/flash_cpu.h"
#include "../../attention/sparse/sparse.h"
#include "../../dist/util.h"
#include "../../model/safetensors.h"

// Integer field `name` of the JSON object, >= min.
static int64_t json_int(const char *path, const cJSON *root, const char *name, int64_t min) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble) ||
        item->valuedouble < (double)min)
        fail("%s: field '%s' must be an integer >= %lld", path, name, (long long)min);
    return (int64_t)item->valuedouble;
}

// Integer array field `name` of exactly n entries (n < 0: any length, *count
// gets it), each in [0, limit).
static int64_t *json_ints(const char *path, const cJSON *root, const char *name, int64_t n,
                          int64_t limit, int64_t *count) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!cJSON_IsArray(item)) fail("%s: field '%s' must be an array of integers", path, name);
    const int64_t len = cJSON_GetArraySize(item);
    if (n >= 0 && len != n)
        fail("%s: field '%s' has %lld entries, expected %lld", path, name, (long long)len,
             (long long)n);
    int64_t *x = xmalloc((size_t)(len + 1) * sizeof(int64_t)), i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, item) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= (double)limit)
            fail("%s: field '%s' entry %lld must be an integer in [0, %lld)", path, name,
                 (long long)i, (long long)limit);
        x[i++] = (int64_t)e->valuedouble;
    }
    if (count) *count = len;
    return x;
}

// CSR offsets: start [rows + 1] from 0, non-decreasing, ending at the entry count.
static void check_csr(const char *path, const char *name, const int64_t *start, int64_t rows,
                      int64_t entries) {
    for (int64_t r = 0; r < rows; r++)
        if (start[r + 1] < start[r])
            fail("%s: field '%s' decreases at row %lld", path, name, (long long)r);
    if (start[0] != 0 || start[rows] != entries)
        fail("%s: field '%s' must run from 0 to %lld", path, name, (long long)entries);
}

int main(int argc, char **argv) {
    if (argc != 2) fail("usage: tool_sparse_attention DIR");
    char path[4096], in_path[4096], out_path[4096];
    snprintf(path, sizeof path, "%s/index.json", argv[1]);
    snprintf(in_path, sizeof in_path, "%s/inputs.safetensors", argv[1]);
    snprintf(out_path, sizeof out_path, "%s/outputs.safetensors", argv[1]);

    size_t bytes;
    char *text = read_file(path, &bytes);
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object", path);
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(root, "scale");
    if (!cJSON_IsNumber(scale)) fail("%s: field 'scale' must be a number", path);
    SparseIndex x = {.num_heads = (int)json_int(path, root, "heads", 1),
                     .block_size = (int)json_int(path, root, "block", 1),
                     .seq_len = json_int(path, root, "seq_len", 1)};
    const int Hkv = (int)json_int(path, root, "kv_heads", 1), D = (int)json_int(path, root, "head_dim", 1);
    const int B = x.block_size, Hq = x.num_heads;
    const int64_t N = x.seq_len, nblocks = (N + B - 1) / B;
    if (Hq % Hkv != 0) fail("%s: %d heads are not a multiple of %d kv heads", path, Hq, Hkv);
    x.q_blocks = json_ints(path, root, "q_blocks", -1, nblocks, &x.num_q_blocks);
    const int64_t rows = Hq * x.num_q_blocks;
    int64_t nb, nc;
    x.block_start = json_ints(path, root, "block_start", rows + 1, INT64_MAX, NULL);
    x.blocks = json_ints(path, root, "blocks", -1, nblocks, &nb);
    x.column_start = json_ints(path, root, "column_start", rows + 1, INT64_MAX, NULL);
    x.columns = json_ints(path, root, "columns", -1, N, &nc);
    check_csr(path, "block_start", x.block_start, rows, nb);
    check_csr(path, "column_start", x.column_start, rows, nc);

    // Query positions: the tokens of q_blocks, in order.
    int64_t Tq = 0;
    int64_t *q_pos = xmalloc((size_t)(x.num_q_blocks * B + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < x.num_q_blocks; i++) {
        if (i > 0 && x.q_blocks[i] <= x.q_blocks[i - 1]) fail("%s: q_blocks must ascend", path);
        if (i + 1 < x.num_q_blocks && (x.q_blocks[i] + 1) * B > N)
            fail("%s: only the last query block may be the sequence's short last block", path);
        for (int64_t t = x.q_blocks[i] * B; t < (x.q_blocks[i] + 1) * B && t < N; t++) q_pos[Tq++] = t;
    }
    int64_t *k_pos = xmalloc((size_t)N * sizeof(int64_t));
    for (int64_t t = 0; t < N; t++) k_pos[t] = t;
    AttnShape s = {Tq, N, Hq, Hkv, D, B, (float)scale->valuedouble, NULL, 0, NULL};

    const int64_t nq = Tq * Hq * D, nk = N * Hkv * D;
    float *buf = xmalloc((size_t)(4 * nq + 4 * nk + 2 * Hq * Tq) * sizeof(float));
    float *q = buf, *dout = q + nq, *o = dout + nq, *dq = o + nq, *k = dq + nq, *v = k + nk;
    float *dk = v + nk, *dv = dk + nk, *lse = dv + nk, *delta = lse + Hq * Tq;
    SafeTensors st;
    st_open(&st, in_path);
    st_read_f32(&st, "q", 3, (int64_t[]){Tq, Hq, D}, q);
    st_read_f32(&st, "dout", 3, (int64_t[]){Tq, Hq, D}, dout);
    st_read_f32(&st, "k", 3, (int64_t[]){N, Hkv, D}, k);
    st_read_f32(&st, "v", 3, (int64_t[]){N, Hkv, D}, v);
    st_close(&st);

    attn_forward_init(&s, o, lse);
    attn_sparse_forward_cpu(&s, &x, q, q_pos, k, v, k_pos, o, lse);
    attn_backward_delta(&s, o, dout, delta);
    memset(dq, 0, (size_t)nq * sizeof(float));
    memset(dk, 0, (size_t)(2 * nk) * sizeof(float));
    attn_sparse_backward_cpu(&s, &x, q, q_pos, k, v, k_pos, lse, delta, dout, dq, dk, dv);

    const StWriteTensor out[] = {{"o", 3, {Tq, Hq, D}, o}, {"lse", 2, {Hq, Tq}, lse},
                                 {"dq", 3, {Tq, Hq, D}, dq}, {"dk", 3, {N, Hkv, D}, dk},
                                 {"dv", 3, {N, Hkv, D}, dv}};
    st_write(out_path, out, 5, ST_F32);
    free(buf); free(q_pos); free(k_pos); free(text); cJSON_Delete(root);
    free(x.q_blocks); free(x.block_start); free(x.blocks); free(x.column_start); free(x.columns);
    return 0;
}
