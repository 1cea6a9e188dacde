// tensorboard.c: TensorBoard event files (tensorboard.h). A record is
//   uint64 length, uint32 masked CRC-32C of those 8 bytes, data,
//   uint32 masked CRC-32C of the data        (little endian)
// with masked(c) = rotate_right(c, 15) + 0xa282ead8. The data is an Event
// protobuf: wall_time (field 1, double), step (2, int64), file_version
// (3, string), summary (5, Summary: repeated value (1, Summary.Value:
// tag (1, string), simple_value (2, float))), session_log (7, SessionLog:
// status (1, enum; START = 1)).
#include "tensorboard.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../dist/util.h"

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), bytewise.
static uint32_t crc32c(const uint8_t *p, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            table[i] = c;
        }
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// A protobuf message being built (host memory, grows).
typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

static void put(Buf *b, const void *data, size_t n) {
    if (n == 0) return;
    if (b->n + n > b->cap) b->p = xrealloc(b->p, b->cap = 2 * (b->n + n) + 64);
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_varint(Buf *b, uint64_t v) {
    uint8_t out[10];
    size_t n = 0;
    do {
        out[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, out, n);
}

// Wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
static void put_key(Buf *b, int field, int wire) { put_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void put_bytes(Buf *b, int field, const void *data, size_t n) {
    put_key(b, field, 2);
    put_varint(b, n);
    put(b, data, n);
}

// Little-endian fixed-width fields (x86 and every GPU host is little endian).
static void put_double(Buf *b, int field, double v) {
    put_key(b, field, 1);
    put(b, &v, 8);
}

static void put_float(Buf *b, int field, float v) {
    put_key(b, field, 5);
    put(b, &v, 4);
}

// The start of an Event: wall_time (unix seconds) and step.
static void event_begin(Buf *b, int64_t step) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    b->n = 0;
    put_double(b, 1, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    put_key(b, 2, 0);
    put_varint(b, (uint64_t)step);
}

// One record of data [n], flushed.
static void write_record(TbWriter *w, const Buf *data) {
    uint64_t len = data->n;
    uint32_t len_crc = masked_crc((const uint8_t *)&len, 8), data_crc = masked_crc(data->p, data->n);
    if (fwrite(&len, 8, 1, w->f) != 1 || fwrite(&len_crc, 4, 1, w->f) != 1 ||
        fwrite(data->p, 1, data->n, w->f) != data->n || fwrite(&data_crc, 4, 1, w->f) != 1 || fflush(w->f) != 0)
        fail("%s: write failed", w->path);
}

// TensorBoard reads a folder's event files in name order: the seconds in a
// new file's name are now, or one more than the latest events file in dir
// has, when that is not earlier (a run started in the same second).
static long long name_seconds(const char *dir) {
    long long seconds = (long long)time(NULL), latest;
    DIR *d = opendir(dir);
    if (!d) fail("%s: cannot list (%s)", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));)
        if (sscanf(e->d_name, "events.out.tfevents.%lld.", &latest) == 1 && latest >= seconds) seconds = latest + 1;
    closedir(d);
    return seconds;
}

void tb_open(TbWriter *w, const char *dir, int64_t resumed) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof(host) - 1) != 0) snprintf(host, sizeof(host), "localhost");
    snprintf(w->path, sizeof(w->path), "%s/events.out.tfevents.%lld.%s.%d", dir, name_seconds(dir), host,
             (int)getpid());
    w->f = xfopen(w->path, "ab");
    Buf b = {0};
    event_begin(&b, 0);
    put_bytes(&b, 3, "brain.Event:2", 13);
    write_record(w, &b);
    if (resumed > 0) {
        Buf start = {0};
        put_key(&start, 1, 0);
        put_varint(&start, 1);  // SessionLog.START
        event_begin(&b, resumed + 1);
        put_bytes(&b, 7, start.p, start.n);
        write_record(w, &b);
        free(start.p);
    }
    free(b.p);
}

void tb_scalars(TbWriter *w, int64_t step, const char *const *tags, const double *values, int n) {
    Buf event = {0}, summary = {0}, value = {0};
    event_begin(&event, step);
    for (int i = 0; i < n; i++) {
        if (isnan(values[i])) continue;
        value.n = 0;
        put_bytes(&value, 1, tags[i], strlen(tags[i]));
        put_float(&value, 2, (float)values[i]);
        put_bytes(&summary, 1, value.p, value.n);
    }
    put_bytes(&event, 5, summary.p, summary.n);
    write_record(w, &event);
    free(event.p);
    free(summary.p);
    free(value.p);
}

void tb_close(TbWriter *w) {
    if (w->f && fclose(w->f) != 0) fail("%s: close failed", w->path);
    w->f = NULL;
}
