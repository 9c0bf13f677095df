/* Step-1 memory report (train/memreport.h). */
#include "train/memreport.h"

#include "core/mem_cats.h"
#include "util/error.h"

static double mib(int64_t b) { return (double)b / (1024.0 * 1024.0); }

void mc_mem_report_text(FILE *f, int rank, const char *backend, const int64_t measured[MC_MEM_COUNT],
                        const int64_t predicted[MC_MEM_COUNT]) {
  fprintf(f, "memory after step 1, rank %d, backend %s: bytes in each category's arena vs mcplan's prediction\n",
          rank, backend);
  fprintf(f, "  %-28s %14s %14s %8s\n", "category", "measured", "predicted", "ratio");
  int64_t tm = 0, tp = 0;
  for (int c = 0; c < MC_MEM_COUNT; c++) {
    char m[32] = "-", r[16] = "-";
    if (measured[c] >= 0) {
      snprintf(m, sizeof m, "%lld", (long long)measured[c]);
      tm += measured[c], tp += predicted[c];
      if (predicted[c] > 0) snprintf(r, sizeof r, "%.3f", (double)measured[c] / (double)predicted[c]);
    }
    fprintf(f, "  %-28s %14s %14lld %8s\n", mc_mem_cat_label((mc_mem_cat)c), m, (long long)predicted[c], r);
  }
  fprintf(f, "  %-28s %14lld %14lld %8s   (%.2f MiB vs %.2f MiB)\n", "total of measured categories", (long long)tm,
          (long long)tp, "", mib(tm), mib(tp));
}

int mc_mem_report_json(FILE *f, int rank, const char *backend, const int64_t measured[MC_MEM_COUNT],
                       const int64_t predicted[MC_MEM_COUNT]) {
  fprintf(f, "{\"memory\": {\"rank\": %d, \"after_step\": 1, \"backend\": \"%s\", \"categories\": {", rank, backend);
  for (int c = 0; c < MC_MEM_COUNT; c++) {
    fprintf(f, "%s\"%s\": {\"measured\": ", c ? ", " : "", mc_mem_cat_label((mc_mem_cat)c));
    if (measured[c] >= 0) fprintf(f, "%lld", (long long)measured[c]);
    else fputs("null", f);
    fprintf(f, ", \"predicted\": %lld}", (long long)predicted[c]);
  }
  fputs("}}}\n", f);
  if (fflush(f) != 0 || ferror(f)) return mc_error("metrics log: writing the memory record failed");
  return 0;
}
