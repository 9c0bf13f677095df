/* Memory sizes as people write them: "80GiB", "80 GB", "512MiB", "1.5GiB", "1000000". */
#ifndef MC_PLAN_UNITS_H
#define MC_PLAN_UNITS_H

#include <stdint.h>

/* Parses a size with an optional unit (B, KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB,
 * TiB = powers of 1024; case-insensitive). Plain numbers are bytes. Returns 0, or -1 with a
 * message quoting the text (the caller adds the option or key it came from). */
int mc_parse_bytes(const char *text, int64_t *out);
/* "1.50 GiB", "512.00 MiB", "700 B" into buf. Returns buf. */
const char *mc_format_bytes(int64_t bytes, char *buf, int cap);

#endif
