"""Hugging Face export and import (docs/export.md), end to end on the CPU, checked with
numpy and a hand-written safetensors reader (no torch, transformers or safetensors here):

- a tiny dense model (pattern AEAE, one expert) trained for a few steps by mctrain, with a
  padded vocabulary (vocab_pad 100: V 256, Vp 300);
- exported as a model directory with Llama names: index.json (total_size = the tensors' bytes,
  weight_map = exactly the Llama names, each in the file that holds it), config.json
  (LlamaForCausalLM fields), every file's metadata (format pt, sha256 of each tensor);
- a float64 numpy LlamaForCausalLM (HF's modeling_llama: rotate_half RoPE, repeat_kv, RMSNorm
  weight * x / rms, SwiGLU down(silu(gate) * up)) on the exported tensors gives mceval's
  logits (--dump-logits) to 1e-4;
- fp32 export -> import -> export: every tensor byte-identical; bf16: the exported values are
  numpy's round-to-nearest-even of the fp32 export, several shards under --max-shard-size, and
  the import holds exactly those values widened;
- a foreign Llama directory (F16 tensors, HF's metadata only, config.json without the MegaC
  object) imports; a wrong shape, an extra and a missing tensor are refused naming file and
  tensor; --dry-run writes nothing; an existing export is kept without --force; --names llama
  on a hybrid names the difference; --version; and hf_llama_check.py compiles.

- a full disk (tests/reliability/enospc_shim.c, when given) during an export leaves nothing.

usage: test_reshard_hf.py MCRESHARD MCTRAIN MCDATA MCEVAL [ENOSPC_SHIM.so]   (Debian's /usr/bin/python3)
"""
import glob
import hashlib
import json
import os
import py_compile
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
import checks  # noqa: E402
from checks import check, run  # noqa: E402

MCRESHARD, MCTRAIN, MCDATA, MCEVAL = sys.argv[1:5]
SHIM = sys.argv[5] if len(sys.argv) > 5 else None
SOURCE = os.environ.get("MC_SOURCE_DIR", ".")


NP_DTYPE = {"F32": "<f4", "F16": "<f2"}


def read_st(path):
    """(metadata, {name: float32 array}) of a safetensors file, parsed by hand."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out, raw = {}, {}
    for name, t in header.items():
        b0, b1 = t["data_offsets"]
        buf = data[b0:b1]
        raw[name] = (t["dtype"], buf)
        if t["dtype"] == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=NP_DTYPE[t["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(t["shape"])
    return meta, out, raw


def read_dir(d):
    """All tensors of a model directory through its index.json, checking the index."""
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        ix = json.load(f)
    tensors, raw, total = {}, {}, 0
    for fn in sorted(set(ix["weight_map"].values())):
        meta, ts, rw = read_st(os.path.join(d, fn))
        check(meta.get("format") == "pt", "%s: metadata format pt" % fn)
        for name, (dt, buf) in rw.items():
            check(ix["weight_map"].get(name) == fn, "weight_map puts %s in %s" % (name, fn))
            check(meta.get("sha256." + name) == hashlib.sha256(buf).hexdigest(), "sha256 of %s" % name)
            total += len(buf)
        tensors.update(ts)
        raw.update(rw)
    check(set(tensors) == set(ix["weight_map"]), "weight_map names exactly the tensors")
    check(ix["metadata"]["total_size"] == total, "total_size %s == %d" % (ix["metadata"]["total_size"], total))
    return tensors, raw


def llama_names(n_layers):
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(n_layers):
        for leaf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            names.add("model.layers.%d.%s.weight" % (i, leaf))
    return names


def llama_forward(w, cfg, tokens, interleaved=False):
    """HF LlamaForCausalLM's forward in float64 numpy: logits [n_seq, T, V]. interleaved: RoPE
    on pairs (2i, 2i+1) instead (Meta's layout; the test's proof that the check can fail)."""
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    W = {k: v.astype(np.float64) for k, v in w.items()}

    def rms(x, g):
        return g * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))

    def rotate_half(x):
        if interleaved:
            y = np.empty_like(x)
            y[..., 0::2], y[..., 1::2] = -x[..., 1::2], x[..., 0::2]
            return y
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([-x2, x1], axis=-1)

    out = []
    for seq in tokens:
        T = len(seq)
        inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
        freqs = np.outer(np.arange(T), inv_freq)
        emb = np.repeat(freqs, 2, axis=-1) if interleaved else np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
        x = W["model.embed_tokens.weight"][seq]
        for i in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % i
            h = rms(x, W[p + "input_layernorm.weight"])
            q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd)
            k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd)
            v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
            s = s + np.triu(np.full((T, T), -np.inf), 1)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, H * hd)
            x = x + o @ W[p + "self_attn.o_proj.weight"].T
            h = rms(x, W[p + "post_attention_layernorm.weight"])
            g = h @ W[p + "mlp.gate_proj.weight"].T
            u = h @ W[p + "mlp.up_proj.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T
        out.append(rms(x, W["model.norm.weight"]) @ W["lm_head.weight"].T)
    return np.stack(out)


def bf16_rne(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def write_st(path, tensors, meta):
    """A safetensors file written by hand (tensors: {name: array of f4 or f2})."""
    header, off, blobs = {}, 0, []
    if meta is not None:
        header["__metadata__"] = meta
    for name, a in tensors.items():
        b = a.tobytes()
        header[name] = {"dtype": {"float32": "F32", "float16": "F16"}[str(a.dtype)], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    tmp = tempfile.mkdtemp(prefix="mc_hf_")
    j = lambda *p: os.path.join(tmp, *p)
    try:
        files = sorted(glob.glob(os.path.join(SOURCE, "docs", "*.md")))[:6]
        rc, out, err = run(MCDATA, "-o", j("corpus.h5"), *files)
        check(rc == 0, "mcdata: " + out + err)
        model = ["--set", "model.pattern=AEAE", "--set", "model.n_experts=1", "--set", "model.top_k=1",
                 "--set", "model.d_model=32", "--set", "model.n_heads=4", "--set", "model.n_kv_heads=2",
                 "--set", "model.head_dim=8", "--set", "model.expert_hidden=48", "--set", "model.seq_len=16",
                 "--set", "model.vocab_pad=100", "--set", "model.rope_theta=500", "--set", "model.init_std=0.3"]
        rc, out, err = run(MCTRAIN, *model, "--set", "train.steps=4", "--set", "train.global_batch=4",
                           "--set", "train.micro_batch=2", "--set", "train.lr=1e-2", "--set", "train.warmup_steps=1",
                           "--set", "data.path=" + j("corpus.h5"), "--set", "checkpoint.dir=" + j("run"),
                           "--set", "train.device=cpu", "--set", "train.dtype=fp32")
        check(rc == 0, "mctrain: " + out[-2000:] + err[-2000:])
        if rc != 0:
            return 1

        # --dry-run: the listing, nothing written
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("hf"), "--dry-run")
        check(rc == 0 and "model.layers.1.mlp.down_proj.weight F32 [32, 48]" in out and "LlamaForCausalLM" in out
              and not glob.glob(j("hf*")), "--dry-run export: " + out + err)

        # fp32 directory, Llama names
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("hf") + "/", "--no-progress")
        check(rc == 0 and "llama names" in out, "export fp32: " + out + err)
        with open(j("hf", "config.json")) as f:
            cfg = json.load(f)
        want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
                "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "num_hidden_layers": 2, "vocab_size": 256, "rope_theta": 500, "max_position_embeddings": 16,
                "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False}
        for k, v in want.items():
            check(cfg.get(k) == v, "config.json %s = %r (want %r)" % (k, cfg.get(k), v))
        check(abs(cfg.get("rms_norm_eps", 0) - 1e-5) < 1e-12, "rms_norm_eps")
        w32, raw32 = read_dir(j("hf"))
        check(set(w32) == llama_names(2), "Llama names: %s" % sorted(set(w32) ^ llama_names(2)))
        check(w32["model.embed_tokens.weight"].shape == (256, 32) and w32["lm_head.weight"].shape == (256, 32),
              "vocabulary rows only (V=256, not Vp=300)")

        # the same weights under MegaC names (one file) hold the same values
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("m.safetensors"), "--names", "megac", "--no-progress")
        check(rc == 0, "export megac names: " + err)
        _, wm, _ = read_st(j("m.safetensors"))
        check(np.array_equal(wm["embed.weight"][:256], w32["model.embed_tokens.weight"]), "embed rows")
        check(np.array_equal(wm["layers.02.norm.weight"], w32["model.layers.1.input_layernorm.weight"]), "norm of A")
        check(np.array_equal(wm["layers.03.norm.weight"], w32["model.layers.1.post_attention_layernorm.weight"]),
              "norm of E")
        check(np.array_equal(wm["layers.01.moe.w1"][0], w32["model.layers.0.mlp.gate_proj.weight"]), "w1 = gate")
        check(np.array_equal(wm["layers.01.moe.w3"][0], w32["model.layers.0.mlp.up_proj.weight"]), "w3 = up")
        check(np.array_equal(wm["layers.03.moe.w2"][0], w32["model.layers.1.mlp.down_proj.weight"]), "w2 = down")
        check(np.array_equal(wm["layers.02.attn.wk"], w32["model.layers.1.self_attn.k_proj.weight"]), "wk = k_proj")
        check(not np.all(w32["model.norm.weight"] == 1), "trained norms (not the initial ones)")

        # HF's Llama math on the export == MegaC's logits
        rc, out, err = run(MCEVAL, j("run"), "--data", j("corpus.h5"), "--dump-logits", j("logits.npy"))
        check(rc == 0, "mceval --dump-logits: " + out + err)
        if rc == 0:
            lg, tok = np.load(j("logits.npy")), np.load(j("logits.tokens.npy"))
            check(lg.shape == (2, 16, 256) and tok.shape == (2, 16) and lg.dtype == np.float32, "dump shapes")
            ref = llama_forward(w32, cfg, tok)
            err_max = float(np.max(np.abs(ref - lg)))
            print("numpy Llama vs mceval logits: max |diff| = %.3g (logits up to %.3g)" % (err_max, np.abs(lg).max()))
            check(err_max < 1e-4, "Llama forward of the export differs from mceval's logits by %g" % err_max)
            wrong = float(np.max(np.abs(llama_forward(w32, cfg, tok, interleaved=True) - lg)))
            print("with interleaved RoPE pairs instead: max |diff| = %.3g" % wrong)
            check(wrong > 1e-2, "the check cannot tell the RoPE pairing apart (%g)" % wrong)

        # fp32: import -> export gives the same bytes
        rc, out, err = run(MCRESHARD, "--import", j("hf"), j("imp"), "--dp", "2", "--no-progress")
        check(rc == 0, "import fp32 dir: " + err)
        rc, out, err = run(MCRESHARD, j("imp"), "--export", j("hf2"), "--no-progress")
        check(rc == 0, "re-export: " + err)
        _, raw2 = read_dir(j("hf2"))
        check(raw2 == raw32, "fp32 export -> import -> export is byte-identical")

        # bf16, several shards
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("hfb"), "--dtype", "bf16", "--max-shard-size", "20KB",
                           "--no-progress")
        check(rc == 0, "export bf16: " + err)
        shards = sorted(glob.glob(j("hfb", "model-*.safetensors")))
        n = len(shards)
        check(n >= 3 and all(os.path.basename(s) == "model-%05d-of-%05d.safetensors" % (i + 1, n)
                             for i, s in enumerate(shards)), "bf16 shards: %s" % shards)
        for s in shards:
            _, ts, rw = read_st(s)
            check(sum(len(b) for _, b in rw.values()) <= 20000 or len(rw) == 1, "%s within 20KB" % s)
        wb, rawb = read_dir(j("hfb"))
        check(all(rawb[k][0] == "BF16" for k in rawb), "dtype BF16")
        check(all(np.array_equal(wb[k], bf16_rne(w32[k])) for k in w32), "bf16 = round-to-nearest-even of fp32")
        with open(j("hfb", "config.json")) as f:
            check(json.load(f)["torch_dtype"] == "bfloat16", "torch_dtype bfloat16")
        rc, out, err = run(MCRESHARD, "--import", j("hfb"), j("impb"), "--no-progress")
        check(rc == 0, "import bf16: " + err)
        rc, out, err = run(MCRESHARD, j("impb"), "--export", j("hfb2"), "--no-progress")
        wb2, _ = read_dir(j("hfb2"))
        check(all(np.array_equal(wb2[k], wb[k]) for k in wb), "bf16 import holds the bf16 values exactly")
        check(all(np.all(np.abs(wb2[k] - w32[k]) <= np.abs(w32[k]) * 2.0 ** -8) for k in w32), "within bf16 rounding")

        # a foreign Llama directory: F16, HF metadata only, config.json without the MegaC object
        os.makedirs(j("foreign"))
        fcfg = {k: v for k, v in cfg.items() if k != "megac"}
        fcfg["max_position_embeddings"] = 16
        with open(j("foreign", "config.json"), "w") as f:
            json.dump(fcfg, f)
        f16 = {k: v.astype(np.float16) for k, v in w32.items()}
        write_st(j("foreign", "model.safetensors"), f16, {"format": "pt"})
        rc, out, err = run(MCRESHARD, "--import", j("foreign"), j("impf"), "--no-progress")
        check(rc == 0, "import foreign F16 Llama: " + err)
        rc, out, err = run(MCRESHARD, j("impf"), "--export", j("hff"), "--no-progress")
        wf, _ = read_dir(j("hff"))
        check(all(np.array_equal(wf[k], f16[k].astype(np.float32)) for k in f16), "F16 values imported exactly")
        bad = dict(f16)
        bad["model.layers.1.mlp.up_proj.weight"] = np.zeros((47, 32), np.float16)
        write_st(j("foreign", "model.safetensors"), bad, {"format": "pt"})
        rc, out, err = run(MCRESHARD, "--import", j("foreign"), j("x1"), "--no-progress")
        check(rc == 1 and "model.safetensors: tensor model.layers.1.mlp.up_proj.weight has shape [47, 32]" in err
              and "[48, 32]" in err and not os.path.exists(j("x1")), "wrong shape refused: " + err)
        bad = dict(f16)
        bad["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float16)
        write_st(j("foreign", "model.safetensors"), bad, {"format": "pt"})
        rc, out, err = run(MCRESHARD, "--import", j("foreign"), j("x1"), "--no-progress")
        check(rc == 1 and "model.layers.0.self_attn.q_proj.bias is not a tensor of the model" in err, "extra: " + err)
        bad = dict(f16)
        del bad["model.norm.weight"]
        write_st(j("foreign", "model.safetensors"), bad, {"format": "pt"})
        rc, out, err = run(MCRESHARD, "--import", j("foreign"), j("x1"), "--no-progress")
        check(rc == 1 and "no tensor model.norm.weight" in err, "missing: " + err)
        rc, out, err = run(MCRESHARD, "--import", j("hf"), j("x2"), "--dry-run")
        check(rc == 0 and "layers.00.attn.wq <- " in out and "model.layers.0.self_attn.q_proj.weight" in out and
              not os.path.exists(j("x2")), "import --dry-run: " + out + err)

        # an existing export is kept without --force, replaced with it
        before = os.listdir(j("hf"))
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("hf"), "--dtype", "bf16", "--no-progress")
        check(rc == 1 and "--force" in err and os.listdir(j("hf")) == before, "existing export kept: " + err)
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("hf"), "--dtype", "bf16", "--force", "--no-progress")
        _, rawf = read_dir(j("hf"))
        check(rc == 0 and all(v[0] == "BF16" for v in rawf.values()) and not glob.glob(j("hf.export*")),
              "--force replaced the export: " + err)
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("m.safetensors"), "--no-progress")
        check(rc == 1 and "--force" in err, "existing file kept: " + err)

        # a full disk: the export fails, names it, and leaves neither the output nor its temporary
        for budget in ([0, 3000, 100000] if SHIM else []):
            for out_path, match in ((j("disk"), "disk.export.tmp"), (j("disk.safetensors"), "disk.safetensors.tmp")):
                # ASan (an MC_SANITIZE build) wants to come first; the shim must precede libc's write
                asan = os.environ.get("ASAN_OPTIONS", "")
                env = dict(os.environ, LD_PRELOAD=SHIM, MC_ENOSPC_MATCH=match, MC_ENOSPC_AFTER=str(budget),
                           ASAN_OPTIONS=(asan + ":" if asan else "") + "verify_asan_link_order=0")
                rc, out, err = run(MCRESHARD, j("run"), "--export", out_path, "--no-progress", env=env)
                check(rc == 1 and "nothing written" in err and not glob.glob(j("disk*")),
                      "full disk after %d bytes, %s: rc %d %s %s" % (budget, out_path, rc, err, glob.glob(j("disk*"))))

        # flags
        rc, out, err = run(MCRESHARD, "--version")
        check(rc == 0 and out.startswith("mcreshard (MegaC ") and "checkpoint format" in out, "--version: " + out)
        rc, out, err = run(MCRESHARD, j("run"), j("y"), "--dtype", "bf16")
        check(rc == 2 and "--export" in err, "--dtype without --export: " + err)
        rc, out, err = run(MCRESHARD, j("run"), "--export", j("z"), "--max-shard-size", "5XB")
        check(rc == 2 and "unknown unit" in err, "bad size: " + err)

        # a hybrid: --names llama refused naming the difference; auto keeps MegaC names
        rc, out, err = run(MCTRAIN, "--set", "model.pattern=AEMR", "--set", "model.seq_len=16", "--set", "train.steps=1",
                           "--set", "train.global_batch=2", "--set", "train.micro_batch=2",
                           "--set", "data.path=" + j("corpus.h5"), "--set", "checkpoint.dir=" + j("hyb"),
                           "--set", "train.device=cpu", "--set", "train.dtype=fp32")
        check(rc == 0, "mctrain hybrid: " + err[-2000:])
        rc, out, err = run(MCRESHARD, j("hyb"), "--export", j("hy"), "--names", "llama")
        check(rc == 1 and "block 2 is M where a Llama has A" in err and not os.path.exists(j("hy")), "hybrid llama: " + err)
        rc, out, err = run(MCRESHARD, j("hyb"), "--export", j("hy"), "--no-progress")
        check(rc == 0 and "megac names" in out, "hybrid export: " + out + err)
        with open(j("hy", "config.json")) as f:
            hc = json.load(f)
        check(hc["model_type"] == "megac" and hc["megac"]["model"]["pattern"] == "AEMR", "hybrid config.json")
        wh, _ = read_dir(j("hy"))
        check("layers.02.ssm.A_log" in wh and "embed.weight" in wh, "hybrid MegaC names")
        rc, out, err = run(MCRESHARD, "--import", j("hy"), j("imph"), "--no-progress")
        check(rc == 0, "hybrid import: " + err)

        py_compile.compile(os.path.join(SOURCE, "tests", "reshard", "hf_llama_check.py"), doraise=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if checks.failures:
        print("test_reshard_hf: %d failures" % checks.failures)
        return 1
    print("test_reshard_hf: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
