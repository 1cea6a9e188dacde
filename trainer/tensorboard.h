// tensorboard.h: scalars for TensorBoard (log.tensorboard): one
// events.out.tfevents.<unix seconds>.<host>.<pid> file per run start in
// log.dir (its name sorting after the ones there), TFRecord framing of Event protobufs written by hand
// (docs/FORMATS.md): a header record (file_version "brain.Event:2"), then per
// logged step one Event with its scalars, appended and flushed.
#ifndef MTRAIN_TENSORBOARD_H
#define MTRAIN_TENSORBOARD_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char path[4096];
} TbWriter;

// A new events file in dir (which exists) with its header record; a run
// resumed after step `resumed` (0: a fresh run) also writes a SessionLog
// START at step resumed + 1, so that TensorBoard drops the steps after
// `resumed` that an earlier file holds (as metrics.jsonl drops its lines).
void tb_open(TbWriter *w, const char *dir, int64_t resumed);
// One Event at `step`: the scalars values [n] (NaN ones left out) under tags [n].
void tb_scalars(TbWriter *w, int64_t step, const char *const *tags, const double *values, int n);
void tb_close(TbWriter *w);

#endif
