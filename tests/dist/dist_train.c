/* Training steps under a parallel layout against the single-rank run (mpirun -np tp*dp*pp).
 *
 *   dist_train TP DP SP ZERO [options]       steps 1..10 under the layout; rank 0 also runs the
 *                                            single-rank oracle. Every step's loss must match
 *                                            to 1e-4 relative, and the final master weights
 *                                            (and working weights) match within PTOL.
 *   dist_train TP DP SP ZERO --save DIR      steps 1..5, checkpoint of step 5 in DIR, steps
 *                                            6..10; writes DIR/losses.txt (steps 6..10).
 *   dist_train TP DP SP ZERO --resume DIR    loads DIR (any layout wrote it) twice: each rank
 *                                            reading its own boxes, and shared (each needed
 *                                            stored byte read once in the job, handed over in
 *                                            rounds of --round-bytes, default 1000); the
 *                                            states must be bitwise equal, the shared load
 *                                            must read (and hash) exactly the stored bytes
 *                                            some rank needs, each once, within the round
 *                                            bound, and with --replicas F the per-rank load
 *                                            F times that.
 *                                            Both run steps 6..10 on the same data: losses
 *                                            bitwise equal, and within 1e-4 relative of
 *                                            DIR/losses.txt.
 *   dist_train TP DP SP ZERO --late-reduce   steps 1..10 under the layout (pp = 1) twice:
 *                                            every gradient reduced after the step's
 *                                            backward, and each layer's reduced as its
 *                                            backward ends in the last micro-batch (what
 *                                            the trainer does; every other mode runs so):
 *                                            every step's loss and gradient norm and the
 *                                            final master weights bitwise equal, and the
 *                                            dist.staging arena equal to mcplan's figure.
 *   dist_train TP DP SP ZERO --recompute P   steps 1..10 under the layout twice, with
 *                                            train.recompute=none and =P (selective, full;
 *                                            the working set poisoned before every rebuild):
 *                                            every step's loss and gradient norm and the
 *                                            final master weights bitwise equal, and each
 *                                            rank's activations and moe.scratch arenas equal
 *                                            to mcplan's figures for P (activations below
 *                                            none's; under full and ep > 1, moe.scratch too).
 *   dist_train TP DP SP ZERO --corrupt --resume DIR   rank 0 first flips a bit of a shard of
 *                                            DIR (a copy; the largest shard, or with
 *                                            --corrupt-last the last float32 one listed);
 *                                            the shared load must fail on every rank with one
 *                                            message naming the rank, the file and the dataset.
 * Options (before --save/--resume): --ep N expert parallelism; --moe E K CF the E blocks'
 * experts, top-k and capacity factor (default 4 2 0); --mb N the micro-batch (default 2);
 * --empty: some EP rank's expert must receive no row in some micro-batch; with CF > 0 some
 * assignment must be dropped (the capacity path ran); --pp N pipeline stages, --split S
 * their split (equal, weighted, or a pattern with pipes such as AEMR|AEMR: explicit, and the
 * model's pattern is it without pipes), --pattern P the model's pattern (default AMER), --bf16
 * bf16 weights (train.dtype=bf16) on the CPU's bf16 instance, oracle included. Under
 * pp > 1 a step's micro-batches go through mc_net_pipeline_step (1F1B, train/pipeline.h).
 * The step is the documented sequence of train/dist.h: micro-batches, mc_dist_sync_grads,
 * mc_dist_grad_norm, clipping, mc_dist_update; samples follow mc_data_first_sample. */
#define _POSIX_C_SOURCE 200809L /* pread, pwrite (tests/dist/loadcheck.h) */
#include <mpi.h>
#include <pthread.h>

#include "core/dtype.h"
#include "tests/dist/distcheck.h"
#include "tests/dist/loadcheck.h"
#include "train/data.h"
#include "train/pipeline.h"

#define STEPS 10
#define SAVE_AT 5
#define LTOL 1e-4
/* Final weights: max |w - w_1| <= PTOL. AdamW moves each weight by about lr per step
 * whatever the gradient's size, so this bounds the drift of 10 steps at lr 3e-3 (0.03) by
 * a factor 300 below it; the runs differ only by summation order. */
#define PTOL 1e-4
/* The backend of every network: the CPU, or with --bf16 its bf16 instance (train.dtype=bf16). */
static mc_backend *BE;

static char PATTERN[MC_MAX_LAYERS + 1] = "AMER";

typedef struct {
  mc_model m;
  mc_train_cfg t;
  mc_config cfg;
} setup;

/* What the EP tests saw: micro-batches in which some local expert of this rank received no
 * row, and dropped assignments. */
static int64_t g_empty, g_dropped;

/* Whether a step's last micro-batch reduces each layer's gradients as its backward ends
 * (mc_net_reduce_in_backward, as the trainer does; pp <= 1 here, the pipeline sets it
 * itself): 0 only for the reference run of --late-reduce. */
static int g_early = 1;

static void make_setup(setup *s, int E, int k, double cf, int mb) {
  mc_config_default(&s->cfg);
  s->m = dc_model(PATTERN);
  s->m.n_experts = E, s->m.top_k = k, s->m.capacity_factor = cf;
  s->t = s->cfg.train;
  s->t.steps = STEPS, s->t.global_batch = 8, s->t.micro_batch = mb;
  s->t.lr = 3e-3, s->t.min_lr = 3e-4, s->t.warmup_steps = 2;
  s->t.grad_clip = 1.0, s->t.weight_decay = 0.1;
  s->cfg.model = s->m;
  s->cfg.train = s->t;
}

/* Steps [s0, s1): losses[s] = mean token cross-entropy of the global batch of step s,
 * losses[STEPS + s] = its gradient norm before clipping. AdamW is nearly invariant to a
 * uniform gradient scale, so a wrong clipping norm would hide in the losses: it is
 * compared on its own. */
static int run_steps(const setup *S, mc_net *net, mc_dist_opt *d, const mc_layout *l, int rank, int64_t s0,
                     int64_t s1, double *losses) {
  const mc_train_cfg *t = &S->t;
  const int T = S->m.seq_len, G = t->global_batch, mb = t->micro_batch;
  mc_coords c;
  mc_layout_coords(l, rank, &c);
  const int n_micro = G / l->dp / mb;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_micro * mb * (T + 1));
  for (int64_t s = s0; s < s1; s++) {
    mc_net_zero_grad(net);
    mc_net_stats tot;
    memset(&tot, 0, sizeof tot);
    if (l->pp > 1) { /* the step's micro-batches through the stages, 1F1B */
      for (int mi = 0; mi < n_micro; mi++)
        dc_samples(&S->m, mc_data_first_sample(s, G, l->dp, c.dp_rank, mb, mi), mb, tok + (int64_t)mi * mb * (T + 1));
      if (mc_net_pipeline_step(net, tok, n_micro, mb, 1.0 / ((double)G * T), 1.0 / G, &tot)) goto fail;
      g_dropped += tot.dropped;
      /* ep > 1: each micro-batch slot in flight keeps its own EP routes (the last micro-batch
       * each slot ran); distinct slots never share one */
      const int ns = net->n_slots > 1 ? net->n_slots : 1;
      for (int L = net->L0; net->par.ep > 1 && L < net->L1; L++) {
        if (!net->layers[L].bk->routes) continue;
        for (int k = 0; k < ns; k++) {
          struct mc_ep_route *r = mc_ep_route_of(&net->par, net->n_layers, L, k);
          const int32_t *c = r ? mc_ep_counts(r) : NULL; /* NULL: no forward routed in this slot */
          CHECK(c && (k == 0 || r != mc_ep_route_of(&net->par, net->n_layers, L, 0)), "layer %d slot %d: no EP route of its own", L, k);
          for (int e = 0; c && e < S->m.n_experts / net->par.ep; e++) g_empty += c[e] == 0;
        }
      }
    }
    for (int mi = 0; l->pp <= 1 && mi < n_micro; mi++) {
      dc_samples(&S->m, mc_data_first_sample(s, G, l->dp, c.dp_rank, mb, mi), mb, tok);
      mc_net_stats st;
      mc_net_reduce_in_backward(net, g_early && mi == n_micro - 1);
      const int rc = mc_net_forward_backward(net, tok, mb, 1.0 / ((double)G * T), 1.0 / G, &st);
      mc_net_reduce_in_backward(net, 0);
      if (rc) goto fail;
      g_dropped += st.dropped;
      for (int L = 0; net->par.ep > 1 && L < net->n_layers; L++) {
        if (!net->layers[L].bk->routes) continue;
        struct mc_ep_route *r = mc_ep_route_of(&net->par, net->n_layers, L, 0);
        for (int e = 0; r && e < S->m.n_experts / net->par.ep; e++) g_empty += mc_ep_counts(r)[e] == 0;
      }
      tot.ce_sum += st.ce_sum, tot.aux_sum += st.aux_sum, tot.n_tokens += st.n_tokens, tot.n_seqs += st.n_seqs;
    }
    double norm;
    if (mc_dist_stats_sum(d->comm, &tot) || mc_dist_sync_grads(d) || mc_dist_grad_norm(d, &norm)) goto fail;
    if (mc_dist_update(d, t, mc_lr_at(t, s), mc_clip_scale(norm, t->grad_clip))) goto fail;
    losses[s] = tot.ce_sum / (double)tot.n_tokens;
    losses[STEPS + s] = norm; /* the global gradient norm (every element once) */
    CHECK(tot.n_tokens == (int64_t)G * T, "step %lld scored %lld tokens", (long long)s + 1, (long long)tot.n_tokens);
  }
  free(tok);
  return 0;
fail:
  free(tok);
  return -1;
}

typedef struct {
  mc_geometry geo;
  mc_net *net;
  mc_dist_opt d;
  int ok;
} trainee;

static int trainee_make(trainee *e, const setup *S, const mc_layout *l, int rank, const mc_comm_groups *grp) {
  memset(e, 0, sizeof *e);
  if (mc_geometry_build(&S->m, l, &S->t, grp ? grp->world->size : 1, &e->geo)) return -1;
  e->net = mc_net_create_dist_on(&e->geo, rank, S->t.seed, grp, BE);
  if (!e->net || mc_dist_opt_init(&e->d, e->net, &e->geo, grp, rank)) return -1;
  e->ok = 1;
  return 0;
}

static void trainee_free(trainee *e) {
  if (e->ok) mc_dist_opt_free(&e->d);
  mc_net_free(e->net);
  mc_geometry_free(&e->geo);
}

/* The single-rank oracle on rank 0; its losses and final weights are broadcast. */
static int oracle(const setup *S, int rank, double *losses, float ***weights, mc_family_set *fams) {
  mc_layout l1 = dc_layout(1, 1, 0, 0);
  trainee e;
  int rc = 0;
  if (rank == 0) rc = trainee_make(&e, S, &l1, 0, NULL) || run_steps(S, e.net, &e.d, &l1, 0, 0, STEPS, losses);
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc) {
    if (rank == 0) fprintf(stderr, "oracle: %s\n", mc_errmsg()), trainee_free(&e);
    return -1;
  }
  MPI_Bcast(losses, 2 * STEPS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  mc_families_build(&S->m, 0, fams);
  *weights = calloc((size_t)fams->n, sizeof(float *));
  for (int f = 0; f < fams->n; f++) {
    (*weights)[f] = malloc(sizeof(float) * (size_t)fams->f[f].numel);
    if (rank == 0) {
      const mc_optim_slot *sl = &e.d.opt.slots[mc_optim_slot_of(&e.d.opt, f)];
      memcpy((*weights)[f], sl->master, sizeof(float) * (size_t)fams->f[f].numel);
    }
    MPI_Bcast((*weights)[f], (int)fams->f[f].numel, MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  if (rank == 0) trainee_free(&e);
  return 0;
}

static void compare_losses(const double *got, const double *want, int64_t s0, int64_t s1, int rank) {
  for (int64_t s = s0; s < s1; s++) {
    CHECK(fabs(got[s] - want[s]) <= LTOL * fabs(want[s]), "step %lld: loss %.9g, single-rank %.9g", (long long)s + 1,
          got[s], want[s]);
    const double *gn = got + STEPS, *wn = want + STEPS;
    CHECK(fabs(gn[s] - wn[s]) <= LTOL * fabs(wn[s]), "step %lld: gradient norm %.9g, single-rank %.9g",
          (long long)s + 1, gn[s], wn[s]);
    if (rank == 0)
      printf("  step %2lld  loss %.7f  oracle %.7f  rel %.2e   |g| %.6f  oracle %.6f\n", (long long)s + 1, got[s], want[s],
             fabs(got[s] - want[s]) / fabs(want[s]), gn[s], wn[s]);
  }
}

static void compare_weights(trainee *e, float **ref, int rank, uint64_t seed) {
  double worst = 0.0;
  for (int s = 0; s < e->d.opt.n; s++) {
    const mc_optim_slot *sl = &e->d.opt.slots[s];
    const mc_family *f = &e->geo.fams.f[sl->fam];
    double rmax, diff = 0.0;
    if (sl->numel > 0) diff = dc_slice_diff(sl->master, &sl->shard, sl->shard.start, sl->shard.count, ref[sl->fam], f, &rmax);
    CHECK(diff <= PTOL, "rank %d %s: master weights differ by %.3g", rank, f->name, diff);
    worst = fmax(worst, diff);
  }
  for (int i = 0; i < mc_net_n_params(e->net) && e->net->par.zero != 3; i++) { /* working weights = whole local slices */
    mc_net_param *p = mc_net_param_at(e->net, i);
    if (p->w16) continue; /* bf16: the master rounded (tests/train/test_bf16_weights.c) */
    double rmax, diff = dc_slice_diff(p->w, &p->shard, p->shard.local_start, p->shard.local_count, ref[p->fam],
                                      &e->geo.fams.f[p->fam], &rmax);
    CHECK(diff <= PTOL, "rank %d %s: working weights differ by %.3g", rank, e->geo.fams.f[p->fam].name, diff);
  }
  double all = 0.0;
  MPI_Allreduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  /* the comparison means something only if training moved the weights well beyond PTOL */
  mc_layout l1 = dc_layout(1, 1, 0, 0);
  mc_geometry g1;
  double moved = 0.0;
  if (mc_geometry_build(&e->net->geo.model, &l1, NULL, -1, &g1) == 0) {
    mc_net *init = mc_net_create(&g1, 0, seed);
    for (int i = 0; init && i < mc_net_n_params(init); i++) {
      mc_net_param *p = mc_net_param_at(init, i);
      for (int64_t k = 0; k < p->numel; k++) moved = fmax(moved, fabs((double)p->w[k] - ref[p->fam][k]));
    }
    mc_net_free(init);
    mc_geometry_free(&g1);
  }
  CHECK(moved > 100 * PTOL, "training moved the weights by only %.3g", moved);
  if (rank == 0) printf("  final weights: max |w - w_1| = %.3g (tolerance %g; training moved them by up to %.3g)\n", all, PTOL, moved);
}

/* Run b against run a of the same layout (b_name, a_name say how each ran): every step's
 * loss and gradient norm and the final master weights bitwise equal. */
static void check_same_run(const trainee *a, const trainee *b, const double *la, const double *lb, int rank,
                           const char *b_name, const char *a_name) {
  for (int s = 0; s < STEPS; s++) {
    CHECK(la[s] == lb[s] && la[STEPS + s] == lb[STEPS + s], "step %d: %s loss %.17g, gradient norm %.17g; %s %.17g, %.17g",
          s + 1, b_name, lb[s], lb[STEPS + s], a_name, la[s], la[STEPS + s]);
    if (rank == 0) printf("  step %2d  loss %.9f  |g| %.9f  (%s: %.9f, %.9f)\n", s + 1, lb[s], lb[STEPS + s], a_name, la[s], la[STEPS + s]);
  }
  int differ = 0;
  for (int i = 0; i < a->d.opt.n; i++) {
    const mc_optim_slot *x = &a->d.opt.slots[i], *y = &b->d.opt.slots[i];
    if (x->numel && memcmp(x->master, y->master, sizeof(float) * (size_t)x->numel)) differ++;
  }
  CHECK(differ == 0, "rank %d: %d master weight tensors differ", rank, differ);
}

/* --late-reduce: the same layout with every gradient reduced after the backward (a) and with
 * each layer's reduced as its backward ends in the last micro-batch (b): losses, gradient
 * norms and final master weights bitwise equal (the same sums per element; for groups of
 * two members whatever the collective's algorithm). */
static void compare_late_reduce(setup *S, const mc_layout *l, int rank, const mc_comm_groups *grp) {
  trainee a, b;
  const int ok = trainee_make(&a, S, l, rank, grp) == 0 && trainee_make(&b, S, l, rank, grp) == 0;
  CHECK(ok, "rank %d: %s", rank, mc_errmsg());
  double la[2 * STEPS], lb[2 * STEPS];
  memset(la, 0, sizeof la);
  memset(lb, 0, sizeof lb);
  if (ok) {
    g_early = 0;
    CHECK_OK(run_steps(S, a.net, &a.d, l, rank, 0, STEPS, la));
    g_early = 1;
    CHECK_OK(run_steps(S, b.net, &b.d, l, rank, 0, STEPS, lb));
    check_same_run(&a, &b, la, lb, rank, "reduced during the backward:", "after the backward");
    /* the early path ran (every set of every step) in b only */
    const int64_t sets = (int64_t)STEPS * (b.net->n_layers + 2);
    CHECK(a.net->par.n_set_reduce == 0 && b.net->par.n_set_reduce == sets,
          "rank %d: %lld and %lld sets reduced during the backward, want 0 and %lld", rank,
          (long long)a.net->par.n_set_reduce, (long long)b.net->par.n_set_reduce, (long long)sets);
    /* the dist.staging arena holds the largest set's packs (mcplan's figure) */
    int64_t have[MC_MEM_COUNT] = {0}, plan[MC_MEM_COUNT] = {0};
    mc_hold_opts o;
    mc_net_mem_bytes(b.net, have);
    CHECK_OK(mc_hold_opts_of(&b.geo, &S->t, &o) || mc_holdings_of(&b.geo, rank, &o, plan));
    CHECK(have[MC_MEM_DIST_STAGING] == plan[MC_MEM_DIST_STAGING], "rank %d: dist.staging %lld bytes, mcplan %lld", rank,
          (long long)have[MC_MEM_DIST_STAGING], (long long)plan[MC_MEM_DIST_STAGING]);
    if (rank == 0)
      printf("  reduced during the last backward: losses, gradient norms and final master weights bitwise equal "
             "(dist.staging %lld bytes = mcplan)\n", (long long)have[MC_MEM_DIST_STAGING]);
  }
  trainee_free(&b);
  trainee_free(&a);
}

/* --recompute: the same layout under none (a) and policy r (b), bitwise. */
static void compare_recompute(setup *S, const mc_layout *l, int rank, const mc_comm_groups *grp, mc_recompute r) {
  trainee a, b;
  const int ok = trainee_make(&a, S, l, rank, grp) == 0 && trainee_make(&b, S, l, rank, grp) == 0 &&
                 mc_net_set_recompute(b.net, r) == 0;
  CHECK(ok, "rank %d: %s", rank, mc_errmsg());
  double la[2 * STEPS], lb[2 * STEPS];
  memset(la, 0, sizeof la);
  memset(lb, 0, sizeof lb);
  if (ok) {
    CHECK_OK(run_steps(S, a.net, &a.d, l, rank, 0, STEPS, la));
    CHECK_OK(run_steps(S, b.net, &b.d, l, rank, 0, STEPS, lb));
    char name[64];
    snprintf(name, sizeof name, "recompute=%s", mc_recompute_name(r));
    check_same_run(&a, &b, la, lb, rank, name, "none");
    /* the activations and moe.scratch arenas against mcplan's figures for this rank, under each
     * policy: row = none's arena and plan, then the policy's, for activations and moe.scratch */
    int64_t row[8] = {0}, have[MC_MEM_COUNT] = {0}, plan[MC_MEM_COUNT] = {0};
    mc_train_cfg t = S->t;
    mc_hold_opts o;
    const mc_mem_cat cats[2] = {MC_MEM_ACTIVATIONS, MC_MEM_MOE_SCRATCH};
    for (int pol = 0; pol < 2; pol++) {
      trainee *e = pol ? &b : &a;
      memset(have, 0, sizeof have);
      snprintf(t.recompute, sizeof t.recompute, "%s", mc_recompute_name(pol ? r : MC_RECOMPUTE_NONE));
      mc_net_mem_bytes(e->net, have);
      CHECK_OK(mc_hold_opts_of(&e->geo, &t, &o) || mc_holdings_of(&e->geo, rank, &o, plan));
      for (int c = 0; c < 2; c++) row[4 * c + 2 * pol] = have[cats[c]], row[4 * c + 2 * pol + 1] = plan[cats[c]];
    }
    for (int c = 0; c < 2; c++) {
      const int64_t *x = row + 4 * c;
      CHECK(x[0] == x[1] && x[2] == x[3], "rank %d %s: none %lld bytes (mcplan %lld), %s %lld (mcplan %lld)", rank,
            mc_mem_cat_label(cats[c]), (long long)x[0], (long long)x[1], mc_recompute_name(r), (long long)x[2], (long long)x[3]);
    }
    /* less activation memory; under full one set of EP rows for all E layers and slots (fewer
     * bytes where a stage has more than one E layer or micro-batch in flight) */
    CHECK(row[2] < row[0], "rank %d: %s keeps %lld activation bytes, none %lld", rank, mc_recompute_name(r), (long long)row[2],
          (long long)row[0]);
    CHECK(row[6] <= row[4], "rank %d: %s keeps %lld bytes of moe.scratch, none %lld", rank, mc_recompute_name(r),
          (long long)row[6], (long long)row[4]);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int64_t *all = malloc(sizeof row * (size_t)world);
    MPI_Gather(row, 8, MPI_INT64_T, all, 8, MPI_INT64_T, 0, MPI_COMM_WORLD);
    for (int k = 0; rank == 0 && k < world; k++)
      for (int c = 0; c < 2; c++) {
        const int64_t *x = all + 8 * k + 4 * c;
        if (x[1] || x[3])
          printf("  rank %d %s: none %lld bytes (mcplan %lld), %s %lld (mcplan %lld)\n", k, mc_mem_cat_label(cats[c]),
                 (long long)x[0], (long long)x[1], mc_recompute_name(r), (long long)x[2], (long long)x[3]);
      }
    free(all);
    if (rank == 0) printf("  recompute=%s: losses, gradient norms and final master weights bitwise equal to none\n", mc_recompute_name(r));
  }
  trainee_free(&b);
  trainee_free(&a);
}

/* Expert parallelism: every rank's moe.scratch arena (the exchange buffers, train/dist_ep.c)
 * must be exactly what mcplan's holdings plan for that rank (core/holdings.c), and the rows
 * any exchange moved at most the bound the arena is sized for (else the run would have failed
 * naming the layer). Rank 0 prints each rank's figures. */
static void compare_moe_scratch(const setup *S, trainee *e, int rank, int world) {
  mc_hold_opts o;
  int64_t plan[MC_MEM_COUNT] = {0}, have[MC_MEM_COUNT] = {0}, row[6] = {0};
  CHECK_OK(mc_hold_opts_of(&e->geo, &S->t, &o));
  CHECK_OK(mc_holdings_of(&e->geo, rank, &o, plan));
  mc_net_mem_bytes(e->net, have);
  row[0] = have[MC_MEM_MOE_SCRATCH], row[1] = plan[MC_MEM_MOE_SCRATCH];
  mc_net_moe_rows(e->net, &row[2], &row[3], &row[4]);
  row[5] = e->net->stage;
  CHECK(row[0] == row[1], "rank %d: moe.scratch arena %lld bytes, mcplan %lld", rank, (long long)row[0], (long long)row[1]);
  CHECK(row[4] <= row[2], "rank %d: an exchange moved %lld rows, the arena holds %lld", rank, (long long)row[4],
        (long long)row[2]);
  int64_t *all = malloc(sizeof row * (size_t)world);
  MPI_Gather(row, 6, MPI_INT64_T, all, 6, MPI_INT64_T, 0, MPI_COMM_WORLD);
  int any = 0;
  for (int r = 0; rank == 0 && r < world; r++) {
    const int64_t *x = all + 6 * r;
    any |= x[1] > 0;
    printf("  rank %d (stage %lld): moe.scratch measured %lld bytes, planned %lld; rows per exchange reserved %lld, "
           "balanced %lld, most moved %lld\n", r, (long long)x[5], (long long)x[0], (long long)x[1], (long long)x[2],
           (long long)x[3], (long long)x[4]);
  }
  CHECK(rank != 0 || any, "no rank holds moe.scratch under ep=%d", e->geo.layout.ep);
  free(all);
}

static int save_ckpt(const setup *S, trainee *e, const mc_comm_groups *grp, const char *dir, int64_t step) {
  mc_train_state st;
  memset(&st, 0, sizeof st);
  st.step = step, st.schedule_step = step, st.adam_step = e->d.opt.step;
  st.tokens_seen = step * S->t.global_batch * S->m.seq_len;
  st.lr = mc_lr_at(&S->t, step - 1);
  st.lr_max = S->t.lr, st.lr_min = S->t.min_lr, st.warmup_steps = S->t.warmup_steps, st.total_steps = S->t.steps;
  st.beta1 = S->t.beta1, st.beta2 = S->t.beta2, st.adam_eps = S->t.adam_eps;
  st.weight_decay = S->t.weight_decay, st.grad_clip = S->t.grad_clip;
  st.seed = S->t.seed, st.data_position = step * S->t.global_batch;
  mc_ckpt_item *items = malloc(sizeof *items * (size_t)(MC_N_STATES * e->d.opt.n + 1));
  int n = mc_dist_ckpt_items(&e->d, items);
  mc_ckpt_save_opts so;
  mc_ckpt_save_opts_default(&so);
  so.root = grp->world->rank == 0;
  so.barrier = mc_dist_ckpt_barrier;
  so.barrier_user = grp->world;
  mc_config cfg = S->cfg;
  cfg.parallel = e->geo.layout;
  int rc = mc_ckpt_save(dir, &e->geo, &cfg, &st, items, n, &so);
  free(items);
  return rc;
}

/* mc_load_opts.done: how often each request was reported complete (from the reading threads
 * in a per-rank load, hence the lock). */
typedef struct {
  pthread_mutex_t mu;
  int calls[4096], n_calls, bad;
} done_log;

static void log_done(void *user, int i) {
  done_log *l = user;
  pthread_mutex_lock(&l->mu);
  if (i < 0 || i >= 4096) l->bad++;
  else l->calls[i]++;
  l->n_calls++;
  pthread_mutex_unlock(&l->mu);
}

/* Every request of the load (0 .. its count - 1) reported exactly once. */
static void check_done_log(const done_log *l, int n_requests, const char *load, int rank) {
  int once = 0;
  for (int i = 0; i < 4096; i++) once += l->calls[i] == 1 && i < n_requests;
  CHECK(l->bad == 0 && l->n_calls == n_requests && once == n_requests,
        "rank %d: %s load reported %d completions for %d requests (%d exactly once, %d out of range)", rank, load,
        l->n_calls, n_requests, once, l->bad);
}

/* This rank's requests in a load of mc_dist_load: one per state kind of each slot it holds. */
static int dist_requests(const mc_dist_opt *d) {
  int n = 0;
  for (int s = 0; s < d->opt.n; s++)
    for (int k = 0; k < MC_N_STATES && d->opt.slots[s].numel > 0; k++) n += mc_optim_state(&d->opt.slots[s], (mc_state)k) != NULL;
  return n;
}

/* Loads the checkpoint at `dir` into a (each rank reading its own boxes) and b (shared load,
 * rounds of round_bytes, the next round read during each exchange, copies in tasks of 256
 * bytes) through two handles, so
 * each load reads and hashes for itself; checks the states bitwise and the bytes read; then
 * the shared load with serial rounds into a through a third handle, bitwise equal again. */
static int load_both(const setup *S, trainee *a, trainee *b, const char *dir, int64_t round_bytes, int replicas, int rank) {
  mc_ckpt *ka = NULL, *kb = NULL;
  mc_train_state st;
  int rc = mc_ckpt_open(dir, NULL, &ka) || mc_ckpt_open(dir, NULL, &kb) || mc_ckpt_check_model(kb, &S->m) ||
           mc_ckpt_train_state(kb, &st);
  CHECK(rc == 0, "rank %d: opening %s: %s", rank, dir, mc_errmsg());
  CHECK(rc || st.step == SAVE_AT, "checkpoint at step %lld", (long long)st.step);
  mc_load_opts oa, ob;
  mc_load_opts_default(&oa);
  mc_load_opts_default(&ob);
  oa.per_rank = 1, ob.round_bytes = round_bytes;
  ob.copy_bytes = 256; /* a few rows per copy task: the bands are cut and copied on several threads */
  static done_log la = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0}, lb = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0};
  memset(la.calls, 0, sizeof la.calls), memset(lb.calls, 0, sizeof lb.calls);
  la.n_calls = la.bad = lb.n_calls = lb.bad = 0;
  oa.done = ob.done = log_done, oa.done_user = &la, ob.done_user = &lb;
  mc_load_stats sa, sb;
  if (rc == 0) rc = mc_dist_load(&a->d, ka, &oa, &sa) || mc_dist_load(&b->d, kb, &ob, &sb);
  CHECK(rc == 0, "rank %d: loading %s: %s", rank, dir, mc_errmsg());
  if (rc == 0) {
    check_done_log(&la, dist_requests(&a->d), "per-rank", rank);
    check_done_log(&lb, dist_requests(&b->d), "shared", rank);
  }
  if (rc == 0) {
    a->d.opt.step = b->d.opt.step = st.adam_step;
    const int diff = lc_state_diff(&a->d, &b->d);
    CHECK(diff == 0, "rank %d: %d tensors differ between the per-rank and the shared load", rank, diff);
    const int64_t need = lc_needed_bytes(kb, &b->geo);
    CHECK(sb.total_read == need && sb.total_hashed == need && sb.needed == need,
          "shared load: read %lld and hashed %lld bytes in all (plan: %lld); the needed shards hold %lld", (long long)sb.total_read,
          (long long)sb.total_hashed, (long long)sb.needed, (long long)need);
    /* verify before parsing, shared: every piece of the files read hashed once in the job */
    const int64_t files = lc_needed_bytes_of(kb, &b->geo, 1);
    CHECK(sb.total_checked == files && sa.total_checked >= files,
          "shared load: hashed %lld bytes of rank files against their pieces in all (each rank reading its own: %lld); "
          "the files it reads hold %lld", (long long)sb.total_checked, (long long)sa.total_checked, (long long)files);
    CHECK(sa.total_read == sa.per_rank_read && sb.per_rank_read == sa.total_read,
          "per-rank load: read %lld bytes in all, predicted %lld (shared load's figure %lld)", (long long)sa.total_read,
          (long long)sa.per_rank_read, (long long)sb.per_rank_read);
    /* the round bound (train/load_shared.h; two rounds of shards while the next is read
     * meanwhile); no row of the test model exceeds 1000 bytes */
    const int64_t hold_cap = round_bytes > sb.largest_shard ? round_bytes : sb.largest_shard;
    CHECK(sb.peak_exchange <= round_bytes && sb.peak_held <= 2 * hold_cap,
          "rank %d: a round held %lld bytes of exchange buffers and %lld of shards (bounds %lld, 2 x %lld)", rank,
          (long long)sb.peak_exchange, (long long)sb.peak_held, (long long)round_bytes, (long long)hold_cap);
    mc_ckpt *kc = NULL;
    mc_load_opts oc = ob;
    oc.serial = 1;
    mc_load_stats sc;
    lc_state_poison(&a->d);
    const int rc_c = mc_ckpt_open(dir, NULL, &kc) || mc_dist_load(&a->d, kc, &oc, &sc);
    CHECK(rc_c == 0, "rank %d: serial shared load of %s: %s", rank, dir, mc_errmsg());
    const int diff_c = rc_c ? -1 : lc_state_diff(&a->d, &b->d);
    CHECK(diff_c == 0, "rank %d: %d tensors differ between the serial and the overlapped shared load", rank, diff_c);
    CHECK(rc_c || (sc.total_read == need && sc.rounds == sb.rounds && sc.peak_held <= hold_cap &&
                   sc.peak_held <= sb.peak_held),
          "rank %d: serial shared load: read %lld bytes (%lld needed) in %d rounds (overlapped: %d), held %lld bytes of "
          "shards (bound %lld; overlapped %lld)", rank, (long long)sc.total_read, (long long)need, sc.rounds, sb.rounds,
          (long long)sc.peak_held, (long long)hold_cap, (long long)sb.peak_held);
    mc_ckpt_close(kc);
    CHECK(replicas <= 0 || sa.total_read == replicas * need, "per-rank load read %lld bytes, not %d x %lld",
          (long long)sa.total_read, replicas, (long long)need);
    if (rank == 0)
      printf("  load: each rank reading its own boxes read %lld bytes in all (%.2f x the %lld needed); the shared load "
             "read %lld and hashed %lld (%d rounds of at most %lld bytes; rank 0's largest: %lld exchanged, %lld of "
             "shards held); rank files checked against their pieces: %lld bytes in all by the shared load, %lld by the "
             "per-rank one (the files: %lld); states bitwise equal\n",
             (long long)sa.total_read, need ? (double)sa.total_read / (double)need : 0.0, (long long)need,
             (long long)sb.total_read, (long long)sb.total_hashed, sb.rounds, (long long)round_bytes,
             (long long)sb.peak_exchange, (long long)sb.peak_held, (long long)sb.total_checked, (long long)sa.total_checked,
             (long long)files);
  }
  mc_ckpt_close(ka);
  mc_ckpt_close(kb);
  return rc;
}

/* --corrupt: rank 0 flips a bit of the largest stored shard (last = 1: of the last float32 one
 * the manifest lists, read in the last round of a many-round load, so on the thread that reads a
 * round ahead when the files carry no piece digests to catch it first); the shared load, in
 * rounds of round_bytes, must then fail on every rank with the same message, naming the
 * failing rank, the file and the dataset. */
static void load_corrupt(trainee *e, const char *dir, int rank, int64_t round_bytes, int last) {
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return;
  int big = 0;
  for (int i = 1; i < mc_ckpt_n_shards(ck); i++) {
    const mc_ckpt_shard *c = mc_ckpt_shard_at(ck, i);
    if (last ? c->dtype == MC_ELEM_F32 : c->numel > mc_ckpt_shard_at(ck, big)->numel) big = i;
  }
  const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, big);
  if (rank == 0) CHECK_OK(lc_corrupt_shard(ck, big));
  MPI_Barrier(MPI_COMM_WORLD);
  mc_load_opts o;
  mc_load_opts_default(&o);
  o.round_bytes = round_bytes;
  const int rc = mc_dist_load(&e->d, ck, &o, NULL);
  char msg[MC_ERRMSG_MAX], first[MC_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", mc_errmsg());
  CHECK(rc != 0, "rank %d: the load of a corrupt checkpoint succeeded", rank);
  /* the file's piece digests (verify before parsing) catch the flip before the shard's own hash;
   * a manifest without file hashes reaches the shard's, which names the dataset */
  CHECK(strstr(msg, "rank ") && strstr(msg, "failed") && strstr(msg, "hash mismatch") && strstr(msg, s->file) &&
            (strstr(msg, s->dataset) || strstr(msg, "hash mismatch in piece")),
        "rank %d: the message names not the rank, file %s and the dataset %s or the whole file: %s", rank, s->file,
        s->dataset, msg);
  memcpy(first, msg, sizeof msg);
  MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
  CHECK(strcmp(first, msg) == 0, "rank %d's message differs from rank 0's: %s", rank, msg);
  if (rank == 0) printf("  every rank failed alike: %s\n", msg);
  mc_ckpt_close(ck);
  /* a failure on the last rank alone reaches every rank too, with its message */
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  mc_error("synthetic failure of rank %d", rank);
  char want[64];
  snprintf(want, sizeof want, "rank %d failed: synthetic failure of rank %d", world - 1, world - 1);
  CHECK(mc_load_agree(e->d.comm->world, rank != world - 1) != 0 && strcmp(mc_errmsg(), want) == 0,
        "rank %d: a failure of rank %d alone: '%s', expected '%s'", rank, world - 1, mc_errmsg(), want);
}

int main(int argc, char **argv) {
  mc_comm *world;
  if (mc_comm_mpi_init(&argc, &argv, &world)) return fprintf(stderr, "%s\n", mc_errmsg()), 1;
  if (argc < 5) {
    fprintf(stderr, "usage: dist_train TP DP SP ZERO [--ep N] [--moe E K CF] [--mb N] [--empty] [--pp N] [--split S] "
                    "[--pattern P] [--groups OPTIM_GROUPS] [--bf16] [--late-reduce | --recompute P | --save DIR | [--round-bytes N] [--replicas F] [--corrupt | --corrupt-last] --resume DIR]\n");
    mc_comm_mpi_finalize();
    world->ops->destroy(world);
    return 2;
  }
  mc_layout l = dc_layout(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  const char *save = NULL, *resume = NULL, *recompute = NULL, *groups = NULL;
  int E = 4, k = 2, mb = 2, want_empty = 0, replicas = 0, corrupt = 0, late_reduce = 0;
  int64_t round_bytes = 1000;
  double cf = 0.0;
  for (int a = 5; a < argc; a++) {
    if (!strcmp(argv[a], "--ep") && a + 1 < argc) l.ep = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--moe") && a + 3 < argc) E = atoi(argv[a + 1]), k = atoi(argv[a + 2]), cf = atof(argv[a + 3]), a += 3;
    else if (!strcmp(argv[a], "--mb") && a + 1 < argc) mb = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--empty")) want_empty = 1;
    else if (!strcmp(argv[a], "--save") && a + 1 < argc) save = argv[++a];
    else if (!strcmp(argv[a], "--resume") && a + 1 < argc) resume = argv[++a];
    else if (!strcmp(argv[a], "--round-bytes") && a + 1 < argc) round_bytes = atoll(argv[++a]);
    else if (!strcmp(argv[a], "--replicas") && a + 1 < argc) replicas = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--corrupt")) corrupt = 1;
    else if (!strcmp(argv[a], "--corrupt-last")) corrupt = 2;
    else if (!strcmp(argv[a], "--recompute") && a + 1 < argc) recompute = argv[++a];
    else if (!strcmp(argv[a], "--late-reduce")) late_reduce = 1;
    else if (!strcmp(argv[a], "--groups") && a + 1 < argc) groups = argv[++a];
    else if (!strcmp(argv[a], "--bf16")) BE = mc_backend_cpu_bf16();
    else if (!strcmp(argv[a], "--pp") && a + 1 < argc) l.pp = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--pattern") && a + 1 < argc) snprintf(PATTERN, sizeof PATTERN, "%s", argv[++a]);
    else if (!strcmp(argv[a], "--split") && a + 1 < argc && mc_layout_parse_split(&l, argv[++a])) {
      fprintf(stderr, "%s\n", mc_errmsg());
      mc_comm_mpi_finalize();
      world->ops->destroy(world);
      return 2;
    }
  }
  if (!BE) BE = mc_backend_cpu();
  /* under TP the products' sums split over the ranks and their bf16-rounded outputs then
   * differ from the oracle's by ~1e-4 after a few steps: beyond this harness's 1e-4;
   * mctrain_mpi.sh's equal mode compares bf16 TP layouts with its own band */
  if (BE->bf16_weights && l.tp > 1) {
    fprintf(stderr, "dist_train: --bf16 compares layouts without TP only (tp=%d)\n", l.tp);
    mc_comm_mpi_finalize();
    world->ops->destroy(world);
    return 2;
  }
  if (l.split == MC_SPLIT_EXPLICIT) { /* the model's pattern is the split's without pipes */
    int n = 0;
    for (const char *c = l.split_pattern; *c && n < MC_MAX_LAYERS; c++)
      if (*c != '|') PATTERN[n++] = *c;
    PATTERN[n] = 0;
  }
  mc_comm_groups grp;
  if (mc_comm_make_groups(world, &l, &grp)) {
    fprintf(stderr, "%s\n", mc_errmsg());
    mc_comm_mpi_finalize();
    world->ops->destroy(world);
    return 1;
  }
  int rank = world->rank;
  setup S;
  make_setup(&S, E, k, cf, mb);
  if (groups) { /* optim.groups, e.g. muon:matrices,adamw:all */
    snprintf(S.t.optim.groups, sizeof S.t.optim.groups, "%s", groups);
    S.cfg.train = S.t;
  }
  if (BE->bf16_weights) { /* the run's dtype, so the planner's holdings are the bf16 ones */
    snprintf(S.t.dtype, sizeof S.t.dtype, "bf16");
    S.cfg.train = S.t;
  }
  if (rank == 0)
    printf("layout tp=%d dp=%d sp=%d ep=%d zero=%d pp=%d (split %s%s%s), pattern %s, E=%d k=%d cf=%g, G=%d, micro-batch "
           "%d, optim.groups %s%s%s\n", l.tp, l.dp, l.sp, l.ep, l.zero, l.pp, mc_split_name(l.split), l.split == MC_SPLIT_EXPLICIT ? " " : "",
           l.split == MC_SPLIT_EXPLICIT ? l.split_pattern : "", PATTERN, E, k, cf, S.t.global_batch, S.t.micro_batch,
           S.t.optim.groups, save ? ", save to " : resume ? ", resume from " : "",
           save ? save : resume ? resume : "");
  double losses[2 * STEPS], want[2 * STEPS];
  memset(losses, 0, sizeof losses);
  memset(want, 0, sizeof want);
  trainee e;
  int made = trainee_make(&e, &S, &l, rank, &grp) == 0;
  CHECK(made, "rank %d: %s", rank, mc_errmsg());
  char path[1200];
  if (made && late_reduce) {
    CHECK(l.pp <= 1, "--late-reduce compares layouts without pipeline stages (pp=%d)", l.pp);
    if (l.pp <= 1) compare_late_reduce(&S, &l, rank, &grp);
  } else if (made && recompute) {
    const int r = mc_recompute_parse(recompute);
    CHECK(r > 0, "--recompute %s: selective or full", recompute);
    setenv("MC_RECOMPUTE_POISON", "1", 1);
    if (r > 0) compare_recompute(&S, &l, rank, &grp, (mc_recompute)r);
  } else if (made && !save && !resume) {
    float **ref = NULL;
    mc_family_set fams;
    memset(&fams, 0, sizeof fams);
    if (oracle(&S, rank, want, &ref, &fams) == 0) {
      g_empty = g_dropped = 0;
      CHECK_OK(run_steps(&S, e.net, &e.d, &l, rank, 0, STEPS, losses));
      compare_losses(losses, want, 0, STEPS, rank);
      int64_t seen[2] = {g_empty, g_dropped};
      MPI_Allreduce(MPI_IN_PLACE, seen, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      if (rank == 0 && l.ep > 1)
        printf("  EP: %lld (micro-batch, rank, local expert) exchanges with no row; %lld assignments dropped\n",
               (long long)seen[0], (long long)seen[1]);
      CHECK(!want_empty || seen[0] > 0, "no EP rank's expert ever received no row: the empty-expert path is untested");
      CHECK(cf <= 0 || seen[1] > 0, "capacity factor %g dropped nothing: the capacity path is untested", cf);
      CHECK(want[STEPS] > S.t.grad_clip, "step 1 gradient norm %g does not exceed grad_clip=%g: clipping untested",
            want[STEPS], S.t.grad_clip);
      compare_weights(&e, ref, rank, S.t.seed);
      if (l.ep > 1) compare_moe_scratch(&S, &e, rank, world->size);
      for (int f = 0; f < fams.n; f++) free(ref[f]);
      free(ref);
      mc_families_free(&fams);
    } else {
      CHECK(0, "the single-rank oracle failed");
    }
  } else if (made && save) {
    CHECK_OK(run_steps(&S, e.net, &e.d, &l, rank, 0, SAVE_AT, losses));
    CHECK_OK(save_ckpt(&S, &e, &grp, save, SAVE_AT));
    CHECK_OK(run_steps(&S, e.net, &e.d, &l, rank, SAVE_AT, STEPS, losses));
    snprintf(path, sizeof path, "%s/losses.txt", save);
    FILE *fp = rank == 0 ? fopen(path, "w") : NULL;
    for (int s = SAVE_AT; fp && s < STEPS; s++) fprintf(fp, "%d %.17g %.17g\n", s + 1, losses[s], losses[STEPS + s]);
    if (fp) fclose(fp);
    CHECK(rank != 0 || fp, "cannot write %s", path);
  } else if (made && resume && corrupt) {
    load_corrupt(&e, resume, rank, round_bytes, corrupt == 2);
  } else if (made && resume) {
    trainee e2; /* the shared load's copy; e loads rank by rank */
    const int made2 = trainee_make(&e2, &S, &l, rank, &grp) == 0;
    CHECK(made2, "rank %d: %s", rank, mc_errmsg());
    if (made2 && load_both(&S, &e, &e2, resume, round_bytes, replicas, rank) == 0) {
      snprintf(path, sizeof path, "%s/losses.txt", resume);
      FILE *fp = fopen(path, "r");
      CHECK(fp, "cannot read %s", path);
      int got = 0, sx;
      double v, gv, shared[2 * STEPS];
      while (fp && fscanf(fp, "%d %lf %lf", &sx, &v, &gv) == 3)
        if (sx >= 1 && sx <= STEPS) want[sx - 1] = v, want[STEPS + sx - 1] = gv, got++;
      if (fp) fclose(fp);
      CHECK(got == STEPS - SAVE_AT, "%s holds %d losses", path, got);
      memset(shared, 0, sizeof shared);
      CHECK_OK(run_steps(&S, e.net, &e.d, &l, rank, SAVE_AT, STEPS, losses));
      CHECK_OK(run_steps(&S, e2.net, &e2.d, &l, rank, SAVE_AT, STEPS, shared));
      compare_losses(losses, want, SAVE_AT, STEPS, rank);
      if (l.ep > 1) compare_moe_scratch(&S, &e, rank, world->size);
      for (int s = SAVE_AT; s < STEPS; s++)
        CHECK(losses[s] == shared[s] && losses[STEPS + s] == shared[STEPS + s],
              "step %d after the shared load: loss %.17g, gradient norm %.17g; after the per-rank load %.17g, %.17g", s + 1,
              shared[s], shared[STEPS + s], losses[s], losses[STEPS + s]);
      if (rank == 0) printf("  steps %d-%d after the shared load: losses and gradient norms bitwise equal\n", SAVE_AT + 1, STEPS);
    }
    trainee_free(&e2);
  }
  trainee_free(&e);
  int fails = mc_check_failures, total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  mc_check_failures = total;
  int rc = rank == 0 ? mc_check_exit("dist_train") : (total ? 1 : 0);
  mc_comm_free_groups(&grp);
  mc_comm_mpi_finalize();
  world->ops->destroy(world); /* the wrapper only: MPI_COMM_WORLD is not freed (as in mctrain) */
  return rc;
}
