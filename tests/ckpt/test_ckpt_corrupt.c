/* The corruption matrix: each way a checkpoint can be damaged is detected with its own
 * message naming the file or dataset, and a failed load changes nothing on disk. */
#include "tests/ckpt/test_ckpt_common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <hdf5.h>

#include "tests/check.h"

static const char *g_root;
static int g_case;

/* A fresh sample checkpoint (tp2 x dp2, ZeRO-1: four rank files) for one case. */
static void fresh(char *dir, size_t cap) {
  pathf(dir, cap, "%s/case%d", g_root, g_case++);
  rm_rf(dir);
  CHECK_OK(save_reference(dir, 2, 1, 2, 1, 0, 1, 5, 9, 0));
}

/* Replaces the byte at `off` of a file by change(byte); returns the byte it replaced (-1 if the
 * file cannot be opened). */
static int put_byte_at(const char *path, long off, int (*change)(int)) {
  FILE *f = fopen(path, "r+b");
  CHECK(f != NULL, "open %s", path);
  if (!f) return -1;
  fseek(f, off, SEEK_SET);
  int c = fgetc(f);
  fseek(f, off, SEEK_SET);
  fputc(change(c), f);
  fclose(f);
  return c;
}

static int flip_bit0(int c) { return c ^ 0x01; }
/* another hex digit for a hex digit (flipping a bit could make it none: the text malformed) */
static int other_hex_digit(int c) { return c == '0' ? '1' : '0'; }

static void flip_byte_at(const char *path, long off) { put_byte_at(path, off, flip_bit0); }

static void change_hex_digit_at(const char *path, long off) {
  int c = put_byte_at(path, off, other_hex_digit);
  CHECK(c >= 0 && strchr("0123456789abcdef", c) != NULL, "%s: byte %ld is no hex digit", path, off);
}

static long find_bytes(const char *path, const char *needle) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n);
  long got = (long)fread(buf, 1, (size_t)n, f);
  fclose(f);
  long at = -1, m = (long)strlen(needle);
  for (long i = 0; i + m <= got && at < 0; i++)
    if (memcmp(buf + i, needle, (size_t)m) == 0) at = i;
  free(buf);
  return at;
}

/* Opens dir, reads every hyperslab of the saving layout, and expects failure with every
 * `needle` in the message; also checks the tree did not change. */
static void expect_load_error(const char *dir, const char *what, const char *n1, const char *n2) {
  uint64_t before = tree_fingerprint(dir);
  mc_ckpt *ck = NULL;
  int rc = mc_ckpt_open(dir, NULL, &ck);
  if (rc == 0) {
    mc_config cfg;
    mc_geometry g;
    tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g);
    rc = check_against_layout(ck, &g, 9) < 0 ? -1 : 0;
    mc_geometry_free(&g);
    mc_ckpt_close(ck);
  }
  const char *msg = mc_errmsg();
  CHECK(rc != 0, "%s: load should fail", what);
  CHECK(rc == 0 || strstr(msg, n1) != NULL, "%s: message lacks '%s': %s", what, n1, msg);
  CHECK(rc == 0 || !n2 || strstr(msg, n2) != NULL, "%s: message lacks '%s': %s", what, n2, msg);
  CHECK(tree_fingerprint(dir) == before, "%s: a failed load changed the directory", what);
  if (getenv("MC_TEST_VERBOSE")) printf("%-28s -> %s\n", what, msg);
}

/* Rewrites the manifest with `edit` applied and records its new hash in latest and
 * manifest.sha256, so only the content rules can catch it. */
static void rewrite_manifest(const char *dir, const char *from, const char *to) {
  CHECK(edit_manifest(dir, 5, from, to) == 0, "manifest of %s: replacing '%s' failed", dir, from);
}

static void case_data_flip(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/step_5/rank_1.h5", dir);
  hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "/layers.00.attn.wq/exp_avg", H5P_DEFAULT);
  haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  CHECK(off != HADDR_UNDEF, "dataset offset");
  flip_byte_at(file, (long)off + 17);
  /* the file's piece digests catch it before the file is parsed */
  expect_load_error(dir, "flipped data byte", "hash mismatch in piece", "rank_1.h5");
  /* a manifest without whole-file hashes (older MegaC): the shard hash names the dataset */
  CHECK(strip_file_hashes(dir, 5) == 0, "strip the file hashes of %s", dir);
  expect_load_error(dir, "flipped data byte (no file hash)", "hash mismatch", "rank_1.h5");
  CHECK(strstr(mc_errmsg(), "/layers.00.attn.wq/exp_avg") != NULL, "names the dataset: %s", mc_errmsg());
  /* the explicit opt-out reads it anyway, with the damaged value */
  mc_ckpt_open_opts o;
  mc_ckpt_open_opts_default(&o);
  o.verify = 0;
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, &o, &ck));
  if (ck) {
    mc_config cfg;
    mc_geometry g;
    tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g);
    CHECK(check_against_layout(ck, &g, 9) == 1, "unverified read sees exactly one damaged value");
    mc_geometry_free(&g);
    CHECK(mc_ckpt_verify_all(ck) != 0 && strstr(mc_errmsg(), "hash mismatch"), "verify_all still finds it");
    mc_ckpt_close(ck);
  }
}

/* A job's shared check (mc_ckpt_check_files_part), each part on its own handle: with piece
 * bad (numbered over rank_0.h5 then rank_1.h5; -1: none) flipped, exactly the part holding it
 * fails, with want in its message; the parts' checked bytes add up to both files once; with
 * none flipped, every handle records the files as checked (as a job does once all parts
 * passed) and then parses them without hashing them again. */
static void check_parts(const char *dir, long bad, long total, long bytes, const char *want) {
  const char *files[] = {"rank_0.h5", "rank_1.h5"};
  for (int parts = 1; parts <= 5; parts += 2) {
    int64_t checked = 0;
    for (int r = 0; r < parts; r++) {
      mc_ckpt *ck = NULL;
      CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
      if (!ck) continue;
      const int rc = mc_ckpt_check_files_part(ck, files, 2, r, parts);
      const int holds = bad >= 0 && total * r / parts <= bad && bad < total * (r + 1) / parts;
      CHECK(holds ? rc != 0 && strstr(mc_errmsg(), want) : rc == 0, "piece %ld, part %d of %d: %s", bad, r, parts,
            rc ? mc_errmsg() : "passed");
      checked += mc_ckpt_checked_bytes(ck);
      CHECK(bad >= 0 || mc_ckpt_files_checked(ck, files, 2) == 0, "part %d of %d: files_checked: %s", r, parts, mc_errmsg());
      CHECK(!holds || mc_ckpt_files_checked(ck, files, 2) != 0, "part %d of %d: files_checked passed a failed file", r, parts);
      if (bad < 0) { /* clean: the files are not hashed again before parsing */
        const int64_t before = mc_ckpt_checked_bytes(ck);
        CHECK_OK(mc_ckpt_check_file(ck, files[0]));
        CHECK_OK(mc_ckpt_check_file(ck, files[1]));
        CHECK(mc_ckpt_checked_bytes(ck) == before, "part %d of %d: the files were checked again", r, parts);
      }
      mc_ckpt_close(ck);
    }
    CHECK(checked == bytes, "%d parts checked %lld bytes of the %ld of both files", parts, (long long)checked, bytes);
  }
}

/* Format 5: the piece digests pin a damaged byte down to its piece. Saved with 4 KiB pieces
 * (a rank file of some 200): a byte flipped at the first byte, the end of piece 0, the start
 * of piece 1, a middle piece, the last byte of the last full piece and the last byte of the
 * file (its last piece is shorter) is reported as that piece, with its byte range, by a load
 * and by mc_ckpt_check_file; two flipped pieces report the first. */
static void case_piece_flip(void) {
  char dir[4096], file[4200];
  g_ref_piece_bytes = 4096;
  fresh(dir, sizeof dir);
  g_ref_piece_bytes = 0;
  pathf(file, sizeof file, "%s/step_5/rank_1.h5", dir);
  struct stat st;
  CHECK(stat(file, &st) == 0, "stat %s", file);
  const long size = (long)st.st_size, pb = 4096, n = (size + pb - 1) / pb;
  CHECK(n > 8 && size % pb != 0, "%s: %ld bytes: want several pieces and a short last one", file, size);
  char file0[4200];
  pathf(file0, sizeof file0, "%s/step_5/rank_0.h5", dir);
  CHECK(stat(file0, &st) == 0, "stat %s", file0);
  const long size0 = (long)st.st_size, n0 = (size0 + pb - 1) / pb;
  check_parts(dir, -1, n0 + n, size0 + size, "");
  const long at[] = {0, pb - 1, pb, (n / 2) * pb + 17, (n - 1) * pb - 1, size - 1};
  for (int i = 0; i < (int)(sizeof at / sizeof at[0]); i++) {
    const long k = at[i] / pb, a = k * pb, b = a + pb < size ? a + pb : size;
    char want[160], what[64];
    snprintf(want, sizeof want, "hash mismatch in piece %ld of %ld (bytes %ld to %ld)", k, n, a, b);
    snprintf(what, sizeof what, "flipped byte %ld (piece %ld)", at[i], k);
    flip_byte_at(file, at[i]);
    expect_load_error(dir, what, want, "rank_1.h5");
    check_parts(dir, n0 + k, n0 + n, size0 + size, want);
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
    if (ck) {
      CHECK(mc_ckpt_check_file(ck, "rank_1.h5") != 0 && strstr(mc_errmsg(), want), "%s: check_file: %s", what, mc_errmsg());
      CHECK(mc_ckpt_check_files(ck) != 0 && strstr(mc_errmsg(), want), "%s: check_files: %s", what, mc_errmsg());
      CHECK_OK(mc_ckpt_check_file(ck, "rank_0.h5"));
      mc_ckpt_close(ck);
    }
    flip_byte_at(file, at[i]); /* back */
  }
  flip_byte_at(file, 7 * pb + 5);
  flip_byte_at(file, 3 * pb + 9);
  char want[160];
  snprintf(want, sizeof want, "hash mismatch in piece 3 of %ld (bytes %ld to %ld)", n, 3 * pb, 4 * pb);
  expect_load_error(dir, "two flipped pieces", want, "rank_1.h5");
  flip_byte_at(file, 7 * pb + 5);
  flip_byte_at(file, 3 * pb + 9);
  /* restored: it loads again, every hyperslab equal */
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) {
    mc_config cfg;
    mc_geometry g;
    tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g);
    CHECK(check_against_layout(ck, &g, 9) == 0, "restored checkpoint: %s", mc_errmsg());
    mc_geometry_free(&g);
    mc_ckpt_close(ck);
  }
}

static void case_attr_flip(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return;
  char sha[65] = "";
  for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    if (strcmp(s->dataset, "/layers.02.ssm.w_x/param") == 0 && strcmp(s->file, "rank_2.h5") == 0) memcpy(sha, s->sha256, 65);
  }
  mc_ckpt_close(ck);
  pathf(file, sizeof file, "%s/step_5/rank_2.h5", dir);
  long at = find_bytes(file, sha);
  CHECK(sha[0] && at >= 0, "sha256 attribute bytes found in the file");
  if (at >= 0) flip_byte_at(file, at + 10);
  expect_load_error(dir, "flipped attribute byte", "hash mismatch in piece", "rank_2.h5");
  CHECK(strip_file_hashes(dir, 5) == 0, "strip the file hashes of %s", dir);
  expect_load_error(dir, "flipped attribute byte (no file hash)", "attribute 'sha256'", "/layers.02.ssm.w_x/param");
  CHECK(strstr(mc_errmsg(), "rank_2.h5") != NULL, "names the file: %s", mc_errmsg());
}

static void case_manifest_flip(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/step_5/manifest.json", dir);
  long at = find_bytes(file, "\"count\"");
  flip_byte_at(file, at + 30);
  expect_load_error(dir, "flipped manifest byte", "manifest is corrupt", "manifest.json");
  /* opened as a step directory, manifest.sha256 still catches it */
  char step[4200];
  pathf(step, sizeof step, "%s/step_5", dir);
  expect_load_error(step, "flipped manifest (step dir)", "manifest is corrupt", "manifest.json");
}

static void case_truncated(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/step_5/rank_3.h5", dir);
  int64_t size = 0;
  struct stat st;
  if (stat(file, &st) == 0) size = st.st_size;
  CHECK(truncate(file, size / 2) == 0, "truncate");
  expect_load_error(dir, "truncated shard file", "truncated", "rank_3.h5");
}

static void case_unreadable(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/step_5/rank_0.h5", dir);
  FILE *f = fopen(file, "r+b");
  fwrite("garbage!", 1, 8, f); /* the HDF5 signature; size unchanged */
  fclose(f);
  expect_load_error(dir, "overwritten file header", "hash mismatch in piece", "rank_0.h5");
  CHECK(strip_file_hashes(dir, 5) == 0, "strip the file hashes of %s", dir);
  expect_load_error(dir, "overwritten file header (no file hash)", "unreadable shard file", "rank_0.h5");
}

static void case_deleted(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/step_5/rank_2.h5", dir);
  CHECK(unlink(file) == 0, "unlink");
  expect_load_error(dir, "deleted shard file", "missing shard file", "rank_2.h5");
}

static void case_missing_dataset(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  CHECK(strip_file_hashes(dir, 5) == 0, "strip the file hashes of %s", dir); /* else the file hash stops it first */
  pathf(file, sizeof file, "%s/step_5/rank_0.h5", dir);
  hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
  CHECK(H5Ldelete(f, "/head.weight/param", H5P_DEFAULT) >= 0, "delete dataset");
  H5Fclose(f);
  /* the file must keep its recorded size for this case to reach the dataset check */
  char mp[4200];
  pathf(mp, sizeof mp, "%s/step_5/manifest.json", dir);
  struct stat st;
  stat(file, &st);
  char sz[64];
  snprintf(sz, sizeof sz, "%lld", (long long)st.st_size);
  mc_ckpt *ck = NULL;
  int opened = mc_ckpt_open(dir, NULL, &ck) == 0;
  mc_ckpt_close(ck);
  if (opened) expect_load_error(dir, "deleted dataset", "dataset /head.weight/param is missing", "rank_0.h5");
  else expect_load_error(dir, "deleted dataset (file size changed)", "rank_0.h5", NULL);
}

static void case_wrong_root_hash(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/latest", dir);
  long at = find_bytes(file, "\"manifest_sha256\"");
  change_hex_digit_at(file, at + 25);
  expect_load_error(dir, "wrong root hash in latest", "wrong root hash in latest", "manifest.json");
}

static void case_bad_latest(void) {
  char dir[4096], file[4200];
  fresh(dir, sizeof dir);
  pathf(file, sizeof file, "%s/latest", dir);
  FILE *f = fopen(file, "wb");
  fputs("step_5\n", f);
  fclose(f);
  expect_load_error(dir, "malformed latest", "latest is malformed", NULL);
  rm_rf(file);
  f = fopen(file, "wb");
  fputs("{\"step\": 99, \"path\": \"step_99\", \"manifest_sha256\": "
        "\"0000000000000000000000000000000000000000000000000000000000000000\"}",
        f);
  fclose(f);
  expect_load_error(dir, "latest pointing at nothing", "points at step_99", NULL);
  unlink(file);
  char step[4200];
  pathf(step, sizeof step, "%s/step_5", dir);
  rm_rf(step);
  expect_load_error(dir, "no latest, no manifest", "neither a checkpoint directory", NULL);
}

static void case_version_too_new(void) {
  char dir[4096];
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"format_version\":\t6", "\"format_version\":\t7");
  expect_load_error(dir, "format version too new", "format version 7 is newer", "supports (6)");
  /* version 2 records the ownership rule: without it, or with an unknown one, it is invalid */
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"ownership_rule\":", "\"ownership_rulez\":");
  expect_load_error(dir, "no ownership rule", "manifest invalid", "missing key 'layout.ownership_rule'");
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"ownership_rule\":\t\"balanced-v2\"", "\"ownership_rule\":\t\"lumpy\"");
  expect_load_error(dir, "unknown ownership rule", "manifest invalid", "ownership_rule 'lumpy' unknown");
}

/* A malformed piece list (format 5) is refused naming the file entry and the field. */
static void case_pieces_invalid(void) {
  static const char zeros[] = "0000000000000000000000000000000000000000000000000000000000000000";
  char dir[4096], to[256];
  struct {
    const char *what, *from, *to, *needle;
  } c[] = {
      {"piece_bytes 0", "\"piece_bytes\":\t67108864", "\"piece_bytes\":\t0", "piece_bytes is not a multiple of 4096"},
      {"piece_bytes 2^40", "\"piece_bytes\":\t67108864", "\"piece_bytes\":\t1099511627776", "piece_bytes is not a multiple"},
      {"piece_bytes 5000", "\"piece_bytes\":\t67108864", "\"piece_bytes\":\t5000", "piece_bytes is not a multiple"},
      {"piece_bytes -4096", "\"piece_bytes\":\t67108864", "\"piece_bytes\":\t-4096", "piece_bytes is not a multiple"},
      {"piece_bytes a string", "\"piece_bytes\":\t67108864", "\"piece_bytes\":\t\"64M\"", "piece_bytes is not a multiple"},
      {"piece_bytes not matching the count", "\"piece_bytes\":\t67108864", "\"piece_bytes\":\t4096",
       "pieces has 1 digests but"},
      {"a piece not hex", "\"pieces\":\t[\"", "\"pieces\":\t[\"g", "pieces[0] is not 64 lowercase hex digits"},
      {"a piece too many", "\"pieces\":\t[", NULL, "pieces has 2 digests but"},
      {"no pieces", "\"pieces\":\t[", "\"pieces\":\t[], \"x\":\t[", "pieces has 0 digests"},
      {"pieces not an array", "\"pieces\":\t[", "\"pieces\":\t{\"a\": 1}, \"x\":\t[", "pieces must be an array"},
      {"pieces missing", "\"pieces\":", "\"piecez\":", "but pieces is missing"},
      {"pieces_sha256 missing", "\"pieces_sha256\":", "\"pieces_sha257\":", "but pieces_sha256 is missing"},
      {"pieces_sha256 wrong", "\"pieces_sha256\":\t\"", NULL, "is not the SHA-256 of its pieces"},
      {"whole-file sha256 in version 5", "\"piece_bytes\":", "\"sha256\":\t\"00\", \"piece_bytes\":",
       "sha256 is a key of format version 4 and older"},
      {"pieces in version 4", "\"format_version\":\t6", "\"format_version\":\t4", "piece_bytes is a key of format version 5"},
  };
  for (int i = 0; i < (int)(sizeof c / sizeof c[0]); i++) {
    fresh(dir, sizeof dir);
    const char *t = c[i].to;
    if (!t && strstr(c[i].what, "too many")) {
      snprintf(to, sizeof to, "\"pieces\":\t[\"%s\", ", zeros);
      t = to;
    } else if (!t) { /* another root; the recorded one moves to a key of no meaning */
      snprintf(to, sizeof to, "\"pieces_sha256\":\t\"%s\", \"old\":\t\"", zeros);
      t = to;
    }
    rewrite_manifest(dir, c[i].from, t);
    expect_load_error(dir, c[i].what, "manifest invalid", c[i].needle);
    CHECK(strstr(mc_errmsg(), "files[0] (rank_"), "%s: the file entry is not named: %s", c[i].what, mc_errmsg());
  }
}

static void case_manifest_invalid(void) {
  char dir[4096];
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"shards\":", "\"shardz\":");
  expect_load_error(dir, "manifest missing a key", "manifest invalid", "missing key 'shards'");
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"sha256\":\t\"", "\"sha256\":\t\"x");
  expect_load_error(dir, "manifest bad hash string", "manifest invalid", "sha256 is not 64");
  /* issue 17 item 9: an absurd world size (2^40 and more) was accepted */
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"world\":\t", "\"world\":\t1099511627776");
  expect_load_error(dir, "manifest world 2^40", "manifest invalid", "more than 1048576 ranks");
  /* a rank file listed twice (found by sorting the names, not by comparing every pair) */
  fresh(dir, sizeof dir);
  rewrite_manifest(dir, "\"name\":\t\"rank_1.h5\"", "\"name\":\t\"rank_0.h5\"");
  expect_load_error(dir, "manifest file listed twice", "manifest invalid", "file 'rank_0.h5' listed twice");
}

/* issue 17 item 9: values the parser coerced silently (clamped, truncated to an int, a
 * fraction taken as an integer, an infinity) are refused with the key named. */
static void case_manifest_coercions(void) {
  static const struct {
    const char *what, *from, *to, *says;
  } edits[] = {
      /* 2^64: strtoull clamped it to 2^64-1 */
      {"manifest seed 2^64", "\"seed\":\t\"18446744073709551557\"", "\"seed\":\t\"18446744073709551616\"",
       "training_state.seed' \"18446744073709551616\" is above"},
      /* 2^32 ranks and stages were cut to an int (2^32 -> 0) */
      {"manifest file rank 2^32", "\"rank\":\t0,", "\"rank\":\t4294967296,", "].rank' is 4294967296, more than 2^31-1"},
      {"manifest family stage 2^32", "\"stage\":\t0,", "\"stage\":\t4294967296,", "families[0].stage' is 4294967296"},
      /* a fraction in a replica group was read as its integer part */
      {"manifest replica 0.5", "\"replica_group\":\t[", "\"replica_group\":\t[0.5, ", "replica_group[0] is not a rank"},
      /* 1e999 parses as an infinity */
      {"manifest lr 1e999", "\"lr\":\t", "\"lr\":\t1e999,\n\"lr_was\":\t", "training_state.lr' must be a finite number"},
  };
  char dir[4096];
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    fresh(dir, sizeof dir);
    rewrite_manifest(dir, edits[i].from, edits[i].to);
    expect_load_error(dir, edits[i].what, "manifest invalid", edits[i].says);
  }
  /* a step in latest beyond int64 (its conversion was undefined) */
  fresh(dir, sizeof dir);
  char file[4200];
  pathf(file, sizeof file, "%s/latest", dir);
  FILE *f = fopen(file, "wb");
  fputs("{\"step\": 1e300, \"path\": \"step_5\", \"manifest_sha256\": "
        "\"0000000000000000000000000000000000000000000000000000000000000000\"}",
        f);
  fclose(f);
  expect_load_error(dir, "latest step 1e300", "latest is malformed", NULL);
}

static void case_model_mismatch(void) {
  char dir[4096];
  fresh(dir, sizeof dir);
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return;
  mc_config cfg;
  mc_config_default(&cfg);
  cfg.model.n_experts = 8;
  CHECK(mc_ckpt_check_model(ck, &cfg.model) != 0 && strstr(mc_errmsg(), "model mismatch: model.n_experts is 4"),
        "model mismatch: %s", mc_errmsg());
  mc_ckpt_close(ck);
}

int main(void) {
  char root[2048];
  scratch_dir("corrupt", root, sizeof root);
  g_root = root;
  case_data_flip();
  case_piece_flip();
  case_pieces_invalid();
  case_attr_flip();
  case_manifest_flip();
  case_truncated();
  case_unreadable();
  case_deleted();
  case_missing_dataset();
  case_wrong_root_hash();
  case_bad_latest();
  case_manifest_coercions();
  case_version_too_new();
  case_manifest_invalid();
  case_model_mismatch();
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit("test_ckpt_corrupt");
}
