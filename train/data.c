#define _POSIX_C_SOURCE 200809L /* access() */

#include "train/data.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/checked.h"
#include "util/error.h"
#include "util/fileio.h"
#include "util/rng.h"

/* Reads a string attribute (fixed-length or variable-length) into buf; 0 if absent. */
static int read_string_attr(hid_t obj, const char *name, char *buf, size_t cap) {
  buf[0] = 0;
  if (H5Aexists(obj, name) <= 0) return 0;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t t = H5Aget_type(a);
  int rc = -1;
  if (H5Tget_class(t) == H5T_STRING) {
    if (H5Tis_variable_str(t) > 0) {
      /* Read with the stored type: HDF5 1.10 cannot convert between ASCII and UTF-8. */
      char *s = NULL;
      if (H5Aread(a, t, &s) >= 0 && s) {
        snprintf(buf, cap, "%s", s);
        H5free_memory(s);
        rc = 0;
      }
    } else {
      size_t n = H5Tget_size(t);
      char *tmp = calloc(n + 1, 1);
      if (tmp && H5Aread(a, t, tmp) >= 0) {
        snprintf(buf, cap, "%s", tmp);
        rc = 0;
      }
      free(tmp);
    }
  }
  H5Tclose(t);
  H5Aclose(a);
  return rc;
}

/* Whether "/tokens" can be read with pread: contiguous, no filters, little-endian uint16 or
 * uint32 data stored in full at a known offset (the checks before this one ensured the extent
 * and the stored size agree). Then d->fd and d->raw_offset are set; -1 only when the file
 * cannot be opened. */
static int open_raw(mc_data *d) {
  hid_t dcpl = H5Dget_create_plist(d->id), t = H5Dget_type(d->id);
  const int plain = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 && t >= 0 &&
                    (H5Tequal(t, H5T_STD_U16LE) > 0 || H5Tequal(t, H5T_STD_U32LE) > 0);
  if (dcpl >= 0) H5Pclose(dcpl);
  if (t >= 0) H5Tclose(t);
  const uint16_t probe = 1;
  const int little = *(const unsigned char *)&probe == 1;
  const haddr_t off = plain && little ? H5Dget_offset(d->id) : HADDR_UNDEF;
  if (off == HADDR_UNDEF || off > (haddr_t)INT64_MAX) return 0; /* read through HDF5 */
  if ((d->fd = open(d->path, O_RDONLY | O_CLOEXEC)) < 0) return -1;
  d->raw_offset = (int64_t)off;
  return 0;
}

static int fail_open(mc_data *d, const char *fmt, const char *detail) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, detail);
  mc_data_close(d);
  return mc_error("dataset %s: %s", d->path, msg);
}

int mc_data_open(mc_data *d, const char *path, int seq_len, double val_fraction) {
  memset(d, 0, sizeof *d);
  d->id = d->file = -1;
  d->fd = -1;
  snprintf(d->path, sizeof d->path, "%s", path);
  if (seq_len < 1 || seq_len == INT32_MAX) return mc_error("dataset %s: seq_len=%d must be in [1, 2^31-2]", path, seq_len);
  if (!(val_fraction >= 0 && val_fraction < 1))
    return mc_error("dataset %s: data.val_fraction=%g must be in [0, 1)", path, val_fraction);
  if (access(path, R_OK) != 0)
    return mc_error("dataset %s: cannot read the file (make one with mcdata)", path);
  H5E_BEGIN_TRY {
    if (H5Fis_hdf5(path) > 0) d->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  } H5E_END_TRY;
  if (d->file < 0) return fail_open(d, "%s", "not an HDF5 file");
  /* A compressed dataset (mcdata --compress) is read in windows at random places: HDF5's
   * default 1 MiB chunk cache would inflate a whole 65536-token chunk for almost every window
   * of a larger corpus (0.9 ms against 25 us, docs/checkpoint.md "Compression"). Up to
   * 256 MiB of inflated chunks are kept instead (allocated as chunks are read; unused by
   * contiguous datasets). */
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  if (dapl >= 0) H5Pset_chunk_cache(dapl, 20011, (size_t)256 << 20, 0.75);
  H5E_BEGIN_TRY { d->id = H5Dopen2(d->file, "/tokens", dapl >= 0 ? dapl : H5P_DEFAULT); } H5E_END_TRY;
  if (dapl >= 0) H5Pclose(dapl);
  if (d->id < 0) return fail_open(d, "%s", "no dataset \"/tokens\" (make the file with mcdata)");

  hid_t t = H5Dget_type(d->id);
  int ok = H5Tget_class(t) == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_NONE &&
           (H5Tget_size(t) == 2 || H5Tget_size(t) == 4);
  d->elem_bytes = (int)H5Tget_size(t);
  H5Tclose(t);
  if (!ok) return fail_open(d, "%s", "\"/tokens\" must be uint16 or uint32");
  hid_t sp = H5Dget_space(d->id);
  hsize_t dims[2] = {0, 0};
  int nd = H5Sget_simple_extent_ndims(sp);
  if (nd == 1) H5Sget_simple_extent_dims(sp, dims, NULL);
  H5Sclose(sp);
  if (nd != 1) return fail_open(d, "%s", "\"/tokens\" must be one-dimensional");
  /* The extent comes from the file: its byte count must be an int64, and the dataset must
   * store every token it declares (else reads return fill values): an unfiltered one at
   * least its bytes, a chunked one (mcdata --compress: shuffle + deflate) every chunk. */
  int64_t want = 0;
  if (dims[0] > (hsize_t)INT64_MAX || mc_mul_i64((int64_t)dims[0], d->elem_bytes, &want)) {
    char msg[160];
    snprintf(msg, sizeof msg, "\"/tokens\" declares %llu tokens of %d bytes: more bytes than a file can hold",
             (unsigned long long)dims[0], d->elem_bytes);
    return fail_open(d, "%s", msg);
  }
  d->n_tokens = (int64_t)dims[0];
  hid_t dcpl = H5Dget_create_plist(d->id);
  const int nfilters = dcpl >= 0 ? H5Pget_nfilters(dcpl) : -1;
  hsize_t cdim = 0, nchunks = 0;
  const int chunked = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 1, &cdim) == 1 && cdim > 0;
  if (dcpl >= 0) H5Pclose(dcpl);
  const hsize_t stored = H5Dget_storage_size(d->id);
  hid_t fsp = chunked ? H5Dget_space(d->id) : -1;
  const herr_t got = fsp >= 0 ? H5Dget_num_chunks(d->id, fsp, &nchunks) : -1;
  if (fsp >= 0) H5Sclose(fsp);
  if (nfilters == 0 && stored < (hsize_t)want) {
    char msg[200];
    snprintf(msg, sizeof msg, "\"/tokens\" declares %lld tokens (%lld bytes) but stores %llu bytes",
             (long long)d->n_tokens, (long long)want, (unsigned long long)stored);
    return fail_open(d, "%s", msg);
  }
  if (chunked && (got < 0 || nchunks != (dims[0] + cdim - 1) / cdim)) {
    char msg[200];
    snprintf(msg, sizeof msg, "\"/tokens\" declares %lld tokens in %llu chunks but stores %llu of them",
             (long long)d->n_tokens, (unsigned long long)((dims[0] + cdim - 1) / cdim), (unsigned long long)nchunks);
    return fail_open(d, "%s", msg);
  }

  if (H5Aexists(d->id, "vocab_size") <= 0)
    return fail_open(d, "%s", "\"/tokens\" has no attribute vocab_size");
  hid_t a = H5Aopen(d->id, "vocab_size", H5P_DEFAULT);
  /* one integer of at most 64 bits, read in its own signedness: HDF5 would convert a float
   * (300.7) or clip a uint64 above 2^63-1 without a word */
  hid_t at = a >= 0 ? H5Aget_type(a) : -1, as = a >= 0 ? H5Aget_space(a) : -1;
  const int int_attr = at >= 0 && H5Tget_class(at) == H5T_INTEGER && H5Tget_size(at) <= 8 && as >= 0 &&
                       H5Sget_simple_extent_npoints(as) == 1;
  const int is_signed = int_attr && H5Tget_sign(at) == H5T_SGN_2;
  if (at >= 0) H5Tclose(at);
  if (as >= 0) H5Sclose(as);
  herr_t e = -1;
  if (is_signed) e = H5Aread(a, H5T_NATIVE_INT64, &d->vocab_size);
  else if (int_attr) {
    uint64_t u = 0;
    e = H5Aread(a, H5T_NATIVE_UINT64, &u);
    d->vocab_size = u > (uint64_t)INT64_MAX ? -1 : (int64_t)u;
  }
  if (a >= 0) H5Aclose(a);
  if (e < 0 || d->vocab_size < 1)
    return fail_open(d, "%s", "attribute vocab_size is not one positive integer below 2^63");
  if (read_string_attr(d->id, "tokenizer", d->tokenizer, sizeof d->tokenizer) < 0)
    return fail_open(d, "%s", "attribute tokenizer is not a string");

  if (open_raw(d) != 0) return fail_open(d, "%s", "cannot open the file for reading");
  d->seq_len = seq_len;
  d->n_windows = d->n_tokens >= (int64_t)seq_len + 1 ? (d->n_tokens - 1) / seq_len : 0;
  if (d->n_windows < 1) {
    char msg[160];
    snprintf(msg, sizeof msg, "%lld tokens are too few for one window of seq_len+1=%d tokens",
             (long long)d->n_tokens, seq_len + 1);
    return fail_open(d, "%s", msg);
  }
  d->n_val = 0;
  if (val_fraction > 0) {
    d->n_val = llround((double)d->n_windows * val_fraction);
    if (d->n_val < 1) d->n_val = 1;
  }
  d->n_train = d->n_windows - d->n_val;
  if (d->n_train < 1) {
    char msg[200];
    snprintf(msg, sizeof msg, "%lld windows of %d tokens leave no training window after "
             "data.val_fraction=%g", (long long)d->n_windows, seq_len + 1, val_fraction);
    return fail_open(d, "%s", msg);
  }
  return 0;
}

void mc_data_close(mc_data *d) {
  if (d->fd >= 0) close(d->fd);
  d->fd = -1;
  if (d->id >= 0) H5Dclose(d->id);
  if (d->file >= 0) H5Fclose(d->file);
  d->id = d->file = -1;
}

int mc_data_check_vocab(const mc_data *d, int model_vocab) {
  if (d->vocab_size > model_vocab)
    return mc_error("dataset %s: its vocab_size=%lld is larger than model.vocab_size=%d",
                    d->path, (long long)d->vocab_size, model_vocab);
  return 0;
}

/* Validation windows among [0, i). i * n_val reaches n_windows^2: 128-bit. */
static int64_t val_before(const mc_data *d, int64_t i) {
  return d->n_val ? (int64_t)((unsigned __int128)i * (uint64_t)d->n_val / (uint64_t)d->n_windows) : 0;
}

int64_t mc_data_train_window(const mc_data *d, int64_t k) {
  /* Smallest i whose prefix [0, i] holds k+1 training windows. */
  int64_t lo = k, hi = d->n_windows - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (mid + 1 - val_before(d, mid + 1) >= k + 1) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

int64_t mc_data_val_window(const mc_data *d, int64_t j) {
  const unsigned __int128 num = (unsigned __int128)(uint64_t)(j + 1) * (uint64_t)d->n_windows + (uint64_t)d->n_val - 1;
  return (int64_t)(num / (uint64_t)d->n_val) - 1;
}

/* Feistel rounds over a domain of 2^(2*half) values; the round key is Philox of
 * (seed, data stream, epoch, round, right half). */
static uint64_t feistel(uint64_t seed, uint64_t epoch, uint64_t x, int half) {
  uint64_t mask = (half >= 64) ? ~0ull : ((1ull << half) - 1);
  uint64_t l = x >> half, r = x & mask;
  for (uint64_t round = 0; round < 6; round++) {
    uint32_t w[4];
    mc_philox(seed, MC_RNG_STREAM_DATA, (epoch << 35) | (round << 32) | r, w);
    uint64_t f = (((uint64_t)w[1] << 32) | w[0]) & mask;
    uint64_t nl = r;
    r = l ^ f;
    l = nl;
  }
  return (l << half) | r;
}

uint64_t mc_data_permute(uint64_t seed, uint64_t epoch, uint64_t x, uint64_t n) {
  if (n <= 1) return 0;
  int bits = 2;
  while (bits < 64 && (1ull << bits) < n) bits++;
  if (bits & 1) bits++;
  /* Cycle walking: a bijection on [0, 2^bits) restricted to [0, n) stays a bijection. */
  uint64_t y = x;
  do y = feistel(seed, epoch, y, bits / 2);
  while (y >= n);
  return y;
}

int64_t mc_data_sample_window(const mc_data *d, uint64_t seed, int64_t j) {
  uint64_t n = (uint64_t)d->n_train;
  uint64_t k = mc_data_permute(seed, (uint64_t)j / n, (uint64_t)j % n, n);
  return mc_data_train_window(d, (int64_t)k);
}

int64_t mc_data_first_sample(int64_t step, int global_batch, int dp, int dp_rank, int micro_batch,
                             int micro) {
  return step * global_batch + (int64_t)dp_rank * (global_batch / dp) + (int64_t)micro * micro_batch;
}

int mc_data_read_window(const mc_data *d, int64_t w, int32_t *out) {
  if (w < 0 || w >= d->n_windows)
    return mc_error("dataset %s: window %lld out of range [0, %lld)", d->path, (long long)w,
                    (long long)d->n_windows);
  hsize_t start = (hsize_t)w * (hsize_t)d->seq_len, count = (hsize_t)d->seq_len + 1;
  uint32_t *buf = (uint32_t *)out; /* same size as int32_t; converted in place below */
  if (d->fd >= 0) {
    /* little-endian on a little-endian host: uint16 tokens widen in place, last first */
    const size_t eb = (size_t)d->elem_bytes;
    const int64_t want = (int64_t)(count * eb), got = mc_pread_full(d->fd, buf, want, d->raw_offset + (int64_t)(start * eb));
    if (got != want)
      return mc_error("dataset %s: reading tokens [%llu, %llu) failed: %s", d->path, (unsigned long long)start,
                      (unsigned long long)(start + count), got < 0 ? strerror(errno) : "unexpected end of file");
    for (hsize_t i = count; eb == 2 && i-- > 0;) { /* memcpy: the two views of buf alias */
      uint16_t v;
      memcpy(&v, (const char *)buf + 2 * i, 2);
      buf[i] = v;
    }
  } else {
    hid_t fs = H5Dget_space(d->id);
    hid_t ms = H5Screate_simple(1, &count, NULL);
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL);
    herr_t e;
    H5E_BEGIN_TRY { e = H5Dread(d->id, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, buf); } H5E_END_TRY;
    H5Sclose(ms);
    H5Sclose(fs);
    if (e < 0)
      return mc_error("dataset %s: reading tokens [%llu, %llu) failed", d->path, (unsigned long long)start,
                      (unsigned long long)(start + count));
  }
  for (hsize_t i = 0; i < count; i++) {
    if ((int64_t)buf[i] >= d->vocab_size)
      return mc_error("dataset %s: token %u at position %llu is not below vocab_size=%lld", d->path,
                      buf[i], (unsigned long long)(start + i), (long long)d->vocab_size);
    out[i] = (int32_t)buf[i];
  }
  return 0;
}

int mc_data_read_train(const mc_data *d, uint64_t seed, int64_t first, int n, int32_t *out) {
  for (int i = 0; i < n; i++)
    if (mc_data_read_window(d, mc_data_sample_window(d, seed, first + i),
                            out + (int64_t)i * (d->seq_len + 1)) != 0)
      return -1;
  return 0;
}

int mc_data_read_val(const mc_data *d, int64_t first, int n, int32_t *out) {
  if (d->n_val < 1) return mc_error("dataset %s: there is no validation split (data.val_fraction=0)", d->path);
  for (int i = 0; i < n; i++)
    if (mc_data_read_window(d, mc_data_val_window(d, (first + i) % d->n_val),
                            out + (int64_t)i * (d->seq_len + 1)) != 0)
      return -1;
  return 0;
}
