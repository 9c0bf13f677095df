/* Activation bytes per block: each term is a tensor the backward pass reads, counted where
 * it lives. Three kinds of tensor:
 *   seq  - width over the full model dimension, replicated over TP, split over the sequence
 *          under SP (layer input x, norm output u): tokens_seq rows;
 *   tp   - outputs of TP-split projections: tokens rows, width / tp;
 *   full - computed redundantly on every TP rank over the whole sequence (Mamba B, C).
 * Statistics (RMSNorm 1/rms, attention log-sum-exp, router probabilities, scan states) are
 * fp32; everything else uses the activation dtype. docs/mcplan.md lists the formulas. */
#include "plan/activations.h"

#include <math.h>
#include <string.h>

/* A chunked selective scan keeps its state at every MC_SSM_CHUNK-th position and recomputes
 * inside a chunk during backward. */
#define MC_SSM_CHUNK 64

void mc_act_shape_of(const mc_model *m, const mc_layout *l, int micro_batch, int abytes,
                     mc_act_shape *s) {
  s->tp = l->tp > 0 ? l->tp : 1;
  s->tokens = (int64_t)micro_batch * m->seq_len;
  s->tokens_seq = l->sp ? s->tokens / s->tp : s->tokens;
  s->abytes = s->pbytes = abytes;
}

/* (token, expert) assignments the rank handles per micro-batch: balanced routing when
 * dropless, the capacity bound cf * average with a capacity factor. */
static int64_t moe_assignments(const mc_model *m, const mc_act_shape *s) {
  double rf = m->capacity_factor > 0 ? m->capacity_factor : 1.0;
  return (int64_t)ceil((double)s->tokens_seq * m->top_k * rf);
}

int64_t mc_act_block_bytes(const mc_model *m, const mc_act_shape *s, char block, mc_recompute r) {
  const int64_t a = s->abytes, t = s->tp, d = m->d_model;
  const int64_t Ts = s->tokens_seq, Tf = s->tokens;
  /* Every policy keeps the layer input x; the others also keep the norm's 1/rms. */
  int64_t bytes = Ts * d * a;
  if (r == MC_RECOMPUTE_FULL) return bytes;
  bytes += Ts * 4;
  const int none = r == MC_RECOMPUTE_NONE;
  /* u = RMSNorm(x) * w, input of every projection (a routed E layer also routes and permutes
   * it; a plain one, mc_moe_is_plain without SP, only multiplies it) */
  const int plain = block == 'E' && mc_moe_is_plain(m, m->seq_len) && Ts == Tf, routed = block == 'E' && !plain;
  if (none) bytes += Ts * d * (routed ? a : s->pbytes);
  switch (block) {
    case 'A': {
      const int64_t q = (int64_t)m->n_heads * m->head_dim / t;
      const int64_t kv = (int64_t)m->n_kv_heads * m->head_dim / t;
      bytes += Tf * (q + 2 * kv) * s->pbytes;    /* q, k, v (after RoPE) */
      if (none) {
        bytes += Tf * q * s->pbytes;             /* o, softmax(qk^T)v, input of wo */
        bytes += Tf * (m->n_heads / t) * 4;      /* log-sum-exp per head (fused attention) */
      }
      break;
    }
    case 'M': {
      const int64_t di = m->mamba_inner / t, hm = mc_mamba_heads(m) / t, n = m->ssm_state;
      bytes += Tf * di * s->pbytes;              /* z (input of the gate only) */
      bytes += Tf * (di + hm) * a;               /* x (before conv), dt (before softplus) */
      bytes += Tf * 2 * n * a;                   /* B, C (before conv), on every TP rank */
      if (none) {
        bytes += Tf * 2 * n * a;                 /* conv outputs of B, C */
        bytes += Tf * 3 * di * a;                /* conv output of x, y, g = y*silu(z) */
        bytes += Tf * di * s->pbytes;            /* norm(g), input of wout */
        bytes += Tf * hm * 4;                    /* per-head 1/rms of the gated norm */
        bytes += Tf * di * n * 4 / MC_SSM_CHUNK; /* scan state at chunk boundaries */
      }
      break;
    }
    case 'E': {
      const int64_t e = m->n_experts, k = m->top_k, f = m->expert_hidden;
      const int64_t as = moe_assignments(m, s);
      bytes += Ts * e * 4;                       /* router probabilities (fp32) */
      bytes += Ts * k * (4 + 4);                 /* top-k expert index and gate */
      if (!plain) bytes += as * d * (s->pbytes + a); /* dispatched input, expert output */
      bytes += as * 2 * f * s->pbytes;           /* u w1^T, u w3^T (inputs of the SwiGLU only) */
      if (none) bytes += as * f * s->pbytes;     /* silu(u w1^T) * (u w3^T), input of w2 */
      break;
    }
    case 'R': {
      const int64_t dr = m->rec_width / t;
      bytes += Tf * 2 * dr * s->pbytes;          /* u w_x^T, u w_gate^T (inputs of gates only) */
      bytes += Tf * 2 * dr * a;                  /* u w_r^T, u w_i^T (biased in place) */
      if (none) bytes += Tf * dr * (a + s->pbytes); /* h (scan output); h * gelu(gate), input of w_out */
      break;
    }
    default: break;
  }
  return bytes;
}

int64_t mc_act_embed_bytes(const mc_act_shape *s) { return s->tokens * 4; }

/* The gradient buffers one block's backward uses (the trainer shares them between layers):
 * fp32 sums, and at the product-input bytes the gradients that feed only products or gates. */
int64_t mc_act_bwd_scratch_bytes(const mc_model *m, const mc_act_shape *s, char block) {
  const int64_t a = 4, p = s->pbytes, t = s->tp, d = m->d_model, Tf = s->tokens;
  switch (block) {
    case 'A': {
      const int64_t q = (int64_t)m->n_heads * m->head_dim / t, kv = (int64_t)m->n_kv_heads * m->head_dim / t;
      /* dq, dk, dv sums; dout, rotated-back dq, dk (and a bf16 copy of dv) */
      return Tf * (q + 2 * kv) * a + Tf * (2 * q + kv + (p < a ? kv : 0)) * p;
    }
    case 'M': {
      const int64_t di = m->mamba_inner / t, hm = mc_mamba_heads(m) / t, n = m->ssm_state;
      /* d(norm g), dg, dy, d conv x (3), dz; dB, dC through their convs (6); ddt (2) */
      return Tf * (6 * di * a + di * p + 6 * n * a + 2 * hm * a);
    }
    case 'E': {
      const int64_t as = moe_assignments(m, s), f = m->expert_hidden, e = m->n_experts, k = m->top_k;
      /* d(expert output), d(dispatched input); da, dh1, dh3; gate and router gradients */
      return as * 2 * d * a + as * 3 * f * p + s->tokens_seq * (k + e) * 4;
    }
    case 'R': {
      const int64_t dr = m->rec_width / t;
      /* dh, dgx, dr, d(r pre), d(i pre); dout, d(gate pre), dxb */
      return Tf * dr * (5 * a + 3 * p);
    }
    default: return 0;
  }
}

int64_t mc_act_working_bytes(const mc_model *m, const mc_layout *l, const mc_act_shape *s, const char *blocks,
                             int has_head) {
  const int64_t d = m->d_model, Ts = s->tokens_seq, Tf = s->tokens;
  int64_t scratch = 0;
  for (const char *b = blocks; *b; b++) {
    const int64_t x = mc_act_bwd_scratch_bytes(m, s, *b);
    scratch = x > scratch ? x : scratch;
  }
  /* x (the head counts it) and its gradient (residual rows), a block input's gradient, a
   * block's output and the gathered rows (whole rows); tokens in and out, loss, lse */
  int64_t rows = ((has_head ? 1 : 2) * Ts + 3 * Tf) * d * 4 + Tf * 4 * 4;
  if (s->tp > 1) rows += (Ts + 2 * Tf + (l->sp ? Tf : 0)) * d * 4; /* shard, staging, embedding rows, gathered u */
  return scratch + rows;
}

int64_t mc_act_head_bytes(const mc_model *m, const mc_act_shape *s, mc_recompute r) {
  const int64_t a = s->abytes, d = m->d_model;
  const int64_t vp = mc_vocab_padded(m) / s->tp;
  /* Final-norm input and 1/rms, labels, the fp32 logits of the vocab slice and their gradient
   * (the product-input dtype). The logits are needed at once by the loss, so no policy
   * recomputes them. */
  int64_t bytes = s->tokens_seq * (d * a + 4) + s->tokens * 4 + s->tokens * vp * (4 + s->pbytes);
  if (r == MC_RECOMPUTE_NONE) bytes += s->tokens_seq * d * s->pbytes; /* final-norm output, head input */
  return bytes;
}

void mc_act_moe_scratch(const mc_model *m, const mc_layout *l, const mc_act_shape *s,
                        mc_moe_scratch *out) {
  memset(out, 0, sizeof *out);
  const int64_t a = s->abytes, d = m->d_model;
  const int64_t sent = s->tokens_seq * m->top_k;
  const int ep = l->ep > 0 ? l->ep : 1;
  out->assignments = moe_assignments(m, s);
  out->counts = (int64_t)m->n_experts * 4 + 2 * (int64_t)ep * 8 + sent * 4;
  out->send = sent * d * a;
  out->recv = out->assignments * d * a;
  out->combine = sent * d * a;
  out->total = out->counts + out->send + out->recv + out->combine;
}
