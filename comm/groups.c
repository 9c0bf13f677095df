/* The layout's process groups (comm/comm.h mc_comm_make_groups), built by the world's own
 * split, so the MPI and NCCL backends form the same groups from core/layout's rule. */

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "util/error.h"

typedef int (*group_fn)(const mc_layout *, int, int *);

static mc_comm *split_by(mc_comm *world, const mc_layout *l, group_fn members_of, const char *label) {
  int *members = malloc(sizeof(int) * (size_t)world->size);
  if (!members) {
    mc_error("out of memory creating the %s group", label);
    return NULL;
  }
  members_of(l, world->rank, members);
  int color = members[0]; /* the group's lowest rank names it */
  free(members);
  return world->ops->split(world, color, world->rank, label);
}

int mc_comm_make_groups(mc_comm *world, const mc_layout *l, mc_comm_groups *out) {
  memset(out, 0, sizeof *out);
  int want = mc_layout_world(l);
  if (want != world->size)
    return mc_error("world size tp*dp*pp=%d*%d*%d=%d does not equal the %d ranks launched", l->tp, l->dp, l->pp, want,
                    world->size);
  out->world = world;
  out->tp = split_by(world, l, mc_group_tp, "tp");
  /* every split is collective: all are made even after one failed, so no member waits */
  out->dp = split_by(world, l, mc_group_dp, "dp");
  out->pp = split_by(world, l, mc_group_pp, "pp");
  out->ep = split_by(world, l, mc_group_ep, "ep");
  out->edp = split_by(world, l, mc_group_edp, "edp");
  if (!out->tp || !out->dp || !out->pp || !out->ep || !out->edp) {
    mc_comm_free_groups(out);
    return -1;
  }
  return 0;
}

void mc_comm_free_groups(mc_comm_groups *g) {
  mc_comm *sub[] = {g->tp, g->dp, g->pp, g->ep, g->edp};
  for (int i = 0; i < 5; i++)
    if (sub[i]) sub[i]->ops->destroy(sub[i]);
  g->tp = g->dp = g->pp = g->ep = g->edp = NULL;
}


double mc_comm_groups_busy(const mc_comm_groups *g) {
  const mc_comm *all[] = {g->world, g->tp, g->dp, g->pp, g->ep, g->edp};
  double s = 0.0;
  for (int i = 0; i < 6; i++) s += all[i] ? all[i]->busy_s : 0.0;
  return s;
}
