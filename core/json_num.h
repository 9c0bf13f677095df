/* Exact JSON numbers. cJSON prints a double with 15 digits whenever that is within about an
 * ulp, which loses bits (0.1+0.2 prints as 0.3); configs and manifests must round-trip
 * exactly, so their numbers are written as the shortest text that reads back identically. */
#ifndef MC_CORE_JSON_NUM_H
#define MC_CORE_JSON_NUM_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* Shortest decimal text that strtod reads back as v; integers in full, never in exponent
 * form. Non-finite values give "inf"/"nan" (for messages); the JSON nodes below use null. */
void mc_json_number_text(double v, char *buf, size_t cap);
/* A raw cJSON node holding that text. */
cJSON *mc_json_number(double v);
/* Rewrites every number node of the tree as such a raw node (in place). Returns 0, or -1
 * when out of memory. */
int mc_json_exact_numbers(cJSON *tree);
/* Prints a copy of `node` with exact numbers (malloc'd; NULL with mc_error when out of memory). */
char *mc_json_print_exact(const cJSON *node, int formatted);

#endif
