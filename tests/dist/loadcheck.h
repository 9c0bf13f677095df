/* Helpers of dist_train's resume checks: the shared checkpoint load (train/load_shared.h)
 * against every rank reading its own boxes. The bytes a load must read are computed here from
 * mc_shard_of and the manifest, apart from the loader's own plan. pread and pwrite need
 * _POSIX_C_SOURCE >= 200809L where the includer asks for strict C. */
#ifndef MC_TESTS_LOADCHECK_H
#define MC_TESTS_LOADCHECK_H

#include <fcntl.h>
#include <unistd.h>

#include "ckpt/format.h"
#include "core/box.h"
#include "tests/dist/distcheck.h"

/* need[i] = 1 for each shard i that some rank of g needs (its hyperslab of some state
 * intersects it). -1 if the checkpoint lacks a family. */
static inline int lc_mark_needed(mc_ckpt *ck, const mc_geometry *g, unsigned char *need) {
  const int ns = mc_ckpt_n_shards(ck);
  for (int f = 0; f < g->fams.n; f++) {
    const int cf = mc_ckpt_find_family(ck, g->fams.f[f].name);
    if (cf < 0) return -1;
    for (int k = 0; k < MC_N_STATES; k++)
      for (int r = 0; r < g->world && !mc_state_is_scalar((mc_state)k); r++) { /* step: read apart, 8 bytes */
        mc_shard sh;
        if (mc_shard_of(g, f, (mc_state)k, r, &sh) != 0 || !sh.held) continue;
        const mc_box want = mc_box_make(sh.ndim, sh.start, sh.count);
        for (int i = 0; i < ns; i++) {
          const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
          const mc_box have = mc_box_make(s->ndim, s->start, s->count);
          mc_box part;
          if (s->family_index == cf && (int)s->state == k && mc_box_intersect(&want, &have, &part)) need[i] = 1;
        }
      }
  }
  return 0;
}

/* Stored bytes of the shards that some rank of g needs, each shard counted once (files = 0),
 * or the bytes of the rank files holding them, each file once (files = 1). -1 if the
 * checkpoint lacks a family. */
static inline int64_t lc_needed_bytes_of(mc_ckpt *ck, const mc_geometry *g, int files) {
  const int ns = mc_ckpt_n_shards(ck), nf = mc_ckpt_n_files(ck);
  unsigned char *need = calloc((size_t)ns + 1, 1), *fneed = calloc((size_t)nf + 1, 1);
  int64_t bytes = need && fneed && lc_mark_needed(ck, g, need) == 0 ? 0 : -1;
  for (int i = 0; i < ns && bytes >= 0; i++) {
    if (!need[i]) continue;
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    if (!files) bytes += s->numel * 4;
    for (int f = 0; files && f < nf; f++) {
      mc_ckpt_file_info fi;
      if (mc_ckpt_file_at(ck, f, &fi) == 0 && strcmp(fi.name, s->file) == 0 && !fneed[f]) fneed[f] = 1, bytes += fi.bytes;
    }
  }
  free(need);
  free(fneed);
  return bytes;
}
static inline int64_t lc_needed_bytes(mc_ckpt *ck, const mc_geometry *g) { return lc_needed_bytes_of(ck, g, 0); }

/* Tensors (a slot's state or a parameter's working weights) of two optimizers over the same
 * layout and rank that differ in any bit. */
static inline int lc_state_diff(mc_dist_opt *a, mc_dist_opt *b) {
  int diff = 0;
  for (int s = 0; s < a->opt.n; s++) {
    const mc_optim_slot *x = &a->opt.slots[s], *y = &b->opt.slots[s];
    const size_t bytes = sizeof(float) * (size_t)x->numel;
    for (int k = 0; k < MC_N_STATES; k++) {
      const float *u = mc_optim_state(x, (mc_state)k), *v = mc_optim_state(y, (mc_state)k);
      diff += bytes && (!u != !v || (u && memcmp(u, v, bytes) != 0));
    }
    diff += x->opt == MC_OPT_ADAMW && x->numel && x->step != y->step; /* AdamW's per-family step */
  }
  for (int i = 0; i < mc_net_n_params(a->net); i++) {
    const mc_net_param *p = mc_net_param_at(a->net, i), *q = mc_net_param_at(b->net, i);
    const float *x = p->ws ? p->ws : p->w, *y = q->ws ? q->ws : q->w;
    const size_t n = (size_t)(p->ws ? p->z_numel : p->numel);
    diff += x && y && n && memcmp(x, y, sizeof(float) * n) != 0;
  }
  return diff;
}

/* Overwrites every optimizer state and working-weight shard of a with NaN bit patterns, so a
 * load into it that leaves anything out fails lc_state_diff against a complete one. */
static inline void lc_state_poison(mc_dist_opt *a) {
  for (int s = 0; s < a->opt.n; s++) {
    const mc_optim_slot *x = &a->opt.slots[s];
    for (int k = 0; k < MC_N_STATES; k++) {
      float *u = (float *)mc_optim_state(x, (mc_state)k);
      if (u && x->numel) memset(u, 0xff, sizeof(float) * (size_t)x->numel);
    }
  }
  for (int i = 0; i < mc_net_n_params(a->net); i++) {
    const mc_net_param *p = mc_net_param_at(a->net, i);
    float *x = p->ws ? p->ws : p->w;
    const size_t n = (size_t)(p->ws ? p->z_numel : p->numel);
    if (x && n) memset(x, 0xff, sizeof(float) * n);
  }
}

/* Flips one bit of stored shard i's data (a contiguous dataset) in place; the file keeps its
 * size, so only the hash can tell. */
static inline int lc_corrupt_shard(mc_ckpt *ck, int i) {
  const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", mc_ckpt_step_dir(ck), s->file);
  int64_t fid = -1;
  if (mc_h5_open_read(path, &fid) != 0) return -1;
  const int64_t at = mc_h5_raw_offset(fid, s->dataset);
  mc_h5_close(fid);
  int fd = at >= 0 ? open(path, O_RDWR) : -1;
  unsigned char c = 0;
  int rc = fd >= 0 && pread(fd, &c, 1, at) == 1 ? 0 : -1;
  c ^= 0x10;
  if (rc == 0 && pwrite(fd, &c, 1, at) != 1) rc = -1;
  if (fd >= 0) close(fd);
  return rc == 0 ? 0 : mc_error("%s: cannot flip a byte of %s", path, s->dataset);
}

#endif
