#include "core/json_num.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

void mc_json_number_text(double v, char *buf, size_t cap) {
  if (!isfinite(v)) { /* "inf", "nan": for messages; JSON nodes use null instead */
    snprintf(buf, cap, "%g", v);
    return;
  }
  if (v == floor(v) && fabs(v) < 1e21) { /* integers in full, never in exponent form */
    snprintf(buf, cap, "%.0f", v);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

cJSON *mc_json_number(double v) {
  char buf[40] = "null";
  if (isfinite(v)) mc_json_number_text(v, buf, sizeof buf);
  return cJSON_CreateRaw(buf);
}

int mc_json_exact_numbers(cJSON *tree) {
  for (cJSON *it = tree; it; it = it->next) {
    if (cJSON_IsNumber(it)) {
      char buf[40] = "null";
      if (isfinite(it->valuedouble)) mc_json_number_text(it->valuedouble, buf, sizeof buf);
      char *text = malloc(strlen(buf) + 1);
      if (!text) return mc_error("out of memory formatting a JSON number");
      strcpy(text, buf);
      it->type = cJSON_Raw;
      it->valuestring = text; /* freed by cJSON_Delete like any string */
    } else if ((cJSON_IsObject(it) || cJSON_IsArray(it)) && mc_json_exact_numbers(it->child)) {
      return -1;
    }
  }
  return 0;
}

char *mc_json_print_exact(const cJSON *node, int formatted) {
  cJSON *copy = cJSON_Duplicate(node, 1);
  char *text = NULL;
  if (copy && mc_json_exact_numbers(copy) == 0) text = formatted ? cJSON_Print(copy) : cJSON_PrintUnformatted(copy);
  cJSON_Delete(copy);
  if (!text) mc_error("out of memory printing JSON");
  return text;
}
