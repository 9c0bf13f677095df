#include "reshard/ownmap.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/box.h"
#include "reshard/plan_print.h"

enum { CELL_W = 18, CELL_H = 12, LEFT = 230, TOP = 60 };

static const char *rule_color(mc_place p) {
  return p == MC_PLACE_TP ? "#e8833a" : p == MC_PLACE_EP ? "#3a9e5c" : "#4f7fc0";
}

static void legend_svg(FILE *f, int x, int y) {
  static const mc_place ps[] = {MC_PLACE_REPLICATED, MC_PLACE_TP, MC_PLACE_EP};
  for (int i = 0; i < 3; i++) {
    fprintf(f, "<rect x='%d' y='%d' width='12' height='12' fill='%s'/>", x + i * 150, y, rule_color(ps[i]));
    fprintf(f, "<text x='%d' y='%d' font-size='11'>%s</text>\n", x + i * 150 + 16, y + 10, mc_place_name(ps[i]));
  }
  fprintf(f, "<text x='%d' y='%d' font-size='11'>opacity = share of the family held (param); dark border = "
             "primary (writes it)</text>\n", x + 450, y + 10);
}

static void write_svg(FILE *f, const mc_geometry *g) {
  int W = g->world, nf = g->fams.n;
  int width = LEFT + W * CELL_W + 20, height = TOP + nf * CELL_H + 40;
  if (width < 1100) width = 1100;
  fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='monospace'>\n", width,
          height);
  char lay[600];
  mc_rs_layout_format(&g->layout, lay, sizeof lay);
  fprintf(f, "<text x='4' y='14' font-size='12'>%s  world %d  pattern %s</text>\n", lay, W, g->model.pattern);
  legend_svg(f, 4, 22);
  /* Column headers: rank numbers; stages are contiguous rank ranges (pp_rank is outermost). */
  mc_coords c;
  int prev_stage = -1;
  for (int r = 0; r < W; r++) {
    mc_layout_coords(&g->layout, r, &c);
    int x = LEFT + r * CELL_W;
    if (c.pp_rank != prev_stage) {
      fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#888'/>", x, TOP - 14, x, TOP + nf * CELL_H);
      fprintf(f, "<text x='%d' y='%d' font-size='10'>stage %d</text>\n", x + 2, TOP - 16, c.pp_rank);
      prev_stage = c.pp_rank;
    }
    fprintf(f, "<text x='%d' y='%d' font-size='9'>%d</text>", x + 2, TOP - 3, r);
  }
  for (int fi = 0; fi < nf; fi++) {
    const mc_family *fam = &g->fams.f[fi];
    int y = TOP + fi * CELL_H;
    char rule[64];
    mc_placement_rule(g, fi, rule, sizeof rule);
    fprintf(f, "<text x='4' y='%d' font-size='10'>%s</text>\n", y + CELL_H - 2, fam->name);
    for (int r = 0; r < W; r++) {
      mc_shard s;
      if (mc_shard_of(g, fi, MC_STATE_PARAM, r, &s) != 0 || !s.held) continue;
      char slab[160];
      mc_box box = mc_box_make(s.ndim, s.start, s.count);
      mc_box_format(&box, slab, (int)sizeof slab);
      double share = fam->numel > 0 ? (double)s.numel / (double)fam->numel : 1.0;
      fprintf(f,
              "<rect x='%d' y='%d' width='%d' height='%d' fill='%s' fill-opacity='%.3f' stroke='%s' "
              "stroke-width='%s'><title>rank %d %s %s %s%s, %d replica(s)</title></rect>\n",
              LEFT + r * CELL_W + 1, y + 1, CELL_W - 2, CELL_H - 2, rule_color(fam->place), 0.25 + 0.75 * share,
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
