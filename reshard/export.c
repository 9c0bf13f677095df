#define _POSIX_C_SOURCE 200809L
#include "reshard/export.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "ckpt/format.h"
#include "util/paths.h"
#include "reshard/execute.h"
#include "reshard/hf_llama.h"
#include "reshard/plan_print.h"
#include "reshard/safetensors.h"

#define ZERO_HEX "0000000000000000000000000000000000000000000000000000000000000000"

void mc_rs_export_opts_default(mc_rs_export_opts *e) {
  memset(e, 0, sizeof *e);
  e->names = MC_EXPORT_NAMES_AUTO;
  e->max_shard_bytes = 5000000000LL;
}

int64_t mc_rs_parse_size(const char *text) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || !(v > 0)) return mc_error("size %s: expected a positive number with an optional unit (5GB, 500MB, 2GiB)", text);
  static const struct { const char *u; double f; } U[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  char unit[8] = {0};
  size_t n = strlen(end);
  if (n >= sizeof unit) return mc_error("size %s: unknown unit %s (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", text, end);
  for (size_t i = 0; i < n; i++) unit[i] = (char)toupper((unsigned char)end[i]);
  for (size_t i = 0; i < sizeof U / sizeof U[0]; i++)
    if (!strcmp(unit, U[i].u)) {
      double b = v * U[i].f;
      if (b < 1 || b > 9e18) return mc_error("size %s is out of range", text);
      return (int64_t)b;
    }
  return mc_error("size %s: unknown unit %s (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", text, end);
}

static const char *dir_trimmed(const char *path, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", path);
  size_t n = strlen(buf);
  while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
  return buf;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

static int write_text_file(const char *path, const char *text) {
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return mc_error("%s: cannot create: %s", path, strerror(errno));
  size_t n = strlen(text), done = 0;
  while (done < n) {
    ssize_t w = write(fd, text + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int e = errno;
      close(fd);
      return mc_error("%s: write failed: %s", path, strerror(e));
    }
    done += (size_t)w;
  }
  if (fsync(fd) != 0 || close(fd) != 0) return mc_error("%s: fsync/close failed: %s", path, strerror(errno));
  return 0;
}

static char *read_text_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = (n + 4096 + 1) * 2;
      char *b = realloc(buf, cap);
      if (!b) break;
      buf = b;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0) break;
  }
  fclose(f);
  if (buf) buf[n] = 0;
  return buf;
}

/* The world-size-1 geometry of cfg's model with cfg's optimizer groups (a plan needs the same
 * optimizer per family on both sides). */
static int consolidated_geometry(const mc_config *cfg, mc_geometry *g) {
  mc_layout l;
  mc_rs_consolidated_layout(&l);
  if (mc_geometry_of_config(cfg, &l, g) != 0) return mc_error_context("the world-size-1 layout");
  return 0;
}

/* ---------------------------------------------------------------- export */

typedef struct {
  int file, idx;   /* output file and tensor there; file -1: not exported */
  int64_t keep;    /* elements of the family written */
  EVP_MD_CTX *sha; /* over the bytes written */
  char hex[65];
} out_map;

typedef struct {
  int n_files;
  mc_st_file *f;
  out_map *m; /* per plan target */
  int bf16;
} hf_sink;

static int hf_write(void *ctx, const mc_rs_plan *p, int t, int64_t off, int64_t n, const void *data_in) {
  const float *buf = data_in; /* an export's plan keeps fp32 targets (mc_rs_tensor.dtype) */
  hf_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  out_map *om = &s->m[t];
  (void)p;
  if (om->file < 0 || off >= om->keep) return 0;
  if (off + n > om->keep) n = om->keep - off;
  const void *data = buf;
  uint16_t *h = NULL;
  int es = 4;
  if (s->bf16) {
    h = malloc((size_t)(n > 0 ? n : 1) * 2);
    if (!h) return mc_error("export: out of memory");
    for (int64_t i = 0; i < n; i++) h[i] = mc_bf16_of_f32(buf[i]);
    data = h, es = 2;
  }
  int rc = EVP_DigestUpdate(om->sha, data, (size_t)(n * es)) == 1 ? 0 : mc_error("export: SHA-256 failed");
  if (rc == 0) rc = mc_st_pwrite(&s->f[om->file], om->idx, off * es, data, n * es);
  free(h);
  return rc;
}

static int hf_done(void *ctx, const mc_rs_plan *p, int t, const unsigned char sha[32]) {
  hf_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  out_map *om = &s->m[t];
  (void)p, (void)sha;
  if (om->file < 0) return 0;
  unsigned char d[32];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(om->sha, d, &len) != 1) return mc_error("export: SHA-256 failed");
  mc_rs_hex(d, om->hex);
  return 0;
}

/* One output file: which targets it holds, in order. */
typedef struct {
  char name[64];
  int n;
  int *targets;
  int64_t bytes;
  mc_st_meta meta;
} out_file;

static int add_common_meta(mc_st_meta *m, mc_ckpt *ck, const char *names, const char *dtype) {
  char step[32];
  snprintf(step, sizeof step, "%" PRId64, mc_ckpt_step(ck));
  return (mc_st_meta_add(m, "format", "pt") || mc_st_meta_add(m, "names", names) || mc_st_meta_add(m, "dtype", dtype) ||
          mc_st_meta_add(m, "config", mc_ckpt_config_json(ck)) || mc_st_meta_add(m, "step", step) ||
          mc_st_meta_add(m, "source_root_sha256", mc_ckpt_root_hash(ck)))
             ? -1
             : 0;
}

static void print_shape(FILE *out, const mc_hf_map *h) {
  fprintf(out, "[");
  for (int d = 0; d < h->ndim; d++) fprintf(out, "%s%" PRId64, d ? ", " : "", h->shape[d]);
  fprintf(out, "]");
}

int mc_rs_export(mc_rs_source *src, const char *path, const mc_rs_export_opts *eo_in, const mc_rs_opts *o,
                 mc_rs_summary *sum) {
  mc_rs_export_opts eo;
  if (eo_in) eo = *eo_in;
  else mc_rs_export_opts_default(&eo);
  if (eo.max_shard_bytes <= 0) eo.max_shard_bytes = 5000000000LL;
  FILE *out = eo.out ? eo.out : stdout;
  const int single = ends_with(path, ".safetensors");
  char dirbuf[1100];
  const char *dir = single ? NULL : dir_trimmed(path, dirbuf, sizeof dirbuf);
  const char *final = single ? path : dir;
  const int force = o && o->force;
  if (!single && !*dir) return mc_error("--export: empty output path");
  if (single && mc_output_file_ok(path, "--export file") != 0) return -1;
  struct stat st;
  if (!single && stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
    if (mc_output_file_ok(dir, "--export path") != 0) return -1; /* a device, FIFO, ... */
    return mc_error("%s exists and is not a directory; a path without .safetensors is a model directory", dir);
  }
  if (mc_path_exists(final) && !force)
    return mc_error("%s already exists; refusing to overwrite it (pass --force to replace it)", final);

  const mc_geometry *sg = mc_rs_source_geometry(src);
  mc_ckpt *ck = mc_rs_source_ckpt(src);
  const mc_model *m = &sg->model;
  if (!mc_ckpt_has_state(ck, MC_STATE_PARAM)) return mc_error("%s: the checkpoint stores no param state", mc_ckpt_step_dir(ck));
  char why[512] = "";
  int is_llama = mc_hf_llama_check(m, why, sizeof why) == 0;
  int llama = 0;
  if (eo.names == MC_EXPORT_NAMES_LLAMA && !is_llama)
    return mc_error("--names llama: this model is not a LlamaForCausalLM: %s", why);
  if (eo.names == MC_EXPORT_NAMES_LLAMA || (eo.names == MC_EXPORT_NAMES_AUTO && is_llama)) llama = 1;
  if (eo.names == MC_EXPORT_NAMES_AUTO && !is_llama)
    fprintf(stderr, "mcreshard: note: MegaC tensor names (not a Llama: %s); docs/export.md\n", why);
  const char *names = llama ? "llama" : "megac";
  const char *dtype = eo.bf16 ? "BF16" : "F32";
  const int es = eo.bf16 ? 2 : 4;

  mc_geometry cg;
  if (consolidated_geometry(mc_rs_source_config(src), &cg) != 0) return -1;
  mc_rs_plan plan;
  if (mc_rs_plan_build(sg, &cg, 1u << MC_STATE_PARAM, &plan) != 0) {
    mc_geometry_free(&cg);
    return -1;
  }
  mc_rs_source_dtypes(src, &plan); /* read as stored, widened; the targets stay fp32 (hf_write) */
  int rc = 0, nt = plan.n_targets;
  hf_sink sink;
  memset(&sink, 0, sizeof sink);
  sink.bf16 = eo.bf16;
  sink.m = calloc((size_t)nt + 1, sizeof *sink.m);
  mc_hf_map *hm = calloc((size_t)nt + 1, sizeof *hm);
  out_file *files = calloc((size_t)nt + 1, sizeof *files);
  int n_files = 0;
  if (!sink.m || !hm || !files) rc = mc_error("out of memory");
  /* names, shapes, and the shards: targets in family order, a new file when the next tensor
   * would pass max_shard_bytes (a tensor larger than that gets a file of its own) */
  int64_t total = 0;
  for (int t = 0; t < nt && rc == 0; t++) {
    const mc_family *f = &cg.fams.f[plan.tensors[plan.targets[t].tensor].fam];
    if (llama) mc_hf_llama_map(m, f, &hm[t]);
    else mc_hf_megac_map(f, &hm[t]);
    sink.m[t].file = -1;
    if (!hm[t].name[0]) continue;
    int64_t b = hm[t].keep * es;
    if (n_files == 0 || (!single && files[n_files - 1].n > 0 && files[n_files - 1].bytes + b > eo.max_shard_bytes)) n_files++;
    out_file *of = &files[n_files - 1];
    if (!of->targets) of->targets = calloc((size_t)nt, sizeof *of->targets);
    if (!of->targets) {
      rc = mc_error("out of memory");
      break;
    }
    sink.m[t].file = n_files - 1;
    sink.m[t].idx = of->n;
    sink.m[t].keep = hm[t].keep;
    of->targets[of->n++] = t;
    of->bytes += b;
    total += b;
  }
  mc_config cfg;
  if (rc == 0 && mc_ckpt_config(ck, &cfg) != 0) rc = -1;
  char *config_json = NULL, *index_json = NULL;
  if (rc == 0 && !single && !(config_json = mc_hf_config_json(&cfg, llama, eo.bf16 ? "bfloat16" : "float32"))) rc = -1;
  for (int i = 0; i < n_files && rc == 0; i++) {
    if (single) snprintf(files[i].name, sizeof files[i].name, "%s", "");
    else snprintf(files[i].name, sizeof files[i].name, "model-%05d-of-%05d.safetensors", i + 1, n_files);
    rc = add_common_meta(&files[i].meta, ck, names, dtype);
    for (int k = 0; k < files[i].n && rc == 0; k++) {
      char key[MC_ST_NAME_MAX + 8];
      snprintf(key, sizeof key, "sha256.%s", hm[files[i].targets[k]].name);
      /* a placeholder of the final length: the header is rewritten in place once hashed */
      rc = mc_st_meta_add(&files[i].meta, key, ZERO_HEX);
    }
  }
  if (rc == 0 && !single) {
    cJSON *ix = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(ix, "metadata"),
          *wm = cJSON_AddObjectToObject(ix, "weight_map");
    char tot[32];
    snprintf(tot, sizeof tot, "%" PRId64, total);
    cJSON_AddItemToObject(md, "total_size", cJSON_CreateRaw(tot));
    for (int i = 0; i < n_files; i++)
      for (int k = 0; k < files[i].n; k++) cJSON_AddStringToObject(wm, hm[files[i].targets[k]].name, files[i].name);
    index_json = cJSON_Print(ix);
    cJSON_Delete(ix);
    if (!index_json) rc = mc_error("out of memory");
  }

  if (rc == 0 && eo.dry_run) {
    fprintf(out, "dry run: would write %s %s (%s names, %s, %d file%s, %" PRId64 " tensor bytes), nothing written\n",
            single ? "the file" : "the model directory", final, names, dtype, n_files, n_files == 1 ? "" : "s", total);
    for (int i = 0; i < n_files; i++) {
      fprintf(out, "%s%s: %d tensors, %" PRId64 " bytes of data\n", single ? "" : "  ", single ? path : files[i].name,
              files[i].n, files[i].bytes);
      for (int k = 0; k < files[i].n; k++) {
        int t = files[i].targets[k];
        const mc_family *f = &cg.fams.f[plan.tensors[plan.targets[t].tensor].fam];
        fprintf(out, "    %s %s ", hm[t].name, dtype);
        print_shape(out, &hm[t]);
        if (strcmp(hm[t].name, f->name) || hm[t].keep != f->numel)
          fprintf(out, " <- %s%s", f->name, hm[t].keep != f->numel ? " (vocabulary rows only)" : "");
        fprintf(out, "\n");
      }
    }
    for (int t = 0; t < nt; t++)
      if (sink.m[t].file < 0)
        fprintf(out, "  not exported: %s (one expert: its router has no effect)\n",
                cg.fams.f[plan.tensors[plan.targets[t].tensor].fam].name);
    if (!single) fprintf(out, "  model.safetensors.index.json:\n%s\n  config.json:\n%s\n", index_json, config_json);
  } else if (rc == 0) {
    /* the directory is built beside its final name and renamed into place when complete */
    char tmpdir[1200], olddir[1200];
    snprintf(tmpdir, sizeof tmpdir, "%s.export.tmp", final);
    snprintf(olddir, sizeof olddir, "%s.export.old", final);
    if (!single) {
      if (mc_path_exists(tmpdir) && mc_rmtree(tmpdir) != 0) rc = mc_error_context("removing the leftover %s", tmpdir);
      else if (mkdir(tmpdir, 0755) != 0) rc = mc_error("%s: cannot create: %s", tmpdir, strerror(errno));
    }
    rc = rc ? rc : mc_rs_source_bind(src, &plan);
    sink.f = calloc((size_t)n_files + 1, sizeof *sink.f);
    if (!sink.f) rc = mc_error("out of memory");
    sink.n_files = n_files;
    int created = 0;
    for (int i = 0; i < n_files && rc == 0; i++) {
      mc_st_tensor *ts = calloc((size_t)files[i].n + 1, sizeof *ts);
      if (!ts) {
        rc = mc_error("out of memory");
        break;
      }
      for (int k = 0; k < files[i].n; k++) {
        const mc_hf_map *h = &hm[files[i].targets[k]];
        snprintf(ts[k].name, sizeof ts[k].name, "%s", h->name);
        snprintf(ts[k].dtype, sizeof ts[k].dtype, "%s", dtype);
        ts[k].ndim = h->ndim;
        for (int d = 0; d < h->ndim; d++) ts[k].shape[d] = h->shape[d];
      }
      char fp[1400];
      if (single) snprintf(fp, sizeof fp, "%s", path);
      else snprintf(fp, sizeof fp, "%s/%s", tmpdir, files[i].name);
      rc = mc_st_create(&sink.f[i], fp, ts, files[i].n, &files[i].meta);
      free(ts);
      if (rc == 0) created = i + 1;
    }
    for (int t = 0; t < nt && rc == 0; t++)
      if (sink.m[t].file >= 0 && (!(sink.m[t].sha = EVP_MD_CTX_new()) || EVP_DigestInit_ex(sink.m[t].sha, EVP_sha256(), NULL) != 1))
        rc = mc_error("export: SHA-256 unavailable");
    mc_rs_exec_stats es_;
    memset(&es_, 0, sizeof es_);
    if (rc == 0) {
      mc_rs_io_ctx ctx = {src, &sink};
      mc_rs_io io = {&ctx, mc_rs_source_read, hf_write, mc_rs_source_done, hf_done};
      mc_rs_exec_opts xo = {o ? o->chunk_bytes : 0, o ? o->threads : 0, o ? o->progress : 0, "export"};
      rc = mc_rs_execute(&plan, &cg, &io, &xo, &es_);
    }
    for (int i = 0; i < n_files && rc == 0; i++) {
      for (int k = 0; k < files[i].n; k++) {
        const int t = files[i].targets[k];
        char key[MC_ST_NAME_MAX + 8];
        snprintf(key, sizeof key, "sha256.%s", hm[t].name);
        for (int j = 0; j < files[i].meta.n_meta; j++)
          if (!strcmp(files[i].meta.meta_key[j], key)) memcpy(files[i].meta.meta_val[j], sink.m[t].hex, 65);
      }
      rc = mc_st_update_meta(&sink.f[i], &files[i].meta);
      if (rc == 0) rc = mc_st_commit(&sink.f[i]);
    }
    if (rc == 0 && !single) {
      char p1[1400], p2[1400];
      snprintf(p1, sizeof p1, "%s/config.json", tmpdir);
      snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", tmpdir);
      rc = write_text_file(p1, config_json);
      if (rc == 0) rc = write_text_file(p2, index_json);
      if (rc == 0) rc = mc_fsync_path(tmpdir, 1);
      int had_old = rc == 0 && mc_path_exists(dir);
      if (had_old && mc_path_exists(olddir)) mc_rmtree(olddir);
      if (had_old && rename(dir, olddir) != 0) rc = mc_error("%s: cannot move aside: %s", dir, strerror(errno));
      if (rc == 0 && rename(tmpdir, dir) != 0) {
        rc = mc_error("%s: cannot rename into place: %s", dir, strerror(errno));
        if (had_old) rename(olddir, dir);
      }
      if (rc == 0 && had_old) mc_rmtree(olddir);
    }
    if (rc != 0) {
      char keep[MC_ERRMSG_MAX];
      snprintf(keep, sizeof keep, "%s", mc_errmsg());
      for (int i = 0; i < created; i++) mc_st_abort(&sink.f[i]);
      if (!single) mc_rmtree(tmpdir);
      mc_error("export to %s failed, nothing written: %s", final, keep);
    }
    if (rc == 0 && sum) {
      memset(sum, 0, sizeof *sum);
      sum->bytes_read = es_.bytes_read;
      sum->bytes_written = total;
      sum->seconds = sum->copy_seconds = es_.seconds;
      sum->peak_rss_kb = mc_rs_peak_rss_kb();
      sum->n_src_shards = plan.n_src;
      sum->n_dst_shards = 0;
      for (int i = 0; i < n_files; i++) sum->n_dst_shards += files[i].n;
      sum->n_dst_files = n_files;
    }
    if (rc == 0)
      fprintf(out, "exported %s: %s names, %s, %d file%s\n", final, names, dtype, n_files, n_files == 1 ? "" : "s");
  }
  for (int t = 0; sink.m && t < nt; t++)
    if (sink.m[t].sha) EVP_MD_CTX_free(sink.m[t].sha);
  for (int i = 0; i < n_files; i++) {
    free(files[i].targets);
    mc_st_meta_free(&files[i].meta);
  }
  free(files);
  free(hm);
  free(sink.m);
  free(sink.f);
  free(config_json);
  free(index_json);
  mc_rs_plan_free(&plan);
  mc_geometry_free(&cg);
  return rc;
}

int mc_rs_export_safetensors(mc_rs_source *src, const char *path, const mc_rs_opts *o, mc_rs_summary *sum) {
  return mc_rs_export(src, path, NULL, o, sum);
}

/* ---------------------------------------------------------------- import */

/* The input: one file, or a model directory's shards. */
typedef struct {
  int n;
  mc_st_file *f;
  char **used; /* per file, per tensor: consumed by a family */
  mc_config cfg;
  int have_cfg, tied;
  char cfg_origin[1400];
} hf_input;

static void input_close(hf_input *in) {
  for (int i = 0; i < in->n; i++) {
    mc_st_close(&in->f[i]);
    free(in->used ? in->used[i] : NULL);
  }
  free(in->f);
  free(in->used);
  memset(in, 0, sizeof *in);
}

static int input_add(hf_input *in, const char *path) {
  for (int i = 0; i < in->n; i++)
    if (!strcmp(in->f[i].path, path)) return 0;
  mc_st_file *f = realloc(in->f, (size_t)(in->n + 1) * sizeof *f);
  if (!f) return mc_error("out of memory");
  in->f = f;
  char **u = realloc(in->used, (size_t)(in->n + 1) * sizeof *u);
  if (!u) return mc_error("out of memory");
  in->used = u;
  in->used[in->n] = NULL;
  if (mc_st_open(&in->f[in->n], path) != 0) return -1;
  in->used[in->n] = calloc((size_t)in->f[in->n].n + 1, 1);
  in->n++;
  if (!in->used[in->n - 1]) return mc_error("out of memory");
  return 0;
}

static int input_open(const char *path, hf_input *in) {
  memset(in, 0, sizeof *in);
  struct stat st;
  if (stat(path, &st) != 0) return mc_error("%s: cannot open: %s", path, strerror(errno));
  char dir[1100], p[1300];
  int rc = 0;
  if (S_ISDIR(st.st_mode)) {
    dir_trimmed(path, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *ix = read_text_file(p);
    if (ix) {
      cJSON *j = cJSON_Parse(ix);
      free(ix);
      const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
      if (!cJSON_IsObject(wm)) rc = mc_error("%s: no \"weight_map\" object", p);
      for (const cJSON *e = wm ? wm->child : NULL; e && rc == 0; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
          rc = mc_error("%s: weight_map.%s is not a file name of the directory", p, e->string);
          break;
        }
        char fp[1400];
        snprintf(fp, sizeof fp, "%s/%s", dir, e->valuestring);
        rc = input_add(in, fp);
        if (rc == 0) {
          int found = 0;
          for (int i = 0; i < in->n && !found; i++)
            if (!strcmp(in->f[i].path, fp)) found = mc_st_find(&in->f[i], e->string) >= 0;
          if (!found) rc = mc_error("%s: weight_map says %s is in %s, which does not hold it", p, e->string, e->valuestring);
        }
      }
      cJSON_Delete(j);
    } else {
      snprintf(p, sizeof p, "%s/model.safetensors", dir);
      if (!mc_path_exists(p))
        rc = mc_error("%s: neither model.safetensors.index.json nor model.safetensors in this directory", dir);
      else rc = input_add(in, p);
    }
  } else {
    rc = input_add(in, path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
  }
  /* the config: a MegaC export's metadata, else config.json beside the files */
  for (int i = 0; i < in->n && rc == 0 && !in->have_cfg; i++) {
    const char *c = mc_st_meta_get(&in->f[i].meta, "config");
    if (!c) continue;
    if (mc_config_default(&in->cfg) != 0 || mc_config_apply_json(&in->cfg, c, in->f[i].path) != 0) rc = -1;
    in->have_cfg = 1;
    snprintf(in->cfg_origin, sizeof in->cfg_origin, "%s (__metadata__.config)", in->f[i].path);
  }
  if (rc == 0) {
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *cj = read_text_file(p);
    if (cj) {
      mc_config c2;
      int tied = 0;
      int r2 = mc_hf_config_read(cj, p, &c2, &tied);
      if (!in->have_cfg) {
        rc = r2;
        in->cfg = c2;
        in->have_cfg = r2 == 0;
        snprintf(in->cfg_origin, sizeof in->cfg_origin, "%s", p);
      }
      in->tied = r2 == 0 && tied;
      free(cj);
    }
  }
  if (rc == 0 && !in->have_cfg)
    rc = mc_error("%s: no MegaC config in __metadata__.config and no config.json beside it: the model is unknown", path);
  if (rc) input_close(in);
  return rc;
}

int mc_rs_safetensors_config(const char *path, mc_config *cfg) {
  hf_input in;
  if (input_open(path, &in) != 0) return -1;
  *cfg = in.cfg;
  input_close(&in);
  return 0;
}

static int input_find(const hf_input *in, const char *name, int *file, int *idx) {
  for (int i = 0; i < in->n; i++) {
    int k = mc_st_find(&in->f[i], name);
    if (k >= 0) {
      *file = i, *idx = k;
      return 0;
    }
  }
  return -1;
}

typedef struct {
  int file, idx;   /* -1: zeros (a moment, the dropped router) */
  int i64;         /* an int64 state (AdamW's step): 0, as 8 zero bytes */
  int64_t keep;    /* elements read from the file, the rest zero (padded vocabulary rows) */
  EVP_MD_CTX *sha; /* over the file's bytes */
  char want[65];   /* the file's sha256.<tensor>, "" if none */
} in_map;

typedef struct {
  hf_input *in;
  in_map *m; /* per plan source */
} hf_source;

static int hf_read(void *ctx, const mc_rs_plan *p, int s, int64_t off, int64_t n, float *buf) {
  hf_source *src = ((mc_rs_io_ctx *)ctx)->src;
  in_map *im = &src->m[s];
  (void)p;
  if (im->i64) { /* an int64 source gives its stored bytes (reshard/execute.h) */
    memset(buf, 0, (size_t)n * 8);
    return 0;
  }
  int64_t k = im->file < 0 || off >= im->keep ? 0 : (off + n > im->keep ? im->keep - off : n);
  if (k < n) memset(buf + k, 0, (size_t)(n - k) * 4);
  if (k == 0) return 0;
  const mc_st_file *f = &src->in->f[im->file];
  const mc_st_tensor *t = &f->t[im->idx];
  const int es = t->esize;
  void *raw = es == 4 ? (void *)buf : malloc((size_t)k * 2);
  if (!raw) return mc_error("import: out of memory");
  int rc = mc_st_pread(f, im->idx, off * es, raw, k * es);
  if (rc == 0 && im->sha && EVP_DigestUpdate(im->sha, raw, (size_t)(k * es)) != 1) rc = mc_error("import: SHA-256 failed");
  if (rc == 0 && es == 2) {
    const uint16_t *h = raw;
    const int bf = !strcmp(t->dtype, "BF16");
    for (int64_t i = 0; i < k; i++) buf[i] = bf ? mc_f32_of_bf16(h[i]) : mc_f32_of_f16(h[i]);
  }
  if (raw != buf) free(raw);
  return rc;
}

static int hf_src_done(void *ctx, const mc_rs_plan *p, int s, const unsigned char sha[32]) {
  hf_source *src = ((mc_rs_io_ctx *)ctx)->src;
  in_map *im = &src->m[s];
  (void)p, (void)sha;
  if (im->file < 0 || !im->want[0] || !im->sha) return 0;
  unsigned char d[32];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(im->sha, d, &len) != 1) return mc_error("import: SHA-256 failed");
  char hex[65];
  mc_rs_hex(d, hex);
  if (strcmp(hex, im->want) != 0)
    return mc_error("%s: tensor %s fails its SHA-256 check (metadata %.16s..., data %.16s...)", src->in->f[im->file].path,
                    src->in->f[im->file].t[im->idx].name, im->want, hex);
  return 0;
}

static void shape_text(int ndim, const int64_t *s, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && n < (int)cap; d++) n += snprintf(buf + n, cap - (size_t)n, "%s%" PRId64, d ? ", " : "", s[d]);
  if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
}

int mc_rs_import(const char *path, const mc_layout *target, const char *dst, const mc_rs_opts *o, int dry_run,
                 mc_rs_summary *sum) {
  if (mc_rs_check_destination(dst, o && o->force) != 0) return -1;
  hf_input in;
  if (input_open(path, &in) != 0) return -1;
  mc_config cfg = in.cfg;
  if (target) cfg.parallel = *target;
  mc_geometry cg, dg;
  if (consolidated_geometry(&cfg, &cg) != 0) {
    input_close(&in);
    return mc_error_context("the model of %s", in.cfg_origin);
  }
  if (mc_geometry_of_config(&cfg, NULL, &dg) != 0) {
    mc_geometry_free(&cg);
    input_close(&in);
    return mc_error_context("target layout refused");
  }
  mc_rs_plan plan;
  if (mc_rs_plan_build(&cg, &dg, MC_RS_ALL_STATES, &plan) != 0) {
    mc_geometry_free(&cg);
    mc_geometry_free(&dg);
    input_close(&in);
    return -1;
  }
  /* the names: Llama's when the files hold its embedding, else MegaC's family names */
  int f0, k0, rc = 0;
  const int llama = input_find(&in, "model.embed_tokens.weight", &f0, &k0) == 0;
  char why[512];
  if (llama && mc_hf_llama_check(&cfg.model, why, sizeof why) != 0)
    rc = mc_error("%s holds Llama tensor names but its model is not a Llama: %s", path, why);
  hf_source src = {&in, calloc((size_t)plan.n_src + 1, sizeof(in_map))};
  if (!src.m) rc = mc_error("out of memory");
  if (rc == 0 && dry_run)
    printf("dry run: would import %s (%s names; model from %s) into %s; nothing written\n", path, llama ? "Llama" : "MegaC",
           in.cfg_origin, dst);
  for (int i = 0; i < plan.n_tensors && rc == 0; i++) {
    const mc_rs_tensor *tn = &plan.tensors[i];
    const mc_family *f = &cg.fams.f[tn->fam];
    in_map *im = &src.m[tn->first_src]; /* world 1: one source shard per tensor, the whole family */
    im->file = -1;
    /* each state in the dtype its optimizer keeps it in: AdamW's step starts at 0, as int64 */
    plan.tensors[i].src_dtype = plan.tensors[i].dtype = mc_opt_state_dtype(f->opt, tn->state);
    im->i64 = plan.tensors[i].dtype == MC_ELEM_I64;
    if (tn->state != MC_STATE_PARAM) continue;
    mc_hf_map h;
    if (llama) mc_hf_llama_map(&cfg.model, f, &h);
    else mc_hf_megac_map(f, &h);
    if (!h.name[0]) {
      if (dry_run) printf("  %s <- zeros (no effect with one expert)\n", f->name);
      continue;
    }
    const char *look = h.name;
    if (llama && f->role == MC_ROLE_HEAD && in.tied && input_find(&in, h.name, &f0, &k0) != 0)
      look = "model.embed_tokens.weight"; /* tie_word_embeddings: the head is the embedding */
    int fi, ki;
    if (input_find(&in, look, &fi, &ki) != 0) {
      rc = mc_error("%s: no tensor %s (family %s), which the model has", path, look, f->name);
      break;
    }
    const mc_st_tensor *t = &in.f[fi].t[ki];
    int same = t->ndim == h.ndim;
    for (int d = 0; same && d < h.ndim; d++) same = t->shape[d] == h.shape[d];
    if (!same) {
      char a[96], b[96];
      shape_text(t->ndim, t->shape, a, sizeof a);
      shape_text(h.ndim, h.shape, b, sizeof b);
      rc = mc_error("%s: tensor %s has shape %s where the model (%s) needs %s", in.f[fi].path, t->name, a, in.cfg_origin, b);
      break;
    }
    im->file = fi, im->idx = ki, im->keep = h.keep;
    in.used[fi][ki] = 1;
    char key[MC_ST_NAME_MAX + 8];
    snprintf(key, sizeof key, "sha256.%s", t->name);
    const char *hx = mc_st_meta_get(&in.f[fi].meta, key);
    if (hx && strlen(hx) == 64 && strcmp(hx, ZERO_HEX) != 0) memcpy(im->want, hx, 65);
    if (!(im->sha = EVP_MD_CTX_new()) || EVP_DigestInit_ex(im->sha, EVP_sha256(), NULL) != 1) rc = mc_error("import: SHA-256 unavailable");
    if (dry_run) {
      char a[96];
      shape_text(t->ndim, t->shape, a, sizeof a);
      printf("  %s <- %s:%s %s %s%s\n", f->name, in.f[fi].path, t->name, t->dtype, a,
             h.keep != f->numel ? " (padded vocabulary rows zero)" : "");
    }
  }
  for (int i = 0; i < in.n && rc == 0; i++)
    for (int k = 0; k < in.f[i].n && rc == 0; k++)
      if (!in.used[i][k] && !ends_with(in.f[i].t[k].name, ".rotary_emb.inv_freq"))
        rc = mc_error("%s: tensor %s is not a tensor of the model (%s names, model from %s); refusing extra tensors",
                      in.f[i].path, in.f[i].t[k].name, llama ? "Llama" : "MegaC", in.cfg_origin);
  if (rc == 0 && dry_run) {
    char ld[600];
    mc_rs_layout_format(&dg.layout, ld, sizeof ld);
    printf("target layout %s: %d shards; optimizer states zero (optim.groups %s), step 0\n", ld, plan.n_targets,
           cfg.train.optim.groups);
  } else if (rc == 0) {
    mc_train_state st;
    memset(&st, 0, sizeof st);
    /* A fresh start from the weights: step 0, the run's hyperparameters, zero optimizer states. */
    st.lr_max = cfg.train.lr;
    st.lr_min = cfg.train.min_lr;
    st.warmup_steps = cfg.train.warmup_steps;
    st.total_steps = cfg.train.steps;
    st.beta1 = cfg.train.beta1;
    st.beta2 = cfg.train.beta2;
    st.adam_eps = cfg.train.adam_eps;
    st.weight_decay = cfg.train.weight_decay;
    st.grad_clip = cfg.train.grad_clip;
    st.seed = cfg.train.seed;
    rc = mc_rs_write_from(hf_read, hf_src_done, &src, &cfg, &st, &dg, &plan, dst, o, sum);
  }
  for (int s = 0; src.m && s < plan.n_src; s++)
    if (src.m[s].sha) EVP_MD_CTX_free(src.m[s].sha);
  free(src.m);
  input_close(&in);
  mc_rs_plan_free(&plan);
  mc_geometry_free(&cg);
  mc_geometry_free(&dg);
  return rc;
}

int mc_rs_import_safetensors(const char *path, const mc_layout *target, const char *dst, const mc_rs_opts *o,
                             mc_rs_summary *sum) {
  return mc_rs_import(path, target, dst, o, 0, sum);
}
