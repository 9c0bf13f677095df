"""Interop: a checkpoint written by MegaC (test_ckpt_roundtrip --write) read with h5py,
hashlib and h5dump alone, without any MegaC code: the root hash in `latest`, every shard's
attributes against the manifest, every shard's SHA-256 over its raw little-endian fp32
bytes, and that the shards of each family and of each state its optimizer keeps (param and
what its group in optimizer_groups declares) tile its global shape exactly once."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def main():
    writer = sys.argv[1]
    base = os.path.join(os.environ.get("MC_BINARY_DIR", tempfile.gettempdir()), "ckpt-scratch")
    os.makedirs(base, exist_ok=True)
    root = tempfile.mkdtemp(prefix="h5py.", dir=base)
    subprocess.run([writer, "--write", root], check=True)

    with open(os.path.join(root, "latest")) as f:
        latest = json.load(f)
    step_dir = os.path.join(root, latest["path"])
    with open(os.path.join(step_dir, "manifest.json"), "rb") as f:
        text = f.read()
    check(hashlib.sha256(text).hexdigest() == latest["manifest_sha256"], "root hash in latest")
    with open(os.path.join(step_dir, "manifest.sha256")) as f:
        check(f.read().split()[0] == latest["manifest_sha256"], "manifest.sha256 agrees with latest")
    manifest = json.loads(text)
    fams = {f["name"]: f for f in manifest["families"]}
    files = {f["name"]: f for f in manifest["files"]}

    cover = {}  # (family, state) -> int array counting how often each element is stored
    steps = {}  # family -> (its step as h5py reads it, the ranks holding it)
    holders = {}  # family -> the ranks holding a nonempty part of its param
    opened = {}
    for s in manifest["shards"]:
        path = os.path.join(step_dir, s["file"])
        if s["file"] not in opened:
            h = h5py.File(path, "r")
            opened[s["file"]] = h
            check(h.attrs["format"] == "megac-checkpoint", f"{s['file']}: format attribute")
            check(int(h.attrs["format_version"]) == manifest["format_version"], f"{s['file']}: version")
            check(int(h.attrs["rank"]) == files[s["file"]]["rank"], f"{s['file']}: rank attribute")
            check(int(h.attrs["step"]) == manifest["step"], f"{s['file']}: step attribute")
            check(os.path.getsize(path) == files[s["file"]]["bytes"], f"{s['file']}: size")
            # format 5: the SHA-256 of each piece of the file, and of the pieces' digests
            rec = files[s["file"]]
            with open(path, "rb") as fb:
                data = fb.read()
            pb = rec["piece_bytes"]
            want = [hashlib.sha256(data[i:i + pb]).hexdigest() for i in range(0, len(data), pb)]
            check(rec["pieces"] == want, f"{s['file']}: piece digests")
            check(rec["pieces_sha256"] == hashlib.sha256(b"".join(bytes.fromhex(p) for p in want)).hexdigest(),
                  f"{s['file']}: pieces_sha256")
            check("sha256" not in rec, f"{s['file']}: no whole-file sha256 in format 5")
        ds = opened[s["file"]][s["dataset"]]
        a = ds.attrs
        fam = fams[s["family"]]
        where = f"{s['file']}:{s['dataset']}"
        check(a["family"] == s["family"], f"{where}: family")
        check(a["state"] == s["state"], f"{where}: state")
        # AdamW's step (format 4): one int64, shape [1], replicated over the family's holders
        step = s["state"] == "step"
        check(a["dtype"] == ("int64" if step else "float32"), f"{where}: dtype")
        check(list(a["global_shape"]) == ([1] if step else fam["shape"]), f"{where}: global_shape")
        check(list(a["start"]) == s["start"], f"{where}: start")
        check(list(a["count"]) == s["count"], f"{where}: count")
        check(a["placement_rule"] == ("replicated" if step else fam["placement_rule"]), f"{where}: placement_rule")
        check(int(a["stage"]) == s["stage"] == fam["stage"], f"{where}: stage")
        check(list(a["replica_group"]) == s["replica_group"], f"{where}: replica_group")
        # format 1 (chunked rule): the lowest replica; format 2: one of the replicas
        lowest = manifest["format_version"] < 2 or manifest["layout"].get("ownership_rule") == "chunked"
        check(int(a["primary_rank"]) == s["rank"] and
              (s["rank"] == min(s["replica_group"]) if lowest or step else s["rank"] in s["replica_group"]),
              f"{where}: primary_rank")
        check(a["sha256"] == s["sha256"], f"{where}: sha256 attribute")
        if manifest["format_version"] >= 3:
            check(a["optimizer"] == fam["optimizer"], f"{where}: optimizer")
        # format 6: a contiguous, unfiltered dataset records where its data lies; HDF5 agrees
        contiguous = ds.chunks is None and ds.compression is None
        check(("offset" in s) == contiguous, f"{where}: offset recorded iff contiguous")
        if "offset" in s:
            check(s["offset"] == ds.id.get_offset(), f"{where}: offset {s['offset']} vs h5py's {ds.id.get_offset()}")
        et = np.dtype("<i8" if step else "<f4")
        check(ds.dtype == et and list(ds.shape) == s["count"], f"{where}: dtype/shape")
        data = ds[()]
        check(hashlib.sha256(data.astype(et).tobytes()).hexdigest() == a["sha256"], f"{where}: data hash")
        if step:
            steps[s["family"]] = (int(data[0]), set(s["replica_group"]))
        if s["state"] == "param":
            holders.setdefault(s["family"], set()).update(s["replica_group"])
        key = (s["family"], s["state"])
        if key not in cover:
            cover[key] = np.zeros([1] if step else fam["shape"], dtype=np.int32)
        box = tuple(slice(st, st + c) for st, c in zip(s["start"], s["count"]))
        cover[key][box] += 1
    for h in opened.values():
        h.close()
    declared = {g["name"]: {"param"} | {d["name"] for d in g["states"]} for g in manifest.get("optimizer_groups", [])}
    for name, fam in fams.items():
        keeps = declared.get(fam.get("optimizer", "adamw"), {"param", "exp_avg", "exp_avg_sq"})
        for state in manifest["states"]:
            c = cover.get((name, state))
            if state not in keeps:
                check(c is None, f"{name}/{state}: stored, but {fam['optimizer']} keeps no {state}")
                continue
            check(c is not None and c.min() == 1 and c.max() == 1, f"{name}/{state}: shards tile the tensor once")
    check(any("offset" in s for s in manifest["shards"]), "no shard records an offset (format 6)")
    check(set(manifest["states"]) == {"param", "exp_avg", "exp_avg_sq", "momentum", "step"}, f"states {manifest['states']}")
    # every AdamW family's step: held by exactly the holders of its param; the writer stores
    # random 64-bit values, so some lie beyond 2^53 and h5py must give them exactly
    adamw = [n for n, f in fams.items() if f["optimizer"] == "adamw"]
    check(adamw and set(steps) == set(adamw), f"step datasets of {sorted(steps)} vs AdamW families {sorted(adamw)}")
    for name, (v, reps) in steps.items():
        check(reps == holders.get(name), f"{name}/step: held by {sorted(reps)}, param by {sorted(holders.get(name, []))}")
    check(any(abs(v) > 2**53 for v, _ in steps.values()), "no step value beyond 2^53 (exactness not exercised)")

    # h5dump (HDF5's own tool) reads the attributes too.
    if shutil.which("h5dump"):
        out = subprocess.run(["h5dump", "-A", os.path.join(step_dir, manifest["shards"][0]["file"])],
                             capture_output=True, text=True)
        check(out.returncode == 0 and manifest["shards"][0]["sha256"] in out.stdout, "h5dump shows the sha256 attribute")

    print(f"test_ckpt_h5py: {len(manifest['shards'])} shards in {len(opened)} files, {len(failures)} failures")
    if not failures:
        shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
