"""transformers' LlamaForCausalLM on a MegaC export against MegaC's own logits (docs/export.md).

usage: hf_llama_check.py EXPORT_DIR LOGITS.npy [--tokens TOKENS.npy] [--device cuda|cpu]
                         [--atol A] [--rtol R]
       hf_llama_check.py EXPORT_DIR LOGITS.npy --mceval MCEVAL --ckpt CKPT --data DATA.h5

EXPORT_DIR: `mcreshard CKPT --export EXPORT_DIR` of a dense (AEAE...) checkpoint: Llama names,
config.json, model-*.safetensors with model.safetensors.index.json.
LOGITS.npy: `mceval CKPT --data DATA.h5 --dump-logits LOGITS.npy` (float32 [n_seq, T, V]); its
input tokens are LOGITS minus .npy plus .tokens.npy (int32 [n_seq, T]) unless --tokens is
given. With --mceval/--ckpt/--data the script runs that mceval command itself first.

The model is loaded with LlamaForCausalLM.from_pretrained(EXPORT_DIR) in float32 (a bf16
export is widened exactly), TF32 off, eager attention, so both sides compute in fp32; it prints
the largest absolute difference of the logits, the per-token cross-entropy of both, and the
agreement of the argmax, and exits 1 when the logits differ by more than atol + rtol * |logit|
(defaults 1e-3 and 1e-3). Needs torch, transformers and safetensors (the device machine has
them); runs offline.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("logits")
    ap.add_argument("--tokens")
    ap.add_argument("--device", default=None)
    ap.add_argument("--atol", type=float, default=1e-3)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--mceval")
    ap.add_argument("--ckpt")
    ap.add_argument("--data")
    a = ap.parse_args()

    if a.mceval:
        if not (a.ckpt and a.data):
            ap.error("--mceval needs --ckpt and --data")
        cmd = [a.mceval, a.ckpt, "--data", a.data, "--dump-logits", a.logits]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    tokens_path = a.tokens or (a.logits[:-4] if a.logits.endswith(".npy") else a.logits) + ".tokens.npy"
    ref = np.load(a.logits).astype(np.float64)
    tokens = np.load(tokens_path).astype(np.int64)
    if ref.ndim != 3 or tokens.shape != ref.shape[:2]:
        sys.exit("logits %s and tokens %s do not match ([n_seq, T, V] and [n_seq, T])" % (ref.shape, tokens.shape))

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with open(os.path.join(a.export_dir, "config.json")) as f:
        cfg = json.load(f)
    print("transformers %s, torch %s, device %s; config: %s" % (
        transformers.__version__, torch.__version__, dev,
        {k: cfg.get(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "vocab_size", "rope_theta", "rms_norm_eps",
                                 "torch_dtype")}))
    try:
        model = LlamaForCausalLM.from_pretrained(a.export_dir, torch_dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        model = LlamaForCausalLM.from_pretrained(a.export_dir, torch_dtype=torch.float32)
    model = model.to(dev).eval()
    with torch.no_grad():
        out = model(torch.tensor(tokens, device=dev)).logits.double().cpu().numpy()
    if out.shape != ref.shape:
        sys.exit("transformers gave logits of shape %s, MegaC %s" % (out.shape, ref.shape))

    diff = np.abs(out - ref)
    bound = a.atol + a.rtol * np.abs(ref)
    worst = np.unravel_index(np.argmax(diff - bound), diff.shape)

    def ce(lg):
        lg = lg[:, :-1]
        m = lg.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(lg - m).sum(-1, keepdims=True)))[..., 0]
        tgt = np.take_along_axis(lg, tokens[:, 1:, None], -1)[..., 0]
        return lse - tgt

    ce_hf, ce_mc = ce(out), ce(ref)
    agree = float(np.mean(out.argmax(-1) == ref.argmax(-1)))
    print("logits [%d, %d, %d]: max |HF - MegaC| = %.3g (largest |logit| %.3g); nearest its bound at %s: |diff| %.3g, "
          "bound %.3g" % (ref.shape + (diff.max(), np.abs(ref).max(), tuple(int(i) for i in worst), diff[worst], bound[worst])))
    print("mean cross-entropy of the next tokens: HF %.7f, MegaC %.7f (max per-token diff %.3g); argmax agreement %.4f"
          % (ce_hf.mean(), ce_mc.mean(), np.abs(ce_hf - ce_mc).max(), agree))
    ok = bool(np.all(diff <= bound))
    print("hf_llama_check: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
