#define _POSIX_C_SOURCE 200809L /* getline() */

#include "train/metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

void mc_metrics_csv_path(const char *jsonl_path, char *out, size_t cap) {
  const size_t n = strlen(jsonl_path);
  if (n > 6 && !strcmp(jsonl_path + n - 6, ".jsonl")) snprintf(out, cap, "%.*s.csv", (int)(n - 6), jsonl_path);
  else snprintf(out, cap, "%s.csv", jsonl_path);
}

/* A number as the shortest text that reads back as the same double. */
static void csv_number(FILE *f, double v) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.15g", v);
  if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
  fputs(buf, f);
}

/* One CSV row for a parsed log record: a step record or a checkpoint record (1), else
 * nothing (0: the memory report, anything else). */
static int csv_row(FILE *f, const cJSON *j) {
  static const char *cols[] = {"step", "time", "loss", "aux_loss", "val_loss", "lr", "grad_norm", "tokens",
                               "tokens_per_s", "model_tflops", "mfu", "comm_s", "ckpt_paused_s", "ckpt_save_s"};
  const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step"), *ck = cJSON_GetObjectItemCaseSensitive(j, "checkpoint");
  const int is_ckpt = !cJSON_IsNumber(step) && cJSON_IsNumber(ck);
  if (!cJSON_IsNumber(step) && !is_ckpt) return 0;
  for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
    const char *key = cols[c];
    if (is_ckpt) /* a checkpoint record's step, pause and save time */
      key = !strcmp(key, "step") ? "checkpoint" : !strcmp(key, "ckpt_paused_s") ? "paused_s"
          : !strcmp(key, "ckpt_save_s") ? "save_s" : !strcmp(key, "time") ? "time" : NULL;
    else if (!strncmp(key, "ckpt_", 5))
      key = NULL;
    const cJSON *v = key ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
    if (c) fputc(',', f);
    if (cJSON_IsNumber(v)) csv_number(f, v->valuedouble);
  }
  fputc('\n', f);
  return 1;
}

int mc_metrics_csv(const char *jsonl_path, const char *csv_path) {
  FILE *in = fopen(jsonl_path, "r");
  if (!in) return mc_error("metrics log %s: cannot read", jsonl_path);
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp", csv_path);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fclose(in);
    return mc_error("metrics CSV %s: cannot write", tmp);
  }
  fputs(MC_METRICS_CSV_COLUMNS "\n", out);
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, in) > 0) {
    cJSON *j = cJSON_Parse(line);
    if (j) csv_row(out, j);
    cJSON_Delete(j);
  }
  free(line);
  fclose(in);
  if (fclose(out) != 0 || rename(tmp, csv_path) != 0) return mc_error("metrics CSV %s: write failed", csv_path);
  return 0;
}

int mc_metrics_open(mc_metrics *m, const char *path, int64_t keep_through) {
  memset(m, 0, sizeof *m);
  snprintf(m->path, sizeof m->path, "%s", path);
  mc_metrics_csv_path(path, m->csv_path, sizeof m->csv_path);
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
        if (!s && j) s = cJSON_GetObjectItemCaseSensitive(j, "checkpoint"); /* a checkpoint record */
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
  /* the CSV: the kept records (none for a new log), then every record as it is written */
  if (mc_metrics_csv(path, m->csv_path) != 0) return -1;
  m->csv = fopen(m->csv_path, "a");
  if (!m->csv) return mc_error("metrics CSV %s: cannot open for writing", m->csv_path);
  return 0;
}

/* Appends one record (the JSON text, one line) to the log and its row to the CSV. */
static int put_record(mc_metrics *m, const char *line) {
  fputs(line, m->f);
  if (fflush(m->f) != 0) return mc_error("metrics log %s: write failed", m->path);
  cJSON *j = cJSON_Parse(line);
  if (!j) return mc_error("metrics log %s: a record did not parse back", m->path);
  csv_row(m->csv, j);
  cJSON_Delete(j);
  if (fflush(m->csv) != 0) return mc_error("metrics CSV %s: write failed", m->csv_path);
  return 0;
}

int mc_metrics_write(mc_metrics *m, const mc_metrics_rec *r) {
  char line[1024];
  int n = snprintf(line, sizeof line,
                   "{\"step\": %lld, \"loss\": %.17g, \"aux_loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
                   "\"tokens\": %lld, \"tokens_per_s\": %.1f",
                   (long long)r->step, r->loss, r->aux_loss, r->lr, r->grad_norm, (long long)r->tokens, r->tokens_per_s);
  if (r->has_val) n += snprintf(line + n, sizeof line - (size_t)n, ", \"val_loss\": %.17g", r->val_loss);
  if (r->has_comm) n += snprintf(line + n, sizeof line - (size_t)n, ", \"comm_s\": %.6f", r->comm_s);
  if (r->has_flops) n += snprintf(line + n, sizeof line - (size_t)n, ", \"model_tflops\": %.6g", r->model_tflops);
  if (r->has_mfu) n += snprintf(line + n, sizeof line - (size_t)n, ", \"mfu\": %.6g", r->mfu);
  snprintf(line + n, sizeof line - (size_t)n, ", \"time\": %.3f}\n", r->time);
  return put_record(m, line);
}

int mc_metrics_checkpoint(mc_metrics *m, const mc_metrics_ckpt *c) {
  char line[256];
  snprintf(line, sizeof line, "{\"checkpoint\": %lld, \"paused_s\": %.6f, \"save_s\": %.6f, \"async\": %s, \"time\": %.3f}\n",
           (long long)c->step, c->paused_s, c->save_s, c->async ? "true" : "false", c->time);
  return put_record(m, line);
}

void mc_metrics_close(mc_metrics *m) {
  if (m->f) fclose(m->f);
  if (m->csv) fclose(m->csv);
  m->f = m->csv = NULL;
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

/* Plot area in SVG pixels: the loss on the left axis, the learning rate on the right one; the
 * x labels, the axis title and the legend below the plot. Text is placed by its width, 0.6 em
 * a character (tests/train/test_loss_svg.py measures it the same way). */
enum { W = 800, H = 520, ML = 70, MR = 76, MT = 40, MB = 84, FONT = 12 };
#define CHAR_EM 0.6

static double sx(double x, double x0, double x1) { return ML + (x - x0) / (x1 - x0) * (W - ML - MR); }
static double sy(double y, double y0, double y1) { return H - MB - (y - y0) / (y1 - y0) * (H - MT - MB); }

static void polyline(FILE *f, const series *s, double x0, double x1, double y0, double y1, const char *color,
                     const char *extra) {
  fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", color, extra);
  for (int i = 0; i < s->n; i++) fprintf(f, "%.1f,%.1f ", sx(s->x[i], x0, x1), sy(s->y[i], y0, y1));
  fprintf(f, "\"/>\n");
}

/* 1 -> 2 -> 5 -> 10 -> 20 ...: the factor to the next round spacing. */
static double every_next(double every) {
  const double mant = every / pow(10, floor(log10(every) + 1e-9));
  return mant < 1.5 ? 2.0 : mant < 3.5 ? 2.5 : 2.0;
}

static void free_series(series *a, series *b, series *c) {
  free(a->x), free(a->y), free(b->x), free(b->y), free(c->x), free(c->y);
}

/* A legend entry at x (a line swatch, then the text); returns the x after it. */
static double legend(FILE *f, double x, int y, const char *color, const char *dash, const char *text) {
  fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>"
             "<text x=\"%.1f\" y=\"%d\">%s</text>\n", x, x + 20, y - 4, y - 4, color, dash, x + 26, y, text);
  return x + 26 + CHAR_EM * FONT * (double)strlen(text) + 24;
}

int mc_metrics_svg(const char *jsonl_path, const char *svg_path, const char *title) {
  FILE *in = fopen(jsonl_path, "r");
  if (!in) return mc_error("metrics log %s: cannot read", jsonl_path);
  series tr = {0}, va = {0}, lr = {0};
  char *line = NULL;
  size_t cap = 0;
  int rc = 0;
  while (rc == 0 && getline(&line, &cap, in) > 0) {
    cJSON *j = cJSON_Parse(line);
    if (!j) continue;
    cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
    cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "val_loss");
    cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "lr");
    if (cJSON_IsNumber(s) && cJSON_IsNumber(l)) rc |= series_add(&tr, s->valuedouble, l->valuedouble);
    if (cJSON_IsNumber(s) && cJSON_IsNumber(v)) rc |= series_add(&va, s->valuedouble, v->valuedouble);
    if (cJSON_IsNumber(s) && cJSON_IsNumber(r)) rc |= series_add(&lr, s->valuedouble, r->valuedouble);
    cJSON_Delete(j);
  }
  free(line);
  fclose(in);
  if (rc != 0) {
    free_series(&tr, &va, &lr);
    return mc_error("metrics log %s: out of memory", jsonl_path);
  }
  double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY, l1 = 0;
  const series *all[2] = {&tr, &va};
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < all[k]->n; i++) {
      if (all[k]->x[i] > x1) x1 = all[k]->x[i];
      if (all[k]->y[i] < y0) y0 = all[k]->y[i];
      if (all[k]->y[i] > y1) y1 = all[k]->y[i];
    }
  for (int i = 0; i < lr.n; i++) {
    if (lr.x[i] > x1) x1 = lr.x[i];
    if (lr.y[i] > l1) l1 = lr.y[i];
  }
  if (!(y0 <= y1)) y0 = 0, y1 = 1;
  if (y1 - y0 < 1e-9) y0 -= 0.5, y1 += 0.5;
  y0 = floor(y0 * 2) / 2, y1 = ceil(y1 * 2) / 2;
  if (!(l1 > 0) || !isfinite(l1)) l1 = 1;
  l1 *= 1.05; /* the peak lr just under the top */

  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    free_series(&tr, &va, &lr);
    return mc_error("loss curve %s: cannot write", tmp);
  }
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "font-family=\"sans-serif\" font-size=\"%d\">\n", W, H, FONT);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
  /* the title, shrunk to fit the width when long (a deep run directory) */
  double tfont = 15, room = W - ML - 10;
  if (CHAR_EM * tfont * (double)strlen(title) > room) tfont = room / (CHAR_EM * (double)strlen(title));
  fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"%.1f\">", ML, tfont);
  for (const char *c = title; *c; c++) /* XML-escape the caller's text */
    fputs(*c == '<' ? "&lt;" : *c == '>' ? "&gt;" : *c == '&' ? "&amp;" : (char[2]){*c, 0}, f);
  fprintf(f, "</text>\n");
  /* Axes with five ticks each: step below, loss left, learning rate right. */
  fprintf(f, "<path d=\"M%d %d V%d H%d V%d\" stroke=\"black\" fill=\"none\"/>\n", ML, MT, H - MB, W - MR, MT);
  /* steps at a round spacing (1, 2 or 5 x 10^k, at most 6 ticks) */
  double every = 1;
  while (every * 5 < x1 - x0) every *= every_next(every);
  for (double x = x0; x <= x1 + 1e-9; x += every)
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", sx(x, x0, x1), H - MB + 18, x);
  for (int i = 0; i <= 5; i++) {
    double fy = H - MB - i / 5.0 * (H - MT - MB);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", ML - 6, fy + 4,
            y0 + i / 5.0 * (y1 - y0));
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#2ca02c\">%.1e</text>\n", W - MR + 6, fy + 4, i / 5.0 * l1);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ML, W - MR, fy, fy);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (ML + W - MR) / 2, H - MB + 38);
  fprintf(f, "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">"
             "cross-entropy (nats)</text>\n", (MT + H - MB) / 2, (MT + H - MB) / 2);
  fprintf(f, "<text x=\"%d\" y=\"%d\" transform=\"rotate(-90 %d %d)\" text-anchor=\"middle\" fill=\"#2ca02c\">"
             "learning rate</text>\n", W - 8, (MT + H - MB) / 2, W - 8, (MT + H - MB) / 2);
  if (lr.n) polyline(f, &lr, x0, x1, 0, l1, "#2ca02c", " stroke-dasharray=\"5,3\"");
  polyline(f, &tr, x0, x1, y0, y1, "#1f77b4", "");
  if (va.n) polyline(f, &va, x0, x1, y0, y1, "#d62728", "");
  for (int i = 0; i < va.n; i++)
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n", sx(va.x[i], x0, x1), sy(va.y[i], y0, y1));
  /* the legend, one row under the axis title */
  double lx = ML;
  lx = legend(f, lx, H - 14, "#1f77b4", "", "train loss");
  if (va.n) lx = legend(f, lx, H - 14, "#d62728", "", "validation loss");
  if (lr.n) legend(f, lx, H - 14, "#2ca02c", " stroke-dasharray=\"5,3\"", "learning rate (right axis)");
  fprintf(f, "</svg>\n");
  free_series(&tr, &va, &lr);
  if (fclose(f) != 0 || rename(tmp, svg_path) != 0) return mc_error("loss curve %s: write failed", svg_path);
  return 0;
}
