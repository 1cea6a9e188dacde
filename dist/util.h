// util.h: the bottom of the include graph. Error reporting (one macro family
// that prints file:line and exits), checked allocation and file I/O, timing,
// and the deterministic random number generator. Every layer may include it.
#ifndef MTRAIN_UTIL_H
#define MTRAIN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Print "mtrain: <message>" and exit(1). Used for user-facing errors (bad
// input files, bad config) where the message already names file and problem.
// Under several ranks an error prints once: by rank 0, or, when rank 0 has
// not hit it, by the rank that did, naming it ("mtrain: rank N: ...").
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
// Set while MPI runs (dist/comm.c): the rank an error line of this process
// names, 0 for none, -1 when it is not printed (rank 0 prints it).
extern int (*fail_rank_to_name)(void);

// Internal errors: print file:line and the message, exit(1).
void fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
// Set by fail() and fail_at(): a run stopped on an error leaves its memory to
// the operating system, so LeakSanitizer (make test SANITIZE=1) checks only
// runs that end normally.
extern volatile int stopping_on_error;
#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond, ...) do { if (!(cond)) fail_at(__FILE__, __LINE__, __VA_ARGS__); } while (0)

// Checked allocation: never returns NULL.
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t bytes);
void *xrealloc(void *ptr, size_t bytes);
char *xstrdup(const char *s);
// 64-byte aligned allocation (free with free()).
void *xmalloc_aligned(size_t bytes);

// Checked file I/O: on failure print "mtrain: PATH: what went wrong" and exit.
FILE *xfopen(const char *path, const char *mode);
void xfread(void *dst, size_t bytes, FILE *f, const char *path);
void xfwrite(const void *src, size_t bytes, FILE *f, const char *path);
// Flush, fsync and close a file opened for writing.
void xfclose_sync(FILE *f, const char *path);
// Read a whole file into a NUL-terminated buffer; *bytes gets its size.
char *read_file(const char *path, size_t *bytes);
// Atomic write: `tmp` is fsynced and renamed to `path`.
void rename_into_place(const char *tmp, const char *path);
// "dir/name" in a new allocation (free it).
char *path_join(const char *dir, const char *name);
// Write `bytes` bytes to "path.tmp.<pid>", fsync, rename onto path.
void write_file_atomic(const char *path, const void *data, size_t bytes);
// fsync a directory (makes renames inside it durable).
void fsync_dir(const char *dir);
// mkdir -p.
void make_dirs(const char *path);

// bf16 (the top half of an fp32) <-> fp32. To fp32 is exact for every value;
// to bf16 rounds to nearest, ties to even; overflow goes to inf; NaN stays a
// (quiet) NaN.
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// Whether two paths name the same existing file or folder (b may be NULL).
bool same_file(const char *a, const char *b);

// Whether a process other than this one with this id is running (EPERM:
// another user's, alive; a zombie, exited but not reaped, is not).
bool other_process_alive(int pid);

// Monotonic wall clock in seconds.
double now_seconds(void);

// Deterministic generator (xoshiro256**, seeded with splitmix64). Its full
// state is 4 words so that checkpoints can store and restore it exactly.
typedef struct { uint64_t s[4]; } Rng;
void rng_seed(Rng *rng, uint64_t seed);
uint64_t rng_next(Rng *rng);
// Uniform in [0, 1).
double rng_uniform(Rng *rng);
// Standard normal (Box-Muller).
double rng_normal(Rng *rng);
// Uniform integer in [0, n).
uint64_t rng_below(Rng *rng, uint64_t n);
// Counter-based draws: functions of (key, index) alone, so that any thread
// draws any element and a result never depends on the thread count.
// rng_hash: 64 uniform bits (splitmix64's output number index + 1 of key);
// also makes a stream's key from a seed and a stream number.
uint64_t rng_hash(uint64_t key, uint64_t index);
// A standard normal (the ziggurat method over rng_hash(key, index)).
double rng_normal_at(uint64_t key, uint64_t index);
// out[j] = (float)(scale * rng_normal_at(key, first + j)) for j < n, on every
// thread.
void rng_normal_fill(float *out, int64_t n, uint64_t key, uint64_t first, double scale);

#endif
