#include "reshard/plan_print.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#include "core/layout.h"

void mc_rs_layout_format(const mc_layout *l, char *buf, int cap) {
  snprintf(buf, (size_t)cap, "tp=%d pp=%d dp=%d ep=%d sp=%d zero=%d split=%s", l->tp, l->pp, l->dp, l->ep,
           l->sp, l->zero, l->split == MC_SPLIT_EXPLICIT ? l->split_pattern : mc_split_name(l->split));
}

void mc_rs_plan_print(FILE *f, const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst) {
  char ls[600], ld[600], sb[160];
  mc_rs_layout_format(&src->layout, ls, sizeof ls);
  mc_rs_layout_format(&dst->layout, ld, sizeof ld);
  fprintf(f, "reshard plan\n  source: %s (world %d)\n  target: %s (world %d)\n", ls, src->world, ld, dst->world);
  for (int i = 0; i < p->n_targets; i++) {
    const mc_rs_target *t = &p->targets[i];
    const mc_rs_tensor *tn = &p->tensors[t->tensor];
    mc_box_format(&t->shard.slab, sb, sizeof sb);
    fprintf(f, "%s/%s -> rank %d %s (%d replica%s) <-", src->fams.f[tn->fam].name, mc_state_name(tn->state),
            t->shard.rank, sb, t->shard.n_replicas, t->shard.n_replicas == 1 ? "" : "s");
    for (int k = 0; k < t->n_pieces; k++) {
      const mc_rs_piece *pc = &p->pieces[t->first_piece + k];
      mc_box_format(&pc->slab, sb, sizeof sb);
      fprintf(f, "%s rank %d %s", k ? "," : "", p->src[pc->src].rank, sb);
    }
    fputc('\n', f);
  }
  fprintf(f, "totals: %d tensors, %d source shards from %d writers -> %d target shards from %d writers, "
             "%d pieces, %.3f MiB\n",
          p->n_tensors, p->n_src, p->n_src_writers, p->n_targets, p->n_dst_writers, p->n_pieces,
          (double)p->bytes / (1024.0 * 1024.0));
}

cJSON *mc_rs_layout_json(const mc_geometry *g) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "tp", g->layout.tp);
  cJSON_AddNumberToObject(o, "pp", g->layout.pp);
  cJSON_AddNumberToObject(o, "dp", g->layout.dp);
  cJSON_AddNumberToObject(o, "ep", g->layout.ep);
  cJSON_AddBoolToObject(o, "sp", g->layout.sp);
  cJSON_AddNumberToObject(o, "zero", g->layout.zero);
  cJSON_AddStringToObject(o, "pp_split", g->layout.split == MC_SPLIT_EXPLICIT ? g->layout.split_pattern
                                                                             : mc_split_name(g->layout.split));
  cJSON_AddNumberToObject(o, "world", g->world);
  return o;
}

static void add_slab(cJSON *o, const mc_box *s) {
  double st[3], ct[3];
  for (int d = 0; d < s->ndim; d++) st[d] = (double)s->start[d], ct[d] = (double)s->count[d];
  cJSON_AddItemToObject(o, "start", cJSON_CreateDoubleArray(st, s->ndim));
  cJSON_AddItemToObject(o, "count", cJSON_CreateDoubleArray(ct, s->ndim));
}

char *mc_rs_plan_json(const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddItemToObject(root, "source", mc_rs_layout_json(src));
  cJSON_AddItemToObject(root, "target", mc_rs_layout_json(dst));
  cJSON *arr = cJSON_AddArrayToObject(root, "targets");
  for (int i = 0; i < p->n_targets; i++) {
    const mc_rs_target *t = &p->targets[i];
    const mc_rs_tensor *tn = &p->tensors[t->tensor];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "family", src->fams.f[tn->fam].name);
    cJSON_AddStringToObject(o, "state", mc_state_name(tn->state));
    cJSON_AddNumberToObject(o, "rank", t->shard.rank);
    cJSON_AddNumberToObject(o, "replicas", t->shard.n_replicas);
    add_slab(o, &t->shard.slab);
    cJSON *pcs = cJSON_AddArrayToObject(o, "pieces");
    for (int k = 0; k < t->n_pieces; k++) {
      const mc_rs_piece *pc = &p->pieces[t->first_piece + k];
      cJSON *q = cJSON_CreateObject();
      cJSON_AddNumberToObject(q, "source_rank", p->src[pc->src].rank);
      add_slab(q, &pc->slab);
      cJSON_AddItemToArray(pcs, q);
    }
    cJSON_AddItemToArray(arr, o);
  }
  cJSON *tot = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(tot, "tensors", p->n_tensors);
  cJSON_AddNumberToObject(tot, "source_shards", p->n_src);
  cJSON_AddNumberToObject(tot, "target_shards", p->n_targets);
  cJSON_AddNumberToObject(tot, "pieces", p->n_pieces);
  cJSON_AddNumberToObject(tot, "source_writers", p->n_src_writers);
  cJSON_AddNumberToObject(tot, "target_writers", p->n_dst_writers);
  cJSON_AddNumberToObject(tot, "bytes", (double)p->bytes);
  char *s = cJSON_Print(root);
  cJSON_Delete(root);
  if (!s) mc_error("reshard plan: out of memory writing JSON");
  return s;
}
