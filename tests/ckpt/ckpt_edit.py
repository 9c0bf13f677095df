"""Edits the manifest of a run directory's latest checkpoint and records its new hash in
manifest.sha256 and latest, so that only the manifest's content rules (or the checks behind
them) can catch the edit. Shared by the python tests that forge checkpoints."""
import hashlib
import json
import os


def step_dir(run_dir):
    with open(os.path.join(run_dir, "latest")) as f:
        return os.path.join(run_dir, json.load(f)["path"])


def rewrite_manifest(run_dir, edit):
    """edit(manifest_dict, step_dir) changes the parsed manifest in place."""
    sd = step_dir(run_dir)
    mp = os.path.join(sd, "manifest.json")
    with open(mp) as f:
        m = json.load(f)
    edit(m, sd)
    text = json.dumps(m, indent="\t").encode()
    with open(mp, "wb") as f:
        f.write(text)
    h = hashlib.sha256(text).hexdigest()
    with open(os.path.join(sd, "manifest.sha256"), "w") as f:
        f.write(h + "  manifest.json\n")
    with open(os.path.join(run_dir, "latest")) as f:
        latest = json.load(f)
    latest["manifest_sha256"] = h
    with open(os.path.join(run_dir, "latest"), "w") as f:
        json.dump(latest, f)


DIGEST_KEYS = ("sha256", "piece_bytes", "pieces", "pieces_sha256")


def strip_file_hashes(run_dir):
    """Makes the checkpoint look written before whole-file hashes (no files[].sha256, nor the
    piece digests of format 5): its rank files are then parsed after a size check only."""
    def edit(m, _):
        for rec in m["files"]:
            for k in DIGEST_KEYS:
                rec.pop(k, None)
    rewrite_manifest(run_dir, edit)


def file_digests(data, version, piece_bytes=64 << 20):
    """The digest keys of a files[] entry for a file holding `data`, as format `version`
    records them: version 5 its pieces (docs/checkpoint.md), earlier ones the whole file's
    SHA-256."""
    if version <= 4:
        return {"sha256": hashlib.sha256(data).hexdigest()}
    pieces = [hashlib.sha256(data[i:i + piece_bytes]).hexdigest() for i in range(0, len(data), piece_bytes)]
    root = hashlib.sha256(b"".join(bytes.fromhex(p) for p in pieces)).hexdigest()
    return {"piece_bytes": piece_bytes, "pieces_sha256": root, "pieces": pieces}


def record_offsets(m, sd):
    """Format 6: each shard's offset as its rank file now stores it (h5py's get_offset() of a
    contiguous, unfiltered dataset; none for chunked, external or virtual storage), as a writer
    of that file would record it."""
    import h5py
    opened = {}
    for s in m["shards"]:
        s.pop("offset", None)
        if s["file"] not in opened:
            opened[s["file"]] = h5py.File(os.path.join(sd, s["file"]), "r")
        ds = opened[s["file"]].get(s["dataset"])
        if isinstance(ds, h5py.Dataset) and ds.chunks is None and ds.external is None and not ds.is_virtual:
            at = ds.id.get_offset()
            if at:
                s["offset"] = at
    for h in opened.values():
        h.close()


def rehash_files(run_dir, offsets=True):
    """Records every rank file's current size and digests (those of the manifest's format
    version, with the piece size it records) and, in format 6, its shards' offsets (unless
    offsets=False): a forged checkpoint consistent in every hash and offset."""
    def edit(m, sd):
        if m["format_version"] >= 6 and offsets:
            record_offsets(m, sd)
        for rec in m["files"]:
            p = os.path.join(sd, rec["name"])
            pb = rec.get("piece_bytes", 64 << 20)
            for k in DIGEST_KEYS:
                rec.pop(k, None)
            with open(p, "rb") as f:
                data = f.read()
            rec["bytes"] = len(data)
            rec.update(file_digests(data, m["format_version"], pb))
    rewrite_manifest(run_dir, edit)


def drop_offsets(m):
    """Format 6 records shards[].offset; earlier versions have no such key."""
    for s in m["shards"]:
        s.pop("offset", None)


def set_version(run_dir, version):
    """Rewrites a checkpoint as format `version` records it: the manifest's and the rank files'
    format_version, no shard offsets before version 6, and the files' digests (rehashed)."""
    import h5py
    sd = step_dir(run_dir)
    for name in sorted(os.listdir(sd)):
        if name.endswith(".h5"):
            with h5py.File(os.path.join(sd, name), "r+") as h:
                h.attrs["format_version"] = version

    def edit(m, _):
        m["format_version"] = version
        if version < 6:
            drop_offsets(m)
    rewrite_manifest(run_dir, edit)
    rehash_files(run_dir)


def drop_steps(run_dir, version):
    """Rewrites a checkpoint as format `version` < 4 wrote it as far as AdamW's step goes: no
    step datasets, no step in states, shards or the AdamW group, rank files and manifest of
    that format_version, whole-file hashes (other version differences are the caller's).
    Rehashes the files."""
    import h5py
    sd = step_dir(run_dir)
    for name in sorted(os.listdir(sd)):
        if not name.endswith(".h5"):
            continue
        with h5py.File(os.path.join(sd, name), "r+") as h:
            h.attrs["format_version"] = version
            steps = []
            h.visititems(lambda path, obj: steps.append(path) if isinstance(obj, h5py.Dataset) and path.endswith("/step") else None)
            for p in steps:
                del h[p]

    def edit(m, _):
        m["format_version"] = version
        drop_offsets(m)
        m["states"] = [s for s in m["states"] if s != "step"]
        m["shards"] = [s for s in m["shards"] if s["state"] != "step"]
        for g in m.get("optimizer_groups", []):
            g["states"] = [s for s in g["states"] if s["name"] != "step"]
    rewrite_manifest(run_dir, edit)
    rehash_files(run_dir)


if __name__ == "__main__":
    # ckpt_edit.py --to-v3 RUN_DIR: the latest checkpoint as format version 3 (before the step)
    # ckpt_edit.py --to-v4 RUN_DIR: the latest checkpoint as format version 4 (whole-file hashes)
    # ckpt_edit.py --to-v5 RUN_DIR: the latest checkpoint as format version 5 (no shard offsets)
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--to-v3":
        drop_steps(sys.argv[2], 3)
    elif len(sys.argv) == 3 and sys.argv[1] in ("--to-v4", "--to-v5"):
        set_version(sys.argv[2], int(sys.argv[1][-1]))
    else:
        sys.exit("usage: ckpt_edit.py --to-v3|--to-v4|--to-v5 RUN_DIR")
