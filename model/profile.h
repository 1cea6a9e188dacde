// profile.h: the per-op profile of one training step (log.profile). A backend
// table that runs another backend's ops and times each between two of its
// profile marks (CUDA: events on its stream; CPU: the wall clock), counting
// each op's device launches where the backend counts them (the CPU execution
// model of CUDA), into one row per category, phase and shape. model.c marks
// the phases through the table (Backend.profile_phase); the trainer swaps the
// table in for the step (model_profile_begin / _end, model.h).
#ifndef MTRAIN_PROFILE_H
#define MTRAIN_PROFILE_H

#include <stdio.h>

#include "backend.h"

// One row of the profile: the ops of one category, phase and shape.
typedef struct {
    ProfileCategory category;
    ProfilePhase phase;
    char shape[48];        // GEMMs: "MxNxK (forward|dX|dW...)"; else empty
    int64_t calls;
    int64_t launches;      // device launches (-1: not counted by this backend)
    double ms;             // device time (CPU: wall time of the op)
    double flops, bytes;   // the work the ops' shapes imply (FLOPs of GEMMs and attention; bytes of the rest)
} ProfileRow;

#define PROFILE_MAX_ROWS 256

// The profile of one step: its rows, the step's wall time, and the device
// time no op accounts for (idle = wall - the rows' sum).
typedef struct Profile {
    ProfileRow rows[PROFILE_MAX_ROWS];
    int num_rows;
    double wall_ms;
    int64_t launches;      // all the device launches of the step (-1: not counted)
} Profile;

// The table that profiles `inner` from now on into a fresh profile (one at
// a time per process); profile_end waits for the device, fills *out and
// returns inner's table.
const Backend *profile_begin(const Backend *inner);
const Backend *profile_end(Profile *out);

// The names of categories and phases ("gemm", "forward", ...).
const char *profile_category_name(ProfileCategory c);
const char *profile_phase_name(ProfilePhase p);
// The sum of the rows' ms (the device's busy time).
double profile_device_ms(const Profile *p);
// The table: one line per row (category, phase, shape, calls, launches, ms, %
// of the step, TFLOP/s or GB/s), the categories' totals, idle, the step.
void profile_print(const Profile *p, int64_t step, FILE *out);
// The same as JSON into path (written to a temporary name and renamed).
void profile_write_json(const Profile *p, int64_t step, const char *path);

#endif
