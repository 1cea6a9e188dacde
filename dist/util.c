// util.c: error reporting, checked allocation and I/O, timing, and the RNG.
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile int stopping_on_error;
// LeakSanitizer (make test SANITIZE=1) asks this before it checks for leaks.
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return stopping_on_error; }

int (*fail_rank_to_name)(void);

// Under mpirun or srun before MPI starts (no fail_rank_to_name yet): the
// launcher's rank of this process, 0 when there is none.
static int launched_rank(void) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank && getenv("SLURM_STEP_ID")) rank = getenv("SLURM_PROCID");
    return rank ? atoi(rank) : 0;
}

// Seconds a rank other than 0 waits, before MPI starts, before it prints an
// error: when rank 0 has the same error (a config error: the same files and
// arguments), the launcher ends the job on rank 0's exit first.
#define OTHER_RANK_GRACE_S 20

// The error line "mtrain: [rank N: ]WHERE MESSAGE", in one write (lines of
// ranks sharing stderr do not interleave), by the rank that names it:
// under several ranks an error that every rank hits prints once.
static void report_error(const char *where, const char *fmt, va_list ap) {
    char line[4096];
    int rank = 0;
    if (fail_rank_to_name) {
        rank = fail_rank_to_name();
    } else if ((rank = launched_rank()) > 0) {
        sleep(OTHER_RANK_GRACE_S);
    }
    if (rank < 0) return;
    int n = rank > 0 ? snprintf(line, sizeof(line), "mtrain: rank %d: %s", rank, where)
                     : snprintf(line, sizeof(line), "mtrain: %s", where);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    if (n > (int)sizeof(line) - 2) n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    fflush(stdout);
    if (write(STDERR_FILENO, line, (size_t)n) < 0) return;  // nowhere left to say it
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    stopping_on_error = 1;
    report_error("", fmt, ap);
    va_end(ap);
    exit(1);
}

void fail_at(const char *file, int line, const char *fmt, ...) {
    char where[512];
    snprintf(where, sizeof(where), "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    stopping_on_error = 1;
    report_error(where, fmt, ap);
    va_end(ap);
    exit(1);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail("out of memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t count, size_t bytes) {
    void *p = calloc(count ? count : 1, bytes ? bytes : 1);
    if (!p) fail("out of memory allocating %zu x %zu bytes", count, bytes);
    return p;
}

void *xrealloc(void *ptr, size_t bytes) {
    void *p = realloc(ptr, bytes ? bytes : 1);
    if (!p) fail("out of memory reallocating %zu bytes", bytes);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void *xmalloc_aligned(size_t bytes) {
    void *p = NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        fail("out of memory allocating %zu bytes", bytes);
    return p;
}

FILE *xfopen(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f) fail("%s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) fail("%s: is a folder (expected a file)", path);
    return f;
}

void xfread(void *dst, size_t bytes, FILE *f, const char *path) {
    if (bytes && fread(dst, 1, bytes, f) != bytes)
        fail("%s: file is truncated (wanted %zu more bytes)", path, bytes);
}

void xfwrite(const void *src, size_t bytes, FILE *f, const char *path) {
    if (bytes && fwrite(src, 1, bytes, f) != bytes)
        fail("%s: write failed (%s)", path, strerror(errno));
}

void xfclose_sync(FILE *f, const char *path) {
    if (fflush(f) != 0) fail("%s: write failed (%s)", path, strerror(errno));
    if (fsync(fileno(f)) != 0) fail("%s: fsync failed (%s)", path, strerror(errno));
    if (fclose(f) != 0) fail("%s: close failed (%s)", path, strerror(errno));
}

char *read_file(const char *path, size_t *bytes) {
    FILE *f = xfopen(path, "rb");
    if (fseek(f, 0, SEEK_END) != 0) fail("%s: cannot seek (%s)", path, strerror(errno));
    long size = ftell(f);
    if (size < 0) fail("%s: cannot tell size (%s)", path, strerror(errno));
    rewind(f);
    char *buf = xmalloc((size_t)size + 1);
    xfread(buf, (size_t)size, f, path);
    buf[size] = 0;
    fclose(f);
    if (bytes) *bytes = (size_t)size;
    return buf;
}

void rename_into_place(const char *tmp, const char *path) {
    if (rename(tmp, path) != 0)
        fail("%s: cannot rename from %s (%s)", path, tmp, strerror(errno));
}

char *path_join(const char *dir, const char *name) {
    char *path = xmalloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    return path;
}

void write_file_atomic(const char *path, const void *data, size_t bytes) {
    char *tmp = xmalloc(strlen(path) + 32);
    sprintf(tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = xfopen(tmp, "wb");
    xfwrite(data, bytes, f, tmp);
    xfclose_sync(f, tmp);
    rename_into_place(tmp, path);
    free(tmp);
}

void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) fail("%s: cannot open directory (%s)", dir, strerror(errno));
    if (fsync(fd) != 0) fail("%s: fsync failed (%s)", dir, strerror(errno));
    close(fd);
}

void make_dirs(const char *path) {
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) fail("%s: cannot create directory (%s)", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) fail("%s: cannot create directory (%s)", p, strerror(errno));
    free(p);
}

float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x0040);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// A zombie (state Z in /proc/PID/stat: exited, not yet reaped) counts as gone.
bool other_process_alive(int pid) {
    if (pid == (int)getpid() || (kill(pid, 0) != 0 && errno != EPERM)) return false;
    char path[64], text[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[got] = '\0';
    const char *end = strrchr(text, ')');  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses
    return !(end && end[1] == ' ' && end[2] == 'Z');
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rng_seed(Rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(Rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double rng_uniform(Rng *rng) { return (double)(rng_next(rng) >> 11) * 0x1.0p-53; }

double rng_normal(Rng *rng) {
    double u1 = rng_uniform(rng), u2 = rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t rng_below(Rng *rng, uint64_t n) { return n ? rng_next(rng) % n : 0; }

uint64_t rng_hash(uint64_t key, uint64_t index) {
    uint64_t state = key + index * 0x9e3779b97f4a7c15ULL;
    return splitmix64(&state);
}

// The ziggurat of Marsaglia and Tsang (2000) for exp(-x^2/2), 128 layers of
// equal area V: layer 0 the base [0, R] with the tail beyond R (width V /
// f(R)), layer i >= 1 the rectangle [0, x_i] between f(x_i) and f(x_{i+1}),
// so that x_i (f(x_{i+1}) - f(x_i)) = V; x_128 = 0. A draw in layer i whose
// |u| < x_{i+1} / x_i lies under the curve whatever its height.
#define ZIGGURAT_LAYERS 128
static const double ZIGGURAT_R = 3.442619855899, ZIGGURAT_V = 9.91256303526217e-3;
static double ziggurat_x[ZIGGURAT_LAYERS + 1], ziggurat_core[ZIGGURAT_LAYERS];
static pthread_once_t ziggurat_once = PTHREAD_ONCE_INIT;

static void ziggurat_build(void) {
    double f = exp(-0.5 * ZIGGURAT_R * ZIGGURAT_R);
    ziggurat_x[0] = ZIGGURAT_V / f;
    ziggurat_x[1] = ZIGGURAT_R;
    for (int i = 2; i < ZIGGURAT_LAYERS; i++) {
        ziggurat_x[i] = sqrt(-2.0 * log(ZIGGURAT_V / ziggurat_x[i - 1] + f));
        f = exp(-0.5 * ziggurat_x[i] * ziggurat_x[i]);
    }
    ziggurat_x[ZIGGURAT_LAYERS] = 0;
    for (int i = 0; i < ZIGGURAT_LAYERS; i++) ziggurat_core[i] = ziggurat_x[i + 1] / ziggurat_x[i];
}

// Beyond R (Marsaglia 1964): R + x with x = -log(u1) / R, kept when
// -2 log(u2) > x^2.
static double ziggurat_tail(Rng *rng, bool negative) {
    double x, y;
    do {
        x = -log(1.0 - rng_uniform(rng)) / ZIGGURAT_R;
        y = -log(1.0 - rng_uniform(rng));
    } while (2.0 * y < x * x);
    return negative ? -(ZIGGURAT_R + x) : ZIGGURAT_R + x;
}

// The ziggurat's draw from its first 64 bits (the fast path inlined where
// it is used).
static inline double ziggurat_normal(uint64_t bits) {
    Rng rng;
    bool seeded = false;
    for (;;) {
        // layer from the low 7 bits, u in [-1, 1) from the high 53
        int i = (int)(bits & (ZIGGURAT_LAYERS - 1));
        double u = (double)(bits >> 11) * 0x1.0p-52 - 1.0;
        if (fabs(u) < ziggurat_core[i]) return u * ziggurat_x[i];
        // the rare rest (about 1.2% of draws) on a generator seeded from this draw
        if (!seeded) rng_seed(&rng, bits), seeded = true;
        if (i == 0) return ziggurat_tail(&rng, u < 0);
        double x = u * ziggurat_x[i];
        double f_outer = exp(-0.5 * (ziggurat_x[i] * ziggurat_x[i] - x * x));
        double f_inner = exp(-0.5 * (ziggurat_x[i + 1] * ziggurat_x[i + 1] - x * x));
        if (f_inner + rng_uniform(&rng) * (f_outer - f_inner) < 1.0) return x;
        bits = rng_next(&rng);
    }
}

double rng_normal_at(uint64_t key, uint64_t index) {
    pthread_once(&ziggurat_once, ziggurat_build);
    return ziggurat_normal(rng_hash(key, index));
}

void rng_normal_fill(float *out, int64_t n, uint64_t key, uint64_t first, double scale) {
    pthread_once(&ziggurat_once, ziggurat_build);
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) out[j] = (float)(scale * ziggurat_normal(rng_hash(key, first + (uint64_t)j)));
}
