/* Rotary position embedding, rotate-half form: the pair (v_i, v_{i+hd/2}) at position t is
 * rotated by t * theta^(-2i/hd). The backward applies the inverse (transposed) rotation. */
#include <math.h>

#include "kernels/cpu/cpu.h"

/* sign = +1 rotates forward, -1 rotates back; out += rot(in) when accumulate, else in place. */
static void rope_apply(const float *in, float *out, int accumulate, int n, int T, int heads, int hd,
                       double theta, double sign) {
  int half = hd / 2;
#pragma omp parallel for if ((int64_t)n * heads * hd > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    double t = (double)(r % T);
    for (int i = 0; i < half; i++) {
      double ang = t * pow(theta, -2.0 * i / hd);
      float c = (float)cos(ang), s = (float)(sign * sin(ang));
      for (int h = 0; h < heads; h++) {
        int64_t o = (int64_t)r * heads * hd + (int64_t)h * hd + i;
        float x1 = in[o], x2 = in[o + half];
        float y1 = x1 * c - x2 * s, y2 = x1 * s + x2 * c;
        if (accumulate) {
          out[o] += y1;
          out[o + half] += y2;
        } else {
          out[o] = y1;
          out[o + half] = y2;
        }
      }
    }
  }
}

void mc_cpu_rope_fwd(mc_backend *be, float *x, int n, int T, int heads, int hd, double theta) {
  (void)be;
  rope_apply(x, x, 0, n, T, heads, hd, theta, 1.0);
}

void mc_cpu_rope_bwd(mc_backend *be, const float *dy, float *dx, int n, int T, int heads, int hd,
                     double theta) {
  (void)be;
  rope_apply(dy, dx, 1, n, T, heads, hd, theta, -1.0);
}
