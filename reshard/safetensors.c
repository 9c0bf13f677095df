#define _POSIX_C_SOURCE 200809L
#include "reshard/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fileio.h"
#include "util/error.h"
#include "util/paths.h"

void mc_st_meta_free(mc_st_meta *m) {
  for (int i = 0; i < m->n_meta; i++) free(m->meta_val[i]);
  free(m->meta_key);
  free(m->meta_val);
  memset(m, 0, sizeof *m);
}

int mc_st_meta_add(mc_st_meta *m, const char *key, const char *val) {
  if (strlen(key) >= MC_ST_NAME_MAX) return mc_error("safetensors: metadata key too long: %s", key);
  void *k = realloc(m->meta_key, (size_t)(m->n_meta + 1) * sizeof *m->meta_key);
  if (!k) return mc_error("safetensors: out of memory");
  m->meta_key = k;
  void *v = realloc(m->meta_val, (size_t)(m->n_meta + 1) * sizeof *m->meta_val);
  if (!v) return mc_error("safetensors: out of memory");
  m->meta_val = v;
  m->meta_val[m->n_meta] = strdup(val);
  if (!m->meta_val[m->n_meta]) return mc_error("safetensors: out of memory");
  snprintf(m->meta_key[m->n_meta], MC_ST_NAME_MAX, "%s", key);
  m->n_meta++;
  return 0;
}

const char *mc_st_meta_get(const mc_st_meta *m, const char *key) {
  for (int i = 0; i < m->n_meta; i++)
    if (strcmp(m->meta_key[i], key) == 0) return m->meta_val[i];
  return NULL;
}

static int write_all(int fd, const void *buf, int64_t n, int64_t off, const char *path) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = pwrite(fd, p, (size_t)n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return mc_error("%s: write failed: %s", path, strerror(errno));
    }
    p += w, n -= w, off += w;
  }
  return 0;
}

static int read_all(int fd, void *buf, int64_t n, int64_t off, const char *path) {
  const int64_t r = mc_pread_full(fd, buf, n, off);
  if (r < 0) return mc_error("%s: read failed: %s", path, strerror(errno));
  if (r < n) return mc_error("%s: unexpected end of file at byte %lld", path, (long long)(off + r));
  return 0;
}

int mc_st_dtype_size(const char *dtype) {
  if (!strcmp(dtype, "F32")) return 4;
  if (!strcmp(dtype, "BF16") || !strcmp(dtype, "F16")) return 2;
  return 0;
}

/* The 8-byte length and the JSON header, padded with spaces so the data region starts
 * 8-byte aligned. Fills offsets and sizes into t. */
static char *build_header(mc_st_tensor *t, int n, const mc_st_meta *meta, int64_t *len) {
  cJSON *root = cJSON_CreateObject();
  if (meta && meta->n_meta) {
    cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; i < meta->n_meta; i++) cJSON_AddStringToObject(m, meta->meta_key[i], meta->meta_val[i]);
  }
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = 1;
    double shp[3];
    for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d], shp[d] = (double)t[i].shape[d];
    if (!t[i].dtype[0]) snprintf(t[i].dtype, sizeof t[i].dtype, "F32");
    t[i].esize = mc_st_dtype_size(t[i].dtype);
    t[i].offset = off;
    t[i].bytes = numel * t[i].esize;
    cJSON *o = cJSON_AddObjectToObject(root, t[i].name);
    cJSON_AddStringToObject(o, "dtype", t[i].dtype);
    cJSON_AddItemToObject(o, "shape", cJSON_CreateDoubleArray(shp, t[i].ndim));
    double offs[2] = {(double)off, (double)(off + t[i].bytes)};
    cJSON_AddItemToObject(o, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
    off += t[i].bytes;
  }
  char *hdr = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!hdr) return NULL;
  size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
  char *buf = malloc(8 + padded);
  if (buf) {
    uint64_t le = padded;
    for (int i = 0; i < 8; i++) buf[i] = (char)((le >> (8 * i)) & 0xff);
    memcpy(buf + 8, hdr, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    *len = 8 + (int64_t)padded;
  }
  free(hdr);
  return buf;
}

int mc_st_create(mc_st_file *f, const char *path, const mc_st_tensor *t, int n, const mc_st_meta *meta) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  /* Written to path.tmp and renamed over path: path must not be a device, FIFO, directory. */
  if (mc_output_file_ok(path, "safetensors output") != 0) return -1;
  snprintf(f->path, sizeof f->path, "%s", path);
  snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path);
  f->t = malloc((size_t)(n ? n : 1) * sizeof *f->t);
  if (!f->t) return mc_error("safetensors: out of memory");
  f->n = n;
  memcpy(f->t, t, (size_t)n * sizeof *t);
  for (int i = 0; i < n; i++)
    if (f->t[i].dtype[0] && mc_st_dtype_size(f->t[i].dtype) == 0) {
      mc_st_abort(f);
      return mc_error("safetensors: tensor %s: unsupported dtype %s", t[i].name, t[i].dtype);
    }
  int64_t hlen = 0;
  char *buf = build_header(f->t, n, meta, &hlen);
  if (!buf) {
    mc_st_abort(f);
    return mc_error("safetensors: out of memory");
  }
  f->data_start = hlen;
  int64_t data = n ? f->t[n - 1].offset + f->t[n - 1].bytes : 0;
  f->fd = open(f->tmp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (f->fd < 0) {
    free(buf);
    int e = errno;
    mc_st_abort(f);
    return mc_error("%s: cannot create: %s", f->tmp, strerror(e));
  }
  int rc = write_all(f->fd, buf, f->data_start, 0, f->tmp);
  free(buf);
  if (rc == 0 && ftruncate(f->fd, (off_t)(f->data_start + data)) != 0)
    rc = mc_error("%s: cannot size the data region: %s", f->tmp, strerror(errno));
  if (rc) mc_st_abort(f);
  return rc;
}

int mc_st_update_meta(mc_st_file *f, const mc_st_meta *meta) {
  int64_t hlen = 0;
  char *buf = build_header(f->t, f->n, meta, &hlen);
  if (!buf) return mc_error("safetensors: out of memory");
  int rc = hlen == f->data_start ? write_all(f->fd, buf, hlen, 0, f->tmp)
                                 : mc_error("%s: new metadata changes the header length", f->tmp);
  free(buf);
  return rc;
}

int mc_st_pwrite(mc_st_file *f, int idx, int64_t byte_off, const void *data, int64_t bytes) {
  if (idx < 0 || idx >= f->n || byte_off < 0 || byte_off + bytes > f->t[idx].bytes)
    return mc_error("%s: write outside tensor %d", f->tmp, idx);
  return write_all(f->fd, data, bytes, f->data_start + f->t[idx].offset + byte_off, f->tmp);
}

int mc_st_commit(mc_st_file *f) {
  if (fsync(f->fd) != 0) return mc_error("%s: fsync failed: %s", f->tmp, strerror(errno));
  if (close(f->fd) != 0) {
    f->fd = -1;
    return mc_error("%s: close failed: %s", f->tmp, strerror(errno));
  }
  f->fd = -1;
  if (rename(f->tmp, f->path) != 0) return mc_error("%s: rename to %s failed: %s", f->tmp, f->path, strerror(errno));
  free(f->t);
  f->t = NULL;
  return 0;
}

void mc_st_abort(mc_st_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  unlink(f->tmp);
  free(f->t);
  f->t = NULL;
  mc_st_meta_free(&f->meta);
}

int mc_st_open(mc_st_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s", path);
  f->fd = open(path, O_RDONLY);
  if (f->fd < 0) return mc_error("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  unsigned char lenb[8];
  if (fstat(f->fd, &st) != 0 || st.st_size < 8 || read_all(f->fd, lenb, 8, 0, path) != 0) {
    mc_st_close(f);
    return mc_error("%s: not a safetensors file (shorter than its 8-byte header length)", path);
  }
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)lenb[i] << (8 * i);
  if (hl == 0 || hl > 100u * 1024 * 1024 || (int64_t)(8 + hl) > (int64_t)st.st_size) {
    mc_st_close(f);
    return mc_error("%s: header length %llu does not fit the file (%lld bytes)", path, (unsigned long long)hl,
                    (long long)st.st_size);
  }
  char *hdr = malloc(hl + 1);
  if (!hdr || read_all(f->fd, hdr, (int64_t)hl, 8, path) != 0) {
    free(hdr);
    mc_st_close(f);
    return mc_error("%s: cannot read the header", path);
  }
  hdr[hl] = 0;
  f->data_start = 8 + (int64_t)hl;
  int64_t data_len = (int64_t)st.st_size - f->data_start;
  cJSON *root = cJSON_Parse(hdr);
  free(hdr);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    mc_st_close(f);
    return mc_error("%s: the header is not a JSON object", path);
  }
  int cap = cJSON_GetArraySize(root);
  f->t = calloc((size_t)(cap ? cap : 1), sizeof *f->t);
  int rc = f->t ? 0 : mc_error("safetensors: out of memory");
  for (cJSON *it = root->child; it && rc == 0; it = it->next) {
    if (strcmp(it->string, "__metadata__") == 0) {
      for (cJSON *m = it->child; m && rc == 0; m = m->next) {
        if (!cJSON_IsString(m)) rc = mc_error("%s: __metadata__.%s is not a string", path, m->string);
        else rc = mc_st_meta_add(&f->meta, m->string, m->valuestring);
      }
      continue;
    }
    mc_st_tensor *t = &f->t[f->n];
    if (strlen(it->string) >= MC_ST_NAME_MAX) { rc = mc_error("%s: tensor name too long: %s", path, it->string); break; }
    snprintf(t->name, sizeof t->name, "%s", it->string);
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || mc_st_dtype_size(dt->valuestring) == 0) {
      rc = mc_error("%s: tensor %s has dtype %s; only F32, BF16 and F16 are supported", path, t->name,
                    cJSON_IsString(dt) ? dt->valuestring : "(missing)");
      break;
    }
    snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
    t->esize = mc_st_dtype_size(t->dtype);
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > 3 || !cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2) {
      rc = mc_error("%s: tensor %s needs a shape of at most 3 dims and two data_offsets", path, t->name);
      break;
    }
    int64_t numel = 1;
    t->ndim = cJSON_GetArraySize(sh);
    for (int d = 0; d < t->ndim; d++) {
      cJSON *v = cJSON_GetArrayItem(sh, d);
      /* integral, below 2^53 (exact in a double), and a product that fits: never a cast or a
       * multiplication that overflows */
      if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
          v->valuedouble != (double)(int64_t)v->valuedouble) {
        rc = mc_error("%s: tensor %s: bad shape", path, t->name);
        break;
      }
      t->shape[d] = (int64_t)v->valuedouble;
      if (__builtin_mul_overflow(numel, t->shape[d], &numel) || numel > INT64_MAX / 8) {
        rc = mc_error("%s: tensor %s: shape has too many elements", path, t->name);
        break;
      }
    }
    if (rc) break;
    cJSON *b = cJSON_GetArrayItem(of, 0), *e = cJSON_GetArrayItem(of, 1);
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e) || b->valuedouble < 0 || e->valuedouble < b->valuedouble ||
        e->valuedouble > 9007199254740992.0) {
      rc = mc_error("%s: tensor %s: bad data_offsets", path, t->name);
      break;
    }
    t->offset = (int64_t)b->valuedouble;
    t->bytes = (int64_t)e->valuedouble - t->offset;
    if (t->bytes != numel * t->esize)
      rc = mc_error("%s: tensor %s: data_offsets span %lld bytes but shape needs %lld", path, t->name,
                    (long long)t->bytes, (long long)(numel * t->esize));
    else if (t->offset + t->bytes > data_len)
      rc = mc_error("%s: tensor %s: data_offsets end at %lld, past the data region (%lld bytes)", path, t->name,
                    (long long)(t->offset + t->bytes), (long long)data_len);
    f->n++;
  }
  cJSON_Delete(root);
  /* Overlap check: sort-free O(n^2) is fine for model-sized tensor counts. */
  for (int i = 0; i < f->n && rc == 0; i++)
    for (int j = i + 1; j < f->n && rc == 0; j++)
      if (f->t[i].bytes && f->t[j].bytes && f->t[i].offset < f->t[j].offset + f->t[j].bytes &&
          f->t[j].offset < f->t[i].offset + f->t[i].bytes)
        rc = mc_error("%s: tensors %s and %s overlap", path, f->t[i].name, f->t[j].name);
  if (rc) mc_st_close(f);
  return rc;
}

int mc_st_find(const mc_st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) == 0) return i;
  return -1;
}

int mc_st_pread(const mc_st_file *f, int idx, int64_t byte_off, void *data, int64_t bytes) {
  if (idx < 0 || idx >= f->n || byte_off < 0 || byte_off + bytes > f->t[idx].bytes)
    return mc_error("%s: read outside tensor %d", f->path, idx);
  return read_all(f->fd, data, bytes, f->data_start + f->t[idx].offset + byte_off, f->path);
}

void mc_st_close(mc_st_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  free(f->t);
  f->t = NULL;
  f->n = 0;
  mc_st_meta_free(&f->meta);
}
