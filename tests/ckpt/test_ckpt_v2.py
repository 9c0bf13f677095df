"""Format version 2 (before optimizer groups) still loads: an AdamW checkpoint written by
test_ckpt_optim --write-adamw is rewritten as version 2 wrote it (no optimizer_groups, no
families[].optimizer, no config.optim, no `optimizer` attribute on the datasets, rank files'
format_version 2, no step datasets) and loads as AdamW throughout, every shard equal (test_ckpt_optim
--check-v2). A version 2 manifest whose config assigns Muon is refused, and so is a version 3
rank file whose `optimizer` attribute disagrees with the manifest."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_edit import drop_steps, rehash_files, rewrite_manifest, set_version, step_dir  # noqa: E402

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def flip_middle_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes([b[0] ^ 1]))


def check_rewritten(tool, root, version, rewrite, records, what, refusal):
    """A sample rewritten as format `version` by rewrite(run_dir) records `what` (records(manifest)
    holds) and reads; with a byte flipped in the middle of its rank_0.h5 it is refused with
    `refusal` in the message."""
    d = os.path.join(root, "v%d" % version)
    subprocess.run([tool, "--write-adamw", d], check=True)
    rewrite(d)
    with open(os.path.join(step_dir(d), "manifest.json")) as f:
        m = json.load(f)
    check(m["format_version"] == version and records(m), f"the version {version} rewrite records {what}")
    r = run(tool, "--read", d)
    check(r.returncode == 0, f"version {version} sample does not read: {r.stderr}")
    flip_middle_byte(os.path.join(step_dir(d), "rank_0.h5"))
    r = run(tool, "--read", d)
    check(r.returncode != 0 and refusal in r.stderr, f"version {version} with a flipped byte: {r.returncode} {r.stderr}")


def run(tool, mode, d):
    return subprocess.run([tool, mode, d], capture_output=True, text=True)


def to_v2(d):
    sd = step_dir(d)
    for name in sorted(os.listdir(sd)):
        if not name.endswith(".h5"):
            continue
        with h5py.File(os.path.join(sd, name), "r+") as h:
            def drop(_, obj):
                if isinstance(obj, h5py.Dataset):
                    del obj.attrs["optimizer"]
            h.visititems(drop)
    drop_steps(d, 2)  # AdamW's step came with format 4

    def edit(m, _):
        m.pop("optimizer_groups")
        for f in m["families"]:
            f.pop("optimizer")
        m["config"].pop("optim")
    rewrite_manifest(d, edit)
    rehash_files(d)


def main():
    tool = sys.argv[1]
    base = os.path.join(os.environ.get("MC_BINARY_DIR", tempfile.gettempdir()), "ckpt-scratch")
    os.makedirs(base, exist_ok=True)
    root = tempfile.mkdtemp(prefix="v2.", dir=base)

    d = os.path.join(root, "v2")
    subprocess.run([tool, "--write-adamw", d], check=True)
    to_v2(d)
    r = run(tool, "--check-v2", d)
    check(r.returncode == 0, f"version 2 checkpoint does not load as AdamW: {r.stdout}{r.stderr}")

    # a version 2 manifest cannot have Muon families: a config saying so is refused
    def muon(m, _):
        m["config"]["optim"] = {"groups": "muon:matrices,adamw:all"}
    rewrite_manifest(d, muon)
    r = run(tool, "--read", d)
    check(r.returncode != 0 and "(format version < 3) but the recorded config's optim.groups" in r.stderr
          and "assigns muon" in r.stderr, f"version 2 with Muon in its config: {r.returncode} {r.stderr}")

    # version 3: a dataset whose optimizer attribute disagrees with the manifest
    d3 = os.path.join(root, "v3")
    subprocess.run([tool, "--write-adamw", d3], check=True)
    r = run(tool, "--read", d3)
    check(r.returncode == 0, f"version 3 sample does not read: {r.stderr}")
    names = []
    with h5py.File(os.path.join(step_dir(d3), "rank_0.h5"), "r+") as h:
        h.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        h[names[0]].attrs["optimizer"] = "muon"
    rehash_files(d3)
    r = run(tool, "--read", d3)
    check(r.returncode != 0 and f"attribute 'optimizer' of dataset /{names[0]}" in r.stderr,
          f"optimizer attribute edited: {r.returncode} {r.stderr}")

    # version 4 (whole-file hashes, before piece digests) still loads, its files checked whole:
    # a flipped byte is refused as a whole-file hash mismatch before the file is parsed
    check_rewritten(tool, root, 4, lambda d: set_version(d, 4),
                    lambda m: all("sha256" in rec and "pieces" not in rec for rec in m["files"]), "whole-file hashes",
                    "rank_0.h5: whole-file hash mismatch")
    # version 5 (piece digests, no shard offsets: the two-pass load) still loads, rewritten by
    # ckpt_edit.py --to-v5; a flipped byte is refused naming its piece
    edit = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_edit.py")
    check_rewritten(tool, root, 5, lambda d: subprocess.run(["/usr/bin/python3", edit, "--to-v5", d], check=True),
                    lambda m: all("pieces" in rec for rec in m["files"]) and not any("offset" in s for s in m["shards"]),
                    "pieces and no shard offsets", "rank_0.h5: hash mismatch in piece")

    print(f"test_ckpt_v2: {len(failures)} failures")
    if not failures:
        shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
