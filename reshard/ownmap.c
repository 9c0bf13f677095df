#include "reshard/ownmap.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/box.h"
#include "reshard/plan_print.h"

/* Geometry. Text is laid out with a fixed advance of CHAR_EM of its font size per
 * character (monospace: 0.6 em), so labels are placed by their width and never overlap;
 * tests/reshard/test_ownmap_svg.py measures the boxes the same way. */
#define CHAR_EM 0.6
enum { MIN_WIDTH = 1100, MIN_CELL_W = 18, CELL_H = 12, TOP = 74, RIGHT = 20, ROW_FONT = 10, STAGE_FONT = 10,
       RANK_FONT = 9 };

static double text_w(const char *s, double font) { return CHAR_EM * font * (double)strlen(s); }

static const char *rule_color(mc_place p) {
  return p == MC_PLACE_TP ? "#e8833a" : p == MC_PLACE_EP ? "#3a9e5c" : "#4f7fc0";
}

/* The legend: three swatches, then the note, each placed after the previous text. */
static void legend_svg(FILE *f, double x, int y) {
  static const mc_place ps[] = {MC_PLACE_REPLICATED, MC_PLACE_TP, MC_PLACE_EP};
  for (int i = 0; i < 3; i++) {
    fprintf(f, "<rect x='%.1f' y='%d' width='12' height='12' fill='%s'/>", x, y, rule_color(ps[i]));
    fprintf(f, "<text x='%.1f' y='%d' font-size='11'>%s</text>\n", x + 16, y + 10, mc_place_name(ps[i]));
    x += 16 + text_w(mc_place_name(ps[i]), 11) + 24;
  }
  fprintf(f, "<text x='%.1f' y='%d' font-size='11'>opacity = share of the family held (param); dark border = "
             "primary (writes it)</text>\n", x, y + 10);
}

static double legend_w(void) {
  static const mc_place ps[] = {MC_PLACE_REPLICATED, MC_PLACE_TP, MC_PLACE_EP};
  double w = 0;
  for (int i = 0; i < 3; i++) w += 16 + text_w(mc_place_name(ps[i]), 11) + 24;
  return w + text_w("opacity = share of the family held (param); dark border = primary (writes it)", 11);
}

/* A stage's header over `span` pixels: "stage N" where it fits, else "sN", else "N", at the
 * largest font size (up to STAGE_FONT) that keeps it inside the span. */
static void stage_label(FILE *f, double x, double span, int stage) {
  char text[3][32];
  snprintf(text[0], sizeof text[0], "stage %d", stage);
  snprintf(text[1], sizeof text[1], "s%d", stage);
  snprintf(text[2], sizeof text[2], "%d", stage);
  const double room = span - 4;
  for (int k = 0; k < 3; k++) {
    double font = STAGE_FONT;
    if (text_w(text[k], font) > room) {
      if (k < 2) continue;
      font = room / (CHAR_EM * (double)strlen(text[k])); /* the number alone: shrink it to fit */
    }
    fprintf(f, "<text x='%.1f' y='%d' font-size='%.1f'>%s</text>\n", x + 2, TOP - 18, font, text[k]);
    return;
  }
}

static void write_svg(FILE *f, const mc_geometry *g) {
  const int W = g->world, nf = g->fams.n;
  /* the family names' column is as wide as the longest name */
  double left = 0;
  for (int fi = 0; fi < nf; fi++) {
    double w = text_w(g->fams.f[fi].name, ROW_FONT);
    if (w > left) left = w;
  }
  left = 4 + left + 12;
  char lay[600], head[1100];
  mc_rs_layout_format(&g->layout, lay, sizeof lay);
  snprintf(head, sizeof head, "%s  world %d  pattern %s", lay, W, g->model.pattern);
  /* the picture is at least MIN_WIDTH wide, wide enough for the header, the legend and
   * MIN_CELL_W per rank; the rank columns share all the width right of the names */
  double width = left + (double)W * MIN_CELL_W + RIGHT;
  if (width < MIN_WIDTH) width = MIN_WIDTH;
  if (width < 8 + text_w(head, 12)) width = 8 + text_w(head, 12);
  if (width < 8 + legend_w()) width = 8 + legend_w();
  width = (double)(int)(width + 0.999);
  const double cell_w = (width - left - RIGHT) / (double)W;
  const int height = TOP + nf * CELL_H + 20;
  fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='monospace'>\n", (int)width,
          height);
  fprintf(f, "<text x='4' y='14' font-size='12'>%s</text>\n", head);
  legend_svg(f, 4, 24);
  /* Rank numbers: every rank whose number fits its column at RANK_FONT, else every k-th */
  char num[16];
  snprintf(num, sizeof num, "%d", W - 1);
  int every = 1;
  while (text_w(num, RANK_FONT) + 2 > every * cell_w) every++;
  /* Column headers; stages are contiguous rank ranges (pp_rank is outermost). */
  mc_coords c;
  for (int r = 0; r < W;) {
    mc_layout_coords(&g->layout, r, &c);
    int end = r + 1;
    for (mc_coords d; end < W; end++) {
      mc_layout_coords(&g->layout, end, &d);
      if (d.pp_rank != c.pp_rank) break;
    }
    const double x = left + r * cell_w;
    fprintf(f, "<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='#888'/>\n", x, TOP - 30, x, TOP + nf * CELL_H);
    stage_label(f, x, (end - r) * cell_w, c.pp_rank);
    r = end;
  }
  for (int r = 0; r < W; r += every)
    fprintf(f, "<text x='%.1f' y='%d' font-size='%d'>%d</text>", left + r * cell_w + 1, TOP - 3, RANK_FONT, r);
  fprintf(f, "\n");
  for (int fi = 0; fi < nf; fi++) {
    const mc_family *fam = &g->fams.f[fi];
    int y = TOP + fi * CELL_H;
    char rule[64];
    mc_placement_rule(g, fi, rule, sizeof rule);
    fprintf(f, "<text x='4' y='%d' font-size='%d'>%s</text>\n", y + CELL_H - 2, ROW_FONT, fam->name);
    for (int r = 0; r < W; r++) {
      mc_shard s;
      if (mc_shard_of(g, fi, MC_STATE_PARAM, r, &s) != 0 || !s.held) continue;
      char slab[160];
      mc_box box = mc_box_make(s.ndim, s.start, s.count);
      mc_box_format(&box, slab, (int)sizeof slab);
      double share = fam->numel > 0 ? (double)s.numel / (double)fam->numel : 1.0;
      fprintf(f,
              "<rect x='%.1f' y='%d' width='%.1f' height='%d' fill='%s' fill-opacity='%.3f' stroke='%s' "
              "stroke-width='%s'><title>rank %d %s %s %s%s, %d replica(s)</title></rect>\n",
              left + r * cell_w + 1, y + 1, cell_w - 2, CELL_H - 2, rule_color(fam->place), 0.25 + 0.75 * share,
              s.primary ? "#111" : "none", s.primary ? "1.2" : "0", r, fam->name, slab, rule,
              s.primary ? ", primary" : "", s.n_replicas);
    }
  }
  fprintf(f, "</svg>\n");
}

int mc_rs_ownership_map(const mc_geometry *g, const char *path, const char *title) {
  const char *dot = strrchr(path, '.');
  int html = dot && (!strcmp(dot, ".html") || !strcmp(dot, ".htm"));
  if (!dot || (!html && strcmp(dot, ".svg") != 0))
    return mc_error("%s: the map is written as SVG or HTML; use a .svg, .html or .htm name", path);
  FILE *f = fopen(path, "w");
  if (!f) return mc_error("%s: cannot create: %s", path, strerror(errno));
  if (html) {
    fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>%s</title></head><body>\n"
               "<h2>%s</h2>\n<p>Ranks (columns, grouped by pipeline stage) against families (rows) for the "
               "<code>param</code> state. Hover a cell for its hyperslab.</p>\n",
            title ? title : "ownership map", title ? title : "ownership map");
  }
  write_svg(f, g);
  if (html) fprintf(f, "</body></html>\n");
  if (fclose(f) != 0) return mc_error("%s: write failed: %s", path, strerror(errno));
  return 0;
}
