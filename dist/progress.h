// progress.h: the progress line of a long phase (loading a model folder,
// writing a checkpoint, scoring, evaluating, tokenizing), shared by all of
// them: "WHAT: done/total UNIT | rate UNIT/s | eta" on stderr, so that the
// results a command prints on stdout (eval's tables) stay clean when piped.
// Silent for a phase shorter than 2 s; after that updated in place when
// stderr is a terminal and one line every 5 s otherwise (a log file), and one
// closing line with the time taken. Under MPI only rank 0 shows progress.
// MTRAIN_PROGRESS_SECONDS=S (for tests) replaces the 2 s by S and the 5 s by
// 2.5 S.
#ifndef MTRAIN_PROGRESS_H
#define MTRAIN_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char what[160];           // the phase, e.g. "writing checkpoint step_00000012"
    const char *unit;         // the printed unit, e.g. "MiB" or "samples"
    double scale;             // done and total are divided by this for printing (1 << 20: bytes as MiB)
    int64_t done, total;      // in the caller's units (bytes, samples, ...)
    double start, last_print; // now_seconds()
    double after, every;      // the first line after `after` s, then one every `every` s (not a terminal)
    bool shown, tty;
} Progress;

// No progress lines from this process from now on (MPI ranks other than 0).
void progress_quiet(void);
// "1h02m" / "3m07s".
void format_duration(double seconds, char *out, size_t n);
// Start a phase of `total` units (printed divided by scale, as unit).
void progress_begin(Progress *p, const char *what, int64_t total, const char *unit, double scale);
// `amount` more units done; prints when due. p may be NULL (no progress).
void progress_add(Progress *p, int64_t amount);
// Erase the line being updated in place (a terminal), so that other output
// can follow; the next update draws it again. p may be NULL.
void progress_clear(Progress *p);
// The phase is over: the closing line if any line was shown. p may be NULL.
void progress_end(Progress *p);

#endif
