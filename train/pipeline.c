/* Pipeline parallelism on CPU ranks (train/pipeline.h): the 1F1B schedule over a step's
 * micro-batches, the boundary sends and receives, and the per-micro-batch activation slots.
 *
 * Deadlock freedom with blocking point-to-point calls (a large MPI send may wait for its
 * receive): on every link (s, s+1) both sides issue their calls in the same order. Stage s
 * sends the activation of micro-batch i and then receives the gradient of micro-batch j
 * (the pair of one steady 1F1B step); stage s+1, after its backward of j, first receives the
 * activation its next forward needs and then sends the gradient of j. Checked by simulating
 * the calls with rendezvous semantics for pp 2..6 and 1..9 micro-batches (every schedule
 * completes, and stage s never holds more than min(pp - s, n_micro) micro-batches). */
#include <string.h>

#include "train/net_blocks.h"
#include "train/pipeline.h"
#include "util/error.h"

/* Makes net->layers hold slot k's activation pointers (the layer buffers of one micro-batch
 * in flight); the slot in use is written back first (its host-side MoE results included). */
static void use_slot(mc_net *net, int k) {
  if (net->n_slots <= 1 || k == net->cur_slot) return;
  const int nl = net->L1 - net->L0;
  memcpy(net->slots + (size_t)net->cur_slot * nl, net->layers + net->L0, (size_t)nl * sizeof(mc_layer));
  memcpy(net->layers + net->L0, net->slots + (size_t)k * nl, (size_t)nl * sizeof(mc_layer));
  net->cur_slot = k;
}

typedef enum { ACT = 0, GRAD = 1 } boundary;

/* Sends (send = 1) or receives the boundary rows of micro-batch mb: activations (net->x) go
 * to the next stage, gradients (net->dx) to the previous one. */
static int p2p(mc_net *net, int send, boundary what, int mb, int n_seq) {
  mc_comm *pp = net->par.comm->pp;
  const int64_t count = (int64_t)n_seq * net->par.T_res * net->m.d_model;
  float *buf = what == ACT ? net->x : net->dx;
  const int to_next = (what == ACT) == (send != 0);
  const int peer = net->stage + (to_next ? 1 : -1), tag = 2 * mb + (int)what;
  if (net->be->sync(net->be)) return -1;
  int rc = send ? mc_send(pp, buf, count, MC_DT_F32, peer, tag) : mc_recv(pp, buf, count, MC_DT_F32, peer, tag);
  if (rc)
    return mc_error_context("pipeline stage %d: %s the %s of micro-batch %d %s stage %d", net->stage,
                            send ? "sending" : "receiving", what == ACT ? "activation" : "gradient", mb,
                            send ? "to" : "from", peer);
  return 0;
}

static void add_stats(mc_net_stats *tot, const mc_net_stats *st) {
  tot->ce_sum += st->ce_sum, tot->aux_sum += st->aux_sum;
  tot->n_tokens += st->n_tokens, tot->n_seqs += st->n_seqs, tot->dropped += st->dropped;
}

/* The forward of micro-batch mb in its slot (its activation already received). */
static int fwd(mc_net *net, const int32_t *tok, int mb, int n_seq, mc_net_stats *tot) {
  mc_net_stats st;
  memset(&st, 0, sizeof st);
  use_slot(net, mb % (net->n_slots > 1 ? net->n_slots : 1));
  if (mc_net_stage_forward(net, tok, n_seq, &st)) return mc_error_context("pipeline stage %d, micro-batch %d", net->stage, mb);
  add_stats(tot, &st);
  return 0;
}

/* The backward of micro-batch mb; the step's last (mb = n_micro - 1) starts each layer's
 * gradient reduction as the layer's backward ends (mc_net_reduce_in_backward). */
static int bwd(mc_net *net, const int32_t *tok, int mb, int n_micro, int n_seq, double ce_weight, double seq_weight) {
  use_slot(net, mb % (net->n_slots > 1 ? net->n_slots : 1));
  mc_net_reduce_in_backward(net, mb == n_micro - 1);
  const int rc = mc_net_stage_backward(net, tok, n_seq, ce_weight, seq_weight);
  mc_net_reduce_in_backward(net, 0);
  return rc ? mc_error_context("pipeline stage %d, micro-batch %d backward", net->stage, mb) : 0;
}

int mc_net_pipeline_step(mc_net *net, const int32_t *tokens, int n_micro, int n_seq, double ce_weight,
                         double seq_weight, mc_net_stats *stats) {
  memset(stats, 0, sizeof *stats);
  const int64_t row = (int64_t)n_seq * (net->m.seq_len + 1);
  if (net->geo.layout.pp <= 1) {
    for (int m = 0; m < n_micro; m++) {
      mc_net_stats st;
      memset(&st, 0, sizeof st);
      mc_net_reduce_in_backward(net, m == n_micro - 1);
      const int rc = mc_net_forward_backward(net, tokens + m * row, n_seq, ce_weight, seq_weight, &st);
      mc_net_reduce_in_backward(net, 0);
      if (rc) return -1;
      add_stats(stats, &st);
    }
    return 0;
  }
  if (!net->par.comm || !net->par.comm->pp) return mc_error("pipeline: no pp communicator");
  if (mc_net_ensure_slots(net, n_seq, n_micro)) return -1;
  const int pp = net->geo.layout.pp, s = net->stage, M = n_micro;
  const int first = net->first, last = net->last;
  const int w = pp - s - 1 < M ? pp - s - 1 : M; /* warm-up forwards */
#define TOK(i) (tokens + (int64_t)(i) * row)
  for (int i = 0; i < w; i++) {
    if (!first && p2p(net, 0, ACT, i, n_seq)) return -1;
    if (fwd(net, TOK(i), i, n_seq, stats)) return -1;
    if (!last && p2p(net, 1, ACT, i, n_seq)) return -1;
  }
  if (w < M && !first && p2p(net, 0, ACT, w, n_seq)) return -1;
  for (int j = 0; j < M - w; j++) { /* steady 1F1B: forward i, backward j */
    const int i = w + j;
    if (fwd(net, TOK(i), i, n_seq, stats)) return -1;
    if (!last && (p2p(net, 1, ACT, i, n_seq) || p2p(net, 0, GRAD, j, n_seq))) return -1;
    if (bwd(net, TOK(j), j, M, n_seq, ce_weight, seq_weight)) return -1;
    if (!first) {
      if (j < M - w - 1 && p2p(net, 0, ACT, i + 1, n_seq)) return -1;
      if (p2p(net, 1, GRAD, j, n_seq)) return -1;
    }
  }
  for (int j = M - w; j < M; j++) { /* cool-down backwards */
    if (!last && p2p(net, 0, GRAD, j, n_seq)) return -1;
    if (bwd(net, TOK(j), j, M, n_seq, ce_weight, seq_weight)) return -1;
    if (!first && p2p(net, 1, GRAD, j, n_seq)) return -1;
  }
#undef TOK
  return 0;
}

int mc_pipe_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats) {
  if (!net->par.comm || !net->par.comm->pp) return mc_error("pipeline: no pp communicator");
  if (mc_net_ensure_slots(net, n_seq, 1)) return -1;
  if (!net->first && p2p(net, 0, ACT, 0, n_seq)) return -1;
  if (mc_net_stage_forward(net, tokens, n_seq, stats)) return -1;
  return net->last ? 0 : p2p(net, 1, ACT, 0, n_seq);
}

int mc_pipe_forward_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight, double seq_weight,
                             mc_net_stats *stats) {
  if (mc_pipe_forward(net, tokens, n_seq, stats)) return -1;
  if (!net->last && p2p(net, 0, GRAD, 0, n_seq)) return -1;
  if (mc_net_stage_backward(net, tokens, n_seq, ce_weight, seq_weight)) return -1;
  return net->first ? 0 : p2p(net, 1, GRAD, 0, n_seq);
}
