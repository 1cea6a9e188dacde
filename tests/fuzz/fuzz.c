// fuzz.c: the libFuzzer harness behind tests/fuzz/fuzz.h. exit() inside a
// reader longjmps back to fuzz_read(); every heap block allocated during the
// input (sanitizer allocation hooks: the libraries' too), every stream opened
// with fopen, every descriptor and every mapping made by the reader is
// released on that path.
#include "fuzz.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include "../../dist/util.h"

void __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                               void (*free_hook)(const volatile void *));
void __real_exit(int status) __attribute__((noreturn));
FILE *__real_fopen(const char *path, const char *mode);
int __real_fclose(FILE *f);
void *__real_mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset);
int __real_munmap(void *addr, size_t length);

// Heap blocks live since the input started: an open-addressing set of
// addresses (no allocation inside the hooks). A full table stops tracking for
// that input (its blocks then stay allocated). Only the thread that runs the
// reader tracks: the hooks also run in libFuzzer's own threads (its RSS
// monitor), whose blocks are not the reader's to free and whose concurrent
// updates would corrupt the set.
#define LIVE_SLOTS (1 << 20)
#define SLOT_FREED ((uintptr_t)1)
static uintptr_t live[LIVE_SLOTS];
static uint32_t live_used[LIVE_SLOTS];  // slots written during this input, to reset them
static size_t live_used_count;
static _Thread_local int tracking;

#define MAX_STREAMS 64
static FILE *streams[MAX_STREAMS];
static struct { void *addr; size_t length; } maps[MAX_STREAMS];
#define MAX_FDS 64  // descriptors a reader may open are the lowest free ones
static unsigned char fd_open_before[MAX_FDS];
static jmp_buf on_exit_jump;
static char input_path[64];

static size_t slot_of(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 44) & (LIVE_SLOTS - 1); }

static void malloc_hook(const volatile void *ptr, size_t size) {
    (void)size;
    if (!tracking || live_used_count == LIVE_SLOTS) return;
    size_t s = slot_of((uintptr_t)ptr);
    while (live[s] > SLOT_FREED) s = (s + 1) & (LIVE_SLOTS - 1);
    if (live[s] == 0) live_used[live_used_count++] = (uint32_t)s;
    live[s] = (uintptr_t)ptr;
}

static void free_hook(const volatile void *ptr) {
    if (!tracking || !ptr) return;
    for (size_t s = slot_of((uintptr_t)ptr); live[s] != 0; s = (s + 1) & (LIVE_SLOTS - 1))
        if (live[s] == (uintptr_t)ptr) { live[s] = SLOT_FREED; return; }
}

static void reset_tracking(void) {
    for (size_t i = 0; i < live_used_count; i++) live[live_used[i]] = 0;
    live_used_count = 0;
    memset(streams, 0, sizeof(streams));
    memset(maps, 0, sizeof(maps));
}

FILE *__wrap_fopen(const char *path, const char *mode) {
    FILE *f = __real_fopen(path, mode);
    for (int i = 0; tracking && f && i < MAX_STREAMS; i++)
        if (!streams[i]) { streams[i] = f; break; }
    return f;
}

int __wrap_fclose(FILE *f) {
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] == f) streams[i] = NULL;
    return __real_fclose(f);
}

void *__wrap_mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    void *p = __real_mmap(addr, length, prot, flags, fd, offset);
    for (int i = 0; tracking && p != MAP_FAILED && i < MAX_STREAMS; i++)
        if (!maps[i].addr) { maps[i].addr = p; maps[i].length = length; break; }
    return p;
}

int __wrap_munmap(void *addr, size_t length) {
    for (int i = 0; i < MAX_STREAMS; i++)
        if (maps[i].addr == addr) maps[i].addr = NULL;
    return __real_munmap(addr, length);
}

// Releases what the failed reader held: streams, mappings, descriptors it
// opened, then every heap block still live from this input.
static void release_input_resources(void) {
    for (int i = 0; i < MAX_STREAMS; i++) {  // still tracking: fclose frees heap blocks
        if (streams[i]) __real_fclose(streams[i]);
        if (maps[i].addr) __real_munmap(maps[i].addr, maps[i].length);
    }
    tracking = 0;
    for (int fd = 0; fd < MAX_FDS; fd++)
        if (!fd_open_before[fd] && fcntl(fd, F_GETFD) != -1) close(fd);
    for (size_t i = 0; i < live_used_count; i++)
        if (live[live_used[i]] > SLOT_FREED) free((void *)live[live_used[i]]);
    reset_tracking();
}

void __wrap_exit(int status) {
    if (tracking) {
        release_input_resources();
        stopping_on_error = 0;  // the next input's leaks are checked again
        longjmp(on_exit_jump, 1);
    }
    __real_exit(status);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    __sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook);
    snprintf(input_path, sizeof(input_path), "/tmp/mtrain-fuzz-%d", (int)getpid());
    return 0;
}

int fuzz_read(const uint8_t *data, size_t size, const char *suffix, void (*read)(const char *path)) {
    char path[96];
    snprintf(path, sizeof(path), "%s%s", input_path, suffix);
    FILE *f = __real_fopen(path, "wb");
    CHECK(f, "%s: cannot create the fuzz input file", path);
    if (size) CHECK(fwrite(data, 1, size, f) == size, "%s: cannot write the fuzz input", path);
    CHECK(__real_fclose(f) == 0, "%s: cannot close the fuzz input", path);
    for (int fd = 0; fd < MAX_FDS; fd++) fd_open_before[fd] = fcntl(fd, F_GETFD) != -1;
    int returned = 0;
    if (setjmp(on_exit_jump) == 0) {
        tracking = 1;
        read(path);
        tracking = 0;
        reset_tracking();
        returned = 1;
    }
    unlink(path);
    return returned;
}
