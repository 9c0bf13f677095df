#define _POSIX_C_SOURCE 200809L /* getline() */

#include "train/metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int mc_metrics_open(mc_metrics *m, const char *path, int64_t keep_through) {
  memset(m, 0, sizeof *m);
  snprintf(m->path, sizeof m->path, "%s", path);
  if (keep_through >= 0) {
    /* Keep the resumed run's records up to its checkpoint, then append. */
    FILE *in = fopen(path, "r");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
      if (in) fclose(in);
      return mc_error("metrics log %s: cannot write %s", path, tmp);
    }
    if (in) {
      char *line = NULL;
      size_t cap = 0;
      while (getline(&line, &cap, in) > 0) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        /* records without a step (the step-1 memory report) are kept as well */
        if (j && (!s || (cJSON_IsNumber(s) && s->valuedouble <= (double)keep_through))) fputs(line, out);
        cJSON_Delete(j);
      }
      free(line);
      fclose(in);
    }
    if (fclose(out) != 0 || rename(tmp, path) != 0)
      return mc_error("metrics log %s: cannot replace it", path);
  }
  m->f = fopen(path, keep_through >= 0 ? "a" : "w");
  if (!m->f) return mc_error("metrics log %s: cannot open for writing", path);
  return 0;
}

int mc_metrics_write(mc_metrics *m, const mc_metrics_rec *r) {
  fprintf(m->f,
          "{\"step\": %lld, \"loss\": %.17g, \"aux_loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
          "\"tokens\": %lld, \"tokens_per_s\": %.1f",
          (long long)r->step, r->loss, r->aux_loss, r->lr, r->grad_norm, (long long)r->tokens,
          r->tokens_per_s);
  if (r->has_val) fprintf(m->f, ", \"val_loss\": %.17g", r->val_loss);
  if (r->has_comm) fprintf(m->f, ", \"comm_s\": %.6f", r->comm_s);
  fprintf(m->f, ", \"time\": %.3f", r->time);
  fprintf(m->f, "}\n");
  if (fflush(m->f) != 0) return mc_error("metrics log %s: write failed", m->path);
  return 0;
}

void mc_metrics_close(mc_metrics *m) {
  if (m->f) fclose(m->f);
  m->f = NULL;
}

typedef struct {
  double *x, *y;
  int n, cap;
} series;

static int series_add(series *s, double x, double y) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 256;
    double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
    if (!nx) return -1;
    s->x = nx;
    double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
    if (!ny) return -1;
    s->y = ny;
    s->cap = cap;
  }
  s->x[s->n] = x;
  s->y[s->n] = y;
  s->n++;
  return 0;
}

/* Plot area in SVG pixels. */
enum { W = 800, H = 480, ML = 70, MR = 20, MT = 40, MB = 50 };

static void polyline(FILE *f, const series *s, double x0, double x1, double y0, double y1,
                     const char *color) {
  fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
  for (int i = 0; i < s->n; i++)
    fprintf(f, "%.1f,%.1f ", ML + (s->x[i] - x0) / (x1 - x0) * (W - ML - MR),
            H - MB - (s->y[i] - y0) / (y1 - y0) * (H - MT - MB));
  fprintf(f, "\"/>\n");
}

int mc_metrics_svg(const char *jsonl_path, const char *svg_path, const char *title) {
  FILE *in = fopen(jsonl_path, "r");
  if (!in) return mc_error("metrics log %s: cannot read", jsonl_path);
  series tr = {0}, va = {0};
  char *line = NULL;
  size_t cap = 0;
  int rc = 0;
  while (rc == 0 && getline(&line, &cap, in) > 0) {
    cJSON *j = cJSON_Parse(line);
    if (!j) continue;
    cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
    cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "val_loss");
    if (cJSON_IsNumber(s) && cJSON_IsNumber(l)) rc |= series_add(&tr, s->valuedouble, l->valuedouble);
    if (cJSON_IsNumber(s) && cJSON_IsNumber(v)) rc |= series_add(&va, s->valuedouble, v->valuedouble);
    cJSON_Delete(j);
  }
  free(line);
  fclose(in);
  if (rc != 0) {
    free(tr.x), free(tr.y), free(va.x), free(va.y);
    return mc_error("metrics log %s: out of memory", jsonl_path);
  }
  double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
  const series *all[2] = {&tr, &va};
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < all[k]->n; i++) {
      if (all[k]->x[i] > x1) x1 = all[k]->x[i];
      if (all[k]->y[i] < y0) y0 = all[k]->y[i];
      if (all[k]->y[i] > y1) y1 = all[k]->y[i];
    }
  if (!(y0 <= y1)) y0 = 0, y1 = 1;
  if (y1 - y0 < 1e-9) y0 -= 0.5, y1 += 0.5;
  y0 = floor(y0 * 2) / 2, y1 = ceil(y1 * 2) / 2;

  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    free(tr.x), free(tr.y), free(va.x), free(va.y);
    return mc_error("loss curve %s: cannot write", tmp);
  }
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
  fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">", ML);
  for (const char *c = title; *c; c++) /* XML-escape the caller's text */
    fputs(*c == '<' ? "&lt;" : *c == '>' ? "&gt;" : *c == '&' ? "&amp;" : (char[2]){*c, 0}, f);
  fprintf(f, "</text>\n");
  /* Axes with five ticks each. */
  fprintf(f, "<path d=\"M%d %d V%d H%d\" stroke=\"black\" fill=\"none\"/>\n", ML, MT, H - MB, W - MR);
  for (int i = 0; i <= 5; i++) {
    double fx = ML + i / 5.0 * (W - ML - MR), fy = H - MB - i / 5.0 * (H - MT - MB);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", fx, H - MB + 18,
            x0 + i / 5.0 * (x1 - x0));
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", ML - 6, fy + 4,
            y0 + i / 5.0 * (y1 - y0));
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ML, W - MR, fy, fy);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (ML + W - MR) / 2, H - 12);
  fprintf(f, "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">"
             "cross-entropy (nats)</text>\n", (MT + H - MB) / 2, (MT + H - MB) / 2);
  polyline(f, &tr, x0, x1, y0, y1, "#1f77b4");
  if (va.n) polyline(f, &va, x0, x1, y0, y1, "#d62728");
  for (int i = 0; i < va.n; i++)
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n",
            ML + (va.x[i] - x0) / (x1 - x0) * (W - ML - MR), H - MB - (va.y[i] - y0) / (y1 - y0) * (H - MT - MB));
  fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
             "<text x=\"%d\" y=\"%d\">train loss</text>\n", W - 190, W - 170, MT + 10, MT + 10, W - 164, MT + 14);
  if (va.n)
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#d62728\" stroke-width=\"2\"/>"
               "<text x=\"%d\" y=\"%d\">validation loss</text>\n", W - 190, W - 170, MT + 28, MT + 28, W - 164, MT + 32);
  fprintf(f, "</svg>\n");
  free(tr.x), free(tr.y), free(va.x), free(va.y);
  if (fclose(f) != 0 || rename(tmp, svg_path) != 0) return mc_error("loss curve %s: write failed", svg_path);
  return 0;
}
