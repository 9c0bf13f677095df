/* TensorBoard scalars: an event file (events.out.tfevents.<time>.<host>.<pid>) in a directory,
 * written as TensorBoard reads it: TFRecord framing (length, masked CRC-32C of the length,
 * the record, masked CRC-32C of the record) around Event protocol buffers (wall_time = 1,
 * step = 2, file_version = 3, summary = 5; Summary.value = 1; Value.tag = 1,
 * Value.simple_value = 2), encoded here by hand. */
#ifndef MC_TRAIN_TFEVENTS_H
#define MC_TRAIN_TFEVENTS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
  FILE *f;
  char path[1100];
} mc_tfevents;

/* Creates dir if needed and a new event file in it, starting with the file_version event.
 * 0, or -1 with mc_error naming the path. */
int mc_tfevents_open(mc_tfevents *t, const char *dir);
/* One event at `step` and wall time `wall` (Unix seconds) with n scalars tags[i] = v[i];
 * flushed, so TensorBoard sees it while the run goes on. */
int mc_tfevents_scalars(mc_tfevents *t, int64_t step, double wall, int n, const char *const *tags, const double *v);
void mc_tfevents_close(mc_tfevents *t);

#endif
