/* The step-1 memory report: bytes each category's arena holds on this rank (measured) next
 * to mcplan's prediction for the same rank and config (plan/plan.h), as a text table and as
 * one JSON Lines record of the metrics log. */
#ifndef MC_TRAIN_MEMREPORT_H
#define MC_TRAIN_MEMREPORT_H

#include <stdint.h>
#include <stdio.h>

#include "core/mem_cats.h"

/* measured[c] < 0: the trainer keeps no arena of category c (printed "-"). */
void mc_mem_report_text(FILE *f, int rank, const char *backend, const int64_t measured[MC_MEM_COUNT],
                        const int64_t predicted[MC_MEM_COUNT]);
/* One line: {"memory": {"rank": R, "after_step": 1, "backend": B, "categories": {name:
 * {"measured": bytes or null, "predicted": bytes}, ...}}}. Returns 0 or -1 with mc_error. */
int mc_mem_report_json(FILE *f, int rank, const char *backend, const int64_t measured[MC_MEM_COUNT],
                       const int64_t predicted[MC_MEM_COUNT]);

#endif
