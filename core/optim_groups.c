#define _POSIX_C_SOURCE 200809L /* strtok_r, fnmatch */
#include "core/optim_groups.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "util/error.h"

static const char *const OPT_NAMES[MC_N_OPTS] = {"adamw", "muon"};

static const mc_state_decl ADAMW_STATES[] = {
    {MC_STATE_EXP_AVG, "float32", "param", "param"},
    {MC_STATE_EXP_AVG_SQ, "float32", "param", "param"},
    {MC_STATE_STEP, "int64", "scalar", "replicated"},
};
static const mc_state_decl MUON_STATES[] = {
    {MC_STATE_MOMENTUM, "float32", "param", "param"},
};

const char *mc_opt_name(int kind) { return kind >= 0 && kind < MC_N_OPTS ? OPT_NAMES[kind] : "?"; }

int mc_opt_parse(const char *name) {
  for (int k = 0; k < MC_N_OPTS; k++)
    if (!strcmp(name, OPT_NAMES[k])) return k;
  return -1;
}

const mc_state_decl *mc_opt_states(int kind, int *n) {
  switch (kind) {
    case MC_OPT_ADAMW:
      *n = (int)(sizeof ADAMW_STATES / sizeof *ADAMW_STATES);
      return ADAMW_STATES;
    case MC_OPT_MUON:
      *n = (int)(sizeof MUON_STATES / sizeof *MUON_STATES);
      return MUON_STATES;
    default:
      *n = 0;
      return NULL;
  }
}

const mc_state_decl *mc_opt_state_decl(int kind, mc_state s) {
  int n;
  const mc_state_decl *d = mc_opt_states(kind, &n);
  for (int i = 0; i < n; i++)
    if (d[i].state == s) return &d[i];
  return NULL;
}

int mc_opt_state_dtype(int kind, mc_state s) {
  if (s == MC_STATE_PARAM) return MC_ELEM_F32;
  const mc_state_decl *d = mc_opt_state_decl(kind, s);
  return d ? mc_elem_dtype_parse(d->dtype) : -1;
}

unsigned mc_opt_state_mask(int kind) {
  int n;
  const mc_state_decl *d = mc_opt_states(kind, &n);
  unsigned m = 1u << MC_STATE_PARAM;
  for (int i = 0; i < n; i++) m |= 1u << d[i].state;
  return m;
}

int mc_opt_has_state(int kind, mc_state s) {
  return (int)s >= 0 && s < MC_N_STATES && (mc_opt_state_mask(kind) >> s & 1u);
}

int mc_family_has_state(const mc_family *f, mc_state s) { return mc_opt_has_state(f->opt, s); }

/* ------------------------------------------------------------------ optim.groups */

static int selector_matches(const char *sel, const mc_family *f) {
  if (!strcmp(sel, "all")) return 1;
  if (!strcmp(sel, "matrices")) return f->ndim == 2 && mc_role_is_matmul(f->role) && f->role != MC_ROLE_HEAD;
  if (!strcmp(sel, "experts")) return f->ndim == 3;
  if (!strcmp(sel, "vectors")) return f->ndim == 1;
  if (!strcmp(sel, "embed")) return f->role == MC_ROLE_EMBED;
  if (!strcmp(sel, "head")) return f->role == MC_ROLE_HEAD;
  if (!strcmp(sel, "router")) return f->role == MC_ROLE_MOE_ROUTER;
  return fnmatch(sel, f->name, 0) == 0;
}

#define RULE_MAX 128
typedef struct {
  int opt;
  char sel[RULE_MAX];
} rule;

/* Splits "opt:sel,opt:sel" into rules (whitespace around either part ignored). */
static int parse_rules(const char *groups, rule **out, int *n_out) {
  *out = NULL, *n_out = 0;
  size_t len = strlen(groups);
  char *buf = malloc(len + 1);
  rule *r = calloc(len / 2 + 1, sizeof *r); /* each rule takes at least "a:b," */
  if (!buf || !r) {
    free(buf), free(r);
    return mc_error("optim.groups: out of memory");
  }
  memcpy(buf, groups, len + 1);
  int n = 0, rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    char *colon = strchr(tok, ':');
    if (!colon) {
      rc = mc_error("optim.groups: rule '%s' is not OPTIMIZER:SELECTOR (e.g. muon:matrices)", tok);
      break;
    }
    *colon = 0;
    char *sel = colon + 1, *end = colon;
    while (end > tok && end[-1] == ' ') *--end = 0;
    while (*sel == ' ') sel++;
    for (end = sel + strlen(sel); end > sel && end[-1] == ' ';) *--end = 0;
    int opt = mc_opt_parse(tok);
    if (opt < 0) rc = mc_error("optim.groups: unknown optimizer '%s' (adamw or muon)", tok);
    else if (!*sel) rc = mc_error("optim.groups: rule '%s:' has no selector", tok);
    else if (strlen(sel) >= RULE_MAX) rc = mc_error("optim.groups: selector '%.40s...' longer than %d characters", sel, RULE_MAX - 1);
    else {
      r[n].opt = opt;
      snprintf(r[n].sel, RULE_MAX, "%s", sel);
      n++;
    }
  }
  if (rc == 0 && n == 0) rc = mc_error("optim.groups: no rule (e.g. adamw:all)");
  free(buf);
  if (rc) {
    free(r);
    return -1;
  }
  *out = r, *n_out = n;
  return 0;
}

int mc_optim_groups_check(const char *groups) {
  rule *r;
  int n;
  if (parse_rules(groups, &r, &n) != 0) return -1;
  free(r);
  return 0;
}

int mc_optim_groups_assign(const char *groups, mc_family_set *fams) {
  rule *r;
  int n;
  if (parse_rules(groups, &r, &n) != 0) return -1;
  int *opt = malloc(sizeof *opt * (size_t)(fams->n > 0 ? fams->n : 1));
  int rc = opt ? 0 : mc_error("optim.groups: out of memory");
  for (int f = 0; f < fams->n && rc == 0; f++) {
    const mc_family *fa = &fams->f[f];
    int k = 0;
    while (k < n && !selector_matches(r[k].sel, fa)) k++;
    if (k == n) rc = mc_error("optim.groups '%s': no rule matches family %s (end with adamw:all)", groups, fa->name);
    else if (r[k].opt == MC_OPT_MUON && fa->ndim != 2)
      rc = mc_error("optim.groups: rule muon:%s matches family %s, which is %d-D: Muon takes 2-D matrices only", r[k].sel,
                    fa->name, fa->ndim);
    else opt[f] = r[k].opt;
  }
  for (int f = 0; f < fams->n && rc == 0; f++) fams->f[f].opt = opt[f];
  free(opt), free(r);
  return rc;
}
