// progress.c: the progress line of long phases (see progress.h).
#include "progress.h"

#include <stdlib.h>
#include <unistd.h>

#include "util.h"

static bool quiet;

void progress_quiet(void) { quiet = true; }

void format_duration(double seconds, char *out, size_t n) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, n, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(out, n, "%ldm%02lds", s / 60, s % 60);
}

void progress_begin(Progress *p, const char *what, int64_t total, const char *unit, double scale) {
    snprintf(p->what, sizeof(p->what), "%s", what);
    p->unit = unit;
    p->scale = scale;
    p->done = 0;
    p->total = total;
    p->start = p->last_print = now_seconds();
    const char *env = getenv("MTRAIN_PROGRESS_SECONDS");
    p->after = env ? atof(env) : 2.0;
    p->every = 2.5 * p->after;
    p->shown = false;
    // mpirun hands its ranks a pseudo-terminal whatever its own output is
    // (often a log file), so under mpirun the lines are never redrawn.
    p->tty = isatty(STDERR_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE");
}

static void print_line(Progress *p, double now) {
    double elapsed = now - p->start, rate = elapsed > 0 ? (double)p->done / elapsed : 0;
    char eta[32] = "?";
    if (rate > 0) format_duration((double)(p->total - p->done) / rate, eta, sizeof(eta));
    fprintf(stderr, "%s%s: %.1f/%.1f %s | %.1f %s/s | eta %s%s", p->tty ? "\r" : "", p->what, (double)p->done / p->scale,
           (double)p->total / p->scale, p->unit, rate / p->scale, p->unit, eta, p->tty ? "\033[K" : "\n");
    p->shown = true;
    p->last_print = now;
}

void progress_add(Progress *p, int64_t amount) {
    if (!p || quiet) return;
    p->done += amount;
    double now = now_seconds();
    if (now - p->start < p->after) return;
    if (!p->shown || now - p->last_print >= (p->tty ? 0.2 : p->every)) print_line(p, now);
}

void progress_clear(Progress *p) {
    if (!p || !p->shown || !p->tty) return;
    fputs("\r\033[K", stderr);
}

void progress_end(Progress *p) {
    if (!p || !p->shown) return;
    double elapsed = now_seconds() - p->start;
    fprintf(stderr, "%s%s: %.1f %s in %.1f s (%.1f %s/s)%s\n", p->tty ? "\r" : "", p->what, (double)p->done / p->scale, p->unit,
           elapsed, elapsed > 0 ? (double)p->done / p->scale / elapsed : 0, p->unit, p->tty ? "\033[K" : "");
}
