/* Optimizer groups: which optimizer trains each family and which state kinds that optimizer
 * keeps (docs/training.md, "Optimizer groups"; docs/checkpoint.md records them).
 *
 * Each optimizer declares its state kinds, besides the fp32 master weight every family has
 * (MC_STATE_PARAM): a name (mc_state_name), an element dtype, a shape rule relative to the
 * parameter and a placement rule (the kind fixes both: core/ownership.h, mc_state_is_scalar).
 * A state shaped and placed like the parameter reshards with it; a scalar one is replicated
 * over the ranks holding the parameter (mc_shard_of).
 *   adamw: exp_avg, exp_avg_sq (float32, "param", "param"); step (int64, "scalar",
 *          "replicated": the optimizer steps the family has taken, its bias-correction count t,
 *          as PyTorch's AdamW keeps state["step"])
 *   muon:  momentum (float32, "param", "param")
 *
 * The configuration key optim.groups assigns families to optimizers: a comma-separated list of
 * OPTIMIZER:SELECTOR rules, first match wins, and every family must match one. Selectors:
 *   matrices  2-D weights used only as matrix-product operands (attention, Mamba, recurrence
 *             and dense projections; not the embedding, the head or the MoE router)
 *   experts   3-D expert weights
 *   vectors   1-D families (norms, biases, per-head vectors)
 *   embed, head, router   the embedding, the output head, the MoE routers
 *   all       every family
 *   anything else is a glob on the family name (fnmatch), e.g. layers.0*.attn.*
 * Muon takes 2-D families only (a rule that sends another family to it is refused, naming
 * both). The default "adamw:all" is the AdamW-only run of every earlier version. */
#ifndef MC_CORE_OPTIM_GROUPS_H
#define MC_CORE_OPTIM_GROUPS_H

#include "core/families.h"
#include "core/ownership.h"

typedef enum { MC_OPT_ADAMW = 0, MC_OPT_MUON = 1, MC_N_OPTS = 2 } mc_opt_kind;

const char *mc_opt_name(int kind); /* "adamw", "muon" ("?" if out of range) */
int mc_opt_parse(const char *name); /* -1 if unknown */

/* A declared state kind of an optimizer. */
typedef struct {
  mc_state state;
  const char *dtype;     /* element dtype the optimizer keeps it in: "float32" (a checkpoint may
                          * store it narrower: docs/checkpoint.md, "Element dtypes") or "int64"
                          * (stored as int64, never converted) */
  const char *shape;     /* "param": the parameter's shape; "scalar": one element, shape [1] */
  const char *placement; /* "param": the parameter's hyperslab on every rank; "replicated": whole
                          * on every rank holding part of the parameter (mc_shard_of) */
} mc_state_decl;

/* The state kinds optimizer `kind` declares (not counting param); *n receives how many. */
const mc_state_decl *mc_opt_states(int kind, int *n);
/* Optimizer `kind`'s declaration of state kind s, NULL if it does not declare it (param
 * included: no optimizer declares it). */
const mc_state_decl *mc_opt_state_decl(int kind, mc_state s);
/* The element dtype (mc_elem_dtype, core/dtype.h) optimizer `kind` keeps state kind s in: float32
 * for param, the declared dtype otherwise; -1 for a kind it does not keep. */
int mc_opt_state_dtype(int kind, mc_state s);
/* Bit s set for every state kind a family trained by `kind` has: param and the declared ones. */
unsigned mc_opt_state_mask(int kind);
/* 1 if optimizer `kind` keeps state kind s (param included: every optimizer has it). */
int mc_opt_has_state(int kind, mc_state s);
/* 1 if family f (its optimizer f->opt) has state kind s. */
int mc_family_has_state(const mc_family *f, mc_state s);

/* Assigns every family of `fams` its optimizer (mc_family.opt) from an optim.groups value.
 * Errors (message naming the rule and family): a malformed rule, an unknown optimizer or
 * selector, a family no rule matches, Muon for a family that is not 2-D. On error nothing
 * is changed. */
int mc_optim_groups_assign(const char *groups, mc_family_set *fams);
/* Checks an optim.groups value's syntax (optimizers and rule shape) without a model. */
int mc_optim_groups_check(const char *groups);

#endif
