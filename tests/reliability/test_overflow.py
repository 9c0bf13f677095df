#!/usr/bin/python3
"""Checked arithmetic on sizes computed from input (docs/reliability.md, issue 17 item 9).

  config:  configurations whose products overflow (tokens per micro-batch, an activation
           buffer, the parameter count, the world size, the MoE capacity, the expert exchange,
           the tokens a run records) make mcplan (status 2, its invalid-input status) and
           mctrain (status 1) exit at once with a message naming the keys, never crash or
           try to allocate;
  dataset: token files whose header declares more tokens than int64 bytes, more than they
           store, or a vocab_size that is not an integer make mctrain exit 1 naming the file.

usage: test_overflow.py   (MC_BINARY_DIR and MC_SOURCE_DIR from ctest; Debian's /usr/bin/python3)"""
import os
import sys
import tempfile

B = os.environ["MC_BINARY_DIR"]
S = os.environ["MC_SOURCE_DIR"]
sys.path.insert(0, os.path.join(S, "tests", "reliability"))
from test_untrusted import SMALL, check, run  # noqa: E402
import test_untrusted  # noqa: E402


def sets(*kv):
    out = []
    for a in kv:
        out += ["--set", a]
    return out


# (what, --set assignments, substrings the message must hold)
CONFIGS = [
    # 2^48 tokens x 2^24 vocabulary: at 79463f1 mcplan overflowed int64 in mc_act_buf_numel (UBSan)
    ("2^48 tokens x 2^24 vocabulary", sets("model.seq_len=16777216", "train.micro_batch=16777216",
                                           "train.global_batch=16777216", "model.vocab_size=16777216"),
     ["train.micro_batch=16777216 x model.seq_len=16777216", "more than 2^31-1"]),
    ("tokens per micro-batch 2^32", sets("model.seq_len=16777216", "train.micro_batch=256", "train.global_batch=256"),
     ["train.micro_batch=256 x model.seq_len=16777216", "more than 2^31-1"]),
    ("logits of 2^46 elements", sets("model.vocab_size=16777216", "model.seq_len=65536", "train.micro_batch=64",
                                      "train.global_batch=64"),
     ["buffer logits", "model.vocab_size", "exceeds 2^42 elements"]),
    ("2^56 parameters", sets("model.pattern=" + "E" * 256, "model.n_experts=4096", "model.expert_hidden=1048576",
                             "model.d_model=65536"),
     ["more than 2^56 parameters", "model.expert_hidden=1048576"]),
    ("world 2^32", sets("parallel.tp=1024", "parallel.dp=65536", "parallel.pp=64"),
     ["parallel.tp*parallel.dp*parallel.pp=1024*65536*64", "more than 1048576 ranks"]),
    ("capacity above 2^31", sets("model.capacity_factor=1000", "model.seq_len=16777216", "model.top_k=64",
                                 "model.n_experts=64", "train.micro_batch=1", "train.global_batch=1"),
     ["model.capacity_factor=1000", "above 2^31-1"]),
    ("expert exchange 2^32 rows", sets("parallel.ep=4096", "parallel.dp=4096", "model.n_experts=4096",
                                       "model.seq_len=1048576", "train.micro_batch=1", "train.global_batch=4096"),
     ["parallel.ep=4096", "expert exchange"]),
    ("tokens seen 2^63", sets("train.steps=2147483647", "train.global_batch=1048576", "model.seq_len=4096"),
     ["train.steps=2147483647 x train.global_batch=1048576 x model.seq_len=4096", "2^53"]),
]


def configs(w):
    for what, args, want in CONFIGS:
        rc, out, err = run(os.path.join(B, "mcplan"), *args, timeout=60)
        check(rc == 2 and all(s in err for s in want), "mcplan, %s: rc %d, wanted %s in: %s" % (what, rc, want, err[-600:]))
    # mctrain refuses before it allocates (the first three would ask for exabytes)
    for what, args, want in CONFIGS[:3]:
        rc, _, err = run(os.path.join(B, "mctrain"), *args, "--set", "checkpoint.dir=" + os.path.join(w, "run"),
                         "--set", "data.path=" + os.path.join(w, "none.h5"), timeout=60)
        check(rc == 1 and all(s in err for s in want), "mctrain, %s: rc %d, wanted %s in: %s" % (what, rc, want, err[-600:]))


def datasets(w):
    import h5py
    import numpy as np
    cases = []
    p = os.path.join(w, "huge.h5")  # 2^62+1 uint16 tokens: more bytes than int64
    with h5py.File(p, "w") as f:
        d = f.create_dataset("tokens", shape=(2**62 + 1,), dtype="u2", chunks=(1024,))
        d.attrs["vocab_size"] = np.int64(256)
    cases.append(("2^62+1 tokens", p, ["declares 4611686018427387905 tokens of 2 bytes", "more bytes than"]))
    p = os.path.join(w, "sparse.h5")  # 2^40 tokens declared, none stored
    with h5py.File(p, "w") as f:
        d = f.create_dataset("tokens", shape=(2**40,), dtype="u2", chunks=(1024,))
        d.attrs["vocab_size"] = np.int64(256)
    cases.append(("2^40 tokens, none stored", p, ["declares 1099511627776 tokens", "stores 0 bytes"]))
    p = os.path.join(w, "floatvocab.h5")  # vocab_size 300.7 was read as 300
    with h5py.File(p, "w") as f:
        d = f.create_dataset("tokens", data=np.arange(4096, dtype=np.uint16) % 256)
        d.attrs["vocab_size"] = np.float64(300.7)
    cases.append(("vocab_size 300.7", p, ["vocab_size is not one positive integer"]))
    p = os.path.join(w, "bigvocab.h5")  # vocab_size 2^64-1 (uint64) was clipped to 2^63-1
    with h5py.File(p, "w") as f:
        d = f.create_dataset("tokens", data=np.arange(4096, dtype=np.uint16) % 256)
        d.attrs["vocab_size"] = np.uint64(2**64 - 1)
    cases.append(("vocab_size 2^64-1", p, ["vocab_size is not one positive integer"]))
    for what, path, want in cases:
        rc, _, err = run(os.path.join(B, "mctrain"), *SMALL, "--set", "data.path=" + path, "--set",
                         "checkpoint.dir=" + os.path.join(w, "run"), "--set", "train.steps=1", timeout=120)
        check(rc == 1 and path in err and all(s in err for s in want),
              "mctrain on a token file with %s: rc %d, wanted %s in: %s" % (what, rc, want, err[-600:]))


def main():
    with tempfile.TemporaryDirectory(prefix="mc_overflow_", dir=os.environ.get("TMPDIR")) as w:
        configs(w)
        datasets(w)
    failures = test_untrusted.failures
    print("test_overflow: %s" % ("ok" if failures == 0 else "%d failures" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
