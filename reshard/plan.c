#include "reshard/plan.h"

#include "core/dtype.h"
#include "core/optim_groups.h"

#include <stdlib.h>
#include <string.h>

int mc_rs_model_diff(const mc_model *a, const mc_model *b, mc_errlist *errs) {
  int before = errs->n;
  if (strcmp(a->pattern, b->pattern) != 0)
    mc_errlist_add(errs, "model change: pattern %s -> %s (block letters must stay; a reshard keeps the model)",
                   a->pattern, b->pattern);
#define MC_RS_INT(k)                                                                           \
  if (a->k != b->k)                                                                            \
    mc_errlist_add(errs, "model change: %s %d -> %d (a reshard keeps the model)", #k, a->k, b->k);
  MC_RS_INT(vocab_size)
  MC_RS_INT(vocab_pad)
  MC_RS_INT(d_model)
  MC_RS_INT(n_heads)
  MC_RS_INT(n_kv_heads)
  MC_RS_INT(head_dim)
  MC_RS_INT(n_experts)
  MC_RS_INT(top_k)
  MC_RS_INT(expert_hidden)
  MC_RS_INT(mamba_inner)
  MC_RS_INT(mamba_head_dim)
  MC_RS_INT(ssm_state)
  MC_RS_INT(conv_width)
  MC_RS_INT(rec_width)
  MC_RS_INT(seq_len)
#undef MC_RS_INT
#define MC_RS_DBL(k)                                                                           \
  if (a->k != b->k)                                                                            \
    mc_errlist_add(errs, "model change: %s %g -> %g (a reshard keeps the model)", #k, a->k, b->k);
  MC_RS_DBL(capacity_factor)
  MC_RS_DBL(aux_loss_coef)
  MC_RS_DBL(rope_theta)
  MC_RS_DBL(norm_eps)
  MC_RS_DBL(init_std)
#undef MC_RS_DBL
  return errs->n - before;
}

static void shard_to_slab(const mc_shard *s, mc_box *out) { *out = mc_box_make(s->ndim, s->start, s->count); }

int mc_rs_primaries(const mc_geometry *g, int fam, mc_state state, mc_rs_shard *out) {
  int n = 0;
  for (int r = 0; r < g->world; r++) {
    mc_shard s;
    if (mc_shard_of(g, fam, state, r, &s) != 0) return -1;
    if (!s.primary) continue;
    out[n].rank = r;
    out[n].n_replicas = s.n_replicas;
    shard_to_slab(&s, &out[n].slab);
    n++;
  }
  return n;
}

/* Growable arrays without a generic container: each grows by doubling. */
#define MC_RS_PUSH(arr, n, cap, val)                                          \
  do {                                                                        \
    if ((n) == (cap)) {                                                       \
      int nc_ = (cap) ? 2 * (cap) : 64;                                       \
      void *p_ = realloc((arr), (size_t)nc_ * sizeof *(arr));                 \
      if (!p_) goto oom;                                                      \
      (arr) = p_;                                                             \
      (cap) = nc_;                                                            \
    }                                                                         \
    (arr)[(n)++] = (val);                                                     \
  } while (0)

int mc_rs_plan_build(const mc_geometry *src, const mc_geometry *dst, unsigned states, mc_rs_plan *out) {
  memset(out, 0, sizeof *out);
  mc_errlist errs;
  mc_errlist_init(&errs);
  if (mc_rs_model_diff(&src->model, &dst->model, &errs)) return mc_errlist_raise(&errs, "reshard refused");
  if (src->fams.n != dst->fams.n) return mc_error("reshard refused: family count %d -> %d", src->fams.n, dst->fams.n);

  int cap_t = 0, cap_s = 0, cap_g = 0, cap_p = 0;
  int maxw = src->world > dst->world ? src->world : dst->world;
  mc_rs_shard *tmp = malloc((size_t)maxw * sizeof *tmp);
  char *src_writer = calloc((size_t)src->world, 1), *dst_writer = calloc((size_t)dst->world, 1);
  if (!tmp || !src_writer || !dst_writer) goto oom;
  for (int f = 0; f < src->fams.n; f++) {
    if (strcmp(src->fams.f[f].name, dst->fams.f[f].name) != 0) {
      mc_error("reshard refused: family %d is %s in the source and %s in the target", f,
               src->fams.f[f].name, dst->fams.f[f].name);
      goto fail;
    }
    /* The optimizer fixes which state kinds a family has; a reshard moves states, it cannot
     * turn AdamW moments into a Muon momentum. */
    if (src->fams.f[f].opt != dst->fams.f[f].opt) {
      mc_error("reshard refused: family %s is trained by %s in the source and by %s in the target (a reshard keeps "
               "the optimizer groups, optim.groups)",
               src->fams.f[f].name, mc_opt_name(src->fams.f[f].opt), mc_opt_name(dst->fams.f[f].opt));
      goto fail;
    }
    for (int st = 0; st < MC_N_STATES; st++) {
      /* `states` names kinds; a family has only those its optimizer declares */
      if (!(states & (1u << st)) || !mc_family_has_state(&src->fams.f[f], (mc_state)st)) continue;
      mc_rs_tensor t = {.fam = f, .state = (mc_state)st, .first_src = out->n_src, .first_tgt = out->n_targets,
                        .src_dtype = MC_ELEM_F32, .dtype = MC_ELEM_F32};
      int ns = mc_rs_primaries(src, f, (mc_state)st, tmp);
      if (ns < 0) goto fail;
      for (int i = 0; i < ns; i++) {
        MC_RS_PUSH(out->src, out->n_src, cap_s, tmp[i]);
        src_writer[tmp[i].rank] = 1;
        out->bytes += mc_box_numel(&tmp[i].slab) * 4;
      }
      t.n_src = ns;
      int nt = mc_rs_primaries(dst, f, (mc_state)st, tmp);
      if (nt < 0) goto fail;
      for (int i = 0; i < nt; i++) {
        mc_rs_target tg = {.tensor = out->n_tensors, .shard = tmp[i], .first_piece = out->n_pieces};
        int64_t covered = 0;
        for (int s = t.first_src; s < t.first_src + ns; s++) {
          mc_rs_piece pc = {.src = s};
          int64_t n = mc_box_intersect(&out->src[s].slab, &tmp[i].slab, &pc.slab);
          if (n == 0) continue;
          covered += n;
          MC_RS_PUSH(out->pieces, out->n_pieces, cap_p, pc);
        }
        tg.n_pieces = out->n_pieces - tg.first_piece;
        if (covered != mc_box_numel(&tmp[i].slab)) {
          char sb[128];
          mc_box_format(&tmp[i].slab, sb, sizeof sb);
          mc_error("reshard plan: %s/%s target shard %s of rank %d is covered by %lld of %lld elements "
                   "of the source primaries (source ownership does not tile the family)",
                   src->fams.f[f].name, mc_state_name((mc_state)st), sb, tmp[i].rank,
                   (long long)covered, (long long)mc_box_numel(&tmp[i].slab));
          goto fail;
        }
        dst_writer[tmp[i].rank] = 1;
        MC_RS_PUSH(out->targets, out->n_targets, cap_g, tg);
      }
      t.n_tgt = nt;
      MC_RS_PUSH(out->tensors, out->n_tensors, cap_t, t);
    }
  }
  for (int r = 0; r < src->world; r++) out->n_src_writers += src_writer[r];
  for (int r = 0; r < dst->world; r++) out->n_dst_writers += dst_writer[r];
  free(tmp);
  free(src_writer);
  free(dst_writer);
  return 0;
oom:
  mc_error("reshard plan: out of memory");
fail:
  free(tmp);
  free(src_writer);
  free(dst_writer);
  mc_rs_plan_free(out);
  return -1;
}

void mc_rs_plan_free(mc_rs_plan *p) {
  free(p->tensors);
  free(p->src);
  free(p->targets);
  free(p->pieces);
  memset(p, 0, sizeof *p);
}
