/* How each parameter's gradient is combined across ranks, and ZeRO 3's per-layer gather of
 * working weights and reduce-scatter of gradients (docs/parallel.md).
 *
 * Per family: a TP-split slice is summed over its data-parallel group only; a family
 * replicated over TP whose gradient is partial there (mc_family.tp_partial_grad) is first
 * summed over TP; experts (never TP-split; ep = 1 here) are reduced over the expert-DP group,
 * which spans TP as well: with SP every TP rank contributes its shard's partial gradient,
 * without SP the TP ranks hold identical copies and only TP rank 0 contributes. */
#include <stdlib.h>
#include <string.h>

#include "train/net_blocks.h"
#include "util/error.h"

int mc_dist_setup(struct mc_net *net) {
  const mc_layout *l = &net->geo.layout;
  int *members = malloc(sizeof(int) * (size_t)net->geo.world);
  if (!members) return mc_error("network: out of memory");
  for (int i = 0; i < net->n_params; i++) {
    mc_net_param *p = &net->params[i];
    mc_dist_param *dp = &net->dist[i];
    const mc_family *f = &net->geo.fams.f[p->fam];
    int expert = f->place == MC_PLACE_EP, gs;
    dp->group = net->comm ? (expert ? net->comm->edp : net->comm->dp) : NULL;
    dp->tp_sum = !expert && f->tp_partial_grad && net->tp > 1;
    dp->contribute = !expert || net->sp || net->tp_rank == 0;
    gs = expert ? mc_group_edp(l, net->rank, members) : mc_group_dp(l, net->rank, members);
    if (dp->group && dp->group->size != gs) {
      free(members);
      return mc_error("network: the %s communicator has %d members, the layout %d", dp->group->label, dp->group->size, gs);
    }
    dp->counts = malloc(sizeof(int64_t) * (size_t)gs);
    if (!dp->counts) {
      free(members);
      return mc_error("network: out of memory");
    }
    int64_t row = p->numel / (p->shard.local_count[0] > 0 ? p->shard.local_count[0] : 1);
    for (int j = 0; j < gs; j++) {
      mc_shard sh;
      if (mc_shard_of(&net->geo, p->fam, MC_STATE_PARAM, members[j], &sh)) {
        free(members);
        return -1;
      }
      dp->counts[j] = sh.count[0] * row;
    }
  }
  free(members);
  return 0;
}

void mc_dist_free(struct mc_net *net) {
  if (!net->dist) return;
  for (int i = 0; i < net->n_params; i++) free(net->dist[i].counts), net->dist[i].counts = NULL;
}

static int group_size(const mc_dist_param *dp) { return dp->group ? dp->group->size : 1; }

int mc_dist_reduce_grad(struct mc_net *net, int i, float *g, float *out) {
  mc_backend *be = net->be;
  mc_net_param *p = &net->params[i];
  mc_dist_param *dp = &net->dist[i];
  const char *name = net->geo.fams.f[p->fam].name;
  if (!dp->contribute) be->fill(be, g, p->numel, 0.0f);
  if (be->sync(be)) return -1;
  if (dp->tp_sum && mc_allreduce_sum(net->comm->tp, g, p->numel, MC_DT_F32))
    return mc_error_context("summing the partial gradient of %s over TP", name);
  if (net->zero == 0) {
    if (group_size(dp) > 1 && mc_allreduce_sum(dp->group, g, p->numel, MC_DT_F32))
      return mc_error_context("all-reducing the gradient of %s", name);
    return 0;
  }
  if (group_size(dp) > 1) {
    if (mc_reduce_scatter_sum(dp->group, g, out, dp->counts, MC_DT_F32))
      return mc_error_context("reduce-scattering the gradient of %s", name);
  } else {
    be->copy(be, out, g + p->z_off, p->z_numel);
  }
  return 0;
}

/* ZeRO 3: the working weights exist only between acquire and release; during a backward
 * the gradient buffer is a whole local slice whose reduced shard is added to the rank's
 * accumulator (parked in mc_dist_param.g_acc meanwhile) on release. */
int mc_zero3_acquire(struct mc_net *net, const int *idx, int n, int for_backward) {
  if (net->zero != 3) return 0;
  mc_backend *be = net->be;
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &net->params[idx[k]];
    mc_dist_param *dp = &net->dist[idx[k]];
    if (!p->w && !(p->w = be->alloc(be, (size_t)p->numel * sizeof(float)))) return -1;
    if (group_size(dp) > 1) {
      if (be->sync(be) || mc_allgather(dp->group, p->ws, p->w, dp->counts, MC_DT_F32))
        return mc_error_context("ZeRO 3: gathering %s", net->geo.fams.f[p->fam].name);
    } else {
      be->copy(be, p->w, p->ws, p->z_numel);
    }
    if (for_backward) {
      float *full = be->alloc(be, (size_t)p->numel * sizeof(float)); /* zero-filled */
      if (!full) return -1;
      net->dist[idx[k]].g_acc = p->g;
      p->g = full;
    }
  }
  return 0;
}

int mc_zero3_release(struct mc_net *net, const int *idx, int n, int after_backward) {
  if (net->zero != 3) return 0;
  mc_backend *be = net->be;
  int rc = 0;
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &net->params[idx[k]];
    be->free(be, p->w);
    p->w = NULL;
    if (!after_backward) continue;
    float *part = be->alloc(be, (size_t)(p->z_numel ? p->z_numel : 1) * sizeof(float));
    if (!part) rc = -1;
    if (!rc) rc = mc_dist_reduce_grad(net, idx[k], p->g, part);
    if (!rc) be->axpy(be, net->dist[idx[k]].g_acc, part, p->z_numel, 1.0f);
    be->free(be, part);
    be->free(be, p->g);
    p->g = net->dist[idx[k]].g_acc;
  }
  return rc;
}
