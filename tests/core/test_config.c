/* Configuration: good files parse, every bad case fails with its own message naming the key
 * and the file, --set and the command line, canonical JSON round trips, and the committed
 * schema and key reference match the key table.
 * `test_config --check FILE...` prints "ok" or "error<TAB>message" per file and
 * `test_config --dump` prints the canonical JSON of the defaults (both for config_cases/check_schema.py). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/layout.h"
#include "tests/check.h"

static char g_src[1024], g_bin[1024];

/* snprintf that fails the test on truncation (checking the result also keeps
 * -Wformat-truncation quiet). */
#define FMT(buf, ...) CHECK(snprintf(buf, sizeof buf, __VA_ARGS__) < (int)sizeof buf, "path too long")

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (b) b[n] = 0;
  fclose(f);
  return b;
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

/* Exact structural equality (cJSON_Compare lets numbers differ by about an ulp). */
static int json_equal(const cJSON *a, const cJSON *b) {
  if (!a || !b || (a->type & 0xFF) != (b->type & 0xFF)) return 0;
  if (cJSON_IsNumber(a)) return a->valuedouble == b->valuedouble;
  if (cJSON_IsString(a)) return !strcmp(a->valuestring, b->valuestring);
  if (!cJSON_IsArray(a) && !cJSON_IsObject(a)) return 1;
  if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) return 0;
  const cJSON *y = b->child;
  for (const cJSON *x = a->child; x; x = x->next, y = y ? y->next : NULL) {
    const cJSON *other = cJSON_IsObject(a) ? cJSON_GetObjectItemCaseSensitive(b, x->string) : y;
    if (!json_equal(x, other)) return 0;
  }
  return 1;
}

static int sort_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted *.json names of a directory that start with `prefix`. */
static int list_json(const char *dir, const char *prefix, char names[][128], int cap) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d)) && n < cap;) {
    size_t l = strlen(e->d_name);
    if (l > 5 && l < 128 && !strcmp(e->d_name + l - 5, ".json") && !strncmp(e->d_name, prefix, strlen(prefix)))
      memcpy(names[n++], e->d_name, l + 1);
  }
  closedir(d);
  char *ptr[256];
  for (int i = 0; i < n; i++) ptr[i] = names[i];
  qsort(ptr, (size_t)n, sizeof ptr[0], sort_names);
  char tmp[256][128];
  for (int i = 0; i < n; i++) memcpy(tmp[i], ptr[i], 128);
  for (int i = 0; i < n; i++) memcpy(names[i], tmp[i], 128);
  return n;
}

/* to_json -> defaults + apply_json gives the same bytes and the same text. */
static void check_round_trip(const mc_config *c, const char *what) {
  char *j1 = mc_config_to_json(c);
  CHECK(j1 != NULL, "%s: to_json failed: %s", what, mc_errmsg());
  if (!j1) return;
  mc_config back;
  CHECK_OK(mc_config_default(&back));
  CHECK_OK(mc_config_apply_json(&back, j1, what));
  CHECK(!memcmp(&back, c, sizeof back), "%s: config differs after to_json and apply_json", what);
  char *j2 = mc_config_to_json(&back);
  CHECK(j2 && !strcmp(j1, j2), "%s: canonical JSON differs after a round trip:\n%s\n---\n%s", what, j1, j2 ? j2 : "");
  free(j1);
  free(j2);
}

static void test_defaults(void) {
  mc_config c;
  CHECK_OK(mc_config_default(&c));
  /* The defaults are exactly configs/default.json: compare it with the canonical output. */
  char path[1200];
  FMT(path, "%s/configs/default.json", g_src);
  char *text = read_text(path);
  CHECK(text != NULL, "cannot read %s", path);
  char *out = mc_config_to_json(&c);
  cJSON *a = text ? cJSON_Parse(text) : NULL, *b = out ? cJSON_Parse(out) : NULL;
  CHECK(json_equal(a, b), "canonical defaults differ from configs/default.json:\n%s", out ? out : "");
  cJSON_Delete(a);
  cJSON_Delete(b);
  free(text);
  free(out);
  CHECK(c.model.n_layers == (int)strlen(c.model.pattern), "n_layers %d vs pattern %s", c.model.n_layers, c.model.pattern);
  CHECK(c.parallel.split == MC_SPLIT_EQUAL && c.parallel.split_pattern[0] == 0, "default split");
  check_round_trip(&c, "defaults");
}

/* Reference configs and good cases parse, pass the layout rules and round trip. */
static void test_good_files(void) {
  static char names[256][128];
  char dir[1200], path[1400];
  const char *dirs[2] = {"configs", "tests/core/config_cases"};
  const char *prefix[2] = {"", "good_"};
  int total = 0;
  for (int d = 0; d < 2; d++) {
    FMT(dir, "%s/%s", g_src, dirs[d]);
    int n = list_json(dir, prefix[d], names, 256);
    CHECK(n > 0, "no %s*.json in %s", prefix[d], dir);
    for (int i = 0; i < n; i++, total++) {
      FMT(path, "%s/%s", dir, names[i]);
      mc_config c;
      CHECK_OK(mc_config_default(&c));
      int rc = mc_config_apply_file(&c, path);
      CHECK(rc == 0, "%s: %s", path, mc_errmsg());
      if (rc) continue;
      mc_errlist errs;
      mc_errlist_init(&errs);
      mc_model_check(&c.model, &errs);
      mc_layout_check(&c.model, &c.parallel, &c.train, -1, &errs);
      CHECK(errs.n == 0, "%s breaks %d layout rule(s), first: %s", path, errs.n, errs.n ? errs.msg[0] : "");
      check_round_trip(&c, path);
    }
  }
  /* The reference configurations of docs/design.md section 7 are shipped. */
  const char *refs[] = {"tiny", "nam-small", "nam-medium", "dense-a"};
  for (int i = 0; i < 4; i++) {
    FMT(path, "%s/configs/%s.json", g_src, refs[i]);
    mc_config c;
    CHECK_OK(mc_config_default(&c));
    CHECK(mc_config_apply_file(&c, path) == 0, "%s: %s", path, mc_errmsg());
  }
  printf("good files: %d\n", total);
}

/* Every bad case in config_cases/expect.tsv fails, naming the file and the expected text,
 * and leaves the config untouched; every bad_*.json file is listed there. */
static void test_bad_files(void) {
  char dir[1200], path[1400];
  FMT(dir, "%s/tests/core/config_cases", g_src);
  FMT(path, "%s/expect.tsv", dir);
  char *tsv = read_text(path);
  CHECK(tsv != NULL, "cannot read %s", path);
  if (!tsv) return;
  static char names[256][128];
  int nfiles = list_json(dir, "bad_", names, 256), listed[256] = {0}, rows = 0;
  for (char *line = strtok(tsv, "\n"); line; line = strtok(NULL, "\n")) {
    if (line[0] == '#' || !line[0]) continue;
    char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
    CHECK(t2 != NULL, "malformed expect.tsv line: %s", line);
    if (!t2) continue;
    *t1 = *t2 = 0;
    const char *file = line, *want = t2 + 1;
    for (int i = 0; i < nfiles; i++)
      if (!strcmp(names[i], file)) listed[i] = 1;
    FMT(path, "%s/%s", dir, file);
    mc_config c, before;
    CHECK_OK(mc_config_default(&c));
    before = c;
    int rc = mc_config_apply_file(&c, path);
    CHECK(rc != 0, "%s was accepted", file);
    CHECK(strstr(mc_errmsg(), path) != NULL, "%s: message does not name the file: %s", file, mc_errmsg());
    CHECK(strstr(mc_errmsg(), want) != NULL, "%s: message lacks \"%s\":\n%s", file, want, mc_errmsg());
    CHECK(!memcmp(&c, &before, sizeof c), "%s: a failed apply changed the config", file);
    rows++;
  }
  for (int i = 0; i < nfiles; i++) CHECK(listed[i], "%s is not listed in expect.tsv", names[i]);
  CHECK(rows >= 30, "only %d bad cases", rows);
  printf("bad cases: %d rows over %d files\n", rows, nfiles);
  free(tsv);
}

static void expect_set_error(mc_config *c, const char *assignment, const char *want) {
  mc_config before = *c;
  int rc = mc_config_set(c, assignment);
  CHECK(rc != 0, "--set %s was accepted", assignment);
  CHECK(strstr(mc_errmsg(), want) != NULL, "--set %s: message lacks \"%s\": %s", assignment, want, mc_errmsg());
  CHECK(strstr(mc_errmsg(), "--set") != NULL, "--set %s: message does not name the origin: %s", assignment, mc_errmsg());
  CHECK(!memcmp(c, &before, sizeof before), "--set %s: a failed set changed the config", assignment);
}

static void test_set(void) {
  mc_config c;
  CHECK_OK(mc_config_default(&c));
  CHECK_OK(mc_config_set(&c, "model.d_model=128"));
  CHECK(c.model.d_model == 128, "d_model %d", c.model.d_model);
  CHECK_OK(mc_config_set(&c, "train.lr=2.5e-4"));
  CHECK(c.train.lr == 2.5e-4, "lr %g", c.train.lr);
  CHECK_OK(mc_config_set(&c, "parallel.sp=true"));
  CHECK(c.parallel.sp == 1, "sp");
  CHECK_OK(mc_config_set(&c, "parallel.sp=0"));
  CHECK(c.parallel.sp == 0, "sp");
  CHECK_OK(mc_config_set(&c, "parallel.zero=3"));
  CHECK(c.parallel.zero == 3, "zero");
  CHECK_OK(mc_config_set(&c, "train.dtype=bf16"));
  CHECK(!strcmp(c.train.dtype, "bf16"), "dtype %s", c.train.dtype);
  CHECK_OK(mc_config_set(&c, "checkpoint.dir=/tmp/a=b"));
  CHECK(!strcmp(c.checkpoint.dir, "/tmp/a=b"), "dir %s (only the first '=' separates)", c.checkpoint.dir);
  CHECK_OK(mc_config_set(&c, "train.metrics="));
  CHECK(c.train.metrics[0] == 0, "metrics");
  /* Values that need all 17 digits, and integers above 2^31, survive to_json exactly. */
  CHECK_OK(mc_config_set(&c, "train.lr=0.30000000000000004"));
  CHECK(c.train.lr == 0.1 + 0.2 && c.train.lr != 0.3, "lr %.17g", c.train.lr);
  CHECK_OK(mc_config_set(&c, "train.seed=9007199254740992"));
  check_round_trip(&c, "17-digit lr, seed 2^53");
  CHECK_OK(mc_config_set(&c, "train.seed=18446744073709551615"));
  CHECK(c.train.seed == UINT64_MAX, "seed %llu", (unsigned long long)c.train.seed);
  check_round_trip(&c, "--set values with a seed above 2^53");
  CHECK_OK(mc_config_set(&c, "train.seed=9007199254740993"));
  CHECK(c.train.seed == 9007199254740993ull, "seed %llu (a decimal --set is exact above 2^53)",
        (unsigned long long)c.train.seed);
  check_round_trip(&c, "seed 2^53+1");

  /* Pipes in model.pattern select the explicit split; pp_split changes it back. */
  CHECK_OK(mc_config_set(&c, "model.pattern=AEME|AEMR"));
  CHECK(!strcmp(c.model.pattern, "AEMEAEMR") && c.model.n_layers == 8, "pattern %s n_layers %d", c.model.pattern,
        c.model.n_layers);
  CHECK(c.parallel.split == MC_SPLIT_EXPLICIT && !strcmp(c.parallel.split_pattern, "AEME|AEMR"), "split %d %s",
        c.parallel.split, c.parallel.split_pattern);
  check_round_trip(&c, "explicit split from a piped pattern");
  CHECK_OK(mc_config_set(&c, "parallel.pp_split=weighted"));
  CHECK(c.parallel.split == MC_SPLIT_WEIGHTED && c.parallel.split_pattern[0] == 0, "weighted clears the boundaries");
  expect_set_error(&c, "parallel.pp_split=explicit", "needs stage boundaries");
  CHECK_OK(mc_config_set(&c, "parallel.pp_split=AE|ME|AE|MR"));
  CHECK(c.parallel.split == MC_SPLIT_EXPLICIT && !strcmp(c.parallel.split_pattern, "AE|ME|AE|MR"), "piped pp_split");
  CHECK(!strcmp(c.model.pattern, "AEMEAEMR"), "pp_split does not change model.pattern");
  check_round_trip(&c, "piped pp_split");
  CHECK_OK(mc_config_set(&c, "parallel.pp_split=explicit"));
  CHECK(c.parallel.split == MC_SPLIT_EXPLICIT && !strcmp(c.parallel.split_pattern, "AE|ME|AE|MR"), "explicit keeps");
  CHECK_OK(mc_config_set(&c, "parallel.pp_split=equal"));
  CHECK(c.parallel.split == MC_SPLIT_EQUAL, "equal");

  expect_set_error(&c, "train.steps=abc", "train.steps: \"abc\" is not an integer");
  expect_set_error(&c, "train.steps=1.5", "train.steps: \"1.5\" is not an integer");
  expect_set_error(&c, "train.steps=-1", "train.steps: -1 is out of range [0, 2147483647]");
  expect_set_error(&c, "train.steps=99999999999", "train.steps: 99999999999 is out of range");
  expect_set_error(&c, "train.lr=fast", "train.lr: \"fast\" is not a number");
  expect_set_error(&c, "train.lr=nan", "train.lr: \"nan\" is not a number");
  expect_set_error(&c, "train.lr=", "train.lr: \"\" is not a number");
  expect_set_error(&c, "parallel.sp=yes", "parallel.sp: \"yes\" is not true or false");
  expect_set_error(&c, "parallel.zero=2", "parallel.zero: 2 is not one of 0, 1, 3");
  expect_set_error(&c, "train.dtype=fp16", "train.dtype: \"fp16\" is not one of \"fp32\", \"bf16\"");
  expect_set_error(&c, "train.seed=-5", "train.seed: \"-5\" is not a non-negative decimal integer");
  expect_set_error(&c, "train.seed=18446744073709551616", "is above the maximum 18446744073709551615");
  expect_set_error(&c, "model.pattern=AEQR", "model.pattern: unknown block letter 'Q' at position 2");
  expect_set_error(&c, "model.n_layers=4", "model.n_layers: unknown key");
  expect_set_error(&c, "model.dmodel=4", "model.dmodel: unknown key (did you mean \"d_model\"?)");
  expect_set_error(&c, "trian.lr=1", "unknown section \"trian\" (did you mean \"train\"?)");
  expect_set_error(&c, "train.lr", "is not of the form section.key=value");
  expect_set_error(&c, "lr=1", "is not of the form section.key=value");
  expect_set_error(&c, "train.=1", "is not of the form section.key=value");
  expect_set_error(&c, "checkpoint.dir=", "checkpoint.dir: must not be empty");
}

static void test_apply_json(void) {
  mc_config c;
  CHECK_OK(mc_config_default(&c));
  mc_config before = c;
  /* All problems of a document are reported, not only the first. */
  int rc = mc_config_apply_json(&c, "{\"model\": {\"d_model\": -1, \"pattern\": \"AXMY\"}, \"parallel\": {\"sp\": \"no\"}}",
                                "inline.json");
  CHECK(rc != 0, "accepted");
  const char *m = mc_errmsg();
  CHECK(strstr(m, "inline.json: invalid configuration (4 problems)") != NULL, "%s", m);
  CHECK(strstr(m, "inline.json: model.d_model: -1 is out of range [1, 65536]") != NULL, "%s", m);
  CHECK(strstr(m, "model.pattern: unknown block letter 'X' at position 1") != NULL, "%s", m);
  CHECK(strstr(m, "model.pattern: unknown block letter 'Y' at position 3") != NULL, "%s", m);
  CHECK(strstr(m, "parallel.sp: expected true or false, got a string") != NULL, "%s", m);
  CHECK(!memcmp(&c, &before, sizeof c), "failed apply changed the config");
  /* A single problem is the whole message. */
  rc = mc_config_apply_json(&c, "{\"parallel\": {\"zero\": 2}}", "configs/x.json");
  CHECK(rc != 0 && !strcmp(mc_errmsg(), "configs/x.json: parallel.zero: 2 is not one of 0, 1, 3"), "%s", mc_errmsg());
  /* Overlay: keys not given keep their values. */
  CHECK_OK(mc_config_apply_json(&c, "{\"train\": {\"steps\": 5}, \"parallel\": {}}", "overlay"));
  CHECK(c.train.steps == 5 && c.model.d_model == before.model.d_model && c.train.lr == before.train.lr, "overlay");
  /* Numbers written as integral floats are integers; integers are fine for float keys. */
  CHECK_OK(mc_config_apply_json(&c, "{\"model\": {\"d_model\": 96.0, \"rope_theta\": 500000}}", "numbers"));
  CHECK(c.model.d_model == 96 && c.model.rope_theta == 500000.0, "numbers");
  CHECK_OK(mc_config_apply_json(&c, "{\"train\": {\"seed\": 9007199254740992}}", "seed 2^53"));
  CHECK(c.train.seed == 9007199254740992ull, "seed 2^53 as a JSON number");
  /* A piped pattern and a named split of the same document contradict each other, but a
   * later document may change the split. */
  rc = mc_config_apply_json(&c, "{\"model\": {\"pattern\": \"AE|MR\"}, \"parallel\": {\"pp_split\": \"weighted\"}}", "doc");
  CHECK(rc != 0 && strstr(mc_errmsg(), "contradicts") != NULL, "%s", mc_errmsg());
  CHECK_OK(mc_config_apply_json(&c, "{\"model\": {\"pattern\": \"AE|MR\"}}", "doc1"));
  CHECK_OK(mc_config_apply_json(&c, "{\"parallel\": {\"pp_split\": \"weighted\"}}", "doc2"));
  CHECK(c.parallel.split == MC_SPLIT_WEIGHTED && !strcmp(c.model.pattern, "AEMR"), "later document");
  rc = mc_config_apply_json(&c, "", "empty");
  CHECK(rc != 0 && strstr(mc_errmsg(), "empty: not valid JSON") != NULL, "%s", mc_errmsg());
  rc = mc_config_apply_json(&c, "{} {}", "two");
  CHECK(rc != 0 && strstr(mc_errmsg(), "two: not valid JSON at line 1, column 4") != NULL, "%s", mc_errmsg());
}

static void test_args(void) {
  char cfgpath[1400], p2[1400];
  FMT(cfgpath, "%s/tests/core/config_cases/good_partial.json", g_src);
  FMT(p2, "%s/configs/nam-small.json", g_src);
  char a_config_eq[1500];
  FMT(a_config_eq, "--config=%s", cfgpath);
  /* --set comes first on the line but is applied after both files. */
  char *argv[] = {"prog", "--set", "train.lr=0.5", "positional", "--config", p2, a_config_eq, "--set=train.steps=7",
                  "-v", "--", "--set", "x", NULL};
  int argc = 12;
  mc_config c;
  int rc = mc_config_from_args(&c, &argc, argv);
  CHECK(rc == 0, "%s", mc_errmsg());
  CHECK(argc == 6, "argc %d", argc);
  const char *left[] = {"prog", "positional", "-v", "--", "--set", "x"};
  for (int i = 0; i < 6 && i < argc; i++) CHECK(!strcmp(argv[i], left[i]), "argv[%d]=%s, want %s", i, argv[i], left[i]);
  CHECK(argv[argc] == NULL, "argv[argc] not NULL");
  CHECK(c.train.lr == 0.5 && c.train.steps == 7, "sets applied last: lr %g steps %d", c.train.lr, c.train.steps);
  CHECK(c.train.seed == 7 && c.parallel.sp == 1, "good_partial.json applied after nam-small.json");
  CHECK(c.model.d_model == 1024, "nam-small.json applied: d_model %d", c.model.d_model);

  char *none[] = {"prog", NULL};
  argc = 1;
  mc_config d, def;
  CHECK_OK(mc_config_from_args(&d, &argc, none));
  CHECK_OK(mc_config_default(&def));
  CHECK(argc == 1 && !memcmp(&d, &def, sizeof d), "no arguments gives the defaults");

  char *missing[] = {"prog", "--config", "/nonexistent/dir/x.json", NULL};
  argc = 3;
  rc = mc_config_from_args(&d, &argc, missing);
  CHECK(rc != 0 && strstr(mc_errmsg(), "/nonexistent/dir/x.json: cannot open config file") != NULL, "%s", mc_errmsg());
  CHECK(argc == 3, "argv untouched on error");
  char syntax[1400];
  FMT(syntax, "%s/tests/core/config_cases/bad_syntax.json", g_src);
  char *bad[] = {"prog", "--config", syntax, NULL};
  argc = 3;
  rc = mc_config_from_args(&d, &argc, bad);
  CHECK(rc != 0 && strstr(mc_errmsg(), "bad_syntax.json: not valid JSON at line 4") != NULL, "%s", mc_errmsg());
  char *dangling[] = {"prog", "--set", NULL};
  argc = 2;
  rc = mc_config_from_args(&d, &argc, dangling);
  CHECK(rc != 0 && strstr(mc_errmsg(), "--set needs an argument") != NULL, "%s", mc_errmsg());
  char *badset[] = {"prog", "--set", "parallel.tp=two", NULL};
  argc = 3;
  rc = mc_config_from_args(&d, &argc, badset);
  CHECK(rc != 0 && strstr(mc_errmsg(), "--set: parallel.tp: \"two\" is not an integer") != NULL, "%s", mc_errmsg());
  char *emptyeq[] = {"prog", "--config=", NULL};
  argc = 2;
  rc = mc_config_from_args(&d, &argc, emptyeq);
  CHECK(rc != 0 && strstr(mc_errmsg(), "--config= needs a file name") != NULL, "%s", mc_errmsg());
  CHECK(mc_config_apply_file(&d, g_src) != 0, "a directory is not a config file");
}

/* The committed schema and docs table are what the key table generates. */
static void test_generated(void) {
  char path[1400], out[1400];
  char *gen = mc_config_schema_json();
  CHECK(gen != NULL, "schema: %s", mc_errmsg());
  FMT(path, "%s/schemas/config.schema.json", g_src);
  char *file = read_text(path);
  cJSON *a = gen ? cJSON_Parse(gen) : NULL, *b = file ? cJSON_Parse(file) : NULL;
  int same = json_equal(a, b);
  FMT(out, "%s/config.schema.json", g_bin);
  if (gen) write_text(out, gen);
  CHECK(same, "%s is not what core/config.c generates; the generated one is in %s", path, out);
  cJSON_Delete(a);
  cJSON_Delete(b);
  free(gen);
  free(file);

  char *md = mc_config_reference_markdown();
  CHECK(md != NULL, "markdown: %s", mc_errmsg());
  FMT(path, "%s/docs/config.md", g_src);
  file = read_text(path);
  same = md && file && strstr(file, md) != NULL;
  FMT(out, "%s/config-keys.md", g_bin);
  if (md) write_text(out, md);
  CHECK(same, "%s does not contain the key reference core/config.c generates; it is in %s", path, out);
  free(md);
  free(file);
}

int main(int argc, char **argv) {
  const char *s = getenv("MC_SOURCE_DIR"), *b = getenv("MC_BINARY_DIR");
  FMT(g_src, "%s", s ? s : ".");
  FMT(g_bin, "%s", b ? b : ".");
  if (argc > 1 && !strcmp(argv[1], "--check")) {
    for (int i = 2; i < argc; i++) {
      mc_config c;
      int rc = mc_config_default(&c) || mc_config_apply_file(&c, argv[i]);
      if (!rc) {
        printf("ok\n");
        continue;
      }
      printf("error\t");
      for (const char *p = mc_errmsg(); *p; p++) putchar(*p == '\n' ? ' ' : *p);
      putchar('\n');
    }
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--dump")) {
    mc_config c;
    if (mc_config_default(&c)) return fprintf(stderr, "%s\n", mc_errmsg()), 1;
    char *j = mc_config_to_json(&c);
    printf("%s\n", j);
    free(j);
    return 0;
  }
  test_defaults();
  test_good_files();
  test_bad_files();
  test_set();
  test_apply_json();
  test_args();
  test_generated();
  return mc_check_exit("test_config");
}
