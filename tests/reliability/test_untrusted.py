#!/usr/bin/python3
"""Untrusted checkpoints (docs/reliability.md, issue 17 items 1 and 2), against every reader:
mcaudit --verify, mctrain --resume, mceval, mcreshard and mcreshard --export.

  storage: a rank file whose shard is stored as HDF5 external storage, a virtual dataset,
           chunked without filters, chunked + gzip without shuffle, shuffle + gzip +
           fletcher32, shuffle + gzip with a chunk never written, with every hash (shard,
           whole file, manifest, latest) recomputed so that only the storage rule can catch
           it: every reader exits 1 naming the file and dataset and never copies the outside
           bytes anywhere. The one accepted pipeline, shuffle + gzip in chunks (what
           checkpoint.compress=deflate writes), written by h5py: every reader exits 0; the
           same with the manifest still recording the old contiguous data offset (format 6):
           mctrain --resume, whose verified load uses the offsets, refuses it naming the
           file and dataset.
  flips:   N seeded random bit flips in the metadata of a rank file (bytes outside every
           dataset's data): every reader exits 1 or 2 with a message, none dies of a signal.

usage: test_untrusted.py storage|flips [N]   (MC_BINARY_DIR and MC_SOURCE_DIR from ctest)
Runs under /usr/bin/python3 (Debian's h5py and numpy)."""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
from ckpt_edit import rehash_files, step_dir  # noqa: E402

B = os.environ["MC_BINARY_DIR"]
S = os.environ["MC_SOURCE_DIR"]
SMALL = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_kv_heads=1",
         "--set", "model.head_dim=16", "--set", "model.expert_hidden=64", "--set", "model.mamba_inner=64",
         "--set", "model.mamba_head_dim=32", "--set", "model.ssm_state=8", "--set", "model.rec_width=32",
         "--set", "model.seq_len=32", "--set", "train.global_batch=8", "--set", "train.micro_batch=4",
         "--set", "train.warmup_steps=3", "--set", "checkpoint.keep=0", "--set", "checkpoint.async_save=false"]
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL: " + what)


def run(*args, cwd=None, timeout=300, env=None):
    """(status, stdout, stderr); status 999 if it ran past timeout seconds (a hang)."""
    try:
        p = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace", cwd=cwd, timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 999, "", "timed out after %d s" % timeout


def losses(path):
    """{step: loss} of a metrics.jsonl."""
    out = {}
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m and "step" in m:
                out[m["step"]] = m["loss"]
    return out


def make_run(w):
    """A committed tiny checkpoint at w/run (step 2) and the corpus it trained on."""
    docs = sorted(glob.glob(os.path.join(S, "docs", "*.md")))
    rc, _, err = run(os.path.join(B, "mcdata"), "-o", os.path.join(w, "corpus.h5"), *docs)
    check(rc == 0, "mcdata: " + err)
    rc, _, err = run(os.path.join(B, "mctrain"), *SMALL, "--set", "data.path=corpus.h5", "--set", "checkpoint.dir=run",
                     "--set", "train.steps=2", "--set", "checkpoint.every=2", cwd=w)
    check(rc == 0, "mctrain: " + err)


def readers(w, run_dir, out):
    """(name, argv, cwd) of every reader of the checkpoint at run_dir."""
    name = os.path.basename(run_dir)
    return [
        ("mcaudit --verify", [os.path.join(B, "mcaudit"), run_dir, "--verify", "--no-progress"], w),
        ("mctrain --resume", [os.path.join(B, "mctrain"), *SMALL, "--set", "data.path=corpus.h5",
                              "--set", "checkpoint.dir=" + name, "--set", "train.steps=3", "--set", "checkpoint.every=10",
                              "--resume", "latest"], w),
        ("mceval", [os.path.join(B, "mceval"), run_dir, "--data", os.path.join(w, "corpus.h5"), "--batches", "1"], w),
        ("mcreshard", [os.path.join(B, "mcreshard"), run_dir, os.path.join(out, "resharded"), "--consolidate",
                       "--no-progress"], w),
        ("mcreshard --export", [os.path.join(B, "mcreshard"), run_dir, "--export", os.path.join(out, "w.safetensors")], w),
    ]


def pick_dataset(path):
    """The largest 2-D param dataset of a rank file (name, data, attributes)."""
    best = None
    with h5py.File(path, "r") as f:
        def visit(n, o):
            nonlocal best
            if isinstance(o, h5py.Dataset) and n.endswith("/param") and o.ndim == 2:
                if best is None or o.size > best[1].size:
                    best = ("/" + n, o[()], {k: v for k, v in o.attrs.items()})
        f.visititems(visit)
    return best


def replace_dataset(path, name, data, attrs, make):
    with h5py.File(path, "r+") as f:
        del f[name]
        d = make(f, name, data)
        for k, v in attrs.items():
            d.attrs[k] = v


def storage_cases(w):
    secret_dir = os.path.join(w, "outside")
    os.makedirs(secret_dir)

    def external(f, name, data):
        raw = os.path.join(secret_dir, "secret.bin")
        data.astype("<f4").tofile(raw)  # the same bytes: every shard hash still matches
        return f.create_dataset(name, shape=data.shape, dtype="<f4", external=[(raw, 0, data.nbytes)])

    def virtual(f, name, data):
        src = os.path.join(secret_dir, "secret.h5")
        with h5py.File(src, "w") as g:
            g["x"] = data.astype("<f4")
        lay = h5py.VirtualLayout(shape=data.shape, dtype="<f4")
        lay[...] = h5py.VirtualSource(src, "x", shape=data.shape)
        return f.create_virtual_dataset(name, lay)

    def gzip(f, name, data):
        return f.create_dataset(name, data=data.astype("<f4"), chunks=True, compression="gzip")

    def chunked(f, name, data):
        return f.create_dataset(name, data=data.astype("<f4"), chunks=True)

    def fletcher(f, name, data):
        return f.create_dataset(name, data=data.astype("<f4"), chunks=(1, data.shape[1]), shuffle=True,
                                compression="gzip", fletcher32=True)

    def unwritten(f, name, data):
        # shuffle + gzip, one row a chunk, the last row never written: reads would return
        # fill values (the storage rule refuses it before any hash is computed)
        d = f.create_dataset(name, shape=data.shape, dtype="<f4", chunks=(1, data.shape[1]), shuffle=True,
                             compression="gzip")
        d[:-1] = data[:-1].astype("<f4")
        return d

    cases = [("external", external, "external storage"), ("virtual", virtual, "virtual dataset"),
             ("gzip", gzip, "has filters deflate"), ("chunked", chunked, "chunked without compression"),
             ("fletcher32", fletcher, "has filters shuffle"), ("unwritten", unwritten, "chunks are stored")]
    for label, make, why in cases:
        rd = os.path.join(w, "run_" + label)
        shutil.copytree(os.path.join(w, "run"), rd)
        rank = os.path.join(step_dir(rd), "rank_0.h5")
        name, data, attrs = pick_dataset(rank)
        replace_dataset(rank, name, data, attrs, make)
        rehash_files(rd)
        for tool, argv, cwd in readers(w, rd, os.path.join(w, "out_" + label)):
            os.makedirs(os.path.join(w, "out_" + label), exist_ok=True)
            rc, out, err = run(*argv, cwd=cwd)
            check(rc in (1, 2) and why in err and name in err and "rank_0.h5" in err,
                  "%s: %s must refuse the %s dataset %s (rc %d): %s" % (label, tool, label, name, rc, err.strip()[-400:]))
            for produced in glob.glob(os.path.join(w, "out_" + label, "*")):
                check(False, "%s: %s left %s" % (label, tool, produced))
                shutil.rmtree(produced, ignore_errors=True) if os.path.isdir(produced) else os.unlink(produced)
        shutil.rmtree(rd)
    print("storage: %d forged layouts x 5 readers" % len(cases))

    # the accepted pipeline, written by another program: shuffle + gzip, chunks of rows
    def shuffle_gzip(f, name, data):
        return f.create_dataset(name, data=data.astype("<f4"), chunks=(max(1, data.shape[0] // 3), data.shape[1]),
                                shuffle=True, compression="gzip", compression_opts=4)

    rd = os.path.join(w, "run_shuffle_gzip")
    shutil.copytree(os.path.join(w, "run"), rd)
    rank = os.path.join(step_dir(rd), "rank_0.h5")
    name, data, attrs = pick_dataset(rank)
    replace_dataset(rank, name, data, attrs, shuffle_gzip)
    rehash_files(rd)
    out_dir = os.path.join(w, "out_shuffle_gzip")
    for tool, argv, cwd in readers(w, rd, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        rc, out, err = run(*argv, cwd=cwd)
        check(rc == 0, "shuffle+gzip: %s must accept %s (rc %d): %s" % (tool, name, rc, err.strip()[-400:]))
    shutil.rmtree(rd)
    shutil.rmtree(out_dir, ignore_errors=True)
    print("storage: shuffle + gzip accepted by 5 readers")

    # the same with the manifest still recording the contiguous dataset's offset (format 6):
    # a verified load that uses the offsets refuses the manifest, naming file and dataset
    rd = os.path.join(w, "run_stale_offset")
    shutil.copytree(os.path.join(w, "run"), rd)
    rank = os.path.join(step_dir(rd), "rank_0.h5")
    name, data, attrs = pick_dataset(rank)
    replace_dataset(rank, name, data, attrs, shuffle_gzip)
    rehash_files(rd, offsets=False)
    tool, argv, cwd = readers(w, rd, out_dir)[1]
    rc, out, err = run(*argv, cwd=cwd)
    check(rc != 0 and "rank_0.h5" in err and name in err and "without one data range" in err,
          "stale offset: %s must refuse %s (rc %d): %s" % (tool, name, rc, err.strip()[-400:]))
    shutil.rmtree(rd)
    print("storage: a stale offset refused by %s" % tool)


def metadata_ranges(path):
    """Byte ranges of a rank file that are not dataset data (HDF5 metadata)."""
    data = []
    with h5py.File(path, "r") as f:
        def visit(n, o):
            if isinstance(o, h5py.Dataset):
                off = o.id.get_offset()
                if off is not None:
                    data.append((off, off + o.id.get_storage_size()))
        f.visititems(visit)
    size = os.path.getsize(path)
    data.sort()
    out, at = [], 0
    for a, b in data:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < size:
        out.append((at, size))
    return out


def flip_cases(w, n):
    rnd = random.Random(17)
    src = os.path.join(w, "run")
    rank = os.path.join(step_dir(src), "rank_0.h5")
    ranges = metadata_ranges(rank)
    total = sum(b - a for a, b in ranges)
    crashes = 0
    for i in range(n):
        # a uniform byte of the metadata region, one bit of it
        k = rnd.randrange(total)
        for a, b in ranges:
            if k < b - a:
                at = a + k
                break
            k -= b - a
        bit = 1 << rnd.randrange(8)
        rd = os.path.join(w, "run_flip")
        shutil.rmtree(rd, ignore_errors=True)
        shutil.copytree(src, rd)
        p = os.path.join(step_dir(rd), "rank_0.h5")
        with open(p, "r+b") as f:
            f.seek(at)
            c = f.read(1)[0]
            f.seek(at)
            f.write(bytes([c ^ bit]))
        out = os.path.join(w, "out_flip")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        for tool, argv, cwd in readers(w, rd, out):
            rc, _, err = run(*argv, cwd=cwd)
            if rc < 0 or rc > 2:
                crashes += 1
                check(False, "flip %d (byte %d xor 0x%02x): %s died with %s: %s" %
                      (i, at, bit, tool, signal.Signals(-rc).name if rc < 0 else "status %d" % rc, err.strip()[-300:]))
            else:
                check(rc in (1, 2) and err.strip() != "" and "rank_0.h5" in err,
                      "flip %d (byte %d xor 0x%02x): %s exited %d: %s" % (i, at, bit, tool, rc, err.strip()[-300:]))
    print("flips: %d metadata bit flips x 5 readers, %d crashes" % (n, crashes))


def scratch_main(prefix, name, body):
    """Runs body(w) in a fresh temporary directory w (removed after), prints the failure count
    as '<name>: N failures' and returns the exit status."""
    w = tempfile.mkdtemp(prefix=prefix)
    try:
        body(w)
    finally:
        shutil.rmtree(w, ignore_errors=True)
    print("%s: %d failures" % (name, failures))
    return 1 if failures else 0


def main():
    mode = sys.argv[1]
    w = tempfile.mkdtemp(prefix="mc_untrusted_")
    try:
        make_run(w)
        if failures == 0:
            if mode == "storage":
                storage_cases(w)
            else:
                flip_cases(w, int(sys.argv[2]) if len(sys.argv) > 2 else 20)
    finally:
        shutil.rmtree(w, ignore_errors=True)
    print("test_untrusted %s: %d failures" % (mode, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
