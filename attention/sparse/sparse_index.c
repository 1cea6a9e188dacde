// sparse_index.c: from estimated scores to work, see sparse.h.
// sparse_select picks each q head's vertical positions and slash
// offsets (top-p mass or fixed counts, plus sink and local lines);
// sparse_index_build turns a pattern into per-(head, query block) key blocks
// and extra columns (sparse_index_for_rows: for the blocks of given rows); sparse_index_count measures the pattern's token-exact
// work; sparse_budget_load reads fixed budgets per layer and head. Everything
// is deterministic: identical inputs give identical output on every rank.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sparse.h"
#include "../../dist/util.h"

// ---------------------------------------------------------------- selection

// Sort key of line `idx` with score x >= 0: descending keys give descending
// scores, ties to the smaller index (a non-negative float's bits order like it).
static uint64_t line_key(float x, int64_t idx) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return ((uint64_t)bits << 32) | (uint64_t)(UINT32_MAX - (uint32_t)idx);
}

static int cmp_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

// Marks in sel [N] the lines of one head and one kind chosen from score [N]
// (key [N] is scratch): budget topp (fixed < 0) the fewest top lines whose
// mass reaches top_p of the total, at most cap; budget fixed the top `fixed`.
static void select_lines(const float *score, int64_t N, double top_p, int64_t cap,
                         int64_t fixed, uint64_t *key, char *sel) {
    for (int64_t i = 0; i < N; i++) {
        CHECK(score[i] >= 0.0f && score[i] < INFINITY,
              "selection: score %g at line %lld is not a finite mass", score[i], (long long)i);
        key[i] = line_key(score[i] + 0.0f, i);                   // -0 becomes +0
    }
    qsort(key, (size_t)N, sizeof(uint64_t), cmp_desc);
    int64_t take;
    if (fixed >= 0) {
        take = fixed < N ? fixed : N;
    } else {
        // The total summed in the same order as the prefix, so top_p = 1 is exact.
        int64_t positive = 0;
        double total = 0.0;
        for (int64_t i = 0; i < N && (key[i] >> 32) != 0; i++, positive++)
            total += score[UINT32_MAX - (uint32_t)key[i]];
        double target = top_p * total, mass = 0.0;
        take = 0;
        if (top_p >= 1.0) take = positive;
        else
            while (take < positive && mass < target)
                mass += score[UINT32_MAX - (uint32_t)key[take++]];
        if (take > cap) take = cap;
    }
    for (int64_t i = 0; i < take; i++) sel[UINT32_MAX - (uint32_t)key[i]] = 1;
}

// The marked positions of sel [N], ascending, in a new list; *count gets its length.
static int64_t *gather_marked(const char *sel, int64_t N, int64_t *count) {
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++) n += sel[i] != 0;
    int64_t *list = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    *count = 0;
    for (int64_t i = 0; i < N; i++)
        if (sel[i]) list[(*count)++] = i;
    return list;
}

// Concatenates per-head lists [H][counts[h]] into CSR (start [H + 1], values).
static void to_csr(int H, int64_t **lists, const int64_t *counts, int64_t **start,
                   int64_t **values) {
    *start = xmalloc((size_t)(H + 1) * sizeof(int64_t));
    (*start)[0] = 0;
    for (int h = 0; h < H; h++) (*start)[h + 1] = (*start)[h] + counts[h];
    *values = xmalloc((size_t)((*start)[H] + 1) * sizeof(int64_t));
    for (int h = 0; h < H; h++)
        memcpy(*values + (*start)[h], lists[h], (size_t)counts[h] * sizeof(int64_t));
}

void sparse_select(const AttentionConfig *cfg, const float *vertical, const float *slash,
                   int num_heads, int64_t seq_len, const int *fixed_vertical,
                   const int *fixed_slash, SparsePattern *pattern) {
    const int64_t N = seq_len;
    const int H = num_heads;
    const int fixed = cfg->budget == BUDGET_FIXED;
    CHECK(N >= 1 && N <= UINT32_MAX, "selection: sequence length %lld", (long long)N);
    int64_t **lists = xmalloc(2 * (size_t)H * sizeof(int64_t *));      // [2H] vertical, slash
    int64_t *counts = xmalloc(2 * (size_t)H * sizeof(int64_t));

    #pragma omp parallel
    {
        uint64_t *key = xmalloc((size_t)N * sizeof(uint64_t));
        char *sel = xmalloc((size_t)N);
        #pragma omp for schedule(dynamic)
        for (int w = 0; w < 2 * H; w++) {
            const int h = w % H, is_slash = w >= H;
            const int64_t always = is_slash ? cfg->local : cfg->sink;
            const int64_t count = !fixed ? -1
                                  : is_slash ? (fixed_slash ? fixed_slash[h] : cfg->slash)
                                             : (fixed_vertical ? fixed_vertical[h] : cfg->vertical);
            memset(sel, 0, (size_t)N);
            select_lines((is_slash ? slash : vertical) + h * N, N, cfg->top_p,
                         is_slash ? cfg->max_slash : cfg->max_vertical, count, key, sel);
            for (int64_t i = 0; i < always && i < N; i++) sel[i] = 1;
            lists[w] = gather_marked(sel, N, &counts[w]);
        }
        free(key); free(sel);
    }
    pattern->num_heads = H;
    pattern->seq_len = N;
    to_csr(H, lists, counts, &pattern->vertical_start, &pattern->vertical);
    to_csr(H, lists + H, counts + H, &pattern->slash_start, &pattern->slash);
    for (int w = 0; w < 2 * H; w++) free(lists[w]);
    free(lists); free(counts);
}

// -------------------------------------------------------------------- index

// Marks in mark [qb + 1] the key blocks of row (h, global query block qb):
// the diagonal and, per slash d, the blocks of keys q - d for the block's
// queries q (q - d >= 0, q < N).
static void mark_blocks(const SparsePattern *p, int h, int B, int64_t qb, char *mark) {
    const int64_t q_lo = qb * B, q_hi = ((qb + 1) * B < p->seq_len ? (qb + 1) * B : p->seq_len) - 1;
    memset(mark, 0, (size_t)(qb + 1));
    mark[qb] = 1;
    for (int64_t s = p->slash_start[h]; s < p->slash_start[h + 1]; s++) {
        const int64_t d = p->slash[s];
        if (q_hi - d < 0) break;                                 // ascending: larger d also out
        const int64_t k_lo = q_lo - d > 0 ? q_lo - d : 0;
        for (int64_t kb = k_lo / B; kb <= (q_hi - d) / B; kb++) mark[kb] = 1;
    }
}

// Fills row (h, qb) of the index from the marked blocks: blocks and columns
// (NULL: only counts) ascending; *nb, *nc get the counts.
static void fill_row(const SparsePattern *p, int h, int B, int64_t qb, const char *mark,
                     int64_t *blocks, int64_t *columns, int64_t *nb, int64_t *nc) {
    const int64_t q_last = ((qb + 1) * B < p->seq_len ? (qb + 1) * B : p->seq_len) - 1;
    *nb = *nc = 0;
    for (int64_t kb = 0; kb <= qb; kb++) {
        if (!mark[kb]) continue;
        if (blocks) blocks[*nb] = kb;
        (*nb)++;
    }
    for (int64_t v = p->vertical_start[h]; v < p->vertical_start[h + 1]; v++) {
        const int64_t kp = p->vertical[v];
        if (kp > q_last) break;
        if (mark[kp / B]) continue;
        if (columns) columns[*nc] = kp;
        (*nc)++;
    }
}

void sparse_index_build(const SparsePattern *pattern, int block_size, const int64_t *q_blocks,
                        int64_t num_q_blocks, SparseIndex *index) {
    const int B = block_size, H = pattern->num_heads;
    const int64_t N = pattern->seq_len, nqb = num_q_blocks, rows = H * nqb;
    const int64_t num_blocks = (N + B - 1) / B;
    CHECK(B >= 1, "index: block size %d", B);
    for (int64_t i = 0; i < nqb; i++)
        CHECK(q_blocks[i] >= 0 && q_blocks[i] < num_blocks, "index: query block %lld of %lld",
              (long long)q_blocks[i], (long long)num_blocks);
    *index = (SparseIndex){.num_heads = H, .block_size = B, .seq_len = N, .num_q_blocks = nqb};
    index->q_blocks = xmalloc((size_t)(nqb + 1) * sizeof(int64_t));
    memcpy(index->q_blocks, q_blocks, (size_t)nqb * sizeof(int64_t));
    index->block_start = xmalloc((size_t)(rows + 1) * sizeof(int64_t));
    index->column_start = xmalloc((size_t)(rows + 1) * sizeof(int64_t));
    index->block_start[0] = index->column_start[0] = 0;

    // Pass 1 counts each row (into start[r + 1]), pass 2 fills at the prefix sums.
    for (int pass = 0; pass < 2; pass++) {
        #pragma omp parallel
        {
            char *mark = xmalloc((size_t)num_blocks);
            #pragma omp for schedule(dynamic, 16)
            for (int64_t r = 0; r < rows; r++) {
                const int h = (int)(r / nqb);
                const int64_t qb = q_blocks[r % nqb];
                int64_t nb, nc;
                mark_blocks(pattern, h, B, qb, mark);
                if (pass == 0) {
                    fill_row(pattern, h, B, qb, mark, NULL, NULL, &nb, &nc);
                    index->block_start[r + 1] = nb;
                    index->column_start[r + 1] = nc;
                } else {
                    fill_row(pattern, h, B, qb, mark, index->blocks + index->block_start[r],
                             index->columns + index->column_start[r], &nb, &nc);
                }
            }
            free(mark);
        }
        if (pass == 0) {
            for (int64_t r = 0; r < rows; r++) {
                index->block_start[r + 1] += index->block_start[r];
                index->column_start[r + 1] += index->column_start[r];
            }
            index->blocks = xmalloc((size_t)(index->block_start[rows] + 1) * sizeof(int64_t));
            index->columns = xmalloc((size_t)(index->column_start[rows] + 1) * sizeof(int64_t));
        }
    }
}

void sparse_index_for_rows(const SparsePattern *pattern, const AttnShape *shape, int sink, const int64_t *rows_pos,
                           int64_t n, SparseIndex *index) {
    const int B = shape->block_size;
    int64_t *blocks = xmalloc((size_t)(n + 1) * sizeof(int64_t)), count = 0;
    for (int64_t i = 0; i < n; i++)
        if (count == 0 || blocks[count - 1] != rows_pos[i] / B) blocks[count++] = rows_pos[i] / B;
    sparse_index_build(pattern, B, blocks, count, index);
    sparse_index_documents(shape, sink, index);
    free(blocks);
}

// Whether the ascending blocks [n] hold block b.
static bool has_block(const int64_t *blocks, int64_t n, int64_t b) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (blocks[mid] < b) lo = mid + 1; else hi = mid;
    }
    return lo < n && blocks[lo] == b;
}

// Column p as entry *n of columns (NULL: only counted) unless one of the
// ascending blocks [nb] holds it.
static void add_column(int64_t p, int B, const int64_t *blocks, int64_t nb, int64_t *columns, int64_t *n) {
    if (has_block(blocks, nb, p / B)) return;
    if (columns) columns[*n] = p;
    (*n)++;
}

// Row r of x restricted to its queries' documents (sparse_index_documents):
// into blocks, columns (NULL: only counts) ascending; *nb, *nc the counts.
static void document_row(const AttnShape *s, int sink, const SparseIndex *x, int64_t r,
                         int64_t *blocks, int64_t *columns, int64_t *nb, int64_t *nc) {
    const int B = x->block_size;
    const int64_t qb = x->q_blocks[r % x->num_q_blocks], N = x->seq_len;
    const int64_t q_last = ((qb + 1) * B < N ? (qb + 1) * B : N) - 1;
    const int64_t first = attn_doc_first(s->doc_starts, s->doc_count, qb * B);
    const int64_t lo = first < 0 ? 0 : first;                    // earliest visible key
    // The row's blocks are ascending: the kept ones (ending after lo) are a suffix.
    const int64_t total = x->block_start[r + 1] - x->block_start[r];
    int64_t kept = 0;
    for (int64_t e = x->block_start[r]; e < x->block_start[r + 1]; e++) kept += (x->blocks[e] + 1) * B > lo;
    const int64_t *kept_blocks = x->blocks + x->block_start[r] + (total - kept);
    if (blocks) memcpy(blocks, kept_blocks, (size_t)kept * sizeof(int64_t));
    // Columns at or after lo merged with the sink of each document from lo to
    // q_last (disjoint ascending ranges), without repeats or kept blocks.
    const int64_t end = x->column_start[r + 1];
    int64_t e = x->column_start[r], n = 0, next = 0;
    while (e < end && x->columns[e] < lo) e++;
    while (next < s->doc_count && s->doc_starts[next] <= lo) next++;
    for (int64_t start = lo; start <= q_last;) {
        const int64_t doc_end = next < s->doc_count ? s->doc_starts[next] : N;
        int64_t sink_end = start + sink < doc_end ? start + sink : doc_end;
        sink_end = sink_end < q_last + 1 ? sink_end : q_last + 1;
        for (; e < end && x->columns[e] < start; e++) add_column(x->columns[e], B, kept_blocks, kept, columns, &n);
        for (int64_t p = start; p < sink_end; p++) add_column(p, B, kept_blocks, kept, columns, &n);
        while (e < end && x->columns[e] < sink_end) e++;
        if (next >= s->doc_count) break;
        start = s->doc_starts[next++];
    }
    for (; e < end; e++) add_column(x->columns[e], B, kept_blocks, kept, columns, &n);
    *nb = kept;
    *nc = n;
}

void sparse_index_documents(const AttnShape *shape, int sink, SparseIndex *index) {
    if (!shape->doc_starts || shape->doc_count == 0) return;
    const int64_t rows = (int64_t)index->num_heads * index->num_q_blocks;
    SparseIndex out = *index;
    out.q_blocks = xmalloc((size_t)(index->num_q_blocks + 1) * sizeof(int64_t));
    memcpy(out.q_blocks, index->q_blocks, (size_t)index->num_q_blocks * sizeof(int64_t));
    out.block_start = xmalloc((size_t)(rows + 1) * sizeof(int64_t));
    out.column_start = xmalloc((size_t)(rows + 1) * sizeof(int64_t));
    out.block_start[0] = out.column_start[0] = 0;
    #pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++)
        document_row(shape, sink, index, r, NULL, NULL, out.block_start + r + 1, out.column_start + r + 1);
    for (int64_t r = 0; r < rows; r++) {
        out.block_start[r + 1] += out.block_start[r];
        out.column_start[r + 1] += out.column_start[r];
    }
    out.blocks = xmalloc((size_t)(out.block_start[rows] + 1) * sizeof(int64_t));
    out.columns = xmalloc((size_t)(out.column_start[rows] + 1) * sizeof(int64_t));
    #pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t nb, nc;
        document_row(shape, sink, index, r, out.blocks + out.block_start[r], out.columns + out.column_start[r],
                     &nb, &nc);
    }
    sparse_index_free(index);
    *index = out;
}

void sparse_index_count(const SparseIndex *index, const int64_t *q_pos, int64_t q_tokens,
                        const int64_t *doc_starts, int64_t doc_count, SparseStats *stats) {
    const int B = index->block_size;
    const int64_t nqb = index->num_q_blocks, N = index->seq_len;
    double computed = 0.0, causal = 0.0;
    #pragma omp parallel for reduction(+:computed, causal) schedule(dynamic, 16)
    for (int64_t r = 0; r < index->num_heads * nqb; r++) {
        const int64_t i = r % nqb, t_end = (i + 1) * B < q_tokens ? (i + 1) * B : q_tokens;
        const int64_t *blocks = index->blocks + index->block_start[r];
        const int64_t nb = index->block_start[r + 1] - index->block_start[r];
        const int64_t *cols = index->columns + index->column_start[r];
        const int64_t nc = index->column_start[r + 1] - index->column_start[r];
        int64_t row_computed = 0, row_causal = 0, c = 0;
        for (int64_t t = i * B; t < t_end; t++) {                // q_pos ascending in a block
            const int64_t q = q_pos[t], doc_first = attn_doc_first(doc_starts, doc_count, q);
            const int64_t first = doc_first < 0 ? 0 : doc_first;  // keys first .. q visible
            row_causal += q - first + 1;
            for (int64_t b = 0; b < nb; b++) {
                const int64_t k_lo = blocks[b] * B > first ? blocks[b] * B : first;
                const int64_t k_hi = ((blocks[b] + 1) * B < N ? (blocks[b] + 1) * B : N) - 1;
                if (k_lo <= q && k_lo <= k_hi) row_computed += (q < k_hi ? q : k_hi) - k_lo + 1;
            }
            while (c < nc && cols[c] <= q) c++;
            int64_t before = 0;                                  // columns before the document
            while (before < c && cols[before] < first) before++;
            row_computed += c - before;
        }
        computed += (double)row_computed;
        causal += (double)row_causal;
    }
    stats->computed += computed;
    stats->causal += causal;
}

void sparse_pattern_free(SparsePattern *pattern) {
    free(pattern->vertical_start); free(pattern->vertical);
    free(pattern->slash_start); free(pattern->slash);
    *pattern = (SparsePattern){0};
}

void sparse_index_free(SparseIndex *index) {
    free(index->q_blocks); free(index->block_start); free(index->blocks);
    free(index->column_start); free(index->columns);
    *index = (SparseIndex){0};
}

// ------------------------------------------------------------------ budgets

// One field of a budget line (tok has no whitespace) as a count in [0, 2^30].
static int parse_count(const char *tok, const char *path, int line, const char *name) {
    char *end;
    errno = 0;
    long v = strtol(tok, &end, 10);
    if (*end != 0 || end == tok || errno != 0 || !(isdigit((unsigned char)tok[0]) || tok[0] == '-'))
        fail("%s:%d: %s '%s' is not a number, expected an integer >= 0", path, line, name, tok);
    if (v < 0) fail("%s:%d: %s %ld is negative, expected an integer >= 0", path, line, name, v);
    if (v > (1 << 30))
        fail("%s:%d: %s %ld is too large, expected at most %d", path, line, name, v, 1 << 30);
    return (int)v;
}

void sparse_budget_load(const char *path, int num_layers, int num_heads, int default_vertical,
                        int default_slash, int *vertical, int *slash) {
    static const char *names[4] = {"layer", "head", "vertical", "slash"};
    const int64_t cells = (int64_t)num_layers * num_heads;
    for (int64_t i = 0; i < cells; i++) { vertical[i] = default_vertical; slash[i] = default_slash; }
    int *line_of = xcalloc((size_t)cells, sizeof(int));            // line that set each cell
    char *text = read_file(path, NULL);
    int line = 0;
    for (char *cur = text, *next; cur; cur = next) {
        line++;
        next = strchr(cur, '\n');
        if (next) *next++ = 0;
        char *hash = strchr(cur, '#');
        if (hash) *hash = 0;
        int v[4], nf = 0;
        for (char *tok = strtok(cur, " \t\r"); tok; tok = strtok(NULL, " \t\r"), nf++) {
            if (nf >= 4) fail("%s:%d: more than 4 fields, expected 'layer head vertical slash'",
                              path, line);
            v[nf] = parse_count(tok, path, line, names[nf]);
        }
        if (nf == 0) continue;
        if (nf != 4)
            fail("%s:%d: %d field%s, expected 'layer head vertical slash'", path, line, nf,
                 nf == 1 ? "" : "s");
        if (v[0] >= num_layers)
            fail("%s:%d: layer %d out of range, expected 0..%d", path, line, v[0], num_layers - 1);
        if (v[1] >= num_heads)
            fail("%s:%d: head %d out of range, expected 0..%d", path, line, v[1], num_heads - 1);
        const int64_t cell = (int64_t)v[0] * num_heads + v[1];
        if (line_of[cell])
            fail("%s:%d: layer %d head %d already given on line %d, expected one line per head",
                 path, line, v[0], v[1], line_of[cell]);
        line_of[cell] = line;
        vertical[cell] = v[2];
        slash[cell] = v[3];
    }
    free(text); free(line_of);
}

void sparse_budget_tables(const AttentionConfig *cfg, int num_layers, int num_heads, int **vertical, int **slash) {
    *vertical = *slash = NULL;
    if (cfg->type != ATTN_SPARSE || cfg->budget != BUDGET_FIXED) return;
    const int n = num_layers * num_heads;
    *vertical = xmalloc(sizeof(int) * (size_t)n);
    *slash = xmalloc(sizeof(int) * (size_t)n);
    if (cfg->budget_file == BUDGET_FILE_PATH) {
        sparse_budget_load(cfg->budget_file_path, num_layers, num_heads, cfg->vertical, cfg->slash, *vertical, *slash);
        return;
    }
    for (int i = 0; i < n; i++) {
        (*vertical)[i] = cfg->vertical;
        (*slash)[i] = cfg->slash;
    }
}

// The recall sample's rows (sparse.h), here beside the index: the GPU
// programs link this file and not the estimation.
int64_t sparse_recall_rows(int64_t seq_len, int64_t last_q, int64_t *rows) {
    const int64_t M = seq_len - last_q >= 1 ? seq_len - last_q : seq_len;
    const int64_t n = M < SPARSE_RECALL_ROWS ? M : SPARSE_RECALL_ROWS;
    Rng rng;
    rng_seed(&rng, 0x5ec411);
    for (int64_t i = 0; i < n; i++) {
        const int64_t lo = i * M / n, hi = (i + 1) * M / n;   // stratum i: [lo, hi), hi > lo as n <= M
        rows[i] = lo + (int64_t)rng_below(&rng, (uint64_t)(hi - lo));
    }
    return n;
}
