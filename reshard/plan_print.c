#include "reshard/plan_print.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/layout.h"

void mc_rs_layout_format(const mc_layout *l, char *buf, int cap) {
  snprintf(buf, (size_t)cap, "tp=%d pp=%d dp=%d ep=%d sp=%d zero=%d split=%s", l->tp, l->pp, l->dp, l->ep,
           l->sp, l->zero, l->split == MC_SPLIT_EXPLICIT ? l->split_pattern : mc_split_name(l->split));
}

int64_t mc_rs_record_bytes(const char *family, const char *state, int rank, int ndim, const int64_t *start,
                           const int64_t *count, int nrep) {
  /* as cJSON_Print lays a record of the manifest's "shards" out: one key a line, three tabs in */
  char buf[768], dims[2][160];
  for (int k = 0; k < 2; k++) {
    int n = snprintf(dims[k], sizeof dims[k], "[");
    for (int d = 0; d < ndim && n < (int)sizeof dims[k] - 24; d++)
      n += snprintf(dims[k] + n, sizeof dims[k] - (size_t)n, "%s%lld", d ? ", " : "", (long long)(k ? count[d] : start[d]));
    snprintf(dims[k] + n, sizeof dims[k] - (size_t)n, "]");
  }
  int n = snprintf(buf, sizeof buf,
                   "\t\t{\n\t\t\t\"family\":\t\"%s\",\n\t\t\t\"state\":\t\"%s\",\n\t\t\t\"file\":\t\"rank_%d.h5\",\n"
                   "\t\t\t\"dataset\":\t\"/%s/%s\",\n\t\t\t\"rank\":\t%d,\n\t\t\t\"stage\":\t0,\n\t\t\t\"start\":\t%s,\n"
                   "\t\t\t\"count\":\t%s,\n\t\t\t\"replica_group\":\t[],\n\t\t\t\"sha256\":\t\"%064d\"\n\t\t}, ",
                   family, state, rank, family, state, rank, dims[0], dims[1], 0);
  char digits[16];
  const int rd = snprintf(digits, sizeof digits, "%d", rank);
  return n + (int64_t)nrep * (rd + 2) - 2; /* replica ranks (about the primary's width) and ", " */
}

void mc_rs_forecast_finish(const int64_t *bytes, int world, double node_gbps, int ranks_per_node, mc_rs_forecast *f) {
  f->world = world, f->node_gbps = node_gbps, f->ranks_per_node = ranks_per_node;
  f->bytes = 0, f->files = 0, f->largest_rank = 0, f->slowest_node_bytes = 0;
  for (int r = 0; r < world; r++) {
    f->bytes += bytes[r];
    f->files += bytes[r] > 0;
    if (bytes[r] > bytes[f->largest_rank]) f->largest_rank = r;
  }
  for (int n0 = 0; n0 < world; n0 += ranks_per_node) {
    int64_t b = 0;
    for (int r = n0; r < n0 + ranks_per_node && r < world; r++) b += bytes[r];
    f->slowest_node_bytes = b > f->slowest_node_bytes ? b : f->slowest_node_bytes;
  }
  f->largest_bytes = world > 0 ? bytes[f->largest_rank] : 0;
  f->writer_balance = f->bytes > 0 ? (double)f->largest_bytes / ((double)f->bytes / world) : 0.0;
  f->predicted_save_s = (double)f->slowest_node_bytes / (node_gbps * 1e9);
}

int mc_rs_plan_forecast(const mc_rs_plan *p, const mc_geometry *dst, double node_gbps, int ranks_per_node,
                        mc_rs_forecast *f) {
  memset(f, 0, sizeof *f);
  int64_t *bytes = calloc((size_t)dst->world, sizeof *bytes);
  if (!bytes) return mc_error("out of memory");
  for (int i = 0; i < p->n_targets; i++) {
    const mc_rs_target *t = &p->targets[i];
    const mc_rs_tensor *tn = &p->tensors[t->tensor];
    bytes[t->shard.rank] += mc_box_numel(&t->shard.slab) * (int64_t)mc_elem_dtype_size(tn->dtype); /* as stored */
    f->manifest_bytes += mc_rs_record_bytes(dst->fams.f[tn->fam].name, mc_state_name(tn->state), t->shard.rank,
                                            t->shard.slab.ndim, t->shard.slab.start, t->shard.slab.count,
                                            t->shard.n_replicas);
  }
  f->shards = p->n_targets;
  mc_rs_forecast_finish(bytes, dst->world, node_gbps, ranks_per_node, f);
  free(bytes);
  return 0;
}

void mc_rs_forecast_print(FILE *out, const mc_rs_forecast *f, const char *what) {
  fprintf(out, "%s: %lld bytes in %lld shards, %d rank files of %d ranks; manifest about %.1f MiB\n", what,
          (long long)f->bytes, (long long)f->shards, f->files, f->world, (double)f->manifest_bytes / (1 << 20));
  fprintf(out, "  writers: largest rank %d writes %lld bytes, %.3fx the mean %.0f\n", f->largest_rank,
          (long long)f->largest_bytes, f->writer_balance, f->world > 0 ? (double)f->bytes / f->world : 0.0);
  fprintf(out, "  predicted save: %.2f s (slowest node of %d ranks writes %.3g GB at %.2f GB/s per node)\n",
          f->predicted_save_s, f->ranks_per_node, (double)f->slowest_node_bytes / 1e9, f->node_gbps);
}

void mc_rs_plan_print(FILE *f, const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst, int targets) {
  char ls[600], ld[600], sb[160];
  mc_rs_layout_format(&src->layout, ls, sizeof ls);
  mc_rs_layout_format(&dst->layout, ld, sizeof ld);
  fprintf(f, "reshard plan\n  source: %s (world %d)\n  target: %s (world %d)\n", ls, src->world, ld, dst->world);
  for (int i = 0; i < p->n_targets && targets; i++) {
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

/* The element dtype of each state kind the plan moves, on each side: src[s], dst[s] (-1: the
 * plan moves no tensor of kind s; a kind whose tensors disagree reports the first's). Returns 1
 * if any is not what the trainer keeps it in: float32, or int64 (only ever AdamW's step, which
 * is never converted). */
static int state_dtypes(const mc_rs_plan *p, int *src, int *dst) {
  int narrow = 0;
  for (int s = 0; s < MC_N_STATES; s++) src[s] = dst[s] = -1;
  for (int t = 0; t < p->n_tensors; t++) {
    const mc_rs_tensor *tn = &p->tensors[t];
    if (src[tn->state] < 0) src[tn->state] = tn->src_dtype, dst[tn->state] = tn->dtype;
    narrow |= (tn->src_dtype != MC_ELEM_F32 && tn->src_dtype != MC_ELEM_I64) || (tn->dtype != MC_ELEM_F32 && tn->dtype != MC_ELEM_I64);
  }
  return narrow;
}

void mc_rs_plan_print_dtypes(FILE *f, const mc_rs_plan *p) {
  int src[MC_N_STATES], dst[MC_N_STATES], n = 0;
  if (!state_dtypes(p, src, dst)) return;
  fprintf(f, "element dtypes:");
  for (int s = 0; s < MC_N_STATES; s++) {
    if (src[s] < 0) continue;
    fprintf(f, "%s %s %s", n++ ? "," : "", mc_state_name((mc_state)s), mc_elem_dtype_name(src[s]));
    if (dst[s] != src[s]) fprintf(f, " -> %s", mc_elem_dtype_name(dst[s]));
  }
  fputc('\n', f);
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

char *mc_rs_plan_json(const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst, int targets,
                      const mc_rs_forecast *fc) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddItemToObject(root, "source", mc_rs_layout_json(src));
  cJSON_AddItemToObject(root, "target", mc_rs_layout_json(dst));
  cJSON *arr = targets ? cJSON_AddArrayToObject(root, "targets") : NULL;
  for (int i = 0; i < p->n_targets && targets; i++) {
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
  int sdt[MC_N_STATES], ddt[MC_N_STATES];
  state_dtypes(p, sdt, ddt);
  cJSON *dts = cJSON_AddObjectToObject(root, "dtypes");
  for (int s = 0; s < MC_N_STATES; s++) {
    if (sdt[s] < 0) continue;
    cJSON *o = cJSON_AddObjectToObject(dts, mc_state_name((mc_state)s));
    cJSON_AddStringToObject(o, "source", mc_elem_dtype_name(sdt[s]));
    cJSON_AddStringToObject(o, "target", mc_elem_dtype_name(ddt[s]));
  }
  if (fc) {
    cJSON *o = cJSON_AddObjectToObject(root, "forecast");
    const struct { const char *key; double v; } kv[] = {
        {"shards", (double)fc->shards}, {"files", fc->files}, {"bytes", (double)fc->bytes},
        {"manifest_bytes", (double)fc->manifest_bytes}, {"writer_largest_rank", fc->largest_rank},
        {"writer_largest_over_mean", fc->writer_balance}, {"node_gbps", fc->node_gbps},
        {"ranks_per_node", fc->ranks_per_node}, {"predicted_save_s", fc->predicted_save_s}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) cJSON_AddNumberToObject(o, kv[i].key, kv[i].v);
  }
  char *s = cJSON_Print(root);
  cJSON_Delete(root);
  if (!s) mc_error("reshard plan: out of memory writing JSON");
  return s;
}
