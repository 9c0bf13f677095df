/* mc_box_copy: a piece of one row-major box copied into another, in 1, 2 and 3 dimensions,
 * checked element by element against the global coordinates each value encodes. */
#include <string.h>

#include "core/box.h"
#include "tests/check.h"

/* The value of global element (i, j, k) of a tensor of extent [*, 100, 100]. */
static float at(const int64_t *g) { return (float)(g[0] * 10000 + g[1] * 100 + g[2]); }

static void fill(float *a, const mc_box *b) {
  int64_t g[3] = {0, 0, 0}, c[3] = {1, 1, 1}, s[3] = {0, 0, 0}, n = 0;
  for (int d = 0; d < b->ndim; d++) c[3 - b->ndim + d] = b->count[d], s[3 - b->ndim + d] = b->start[d];
  for (g[0] = s[0]; g[0] < s[0] + c[0]; g[0]++)
    for (g[1] = s[1]; g[1] < s[1] + c[1]; g[1]++)
      for (g[2] = s[2]; g[2] < s[2] + c[2]; g[2]++) a[n++] = at(g);
}

static void check_copy(int ndim, const int64_t *s0, const int64_t *c0, const int64_t *s1, const int64_t *c1) {
  mc_box src = mc_box_make(ndim, s0, c0), dst = mc_box_make(ndim, s1, c1), part;
  CHECK(mc_box_intersect(&src, &dst, &part) > 0, "ndim %d: the test boxes must overlap", ndim);
  float a[1000], b[1000], want[1000];
  fill(a, &src);
  for (int i = 0; i < 1000; i++) b[i] = -1.0f;
  mc_box_copy(a, &src, b, &dst, &part);
  fill(want, &dst);
  /* inside the piece: the source's value of that element; outside: untouched */
  int64_t n = mc_box_numel(&dst), bad = 0;
  int64_t g[3];
  for (int64_t e = 0; e < n; e++) {
    int64_t rest = e;
    for (int d = ndim - 1; d >= 0; d--) g[d] = dst.start[d] + rest % dst.count[d], rest /= dst.count[d];
    int in = 1;
    for (int d = 0; d < ndim; d++) in &= g[d] >= part.start[d] && g[d] < part.start[d] + part.count[d];
    bad += in ? b[e] != want[e] : b[e] != -1.0f;
  }
  CHECK(bad == 0, "ndim %d: %lld elements wrong", ndim, (long long)bad);
}

int main(void) {
  check_copy(1, (int64_t[]){3}, (int64_t[]){10}, (int64_t[]){0}, (int64_t[]){8});
  check_copy(2, (int64_t[]){2, 1}, (int64_t[]){5, 6}, (int64_t[]){4, 0}, (int64_t[]){4, 4});
  check_copy(3, (int64_t[]){0, 1, 2}, (int64_t[]){3, 4, 5}, (int64_t[]){1, 0, 4}, (int64_t[]){3, 3, 6});
  return mc_check_exit("test_box");
}
