#include "reshard/synth.h"

#include <string.h>

#include "core/dtype.h"
#include "core/optim_groups.h"
#include "reshard/ckpt_source.h"

/* The source is the world-size-1 layout: shard s is the whole tensor s (checked below),
 * so off is the global row-major index. */
static int synth_read(void *ctx, const mc_rs_plan *p, int s, int64_t off, int64_t n, float *buf) {
  const int64_t *step = ((mc_rs_io_ctx *)ctx)->src;
  int fam = p->tensors[s].fam, st = (int)p->tensors[s].state;
  if (p->tensors[s].src_dtype == MC_ELEM_I64) { /* AdamW's step: the checkpoint's step, as stored */
    memcpy(buf, step, sizeof *step);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) buf[i] = mc_rs_synth_value(fam, st, off + i);
  return 0;
}

int mc_rs_synthesize(const mc_config *cfg, int64_t step, const char *dst, const mc_rs_opts *o, mc_rs_summary *sum) {
  mc_layout one;
  mc_rs_consolidated_layout(&one);
  mc_geometry cg, dg; /* both with cfg's optimizer groups: each family gets the states its optimizer keeps */
  if (mc_geometry_of_config(cfg, &one, &cg) != 0) return -1;
  if (mc_geometry_of_config(cfg, NULL, &dg) != 0) {
    mc_geometry_free(&cg);
    return -1;
  }
  mc_rs_plan plan;
  int rc = mc_rs_plan_build(&cg, &dg, MC_RS_ALL_STATES, &plan);
  if (rc == 0) {
    for (int t = 0; t < plan.n_tensors && rc == 0; t++) {
      if (plan.tensors[t].n_src != 1 || plan.tensors[t].first_src != t) rc = mc_error("synthesize: unexpected plan");
      /* each state in the dtype its optimizer keeps it in (int64 counters) */
      mc_rs_tensor *tn = &plan.tensors[t];
      tn->src_dtype = tn->dtype = mc_opt_state_dtype(cg.fams.f[tn->fam].opt, tn->state);
    }
    mc_train_state st;
    memset(&st, 0, sizeof st);
    st.step = step;
    st.tokens_seen = step * (int64_t)cfg->train.global_batch * cfg->model.seq_len;
    st.schedule_step = step;
    st.adam_step = step;
    st.lr = cfg->train.lr;
    st.lr_max = cfg->train.lr;
    st.lr_min = cfg->train.min_lr;
    st.warmup_steps = cfg->train.warmup_steps;
    st.total_steps = cfg->train.steps;
    st.beta1 = cfg->train.beta1;
    st.beta2 = cfg->train.beta2;
    st.adam_eps = cfg->train.adam_eps;
    st.weight_decay = cfg->train.weight_decay;
    st.grad_clip = cfg->train.grad_clip;
    st.seed = cfg->train.seed;
    st.rng_counter = 7 * (uint64_t)step;
    st.data_position = step * (int64_t)cfg->train.global_batch;
    if (rc == 0) rc = mc_rs_write_from(synth_read, NULL, &step, cfg, &st, &dg, &plan, dst, o, sum);
    mc_rs_plan_free(&plan);
  }
  mc_geometry_free(&cg);
  mc_geometry_free(&dg);
  return rc;
}
