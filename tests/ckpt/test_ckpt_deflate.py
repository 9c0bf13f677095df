#!/usr/bin/python3
"""checkpoint.compress=deflate and mcdata --compress end to end (docs/checkpoint.md,
"Compression"; issue 15):

- mcdata --compress writes /tokens chunked through shuffle + deflate, with the same tokens as
  the plain dataset;
- a run with checkpoint.compress=deflate (async saves) on the compressed dataset has the
  losses of a run with compress=none (sync saves) on the plain one, bit for bit; its rank
  files hold chunked shuffle + deflate datasets whose sha256 attributes, and the manifest's
  shard hashes, equal the uncompressed run's (the hash is over the raw fp32 bytes);
- mcaudit --verify accepts it; a resume from its step 2 continues with the losses of the
  uncompressed run's resume and of the run that never stopped; mceval gives the same loss;
- mcreshard from it to dp=4 zero=1 writes the shards (hashes) that a reshard of the
  uncompressed run writes, and mcaudit --verify accepts the target;
- a compressed token file with a chunk never written is refused;
- checkpoint.compress takes none or deflate only.

usage: test_ckpt_deflate.py   (MC_BINARY_DIR and MC_SOURCE_DIR from ctest; /usr/bin/python3)"""
import glob
import json
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reliability"))
from test_untrusted import SMALL as SMALL_SYNC, check, losses, run, scratch_main  # noqa: E402

B = os.environ["MC_BINARY_DIR"]
S = os.environ["MC_SOURCE_DIR"]
# test_untrusted's small model (synchronous saves, checkpoint.keep=0), 4 steps, a save every 2
SMALL = SMALL_SYNC + ["--set", "train.steps=4", "--set", "checkpoint.every=2", "--set", "train.log_every=1"]


def ok(what, *args, cwd=None):
    rc, out, err = run(*args, cwd=cwd)
    check(rc == 0, "%s exited %d: %s" % (what, rc, err.strip()[-600:]))
    return out


def shard_hashes(step_dir):
    m = json.load(open(os.path.join(step_dir, "manifest.json")))
    return sorted((s["dataset"], s["file"], tuple(s["start"]), s["sha256"]) for s in m["shards"])


def storage(step_dir):
    """{dataset: (layout, filters, sha256 attribute)} of every rank file of a step."""
    out = {}
    for p in sorted(glob.glob(os.path.join(step_dir, "rank_*.h5"))):
        with h5py.File(p, "r") as f:
            def visit(n, o):
                if isinstance(o, h5py.Dataset):
                    out[os.path.basename(p) + ":/" + n] = (o.chunks is not None, o.shuffle, o.compression,
                                                            o.fletcher32, o.attrs["sha256"], o.nbytes)
            f.visititems(visit)
    return out


def body(w):
    docs = sorted(glob.glob(os.path.join(S, "docs", "*.md")))
    ok("mcdata", os.path.join(B, "mcdata"), "-o", "plain.h5", *docs, cwd=w)
    ok("mcdata --compress", os.path.join(B, "mcdata"), "--compress", "-o", "zip.h5", *docs, cwd=w)
    with h5py.File(os.path.join(w, "plain.h5"), "r") as a, h5py.File(os.path.join(w, "zip.h5"), "r") as b:
        ta, tb = a["tokens"], b["tokens"]
        check(tb.chunks is not None and tb.shuffle and tb.compression == "gzip", "mcdata --compress: /tokens is not "
              "chunked shuffle + gzip: %s %s %s" % (tb.chunks, tb.shuffle, tb.compression))
        check(np.array_equal(ta[()], tb[()]), "mcdata --compress: tokens differ")
        check(dict(ta.attrs) .keys() == dict(tb.attrs).keys(), "mcdata --compress: attributes differ")
        print("mcdata --compress: %d tokens, %d bytes stored against %d (ratio %.2f)" %
              (ta.size, tb.id.get_storage_size(), ta.id.get_storage_size(),
               ta.id.get_storage_size() / tb.id.get_storage_size()))

    mctrain = os.path.join(B, "mctrain")
    # reference: uncompressed data and checkpoints, synchronous saves, 4 steps
    ok("mctrain none", mctrain, *SMALL, "--set", "data.path=plain.h5", "--set", "checkpoint.dir=a",
       "--set", "checkpoint.async_save=false", cwd=w)
    ok("mctrain deflate", mctrain, *SMALL, "--set", "data.path=zip.h5", "--set", "checkpoint.dir=b",
       "--set", "checkpoint.compress=deflate", "--set", "checkpoint.async_save=true", cwd=w)
    la, lb = losses(os.path.join(w, "a", "metrics.jsonl")), losses(os.path.join(w, "b", "metrics.jsonl"))
    check(len(la) == 4 and la == lb, "losses differ: none/plain %s, deflate/compressed %s" % (la, lb))
    for step in (2, 4):
        sa, sb = os.path.join(w, "a", "step_%d" % step), os.path.join(w, "b", "step_%d" % step)
        check(shard_hashes(sa) == shard_hashes(sb), "step %d: shard hashes of the manifests differ" % step)
        ga, gb = storage(sa), storage(sb)
        check(ga.keys() == gb.keys(), "step %d: datasets differ" % step)
        big = 0
        for k in ga:
            check(ga[k][0] is False and ga[k][2] is None, "%s: compress=none wrote %s" % (k, ga[k]))
            # 16 KiB and more: chunked shuffle + deflate; smaller: contiguous
            want = (True, True, "gzip", False) if gb[k][5] >= 16384 else (False, False, None, False)
            big += gb[k][5] >= 16384
            check(gb[k][:4] == want, "%s: compress=deflate wrote %s" % (k, gb[k]))
            check(ga[k][4] == gb[k][4], "%s: sha256 attribute differs" % k)
        check(big >= 3, "step %d: only %d datasets of 16 KiB or more" % (step, big))
        # format 6: a chunked (compressed) shard records no offset, a contiguous one does
        mb = {s["file"] + ":" + s["dataset"]: s for s in json.load(open(os.path.join(sb, "manifest.json")))["shards"]}
        for k in gb:
            check(("offset" in mb[k]) == (not gb[k][0]), "%s: offset recorded %s, chunked %s" % (k, "offset" in mb[k], gb[k][0]))
        za = sum(os.path.getsize(p) for p in glob.glob(os.path.join(sa, "rank_*.h5")))
        zb = sum(os.path.getsize(p) for p in glob.glob(os.path.join(sb, "rank_*.h5")))
        print("step %d: rank files %d bytes (none), %d bytes (deflate)" % (step, za, zb))
    cfg = json.load(open(os.path.join(w, "b", "step_4", "manifest.json")))["config"]
    check(cfg["checkpoint"]["compress"] == "deflate", "the manifest's config does not record compress=deflate")

    ok("mcaudit --verify", os.path.join(B, "mcaudit"), "b", "--verify", "--no-progress", cwd=w)

    # resume from step 2 of each: the continuation of the run that never stopped
    for src, data, comp in (("a", "plain.h5", "none"), ("b", "zip.h5", "deflate")):
        ok("mctrain --resume " + src, mctrain, *SMALL, "--set", "data.path=" + data, "--set",
           "checkpoint.dir=r" + src, "--set", "checkpoint.compress=" + comp, "--resume", src + "/step_2", cwd=w)
        lr = losses(os.path.join(w, "r" + src, "metrics.jsonl"))
        check(lr.get(3) == la[3] and lr.get(4) == la[4], "resume of %s: losses %s, the run that never stopped %s" %
              (src, lr, la))
    check(shard_hashes(os.path.join(w, "ra", "step_4")) == shard_hashes(os.path.join(w, "rb", "step_4")),
          "resumed step 4: shard hashes differ")

    ev = os.path.join(B, "mceval")
    ea = ok("mceval a", ev, "a", "--data", "plain.h5", "--batches", "2", cwd=w)
    eb = ok("mceval b", ev, "b", "--data", "zip.h5", "--batches", "2", cwd=w)
    check(ea.replace("plain.h5", "X").replace("a/", "") == eb.replace("zip.h5", "X").replace("b/", ""),
          "mceval differs:\n%s\n%s" % (ea, eb))

    rs = os.path.join(B, "mcreshard")
    for src in ("a", "b"):
        ok("mcreshard " + src, rs, src, "t" + src, "--dp", "4", "--zero", "1", "--no-progress", cwd=w)
    check(shard_hashes(os.path.join(w, "ta", "step_4")) == shard_hashes(os.path.join(w, "tb", "step_4")),
          "resharded shards differ between the uncompressed and the compressed source")
    ok("mcaudit --verify tb", os.path.join(B, "mcaudit"), "tb", "--verify", "--no-progress", cwd=w)

    # a compressed token file with a chunk never written: its reads would return fill values
    with h5py.File(os.path.join(w, "plain.h5"), "r") as a, h5py.File(os.path.join(w, "holes.h5"), "w") as h:
        t = a["tokens"]
        d = h.create_dataset("tokens", shape=t.shape, dtype=t.dtype, chunks=(4096,), shuffle=True, compression="gzip")
        d[:t.shape[0] // 2] = t[:t.shape[0] // 2]
        for k, v in t.attrs.items():
            d.attrs[k] = v
    rc, _, err = run(mctrain, *SMALL, "--set", "data.path=holes.h5", "--set", "checkpoint.dir=h", cwd=w)
    check(rc == 1 and "holes.h5" in err and "chunks but stores" in err,
          "a compressed token file with unwritten chunks: rc %d: %s" % (rc, err.strip()[-300:]))

    rc, _, err = run(mctrain, *SMALL, "--set", "data.path=plain.h5", "--set", "checkpoint.dir=c",
                     "--set", "checkpoint.compress=zstd", cwd=w)
    check(rc == 2 and "checkpoint.compress" in err and "none" in err and "deflate" in err,
          "checkpoint.compress=zstd: rc %d: %s" % (rc, err.strip()[-300:]))


if __name__ == "__main__":
    sys.exit(scratch_main("mc_deflate.", "ckpt.deflate", body))
