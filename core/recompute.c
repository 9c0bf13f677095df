#include "core/recompute.h"

#include <string.h>

#include "core/holdings.h"

/* Whether some buffer of a list that exists in the layer is made by part p and dropped by r.
 * Saved buffers are made by the projections when keep_selective marks them, by the parts
 * after them otherwise (core/blocks.h mc_fwd_part). */
static int drops_from(const mc_act_buf *b, int n, const mc_block_kind *k, const mc_act_shape *s, mc_fwd_part p,
                      mc_recompute r) {
  for (int i = 0; i < n; i++) {
    const mc_fwd_part made_by = b[i].keep_selective ? MC_PART_PROJ : MC_PART_INNER;
    if (made_by == p && mc_act_buf_exists(&b[i], s, k) && !mc_act_buf_kept(&b[i], r)) return 1;
  }
  return 0;
}

int mc_recompute_reruns(char block, mc_fwd_part p, int routed, mc_recompute r) {
  const mc_block_kind *k = mc_block_kind_of(block);
  if (!k) return 0;
  /* rows exchanged over EP: the experts' buffers live in moe.scratch, kept by every policy but full */
  if (p == MC_PART_INNER && k->routes && routed == MC_ROUTED_EXCHANGED && r != MC_RECOMPUTE_FULL) return 0;
  /* existence of the layer's buffers depends only on routing (no act16, TP, SP or stage
   * conditions among them) */
  mc_act_shape s;
  memset(&s, 0, sizeof s);
  s.tp = 1, s.n_seq = 1, s.routed = routed;
  switch (p) {
    case MC_PART_NORM: /* makes the normed input (u or u16) and rstd */
      for (int i = MC_L_U16; i <= MC_L_RSTD; i++)
        if (mc_act_buf_exists(&mc_layer_bufs[i], &s, k) && !mc_act_buf_kept(&mc_layer_bufs[i], r)) return 1;
      return 0;
    case MC_PART_PROJ:
    case MC_PART_INNER:
      return drops_from(k->saved, k->n_saved, k, &s, p, r) || drops_from(k->saved_i32, k->n_saved_i32, k, &s, p, r);
    default: return 0; /* the output part makes no buffer */
  }
}

double mc_block_recompute_flops(const mc_model *m, char block, int routed, mc_recompute r) {
  const mc_block_kind *k = mc_block_kind_of(block);
  double f = 0.0;
  for (int p = 0; k && p < MC_N_PARTS; p++)
    if (mc_recompute_reruns(block, (mc_fwd_part)p, routed, r)) f += k->part_flops(m, (mc_fwd_part)p, k->routes && routed != 0);
  return f;
}

double mc_recompute_flops(const mc_model *m, const char *blocks, int n, int routed, mc_recompute r) {
  double f = 0.0;
  for (int i = 0; i < n && blocks[i]; i++) f += mc_block_recompute_flops(m, blocks[i], routed, r);
  return f;
}
