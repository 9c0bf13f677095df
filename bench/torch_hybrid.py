#!/usr/bin/env python3
"""PyTorch peer of MegaC's hybrid model, for the speed comparisons of issues 7 and 16.

The model is the math of docs/design.md section 2 as docs/model.md spells it out (pre-norm blocks
A, M, E, R, final norm, untied head, cross-entropy over the V real vocabulary columns), with
the same parameter families and shapes, so its parameter count equals mcplan's. It is written
the way a PyTorch user would write it, not tuned against MegaC:

- A: GQA through F.scaled_dot_product_attention (causal), K/V heads repeated to the query
  heads first (head h reads kv head h // (H/KV)), RoPE rotate-half.
- M: the selective scan is the chunked (SSD, "Mamba-2 minimal") form: exact for the scalar
  decay per head, evaluated chunk by chunk with matrix products (chunk 64) instead of a
  sequential loop over T; decays are summed and exponentiated in fp32.
- R: the RG-LRU recurrence h_t = a_t h_{t-1} + b_t is a log-depth (Hillis-Steele) scan in
  fp32: log2(T) elementwise passes, no exponent can overflow.
- E: router logits and softmax in fp32, top-k, gates renormalised, dropless dispatch sorted by
  expert. In bf16 (default --experts grouped) the experts are torch._grouped_mm products with
  the per-expert row ends as device offsets (no host synchronisation, traced by
  torch.compile), w1 and w3 as one product, outputs put back by a permutation and combined
  with their gates; in fp32 (or --experts loop) one SwiGLU per expert in a Python loop (its
  token counts go to the host; that part runs eager). With E == 1 every token goes to
  expert 0 and the dispatch is skipped (same math). Aux loss per sequence, averaged, times
  aux_loss_coef.
- Attention's GQA by SDPA's enable_gqa (--gqa native, default) or K/V repeated (--gqa repeat);
  the R scan by the log-depth form (--rec-scan hillis, default) or torch's associative_scan
  (--rec-scan assoc). --block-times adds one step with CUDA-event marks between the parts
  (embedding, each block kind, head and loss, optimizer): GPU time per part, forward and
  backward, for the per-block table of bench/block_table.py.

A training step is global_batch sequences as micro_batch-sized forward/backward passes with
gradient accumulation, global-norm clipping and fused AdamW (decay on 2-D/3-D weights only);
the learning rate is held at train.lr (the schedule's cost is nil). Tokens are synthetic
(uniform random). fp32 runs use IEEE fp32 products (no TF32), like MegaC's fp32 mode; bf16 runs
use torch.autocast(bfloat16) over fp32 master weights.

Data-parallel (issue 14's peer; under torchrun, one process per GPU): --dist ddp wraps the
model in DistributedDataParallel (gradients all-reduced in buckets during the last
micro-batch's backward, no_sync before it); --dist fsdp applies FSDP2's fully_shard to each
block and then to the whole model (bf16 parameter gathers and fp32 gradient reduce-scatters
in bf16 runs, MixedPrecisionPolicy as torchtitan sets it; parameters resharded after each
forward, gradients reduce-scattered after every micro-batch's backward, as MegaC's ZeRO 3).
Every rank runs global_batch sequences of its own random tokens, so a step is world x
global_batch sequences (as bench/multi_gpu.sh scales MegaC's global batch with dp).

Usage (on a CUDA machine; bench/run_bench.sh drives it, with MegaC's runs):
  torch_hybrid.py --config configs/nam-small.json --dtype bf16 --mode compile \
      [--flops-per-token F] [--peak-tflops P] [--json-out FILE]
  torchrun --nproc-per-node 2 torch_hybrid.py --config C --mode compile --dist ddp|fsdp ...
  torch_hybrid.py --selfcheck       # scans, dispatch, conv, attention against plain references
  torch_hybrid.py --count-params --config C   # needs no torch: the family shapes' total
  torch_hybrid.py --summarize DIR [--json-out FILE]   # table of the runs' JSON files
  torch_hybrid.py --export-megac STEP_DIR DATA.h5 LOSS OUT.npz   # MegaC weights + windows (no torch)
  torch_hybrid.py --crosscheck OUT.npz   # this model's loss on MegaC's weights vs mceval's LOSS
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

from bench_record import add_model_flops, result_line

try:
    import torch
    import torch.nn.functional as F

    Module = torch.nn.Module
except ImportError:  # --count-params works without torch
    torch = F = None
    Module = object

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# implementation choices of the peer (command-line flags): grouped experts and SDPA's own GQA
# as issue 16 describes the peer; the log-depth scan, faster than associative_scan here
# (docs/bench-torch.md)
OPTS = {"experts": "grouped", "gqa": "native", "rec_scan": "hillis"}


# ---------------------------------------------------------------- configuration and families


def load_config(path):
    """configs/default.json overlaid section by section with the given file, like mc_config."""
    with open(os.path.join(REPO, "configs", "default.json")) as f:
        cfg = json.load(f)
    if path:
        with open(path) as f:
            user = json.load(f)
        for sec, vals in user.items():
            if not isinstance(vals, dict):
                raise SystemExit(f"{path}: section '{sec}' is not an object")
            cfg.setdefault(sec, {}).update(vals)
    m = cfg["model"]
    for key in ("n_heads", "n_kv_heads", "head_dim", "d_model", "seq_len"):
        if m[key] <= 0:
            raise SystemExit(f"{path}: model.{key} must be positive")
    if m["n_heads"] % m["n_kv_heads"]:
        raise SystemExit(f"{path}: n_kv_heads={m['n_kv_heads']} does not divide n_heads={m['n_heads']}")
    if "M" in m["pattern"] and m["mamba_inner"] % m["mamba_head_dim"]:
        raise SystemExit(f"{path}: mamba_head_dim does not divide mamba_inner")
    return cfg


def padded_vocab(m):
    p = m["vocab_pad"]
    return (m["vocab_size"] + p - 1) // p * p


def family_shapes(m):
    """(name, shape, init kind) of every family, as docs/design.md section 2 lists them."""
    d, vp = m["d_model"], padded_vocab(m)
    fam = [("embed.weight", (vp, d), "normal")]
    for li, blk in enumerate(m["pattern"].replace("|", "")):
        p = f"layers.{li:02d}."
        fam.append((p + "norm.weight", (d,), "ones"))
        if blk == "A":
            q, kv = m["n_heads"] * m["head_dim"], m["n_kv_heads"] * m["head_dim"]
            fam += [(p + "attn.wq", (q, d), "normal"), (p + "attn.wk", (kv, d), "normal"),
                    (p + "attn.wv", (kv, d), "normal"), (p + "attn.wo", (d, q), "normal_out")]
        elif blk == "M":
            di, n, k = m["mamba_inner"], m["ssm_state"], m["conv_width"]
            hm = di // m["mamba_head_dim"]
            fam += [(p + "ssm.w_z", (di, d), "normal"), (p + "ssm.w_x", (di, d), "normal"),
                    (p + "ssm.w_dt", (hm, d), "normal"), (p + "ssm.w_B", (n, d), "normal"),
                    (p + "ssm.w_C", (n, d), "normal")]
            for c, width in (("x", di), ("B", n), ("C", n)):
                fam += [(p + f"ssm.conv_{c}.weight", (width, k), "conv"),
                        (p + f"ssm.conv_{c}.bias", (width,), "zeros")]
            fam += [(p + "ssm.dt_bias", (hm,), "dt_bias"), (p + "ssm.A_log", (hm,), "A_log"),
                    (p + "ssm.D", (hm,), "ones"), (p + "ssm.norm.weight", (di,), "ones"),
                    (p + "ssm.w_out", (d, di), "normal_out")]
        elif blk == "E":
            e, f = m["n_experts"], m["expert_hidden"]
            fam += [(p + "moe.router", (e, d), "normal"), (p + "moe.w1", (e, f, d), "normal"),
                    (p + "moe.w3", (e, f, d), "normal"), (p + "moe.w2", (e, d, f), "normal_out")]
        elif blk == "R":
            dr = m["rec_width"]
            fam += [(p + f"rec.{w}", (dr, d), "normal") for w in ("w_x", "w_gate", "w_r", "w_i")]
            fam += [(p + "rec.b_r", (dr,), "zeros"), (p + "rec.b_i", (dr,), "zeros"),
                    (p + "rec.lambda", (dr,), "lambda"), (p + "rec.w_out", (d, dr), "normal_out")]
        else:
            raise SystemExit(f"unknown block letter '{blk}' in pattern {m['pattern']}")
    fam += [("final_norm.weight", (d,), "ones"), ("head.weight", (vp, d), "normal")]
    return fam


def count_params(m):
    return sum(math.prod(s) for _, s, _ in family_shapes(m))


# ---------------------------------------------------------------- ops


def up(x):
    """x in fp32, or float64 when it already is (the MegaC cross-check runs in float64)."""
    return x if x.dtype == torch.float64 else x.float()


def rmsnorm(x, w, eps, group=None):
    """RMSNorm in fp32 over the last dim, or over each `group` columns of it."""
    xf = up(x)
    if group is not None and group != x.shape[-1]:
        shp = xf.shape
        xg = xf.reshape(*shp[:-1], shp[-1] // group, group)
        xf = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(shp)
        return xf * w
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    """x [b, heads, T, hd]; the pair (i, i + hd/2) rotated by t * theta^(-2i/hd)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


def causal_conv(v, w, b):
    """v [b, T, C] -> out_t[c] = b[c] + sum_j w[c, j] v_{t-K+1+j}[c] (zeros before the start)."""
    K = w.shape[1]
    y = F.conv1d(v.transpose(1, 2), w.unsqueeze(1), b, padding=K - 1, groups=w.shape[0])
    return y[..., : v.shape[1]].transpose(1, 2)


def segsum(x):
    """x [..., L] -> [..., L, L]: out[i, j] = sum_{j<k<=i} x_k for j <= i, -inf above."""
    L = x.shape[-1]
    xe = x.unsqueeze(-1).expand(*x.shape, L)
    low = torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device), diagonal=-1)
    s = torch.cumsum(xe.masked_fill(~low, 0.0), dim=-2)
    diag = torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device), diagonal=0)
    return s.masked_fill(~diag, -math.inf)


def chunk_len(T, want=64):
    q = want
    while T % q:
        q //= 2
    return q


def ssd_scan(x, dt, A, B, C, Q=64):
    """Selective scan S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t, S_{-1} = 0,
    chunked. x [b, T, h, p], dt [b, T, h] fp32, A [h] (< 0), B, C [b, T, n] shared by heads."""
    b, T, h, p = x.shape
    n = B.shape[-1]
    Q = chunk_len(T, Q)
    c = T // Q
    X = (x * dt.unsqueeze(-1)).reshape(b, c, Q, h, p)
    a = (dt * A).reshape(b, c, Q, h).permute(0, 3, 1, 2)  # b h c l, fp32
    a_cum = torch.cumsum(a, dim=-1)
    Bc, Cc = B.reshape(b, c, Q, n), C.reshape(b, c, Q, n)
    # within a chunk: y_l = sum_{s<=l} (C_l . B_s) exp(a_{s+1} + ... + a_l) X_s
    CB = torch.einsum("bcln,bcsn->bcls", Cc, Bc)
    scores = CB.unsqueeze(1) * torch.exp(segsum(a))  # b h c l s
    y = torch.einsum("bhcls,bcshp->bclhp", scores, X)
    # state at each chunk's end from its own inputs, then carried across chunks
    decay_in = torch.exp(a_cum[..., -1:] - a_cum).permute(0, 2, 3, 1).unsqueeze(-1)  # b c l h 1
    states = torch.einsum("bcln,bclhp->bchpn", Bc, X * decay_in)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # b h c+1 c+1
    entering = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    decay_out = torch.exp(a_cum).permute(0, 2, 3, 1).unsqueeze(-1)  # b c l h 1
    y = y + torch.einsum("bcln,bchpn->bclhp", Cc, entering) * decay_out
    return y.reshape(b, T, h, p)


def linear_scan(a, bt):
    """h_t = a_t h_{t-1} + b_t along dim 1, h_{-1} = 0, in log2(T) elementwise passes."""
    T = a.shape[1]
    off = 1
    while off < T:
        b_prev = F.pad(bt[:, :-off], (0, 0, off, 0), value=0.0)
        bt = bt + a * b_prev
        if 2 * off < T:
            a = a * F.pad(a[:, :-off], (0, 0, off, 0), value=1.0)
        off *= 2
    return bt


def _combine_linear(left, right):
    """(a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2, the recurrence's associative step."""
    a1, b1 = left
    a2, b2 = right
    return a2 * a1, a2 * b1 + b2


def assoc_scan(a, bt):
    """h_t = a_t h_{t-1} + b_t along dim 1 by torch's associative_scan (one Triton scan kernel
    per pass under torch.compile); same math as linear_scan."""
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(_combine_linear, (a, bt), dim=1, combine_mode="pointwise")[1]


def swiglu(x, w1, w3, w2):
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


def _experts_dropless(u, topi, gates, w1, w3, w2):
    """u [n, d]; topi, gates [n, k]. Assignments sorted by expert (stable, so tokens in row
    order), one SwiGLU per expert on its rows, outputs weighted by the gates and summed."""
    n, k = topi.shape
    flat = topi.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // k
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    xs = u[tok]
    outs = [swiglu(chunk, w1[e], w3[e], w2[e]) for e, chunk in enumerate(xs.split(counts)) if counts[e]]
    ys = torch.cat(outs) * gates.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros(n, u.shape[1], dtype=ys.dtype, device=u.device).index_add_(0, tok, ys)


if torch is not None and hasattr(torch, "compiler"):
    # data-dependent token counts per expert: kept out of the compiled graphs
    experts_dropless = torch.compiler.disable(_experts_dropless)
else:
    experts_dropless = _experts_dropless


def experts_grouped(u, topi, gates, w1, w3, w2):
    """The same dropless dispatch as _experts_dropless in bf16 with no host synchronisation:
    assignments sorted by expert, the per-expert row ends (cumulative counts) stay on the
    device as torch._grouped_mm's offsets, w1 and w3 run as one grouped product, the outputs
    go back to assignment order by a permutation (no atomics) and are combined per token with
    their gates. Traceable by torch.compile (no data-dependent shapes)."""
    n, k = topi.shape
    E, f, _ = w1.shape
    flat = topi.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    xs = u.to(torch.bfloat16)[order // k]
    w13 = torch.cat([w1, w3], dim=1).to(torch.bfloat16)  # [E, 2f, d]
    h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)  # [n k, 2f]
    a = F.silu(h[:, :f].float()) * h[:, f:].float()
    ys = torch._grouped_mm(a.to(torch.bfloat16), w2.to(torch.bfloat16).transpose(-2, -1), offs=offs)  # [n k, d]
    back = torch.empty_like(ys).index_copy_(0, order, ys)  # assignment order: row i k + j
    return (back.view(n, k, -1).float() * gates.unsqueeze(-1)).sum(1)


# ---------------------------------------------------------------- blocks


class Block(Module):
    """One pre-norm residual layer: x + f(RMSNorm(x) * norm.weight)."""

    def __init__(self, m, letter, params):
        super().__init__()
        self.m, self.letter = m, letter
        self.p = torch.nn.ParameterDict({k.replace(".", "_"): v for k, v in params.items()})
        self.names = {k.replace(".", "_"): k for k in params}

    def w(self, name):
        return self.p[name.replace(".", "_")]

    def forward(self, x, rope_cs):
        m = self.m
        u = rmsnorm(x, self.w("norm.weight"), m["norm_eps"])
        if self.letter == "A":
            f, aux = self.attn(u, rope_cs), None
        elif self.letter == "M":
            f, aux = self.mamba(u), None
        elif self.letter == "E":
            f, aux = self.moe(u)
        else:
            f, aux = self.rec(u), None
        return x + f, aux

    def attn(self, u, rope_cs):
        m = self.m
        b, T, _ = u.shape
        H, KV, hd = m["n_heads"], m["n_kv_heads"], m["head_dim"]
        q = F.linear(u, self.w("attn.wq")).view(b, T, H, hd).transpose(1, 2)
        k = F.linear(u, self.w("attn.wk")).view(b, T, KV, hd).transpose(1, 2)
        v = F.linear(u, self.w("attn.wv")).view(b, T, KV, hd).transpose(1, 2)
        cos, sin = rope_cs
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        gqa = KV != H and OPTS["gqa"] == "native"  # SDPA reads kv head h // (H/KV) itself
        if KV != H and not gqa:
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd), enable_gqa=gqa)
        return F.linear(o.transpose(1, 2).reshape(b, T, H * hd), self.w("attn.wo"))

    def mamba(self, u):
        m = self.m
        b, T, _ = u.shape
        di, n, hdm = m["mamba_inner"], m["ssm_state"], m["mamba_head_dim"]
        hm = di // hdm
        z = F.linear(u, self.w("ssm.w_z"))
        xbc = torch.cat([F.linear(u, self.w("ssm.w_x")), F.linear(u, self.w("ssm.w_B")),
                         F.linear(u, self.w("ssm.w_C"))], dim=-1)
        # the three depthwise convs share one launch; channels stay separate
        cw = torch.cat([self.w("ssm.conv_x.weight"), self.w("ssm.conv_B.weight"), self.w("ssm.conv_C.weight")])
        cb = torch.cat([self.w("ssm.conv_x.bias"), self.w("ssm.conv_B.bias"), self.w("ssm.conv_C.bias")])
        xbc = F.silu(causal_conv(xbc, cw, cb))
        xc, Bc, Cc = torch.split(xbc, [di, n, n], dim=-1)
        dt = F.softplus(up(F.linear(u, self.w("ssm.w_dt"))) + self.w("ssm.dt_bias"))
        A = -torch.exp(up(self.w("ssm.A_log")))
        xh = xc.reshape(b, T, hm, hdm)
        y = ssd_scan(xh, dt, A, Bc, Cc) + self.w("ssm.D").view(hm, 1) * xh
        g = y.reshape(b, T, di) * F.silu(z)
        gn = rmsnorm(g, self.w("ssm.norm.weight"), m["norm_eps"], group=hdm)
        return F.linear(gn, self.w("ssm.w_out"))

    def moe(self, u):
        m = self.m
        b, T, d = u.shape
        E, k = m["n_experts"], m["top_k"]
        with torch.autocast(u.device.type, enabled=False):
            logits = F.linear(up(u), up(self.w("moe.router")))
        prob = torch.softmax(logits, dim=-1)
        topv, topi = torch.topk(prob, k, dim=-1)
        gates = topv / topv.sum(-1, keepdim=True)
        # aux per sequence: E * sum_e f_e P_e, f_e = share of the k*T assignments, P_e = mean prob
        frac = F.one_hot(topi, E).sum(dim=(1, 2)).float() / (k * T)
        aux = (E * (frac * prob.mean(dim=1)).sum(-1)).mean() * m["aux_loss_coef"]
        w1, w3, w2 = self.w("moe.w1"), self.w("moe.w3"), self.w("moe.w2")
        uf = u.reshape(b * T, d)
        if E == 1:  # every token to expert 0 with gate 1: no dispatch needed
            out = swiglu(uf, w1[0], w3[0], w2[0]) * gates.reshape(b * T, 1)
        elif OPTS["experts"] == "grouped" and torch.is_autocast_enabled():
            out = experts_grouped(uf, topi.reshape(b * T, k), gates.reshape(b * T, k), w1, w3, w2)
        else:
            out = experts_dropless(uf, topi.reshape(b * T, k), gates.reshape(b * T, k), w1, w3, w2)
        return out.view(b, T, d), aux

    def rec(self, u):
        xb = F.linear(u, self.w("rec.w_x"))
        gate = F.linear(u, self.w("rec.w_gate"))
        r = torch.sigmoid(up(F.linear(u, self.w("rec.w_r"))) + self.w("rec.b_r"))
        i = torch.sigmoid(up(F.linear(u, self.w("rec.w_i"))) + self.w("rec.b_i"))
        log_a = -8.0 * F.softplus(self.w("rec.lambda")) * r
        a = torch.exp(log_a)
        bt = torch.sqrt(-torch.expm1(2.0 * log_a)) * (i * up(xb))
        h = assoc_scan(a, bt) if OPTS["rec_scan"] == "assoc" else linear_scan(a, bt)
        return F.linear(h * F.gelu(up(gate)), self.w("rec.w_out"))


class SegmentTimer:
    """GPU time by model part, in stream order: mark(label) records a CUDA event that ends the
    running segment and starts `label`'s (None: no segment). Everything runs on one stream,
    so a segment's time is the span of the kernels queued between its mark and the next one
    (host gaps included)."""

    def __init__(self):
        self.events = []

    def mark(self, label):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.events.append((label, e))

    def totals(self):
        torch.cuda.synchronize()
        out = {}
        for (label, e0), (_, e1) in zip(self.events, self.events[1:]):
            if label is not None:
                out[label] = out.get(label, 0.0) + e0.elapsed_time(e1)
        return out


class _Mark(torch.autograd.Function if torch is not None else object):
    """Identity on the residual stream that marks a segment start in the forward and another
    in the backward (the backward reaches it when the part after it is done)."""

    @staticmethod
    def forward(ctx, x, timer, fwd_label, bwd_label):
        timer.mark(fwd_label)
        ctx.timer, ctx.bwd_label = timer, bwd_label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.timer.mark(ctx.bwd_label)
        return g, None, None, None


class Head(Module):
    def __init__(self, m, final_norm, head):
        super().__init__()
        self.m = m
        self.final_norm, self.head = final_norm, head

    def forward(self, x, targets):
        h = rmsnorm(x, self.final_norm, self.m["norm_eps"])
        logits = F.linear(h, self.head)
        V = self.m["vocab_size"]
        # padded vocabulary columns are excluded from the softmax
        return F.cross_entropy(up(logits[..., :V]).reshape(-1, V), targets.reshape(-1))


class HybridLM(Module):
    def __init__(self, m, device, seed=1234):
        super().__init__()
        self.m = m
        gen = torch.Generator(device=device).manual_seed(seed)
        params = {}
        n_layers = len(m["pattern"].replace("|", ""))
        for name, shape, kind in family_shapes(m):
            params[name] = torch.nn.Parameter(init_tensor(m, shape, kind, n_layers, gen, device))
        self.embed = params["embed.weight"]
        self.blocks = torch.nn.ModuleList()
        for li, blk in enumerate(m["pattern"].replace("|", "")):
            pre = f"layers.{li:02d}."
            own = {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}
            self.blocks.append(Block(m, blk, own))
        self.head = Head(m, params["final_norm.weight"], params["head.weight"])
        T, hd = m["seq_len"], m["head_dim"]
        inv = m["rope_theta"] ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64, device=device) / hd)
        ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None, :]
        self.rope_cs = (torch.cos(ang).float(), torch.sin(ang).float())

    def forward(self, tokens, targets, timer=None):
        if timer:
            timer.mark("embed fwd")
        x = F.embedding(tokens, self.embed)
        aux_total = torch.zeros((), device=tokens.device)
        prev = "embed"
        for blk in self.blocks:
            if timer:
                x = _Mark.apply(x, timer, blk.letter + " fwd", prev + " bwd")
            prev = blk.letter
            x, aux = blk(x, self.rope_cs)
            if aux is not None:
                aux_total = aux_total + aux
        if timer:
            x = _Mark.apply(x, timer, "head fwd", prev + " bwd")
        return self.head(x, targets), aux_total


def init_tensor(m, shape, kind, n_layers, gen, device):
    std = m["init_std"]
    if kind == "normal":
        return torch.randn(shape, generator=gen, device=device) * std
    if kind == "normal_out":
        return torch.randn(shape, generator=gen, device=device) * (std / math.sqrt(2 * n_layers))
    if kind == "conv":
        return torch.randn(shape, generator=gen, device=device) / math.sqrt(m["conv_width"])
    if kind == "ones":
        return torch.ones(shape, device=device)
    if kind == "zeros":
        return torch.zeros(shape, device=device)
    if kind == "A_log":
        return torch.log1p(torch.arange(shape[0], device=device).remainder(16).float())
    U = torch.rand(shape, generator=gen, device=device)
    if kind == "dt_bias":
        dt = torch.exp(math.log(1e-3) + U * (math.log(1e-1) - math.log(1e-3)))
        return torch.log(torch.expm1(dt))
    if kind == "lambda":
        a = 0.9 + 0.099 * U
        return torch.log(torch.expm1(-torch.log(a) / 8.0))
    raise ValueError(kind)


# ---------------------------------------------------------------- training step and timing


def make_optimizer(model, tr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tr["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["adam_eps"],
                             fused=True)


def set_fp32_ieee():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def dist_setup(kind):
    """(rank, world, device) of this process: torchrun's environment under --dist, else one GPU."""
    if kind == "none":
        return 0, 1, torch.device("cuda")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if var not in os.environ:
            raise SystemExit(f"torch_hybrid.py: --dist {kind} runs under torchrun ({var} is not set)")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.distributed.init_process_group("nccl", device_id=dev)
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), dev


def dist_wrap(model, kind, dtype, dev):
    """The module the step calls: the model itself, DDP around it, or the model sharded in place."""
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[dev.index])
    if kind == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if dtype == "bf16" else MixedPrecisionPolicy()
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    return model


def bench(args):
    cfg = load_config(args.config)
    m, tr = cfg["model"], cfg["train"]
    if args.micro_batch:
        tr["micro_batch"] = args.micro_batch
    if args.global_batch:
        tr["global_batch"] = args.global_batch
    mb, gb, T = tr["micro_batch"], tr["global_batch"], m["seq_len"]
    if gb % mb:
        raise SystemExit(f"{args.config}: micro_batch={mb} does not divide global_batch={gb}")
    accum = gb // mb
    if args.dist != "none" and (args.block_times or args.profile):
        raise SystemExit("torch_hybrid.py: --block-times and --profile run on one GPU (not with --dist)")
    rank, world, dev = dist_setup(args.dist)
    set_fp32_ieee()
    torch.manual_seed(0)
    model = HybridLM(m, dev)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != count_params(m):
        raise SystemExit(f"parameter count {n_params} differs from the family shapes' {count_params(m)}")
    if args.mode == "compile":
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        for blk in model.blocks:
            blk.compile()
        model.head.compile()
    net = dist_wrap(model, args.dist, args.dtype, dev)
    opt = make_optimizer(model, tr)
    params = list(model.parameters())
    g = torch.Generator(device=dev).manual_seed(42 + rank)
    data = torch.randint(0, m["vocab_size"], (accum, mb, T + 1), generator=g, device=dev)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=(args.dtype == "bf16"))

    def step(timer=None):
        loss_sum = 0.0
        for i in range(accum):
            tok, tgt = data[i, :, :-1], data[i, :, 1:]
            # DDP all-reduces in the last micro-batch's backward only
            sync = args.dist != "ddp" or i == accum - 1
            with contextlib.nullcontext() if sync else net.no_sync():
                with autocast:
                    ce, aux = net(tok, tgt, timer)
                    obj = (ce + aux) / accum
                if timer:
                    timer.mark("head bwd")
                obj.backward()
            loss_sum = loss_sum + ce.detach() / accum
        if timer:
            timer.mark("optimizer")
        torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if timer:
            timer.mark(None)
        return loss_sum

    times, losses = [], []
    total = args.warmup + args.steps
    for s in range(total):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(float(loss))
        if rank == 0:
            print(f"  step {s + 1}/{total} {'(warm-up) ' if s < args.warmup else ''}loss {losses[-1]:.4f} "
                  f"{dt * 1e3:.1f} ms", flush=True)
    timed = times[args.warmup:]
    med = statistics.median(timed)
    tokens = gb * T * world
    mode = args.mode if args.dist == "none" else f"{args.mode}+{args.dist}x{world}"
    res = {
        "config": os.path.basename(args.config).removesuffix(".json"),
        "mode": mode, "dist": args.dist, "world": world, "dtype": args.dtype, "params": n_params, "impl": dict(OPTS),
        "micro_batch": mb, "global_batch": gb, "seq_len": T, "tokens_per_step": tokens,
        "first_step_s": times[0], "step_s_median": med, "step_s_min": min(timed), "step_s_max": max(timed),
        "timed_steps": len(timed), "tokens_per_s": tokens / med,
        "loss_first": losses[0], "loss_last": losses[-1],
        "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "torch": torch.__version__, "card": torch.cuda.get_device_name(),
    }
    add_model_flops(res, args.flops_per_token, args.peak_tflops * world)
    if not all(math.isfinite(x) for x in losses):
        raise SystemExit(f"non-finite loss: {losses}")
    if args.dist != "none":
        torch.distributed.destroy_process_group()
        if rank != 0:
            return
    print(result_line(res), flush=True)
    if args.block_times:
        res["blocks"] = block_times(step, m["pattern"].replace("|", ""), accum, med)
    if args.profile:
        profile_step(step, args.profile)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)


def block_times(step, pattern, accum, step_s):
    """One more step with segment marks (SegmentTimer): GPU time per part of the model in that
    step (labels "A fwd", "E bwd", "head fwd", "optimizer", ...), the rows of
    bench/block_table.py's table beside MegaC's MC_CUDA_PROFILE parts."""
    torch.cuda.synchronize()
    timer = SegmentTimer()
    t0 = time.perf_counter()
    step(timer)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tot = timer.totals()
    print(f"BLOCKS marked step: wall {wall * 1e3:.1f} ms (timed steps' median {step_s * 1e3:.1f} ms), "
          f"{accum} micro-batches, marked GPU time {sum(tot.values()):.1f} ms")
    for label, ms in sorted(tot.items(), key=lambda kv: -kv[1]):
        print(f"BLOCKS {label:12s} {ms:9.2f} ms per step")
    return {"per_step_ms": tot, "micro_batches": accum, "marked_step_s": wall}


def profile_step(step, rows):
    """One more step under torch.profiler: the kernels with the most device time, and how much
    of the step's wall time the device was busy (kernels of one stream do not overlap here)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += e.time_range.elapsed_us()
            k[1] += 1
    busy = sum(v[0] for v in kernels.values()) / 1e6
    print(f"PROFILE step wall {wall * 1e3:.1f} ms (under the profiler), kernel time {busy * 1e3:.1f} ms "
          f"({100 * busy / wall:.0f}% of wall), {sum(v[1] for v in kernels.values())} kernel launches")
    for name, (us, cnt) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(f"PROFILE {us / 1e3:9.2f} ms {100 * us / 1e6 / busy:5.1f}% {cnt:6d}x  {name[:110]}")


# ---------------------------------------------------------------- self-check


def selfcheck():
    """Each fast form against its plain definition, float64, fresh random inputs."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dd = torch.float64
    g = torch.Generator(device=dev).manual_seed(7)
    fails = 0

    def rnd(*s):
        return torch.randn(*s, generator=g, device=dev, dtype=dd)

    def report(name, got, ref, tol=1e-10):
        nonlocal fails
        err = ((got - ref).norm() / ref.norm()).item()
        ok = err < tol and math.isfinite(err)
        fails += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e} (tol {tol:.0e})")

    # selective scan, T not a multiple of the chunk to exercise the chunk choice
    for (b, T, h, p, n, Q) in ((2, 96, 3, 4, 5, 16), (1, 40, 2, 3, 4, 64)):
        x, B, C = rnd(b, T, h, p), rnd(b, T, n), rnd(b, T, n)
        dt = F.softplus(rnd(b, T, h))
        A = -torch.exp(rnd(h) * 0.5)
        S = torch.zeros(b, h, p, n, device=dev, dtype=dd)
        ys = []
        for t in range(T):
            S = torch.exp(dt[:, t] * A)[..., None, None] * S + \
                (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, None, None, :]
            ys.append(torch.einsum("bhpn,bn->bhp", S, C[:, t]))
        report(f"ssd_scan T={T} chunk {chunk_len(T, Q)}", ssd_scan(x, dt, A, B, C, Q), torch.stack(ys, 1))
    # RG-LRU scan
    a, bt = torch.rand(2, 77, 6, generator=g, device=dev, dtype=dd), rnd(2, 77, 6)
    h, hs = torch.zeros(2, 6, device=dev, dtype=dd), []
    for t in range(77):
        h = a[:, t] * h + bt[:, t]
        hs.append(h)
    report("linear_scan T=77", linear_scan(a, bt), torch.stack(hs, 1))
    if dev.type == "cuda":
        try:
            report("assoc_scan T=77", assoc_scan(a, bt), torch.stack(hs, 1))
        except Exception as e:  # noqa: BLE001 - reported, --rec-scan assoc then unusable
            fails += 1
            print(f"  FAIL assoc_scan: {type(e).__name__}: {str(e)[:200]}")
    # causal depthwise conv
    v, w, cb = rnd(2, 11, 5), rnd(5, 4), rnd(5)
    ref = torch.stack([cb + sum(w[:, j] * (v[:, t - 3 + j] if t - 3 + j >= 0 else 0) for j in range(4))
                       for t in range(11)], 1)
    report("causal_conv K=4", causal_conv(v, w, cb), ref)
    # RoPE + GQA attention against the explicit masked softmax
    m = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "norm_eps": 1e-5}
    T, d = 9, 12
    blk_p = {"norm.weight": torch.nn.Parameter(torch.ones(d, device=dev, dtype=dd)),
             "attn.wq": torch.nn.Parameter(rnd(32, d)), "attn.wk": torch.nn.Parameter(rnd(16, d)),
             "attn.wv": torch.nn.Parameter(rnd(16, d)), "attn.wo": torch.nn.Parameter(rnd(d, 32))}
    blk = Block(m, "A", blk_p)
    u = rnd(2, T, d)
    ang = torch.arange(T, device=dev, dtype=dd)[:, None] * 10000.0 ** (-2.0 * torch.arange(4, device=dev, dtype=dd) / 8)
    got = blk.attn(u, (torch.cos(ang), torch.sin(ang)))
    q = (u @ blk_p["attn.wq"].T).view(2, T, 4, 8)
    k = (u @ blk_p["attn.wk"].T).view(2, T, 2, 8)
    vv = (u @ blk_p["attn.wv"].T).view(2, T, 2, 8)

    def rot(z):
        out = z.clone()
        for t in range(T):
            for i in range(4):
                c, s = math.cos(ang[t, i].item()), math.sin(ang[t, i].item())
                out[:, t, :, i] = z[:, t, :, i] * c - z[:, t, :, i + 4] * s
                out[:, t, :, i + 4] = z[:, t, :, i] * s + z[:, t, :, i + 4] * c
        return out
    q, k = rot(q), rot(k)
    o = torch.zeros(2, T, 4, 8, device=dev, dtype=dd)
    for hh in range(4):
        s = torch.einsum("btd,bsd->bts", q[:, :, hh], k[:, :, hh // 2]) / math.sqrt(8)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1), -math.inf)
        o[:, :, hh] = torch.softmax(s, -1) @ vv[:, :, hh // 2]
    report(f"attention GQA+RoPE ({OPTS['gqa']})", got, o.reshape(2, T, 32) @ blk_p["attn.wo"].T)
    other = "repeat" if OPTS["gqa"] == "native" else "native"
    OPTS["gqa"], keep = other, OPTS["gqa"]
    report(f"attention GQA+RoPE ({other})", blk.attn(u, (torch.cos(ang), torch.sin(ang))),
           o.reshape(2, T, 32) @ blk_p["attn.wo"].T)
    OPTS["gqa"] = keep
    # dropless dispatch against a per-token sum
    n, d, E, k, f = 13, 6, 4, 2, 5
    uu, w1, w3, w2 = rnd(n, d), rnd(E, f, d), rnd(E, f, d), rnd(E, d, f)
    topi = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(i))[:k] for i in range(n)]).to(dev)
    topi[0] = torch.tensor([1, 3], device=dev)  # expert 0 or 2 may get no token at all; fine
    gates = torch.rand(n, k, generator=g, device=dev, dtype=dd)
    ref = torch.stack([sum(gates[r, j] * swiglu(uu[r], w1[topi[r, j]], w3[topi[r, j]], w2[topi[r, j]])
                           for j in range(k)) for r in range(n)])
    report("MoE dropless dispatch", _experts_dropless(uu, topi, gates, w1, w3, w2), ref)
    if dev.type == "cuda":
        # the grouped form against the loop in bf16 at a realistic size: operands rounded to
        # bf16 first, so both sides multiply the same values; they differ by the bf16 rounding
        # of h1, h3 and the SwiGLU output (the grouped form keeps bf16 products)
        n, d, E, k, f = 1000, 256, 8, 2, 512
        r16 = lambda *sh: torch.randn(*sh, generator=g, device=dev, dtype=dd).to(torch.bfloat16).double()  # noqa: E731
        uu, w1, w3, w2 = r16(n, d), r16(E, f, d) * 0.05, r16(E, f, d) * 0.05, r16(E, d, f) * 0.05
        logits = torch.randn(n, E, generator=g, device=dev, dtype=dd)
        topv, topi = torch.topk(torch.softmax(logits, -1), k, -1)
        gates = topv / topv.sum(-1, keepdim=True)
        ref = _experts_dropless(uu, topi, gates, w1, w3, w2)
        try:
            got = experts_grouped(uu.float(), topi, gates.float(), w1.float(), w3.float(), w2.float()).double()
            report("MoE grouped_mm (bf16) vs loop (float64)", got, ref, tol=2e-2)
        except Exception as e:  # noqa: BLE001
            fails += 1
            print(f"  FAIL MoE grouped_mm: {type(e).__name__}: {str(e)[:200]}")
    # family table against mcplan's parameter counts (results/bench/torch_mcplan.txt)
    plan = os.path.join(REPO, "results", "bench", "torch_mcplan.txt")
    if os.path.exists(plan):
        for line in open(plan):
            if line.startswith("#") or not line.strip():
                continue
            name, params = line.split()[0], int(line.split()[1])
            mine = count_params(load_config(os.path.join(REPO, "configs", name + ".json"))["model"])
            ok = mine == params
            fails += not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {name}: {mine} parameters here, mcplan {params}")
    # the whole tiny model trains a step without non-finite values
    cfg = load_config(os.path.join(REPO, "configs", "tiny.json"))
    model = HybridLM(cfg["model"], dev)
    tok = torch.randint(0, cfg["model"]["vocab_size"], (2, cfg["model"]["seq_len"] + 1), device=dev)
    ce, aux = model(tok[:, :-1], tok[:, 1:])
    (ce + aux).backward()
    gn = torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1e9)
    ce, aux = ce.detach(), aux.detach()
    ok = math.isfinite(float(ce)) and math.isfinite(float(gn)) and abs(float(ce) - math.log(cfg["model"]["vocab_size"])) < 1.0
    fails += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} tiny model: loss {float(ce):.4f} (ln V = {math.log(cfg['model']['vocab_size']):.4f}), "
          f"aux {float(aux):.4f}, grad norm {float(gn):.3f}")
    print(f"selfcheck: {fails} failed")
    return 1 if fails else 0


def export_megac(step_dir, data_path, loss, out):
    """MegaC checkpoint (every rank file's param shards, placed by their start/count) and the
    token file's windows (window i = tokens [i*T, i*T + T + 1), as train/data.h) into one .npz
    with mceval's loss, for --crosscheck on a machine with PyTorch. Needs h5py and numpy only."""
    import glob

    import h5py
    import numpy as np

    with open(os.path.join(step_dir, "manifest.json")) as f:
        model = json.load(f)["model"]
    T = model["seq_len"]
    arrays = {}
    files = sorted(glob.glob(os.path.join(step_dir, "rank_*.h5")))
    if not files:
        raise SystemExit(f"{step_dir}: no rank_*.h5 files")
    for path in files:
        with h5py.File(path, "r") as f:
            for fam in f:
                if "param" not in f[fam]:
                    continue
                ds = f[fam]["param"]
                a = arrays.setdefault(fam, np.full(tuple(ds.attrs["global_shape"]), np.nan, np.float32))
                sl = tuple(slice(st, st + c) for st, c in zip(ds.attrs["start"], ds.attrs["count"]))
                a[sl] = ds[...]
    for fam, a in arrays.items():
        if np.isnan(a).any():
            raise SystemExit(f"{step_dir}: family {fam} is not fully covered by the rank files")
    with h5py.File(data_path, "r") as f:
        tok = f["tokens"][...].astype(np.int64)
    nw = (len(tok) - 1) // T
    windows = np.stack([tok[i * T: i * T + T + 1] for i in range(nw)])
    np.savez(out, **{"param/" + k: v for k, v in arrays.items()}, windows=windows,
             megac_loss=np.float64(loss), model=json.dumps(model))
    print(f"wrote {out}: {len(arrays)} families, {nw} windows of {T + 1}, MegaC loss {loss}")
    return 0


def crosscheck(npz_path):
    """The mean cross-entropy of MegaC's trained weights on the exported windows, computed by
    this model in float64, fp32 and bf16 autocast, against mceval's (CPU, fp32) figure."""
    import numpy as np

    z = np.load(npz_path)
    cfg = load_config(None)
    cfg["model"].update(json.loads(str(z["model"])))
    m = cfg["model"]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    set_fp32_ieee()
    model = HybridLM(m, dev)
    with torch.no_grad():
        for name, p in family_params(model).items():
            if "param/" + name not in z:
                raise SystemExit(f"{npz_path}: family {name} missing")
            src = torch.from_numpy(z["param/" + name])
            if tuple(src.shape) != tuple(p.shape):
                raise SystemExit(f"{npz_path}: {name} has shape {tuple(src.shape)}, model {tuple(p.shape)}")
            p.copy_(src.to(dev))
    windows = torch.from_numpy(z["windows"]).to(dev)
    ref = float(z["megac_loss"])
    fails = 0
    for label, dtype, amp, tol in (("float64", torch.float64, False, 1e-5), ("fp32", torch.float32, False, 1e-5),
                                   ("bf16 autocast", torch.float32, True, 2e-2)):
        model.to(dtype)
        model.rope_cs = tuple(t.to(dtype) for t in model.rope_cs)
        ce_sum, nt = 0.0, 0
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            for i in range(0, windows.shape[0], 16):
                w = windows[i: i + 16]
                ce, _ = model(w[:, :-1], w[:, 1:])
                ce_sum += float(ce) * w[:, 1:].numel()
                nt += w[:, 1:].numel()
        loss = ce_sum / nt
        rel = abs(loss - ref) / abs(ref)
        ok = rel < tol
        fails += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {label}: loss {loss:.10f} vs MegaC {ref:.10f} over {nt} tokens, "
              f"rel diff {rel:.2e} (tol {tol:.0e})")
    print(f"crosscheck: {fails} failed")
    return 1 if fails else 0


def family_params(model):
    """Family name -> parameter of the model."""
    out = {"embed.weight": model.embed, "final_norm.weight": model.head.final_norm, "head.weight": model.head.head}
    for li, blk in enumerate(model.blocks):
        for key, p in blk.p.items():
            out[f"layers.{li:02d}." + blk.names[key]] = p
    return out


def summarize(folder, json_out):
    """Table of every run's JSON in folder (peak.json gives the MFU denominators)."""
    runs, peak = [], None
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            r = json.load(f)
        if name == "peak.json":
            peak = r
        else:
            runs.append(r)
    order = {("megac", "fp32"): 0, ("megac", "bf16"): 1, ("eager", "fp32"): 2, ("eager", "bf16"): 3,
             ("compile", "fp32"): 4, ("compile", "bf16"): 5}  # "megac": rows from bench/megac_run.py
    runs.sort(key=lambda r: (r["config"], order[(r["mode"], r["dtype"])]))
    print("| config | mode | dtype | step (ms) | tokens/s | model TFLOP/s | MFU (bf16 peak) | MFU (fp32 peak) "
          "| first step (s) | max mem (GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        tf = r["flops_per_token"] * r["tokens_per_s"] / 1e12
        mfu16 = f"{100 * tf / peak['bf16']['tflops']:.1f}%" if peak else "-"
        mfu32 = f"{100 * tf / peak['fp32']['tflops']:.1f}%" if peak and r["dtype"] == "fp32" else "-"
        print(f"| {r['config']} | {r['mode']} | {r['dtype']} | {r['step_s_median'] * 1e3:.1f} | {r['tokens_per_s']:.0f} "
              f"| {tf:.1f} | {mfu16} | {mfu32} | {r['first_step_s']:.1f} | {r['max_mem_gib']:.1f} |")
    if peak:
        print(f"peak ({peak['card']}): bf16 {peak['bf16']['tflops']:.1f}, fp32 {peak['fp32']['tflops']:.1f}, "
              f"tf32 {peak['tf32']['tflops']:.1f} TFLOP/s")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"peak": peak, "runs": runs}, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--micro-batch", type=int, default=0, help="override train.micro_batch")
    ap.add_argument("--global-batch", type=int, default=0, help="override train.global_batch")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--flops-per-token", type=float, default=0.0, help="mcplan's training FLOPs per token")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="measured bf16 matmul peak for MFU")
    ap.add_argument("--json-out")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="after timing, profile one more step and print the ROWS costliest kernels")
    ap.add_argument("--block-times", action="store_true",
                    help="after timing, one more step with CUDA-event marks: GPU time per block kind")
    ap.add_argument("--experts", choices=("grouped", "loop"), default=OPTS["experts"],
                    help="bf16 experts by torch._grouped_mm (device offsets) or a loop over experts")
    ap.add_argument("--gqa", choices=("native", "repeat"), default=OPTS["gqa"],
                    help="SDPA's enable_gqa, or K/V heads repeated first")
    ap.add_argument("--rec-scan", choices=("hillis", "assoc"), default=OPTS["rec_scan"],
                    help="R recurrence: log-depth elementwise scan, or torch's associative_scan")
    ap.add_argument("--dist", choices=("none", "ddp", "fsdp"), default="none",
                    help="data-parallel under torchrun: DistributedDataParallel or FSDP2 (fully_shard)")
    ap.add_argument("--selfcheck", action="store_true")
    ap.add_argument("--count-params", action="store_true")
    ap.add_argument("--summarize", metavar="DIR", help="print the table of the run JSONs in DIR")
    ap.add_argument("--export-megac", nargs=4, metavar=("STEP_DIR", "DATA_H5", "LOSS", "OUT_NPZ"),
                    help="MegaC checkpoint + token windows + mceval loss -> .npz (h5py, numpy; no torch)")
    ap.add_argument("--crosscheck", metavar="NPZ", help="this model's loss on an --export-megac file vs MegaC's")
    args = ap.parse_args()
    OPTS.update(experts=args.experts, gqa=args.gqa, rec_scan=args.rec_scan)
    if args.summarize:
        return summarize(args.summarize, args.json_out)
    if args.export_megac:
        step_dir, data, loss, out = args.export_megac
        return export_megac(step_dir, data, float(loss), out)
    if args.count_params:
        print(count_params(load_config(args.config)["model"]))
        return 0
    if torch is None:
        raise SystemExit("torch_hybrid.py: PyTorch is not installed here (only --count-params works without it)")
    if args.selfcheck:
        return selfcheck()
    if args.crosscheck:
        return crosscheck(args.crosscheck)
    if not args.config:
        raise SystemExit("torch_hybrid.py: --config is required")
    if not torch.cuda.is_available():
        raise SystemExit("torch_hybrid.py: no CUDA device")
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
