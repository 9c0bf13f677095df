/* Causal grouped-query attention, flash style: the forward keeps only the per-row softmax
 * log-normaliser (lse); the backward recomputes each probability from it, so no T x T matrix
 * is ever stored. Backward, with p = exp(s - lse), D_i = dout_i . out_i:
 *   dv_j += p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
 *   dq_i += scale ds_ij k_j,  dk_j += scale ds_ij q_i. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

static inline float dotf(const float *a, const float *b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static void attn_fwd_f32(const float *q, const float *k, const float *v, int n_seq, int T, int H, int KV, int hd,
                         float *out, float *lse) {
  const float scale = 1.0f / sqrtf((float)hd);
  const int grp = H / KV;
  const int64_t qs = (int64_t)H * hd, ks = (int64_t)KV * hd;
#pragma omp parallel if ((int64_t)n_seq * H * T * T * hd / 2 > MC_CPU_PAR_MIN)
  {
    float *p = malloc((size_t)T * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
    for (int s = 0; s < n_seq; s++) {
      for (int h = 0; h < H; h++) {
        if (!p) {
          mc_cpu_fail("attn_fwd: out of memory for the score row");
          continue;
        }
        int kh = h / grp;
        for (int i = 0; i < T; i++) {
          int64_t ri = (int64_t)s * T + i;
          const float *qi = q + ri * qs + (int64_t)h * hd;
          float m = -INFINITY;
          for (int j = 0; j <= i; j++) {
            p[j] = scale * dotf(qi, k + ((int64_t)s * T + j) * ks + (int64_t)kh * hd, hd);
            if (p[j] > m) m = p[j];
          }
          double l = 0.0;
          for (int j = 0; j <= i; j++) {
            p[j] = expf(p[j] - m);
            l += p[j];
          }
          float *oi = out + ri * qs + (int64_t)h * hd;
          for (int c = 0; c < hd; c++) oi[c] = 0.0f;
          float inv = (float)(1.0 / l);
          for (int j = 0; j <= i; j++) {
            const float *vj = v + ((int64_t)s * T + j) * ks + (int64_t)kh * hd;
            float w = p[j] * inv;
            for (int c = 0; c < hd; c++) oi[c] += w * vj[c];
          }
          lse[ri * H + h] = m + (float)log(l);
        }
      }
    }
    free(p);
  }
}

static void attn_bwd_f32(const float *q, const float *k, const float *v, const float *out, const float *lse,
                         const float *dout, int n_seq, int T, int H, int KV, int hd, float *dq, float *dk, float *dv) {
  const float scale = 1.0f / sqrtf((float)hd);
  const int grp = H / KV;
  const int64_t qs = (int64_t)H * hd, ks = (int64_t)KV * hd;
  /* One task per (sequence, kv head): it owns that head's dk, dv and its query heads' dq. */
#pragma omp parallel for collapse(2) schedule(dynamic) if ((int64_t)n_seq * H * T * T * hd > MC_CPU_PAR_MIN)
  for (int s = 0; s < n_seq; s++) {
    for (int kh = 0; kh < KV; kh++) {
      for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        for (int i = 0; i < T; i++) {
          int64_t ri = (int64_t)s * T + i;
          const float *qi = q + ri * qs + (int64_t)h * hd;
          const float *doi = dout + ri * qs + (int64_t)h * hd;
          float *dqi = dq + ri * qs + (int64_t)h * hd;
          float Di = dotf(doi, out + ri * qs + (int64_t)h * hd, hd);
          float li = lse[ri * H + h];
          for (int j = 0; j <= i; j++) {
            int64_t rj = (int64_t)s * T + j;
            const float *kj = k + rj * ks + (int64_t)kh * hd;
            const float *vj = v + rj * ks + (int64_t)kh * hd;
            float p = expf(scale * dotf(qi, kj, hd) - li);
            float ds = p * (dotf(doi, vj, hd) - Di) * scale;
            float *dkj = dk + rj * ks + (int64_t)kh * hd;
            float *dvj = dv + rj * ks + (int64_t)kh * hd;
            for (int c = 0; c < hd; c++) {
              dvj[c] += p * doi[c];
              dqi[c] += ds * kj[c];
              dkj[c] += ds * qi[c];
            }
          }
        }
      }
    }
  }
}

/* ---- inputs stored in bf16 are widened into temporaries, a bf16 out is rounded from the
 * fp32 result: the same values as the fp32 op on the widened inputs */

void mc_cpu_attn_fwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T, int H, int KV,
                     int hd, mc_dst out, float *lse) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *oq, *ok, *ov, *oo = NULL;
  const float *qf = mc_cpu_widen(q, nq, &oq, "attn_fwd: out of memory widening q");
  const float *kf = mc_cpu_widen(k, nk, &ok, "attn_fwd: out of memory widening k");
  const float *vf = mc_cpu_widen(v, nk, &ov, "attn_fwd: out of memory widening v");
  float *of = out.h ? (oo = malloc((size_t)(nq > 0 ? nq : 1) * sizeof(float))) : out.f;
  if (!of) mc_cpu_fail("attn_fwd: out of memory for the fp32 output");
  if (qf && kf && vf && of) {
    attn_fwd_f32(qf, kf, vf, n_seq, T, H, KV, hd, of, lse);
    if (out.h) mc_cpu_to_bf16(be, of, out.h, nq);
  }
  free(oq), free(ok), free(ov), free(oo);
}

void mc_cpu_attn_bwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out, const float *lse,
                     mc_operand dout, int n_seq, int T, int H, int KV, int hd, float *dq, float *dk, float *dv) {
  (void)be;
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *oq, *ok, *ov, *oo, *od;
  const float *qf = mc_cpu_widen(q, nq, &oq, "attn_bwd: out of memory widening q");
  const float *kf = mc_cpu_widen(k, nk, &ok, "attn_bwd: out of memory widening k");
  const float *vf = mc_cpu_widen(v, nk, &ov, "attn_bwd: out of memory widening v");
  const float *of = mc_cpu_widen(out, nq, &oo, "attn_bwd: out of memory widening out");
  const float *df = mc_cpu_widen(dout, nq, &od, "attn_bwd: out of memory widening dout");
  if (qf && kf && vf && of && df) attn_bwd_f32(qf, kf, vf, of, lse, df, n_seq, T, H, KV, hd, dq, dk, dv);
  free(oq), free(ok), free(ov), free(oo), free(od);
}
