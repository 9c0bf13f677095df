/* Rotary position embedding, rotate-half form: the pair (v_i, v_{i+hd/2}) at position t is
 * rotated by t * theta^(-2i/hd). The backward applies the inverse (transposed) rotation. */
#include <math.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

/* sign = +1 rotates forward, -1 rotates back; out gains rot(in) when accumulate (added into
 * fp32, written into bf16), else in place (in is out as stored). */
static void rope_apply(mc_operand in, mc_dst out, int accumulate, int n, int T, int heads, int hd, double theta,
                       double sign) {
  int half = hd / 2;
#pragma omp parallel for if ((int64_t)n * heads * hd > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    double t = (double)(r % T);
    for (int i = 0; i < half; i++) {
      double ang = t * pow(theta, -2.0 * i / hd);
      float c = (float)cos(ang), s = (float)(sign * sin(ang));
      for (int h = 0; h < heads; h++) {
        int64_t o = (int64_t)r * heads * hd + (int64_t)h * hd + i;
        float x1 = mc_operand_at(in, o), x2 = mc_operand_at(in, o + half);
        float y1 = x1 * c - x2 * s, y2 = x1 * s + x2 * c;
        if (accumulate) {
          mc_dst_acc(out, o, y1);
          mc_dst_acc(out, o + half, y2);
        } else {
          mc_dst_set(out, o, y1);
          mc_dst_set(out, o + half, y2);
        }
      }
    }
  }
}

void mc_cpu_rope_fwd(mc_backend *be, mc_dst x, int n, int T, int heads, int hd, double theta) {
  (void)be;
  rope_apply((mc_operand){x.f, x.h}, x, 0, n, T, heads, hd, theta, 1.0);
}

void mc_cpu_rope_bwd(mc_backend *be, mc_operand dy, mc_dst dx, int n, int T, int heads, int hd, double theta) {
  (void)be;
  rope_apply(dy, dx, 1, n, T, heads, hd, theta, -1.0);
}
