// safetensors.h: reading and writing Hugging Face .safetensors files.
// Layout: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data buffer; offsets are relative to the start of the data buffer.
// Reading maps the file read-only and validates the whole header up front;
// tensors come out as fp32 whatever their stored dtype (F32, F16, BF16).
#ifndef MTRAIN_SAFETENSORS_H
#define MTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef enum { ST_F32, ST_F16, ST_BF16 } StDtype;

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;      // product of shape (1 for a scalar)
    size_t offset;      // byte offset into the data buffer
    size_t bytes;       // numel * dtype size
} StTensor;

typedef struct {
    char *path;
    int count;
    StTensor *tensors;       // (count,) in header order
    unsigned char *map;      // the whole file, mapped read-only
    size_t map_bytes;
    size_t data_start;       // 8 + N: where the data buffer begins in map
} SafeTensors;

// Map `path` read-only and validate header and offsets; any problem is a
// one-line fail() naming the file.
void st_open(SafeTensors *st, const char *path);
// The tensor called `name`, or NULL if absent.
const StTensor *st_find(const SafeTensors *st, const char *name);
// Copy tensor `name` into dst (numel floats) as fp32, converting F16/BF16,
// after checking that its shape is exactly (ndim, shape).
void st_read_f32(const SafeTensors *st, const char *name, int ndim, const int64_t *shape, float *dst);
void st_close(SafeTensors *st);

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data;  // numel floats
} StWriteTensor;

// Write `count` tensors, in the given order, stored as `dtype` (ST_F32, or
// ST_BF16 rounded to nearest even). The file is written to "path.tmp.<pid>",
// fsynced and renamed onto `path`; the header is padded with spaces to a
// multiple of 8 bytes and carries "__metadata__": {"format": "pt"}.
void st_write(const char *path, const StWriteTensor *tensors, int count, StDtype dtype);

#endif
