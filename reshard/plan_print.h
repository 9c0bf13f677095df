/* The reshard plan as text (mcreshard --dry-run) or JSON (--dry-run --json). */
#ifndef MC_RESHARD_PLAN_PRINT_H
#define MC_RESHARD_PLAN_PRINT_H

#include <stdio.h>

#include "reshard/plan.h"

/* "tp=2 pp=2 dp=1 ep=1 sp=0 zero=1 split=AEME|AEMR" */
void mc_rs_layout_format(const mc_layout *l, char *buf, int cap);
/* {"tp", "pp", "dp", "ep", "sp", "zero", "pp_split", "world"} of a geometry (a cJSON *). */
struct cJSON;
struct cJSON *mc_rs_layout_json(const mc_geometry *g);
void mc_rs_plan_print(FILE *f, const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst);
/* Malloc'd JSON text; NULL (with the error set) on failure. */
char *mc_rs_plan_json(const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst);

#endif
