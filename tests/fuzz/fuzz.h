// fuzz.h: the harness shared by the libFuzzer targets (tests/fuzz/fuzz_*.c).
// The readers take a path and report bad input through fail(), which exits;
// fuzz_read() writes the input to a file, calls the reader on it and turns
// that exit back into a return. What the reader held when it failed (heap
// blocks, streams, file descriptors, mappings) is released, so that millions
// of rejected inputs neither exhaust the process nor read as leaks.
// Targets are linked with -Wl,--wrap=exit,--wrap=fopen,--wrap=fclose,
// --wrap=mmap,--wrap=munmap (see the fuzz rules of the Makefile).
#ifndef MTRAIN_FUZZ_H
#define MTRAIN_FUZZ_H

#include <stddef.h>
#include <stdint.h>

// Writes data[0..size) to this process's input file (its name ends in
// `suffix`), then runs read(path). Returns 1 if the reader returned, 0 if it
// rejected the input through fail().
int fuzz_read(const uint8_t *data, size_t size, const char *suffix, void (*read)(const char *path));

#endif
