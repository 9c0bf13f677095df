/* The mcplan report: rank map, stage map, ownership table, memory geometry and FLOPs, as
 * text (report_text.c) or as one JSON document (report_json.c). */
#ifndef MC_PLAN_REPORT_H
#define MC_PLAN_REPORT_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "plan/plan.h"

/* Ranks whose memory plans are identical, so large worlds print one block per class. */
typedef struct {
  int n_ranks;
  int *ranks; /* ascending */
} mc_rank_class;

typedef struct {
  int n;
  mc_rank_class *c; /* ordered by lowest rank */
  int *storage;
} mc_rank_classes;

int mc_plan_classes(const mc_plan *p, mc_rank_classes *out);
void mc_plan_classes_free(mc_rank_classes *c);
/* Writes the headroom warning of a class ("ranks {0-3} do not fit: ...") and returns 1, or
 * returns 0 when its ranks fit with the margin to spare. */
int mc_plan_class_warning(const mc_plan *p, const mc_rank_class *cl, char *buf, int cap);

/* detail_max: worlds up to this size list every rank; above it, ranks are grouped and lists
 * are cut to this many entries (with a count of the rest). */
int mc_plan_print_text(FILE *out, const mc_geometry *g, const mc_plan *p, int detail_max);
/* The same content as a cJSON tree (caller deletes). NULL with a message on failure. */
cJSON *mc_plan_to_json(const mc_geometry *g, const mc_plan *p);

#endif
