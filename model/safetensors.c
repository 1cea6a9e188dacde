// safetensors.c: Hugging Face .safetensors reader (mmap, full header
// validation, F32/F16/BF16 -> fp32) and writer (F32 or BF16, atomic rename).
#define _GNU_SOURCE
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../dist/util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as-is"
#endif

// Same limit as the reference implementation: a larger header means a corrupt
// or foreign file, not a real checkpoint.
#define ST_MAX_HEADER_BYTES 100000000ull
// Largest integer a JSON number (a double) holds exactly.
#define JSON_MAX_EXACT_INT 9007199254740992.0

// ----------------------------------------------------------------------------
// dtypes and conversions

static size_t dtype_size(StDtype dtype) { return dtype == ST_F32 ? 4 : 2; }

static const char *dtype_name(StDtype dtype) {
    switch (dtype) {
    case ST_F32: return "F32";
    case ST_F16: return "F16";
    case ST_BF16: return "BF16";
    }
    return "?";
}

static float bits_to_f32(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }

// IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ff;
    if (exponent == 0x1f) return bits_to_f32(sign | 0x7f800000 | mantissa << 13);       // inf, NaN
    if (exponent != 0) return bits_to_f32(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
    float magnitude = (float)mantissa * 0x1p-24f;  // zero or subnormal: exact in fp32
    return sign ? -magnitude : magnitude;
}

// "[2, 3, 4]" into buf (room for ST_MAX_DIMS dims of 20 digits).
#define SHAPE_STR 256
static const char *shape_str(char *buf, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, SHAPE_STR, "[");
    for (int d = 0; d < ndim; d++)
        len += (size_t)snprintf(buf + len, SHAPE_STR - len, "%s%" PRId64, d ? ", " : "", shape[d]);
    snprintf(buf + len, SHAPE_STR - len, "]");
    return buf;
}

// ----------------------------------------------------------------------------
// reading

// A JSON number that is a non-negative integer held exactly by a double.
static bool json_uint(const cJSON *item, uint64_t *value) {
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(d >= 0 && d <= JSON_MAX_EXACT_INT) || d != (double)(uint64_t)d) return false;
    *value = (uint64_t)d;
    return true;
}

static void parse_metadata(const char *path, const cJSON *meta) {
    if (!cJSON_IsObject(meta)) fail("%s: header field '__metadata__' is not a JSON object", path);
    for (const cJSON *kv = meta->child; kv; kv = kv->next)
        if (!cJSON_IsString(kv)) fail("%s: header field '__metadata__' entry '%s' is not a string", path, kv->string);
}

// Fill t from one header entry {"dtype", "shape", "data_offsets"}; data_bytes is
// the size of the data buffer that the offsets index.
static void parse_tensor(const char *path, const cJSON *entry, size_t data_bytes, StTensor *t) {
    const char *name = entry->string;
    if (!cJSON_IsObject(entry)) fail("%s: tensor '%s': header entry is not a JSON object", path, name);

    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    if (!dtype) fail("%s: tensor '%s': field 'dtype' is missing", path, name);
    if (!cJSON_IsString(dtype)) fail("%s: tensor '%s': field 'dtype' is not a string", path, name);
    if (strcmp(dtype->valuestring, "F32") == 0) t->dtype = ST_F32;
    else if (strcmp(dtype->valuestring, "F16") == 0) t->dtype = ST_F16;
    else if (strcmp(dtype->valuestring, "BF16") == 0) t->dtype = ST_BF16;
    else fail("%s: tensor '%s': unsupported dtype '%s' (supported: F32, F16, BF16)", path, name, dtype->valuestring);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (!shape) fail("%s: tensor '%s': field 'shape' is missing", path, name);
    if (!cJSON_IsArray(shape)) fail("%s: tensor '%s': field 'shape' is not an array", path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS) fail("%s: tensor '%s': shape has %d dimensions (at most %d supported)", path, name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    int64_t numel = 1;
    bool has_zero = false, overflow = false;
    int d = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, d++) {
        uint64_t value;
        if (!json_uint(dim, &value)) fail("%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, d);
        t->shape[d] = (int64_t)value;
        if (value == 0) has_zero = true;
        else if (__builtin_mul_overflow(numel, t->shape[d], &numel)) overflow = true;
    }
    char sbuf[SHAPE_STR];
    if (has_zero) numel = 0;
    else if (overflow) fail("%s: tensor '%s': shape %s has too many elements", path, name, shape_str(sbuf, ndim, t->shape));
    t->numel = numel;
    uint64_t need;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)dtype_size(t->dtype), &need))
        fail("%s: tensor '%s': shape %s has too many bytes", path, name, shape_str(sbuf, ndim, t->shape));

    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!offsets) fail("%s: tensor '%s': field 'data_offsets' is missing", path, name);
    uint64_t begin, end;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_uint(offsets->child, &begin) || !json_uint(offsets->child->next, &end))
        fail("%s: tensor '%s': field 'data_offsets' is not [begin, end] with non-negative integers", path, name);
    if (begin > end) fail("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin is after end", path, name, begin, end);
    if (end > data_bytes)
        fail("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end beyond the data buffer (%zu bytes; file truncated?)",
             path, name, begin, end, data_bytes);
    if (end - begin != need)
        fail("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes, but %s %s needs %" PRIu64,
             path, name, begin, end, end - begin, dtype_name(t->dtype), shape_str(sbuf, ndim, t->shape), need);
    t->name = xstrdup(name);
    t->offset = (size_t)begin;
    t->bytes = (size_t)need;
}

static int compare_names(const void *a, const void *b) {
    return strcmp((*(const StTensor *const *)a)->name, (*(const StTensor *const *)b)->name);
}

static int compare_offsets(const void *a, const void *b) {
    size_t x = (*(const StTensor *const *)a)->offset, y = (*(const StTensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

static void parse_header(SafeTensors *st, const char *text, size_t text_bytes, size_t data_bytes) {
    const char *path = st->path;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, text_bytes, &end, 0);
    if (!root) fail("%s: header is not valid JSON (error at header byte %td)", path, end ? end - text : (ptrdiff_t)0);
    for (const char *p = end; p < text + text_bytes; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            fail("%s: header has stray bytes after the JSON (at header byte %td)", path, p - text);
    if (!cJSON_IsObject(root)) fail("%s: header is not a JSON object", path);

    int count = 0;
    for (const cJSON *entry = root->child; entry; entry = entry->next)
        if (strcmp(entry->string, "__metadata__") != 0) count++;
    st->count = count;
    st->tensors = xcalloc((size_t)count, sizeof(StTensor));
    int i = 0;
    for (const cJSON *entry = root->child; entry; entry = entry->next) {
        if (strcmp(entry->string, "__metadata__") == 0) parse_metadata(path, entry);
        else parse_tensor(path, entry, data_bytes, &st->tensors[i++]);
    }
    cJSON_Delete(root);

    // Duplicate keys are valid JSON for cJSON, but would make st_find ambiguous.
    const StTensor **sorted = xmalloc((size_t)count * sizeof(*sorted));
    for (i = 0; i < count; i++) sorted[i] = &st->tensors[i];
    qsort(sorted, (size_t)count, sizeof(*sorted), compare_names);
    for (i = 1; i < count; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) fail("%s: tensor '%s' appears twice in the header", path, sorted[i]->name);
    // Two tensors sharing bytes would alias: each owns its own range.
    qsort(sorted, (size_t)count, sizeof(*sorted), compare_offsets);
    for (i = 1; i < count; i++)
        if (sorted[i - 1]->bytes && sorted[i]->offset < sorted[i - 1]->offset + sorted[i - 1]->bytes)
            fail("%s: tensors '%s' and '%s' overlap in the data buffer (data_offsets from %zu and %zu; expected "
                 "disjoint ranges)", path, sorted[i - 1]->name, sorted[i]->name, sorted[i - 1]->offset, sorted[i]->offset);
    free(sorted);
}

void st_open(SafeTensors *st, const char *path) {
    memset(st, 0, sizeof(*st));
    st->path = xstrdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("%s: cannot open (%s)", path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0) fail("%s: cannot stat (%s)", path, strerror(errno));
    if (!S_ISREG(info.st_mode)) fail("%s: not a regular file", path);
    size_t file_bytes = (size_t)info.st_size;
    if (file_bytes < 8) fail("%s: file is %zu bytes, shorter than the 8-byte safetensors header length", path, file_bytes);
    st->map = mmap(NULL, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (st->map == MAP_FAILED) fail("%s: cannot map (%s)", path, strerror(errno));
    st->map_bytes = file_bytes;
    close(fd);

    uint64_t header_bytes = 0;
    for (int b = 7; b >= 0; b--) header_bytes = header_bytes << 8 | st->map[b];
    if (header_bytes > ST_MAX_HEADER_BYTES)
        fail("%s: header length %" PRIu64 " exceeds the 100 MB limit (not a safetensors file?)", path, header_bytes);
    if (header_bytes > file_bytes - 8)
        fail("%s: header length %" PRIu64 " is larger than the rest of the file (%zu bytes; truncated?)", path, header_bytes, file_bytes - 8);
    st->data_start = 8 + (size_t)header_bytes;
    parse_header(st, (const char *)st->map + 8, (size_t)header_bytes, file_bytes - st->data_start);
}

const StTensor *st_find(const SafeTensors *st, const char *name) {
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

void st_read_f32(const SafeTensors *st, const char *name, int ndim, const int64_t *shape, float *dst) {
    CHECK(ndim >= 0 && ndim <= ST_MAX_DIMS, "tensor '%s': bad expected ndim %d", name, ndim);
    const StTensor *t = st_find(st, name);
    if (!t) fail("%s: tensor '%s' is missing", st->path, name);
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char have[SHAPE_STR], want[SHAPE_STR];
        fail("%s: tensor '%s' has shape %s, expected %s", st->path, name,
             shape_str(have, t->ndim, t->shape), shape_str(want, ndim, shape));
    }
    const unsigned char *src = st->map + st->data_start + t->offset;
    int64_t n = t->numel;
    if (n == 0) return;  // dst may be NULL for an empty tensor
    if (t->dtype == ST_F32) {
        memcpy(dst, src, t->bytes);
        return;
    }
    // 16-bit data may sit at an odd address (the header length need not be
    // a multiple of 8), so each element is loaded with memcpy.
    bool bf16 = t->dtype == ST_BF16;
    #pragma omp parallel for if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
}

void st_close(SafeTensors *st) {
    if (st->map && st->map != MAP_FAILED) munmap(st->map, st->map_bytes);
    for (int i = 0; i < st->count; i++) free(st->tensors[i].name);
    free(st->tensors);
    free(st->path);
    memset(st, 0, sizeof(*st));
}

// ----------------------------------------------------------------------------
// writing

typedef struct { char *text; size_t len, cap; } StrBuf;

static void sb_printf(StrBuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(StrBuf *sb, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(sb->text + sb->len, sb->cap - sb->len, fmt, ap);
        va_end(ap);
        CHECK(n >= 0, "vsnprintf failed");
        if ((size_t)n < sb->cap - sb->len) { sb->len += (size_t)n; return; }
        sb->cap = 2 * sb->cap + (size_t)n + 1;
        sb->text = xrealloc(sb->text, sb->cap);
    }
}

// A JSON string literal: quotes, backslashes and control characters escaped.
static void sb_json_string(StrBuf *sb, const char *s) {
    sb_printf(sb, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') sb_printf(sb, "\\%c", *c);
        else if (*c < 0x20) sb_printf(sb, "\\u%04x", *c);
        else sb_printf(sb, "%c", *c);
    }
    sb_printf(sb, "\"");
}

static int64_t write_numel(const StWriteTensor *t) {
    CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "tensor '%s': ndim %d out of range", t->name, t->ndim);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        CHECK(t->shape[d] >= 0, "tensor '%s': negative dimension", t->name);
        numel *= t->shape[d];
    }
    return numel;
}

void st_write(const char *path, const StWriteTensor *tensors, int count, StDtype dtype) {
    CHECK(dtype == ST_F32 || dtype == ST_BF16, "st_write: dtype %s is not supported for writing", dtype_name(dtype));
    size_t esize = dtype_size(dtype);

    // Header: metadata first, then the tensors in the given order, packed back to back.
    StrBuf header = { xmalloc(4096), 0, 4096 };
    sb_printf(&header, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t offset = 0;
    for (int i = 0; i < count; i++) {
        const StWriteTensor *t = &tensors[i];
        uint64_t bytes = (uint64_t)write_numel(t) * esize;
        sb_printf(&header, ",");
        sb_json_string(&header, t->name);
        sb_printf(&header, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(dtype));
        for (int d = 0; d < t->ndim; d++) sb_printf(&header, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sb_printf(&header, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + bytes);
        offset += bytes;
    }
    sb_printf(&header, "}");
    while (header.len % 8) sb_printf(&header, " ");  // keeps the data buffer 8-byte aligned

    char *tmp = xmalloc(strlen(path) + 32);
    sprintf(tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = xfopen(tmp, "wb");
    unsigned char length[8];
    for (int b = 0; b < 8; b++) length[b] = (unsigned char)((uint64_t)header.len >> (8 * b));
    xfwrite(length, 8, f, tmp);
    xfwrite(header.text, header.len, f, tmp);

    enum { CHUNK = 1 << 16 };
    uint16_t *half = dtype == ST_BF16 ? xmalloc(CHUNK * sizeof(uint16_t)) : NULL;
    for (int i = 0; i < count; i++) {
        const StWriteTensor *t = &tensors[i];
        int64_t n = write_numel(t);
        if (dtype == ST_F32) {
            xfwrite(t->data, (size_t)n * sizeof(float), f, tmp);
            continue;
        }
        for (int64_t start = 0; start < n; start += CHUNK) {
            int64_t len = n - start < CHUNK ? n - start : CHUNK;
            for (int64_t j = 0; j < len; j++) half[j] = f32_to_bf16(t->data[start + j]);
            xfwrite(half, (size_t)len * sizeof(uint16_t), f, tmp);
        }
    }
    xfclose_sync(f, tmp);
    rename_into_place(tmp, path);
    free(half);
    free(tmp);
    free(header.text);
}
