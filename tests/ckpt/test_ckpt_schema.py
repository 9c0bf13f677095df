"""A manifest written by MegaC (test_ckpt_roundtrip --write) is valid against
schemas/manifest.schema.json, and the schema rejects broken variants of it."""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import jsonschema


def main():
    writer = sys.argv[1]
    src = os.environ.get("MC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    with open(os.path.join(src, "schemas", "manifest.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)

    base = os.path.join(os.environ.get("MC_BINARY_DIR", tempfile.gettempdir()), "ckpt-scratch")
    os.makedirs(base, exist_ok=True)
    root = tempfile.mkdtemp(prefix="schema.", dir=base)
    subprocess.run([writer, "--write", root], check=True)
    with open(os.path.join(root, "latest")) as f:
        latest = json.load(f)
    with open(os.path.join(root, latest["path"], "manifest.json")) as f:
        manifest = json.load(f)

    failures = []
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))
    for e in errors:
        failures.append(f"written manifest invalid at {list(e.path)}: {e.message}")

    def broken(name, edit):
        m = copy.deepcopy(manifest)
        edit(m)
        if validator.is_valid(m):
            failures.append(f"schema accepts a manifest with {name}")

    broken("no shards", lambda m: m.pop("shards"))
    broken("a newer format version", lambda m: m.update(format_version=7))
    # version 6: contiguous shards record where their data lies
    if not any("offset" in s for s in manifest["shards"]):
        failures.append("written manifest records no shard offset (format 6)")
    broken("an offset of 0", lambda m: next(s for s in m["shards"] if "offset" in s).update(offset=0))
    broken("an offset that is not an integer", lambda m: next(s for s in m["shards"] if "offset" in s).update(offset="64"))
    broken("an offset in version 5", lambda m: m.update(format_version=5))
    # version 5: piece digests, together, no whole-file sha256
    broken("a whole-file sha256 in version 5", lambda m: m["files"][0].update(sha256="0" * 64))
    broken("pieces without piece_bytes", lambda m: m["files"][0].pop("piece_bytes"))
    broken("pieces without their root", lambda m: m["files"][0].pop("pieces_sha256"))
    broken("piece_bytes 0", lambda m: m["files"][0].update(piece_bytes=0))
    broken("piece_bytes 2^31", lambda m: m["files"][0].update(piece_bytes=2 ** 31))
    broken("piece_bytes not a multiple of 4096", lambda m: m["files"][0].update(piece_bytes=5000))
    broken("a piece digest not hex", lambda m: m["files"][0]["pieces"].__setitem__(0, "g" * 64))
    broken("version 3 without optimizer groups", lambda m: m.pop("optimizer_groups"))
    broken("a family without its optimizer", lambda m: m["families"][0].pop("optimizer"))
    broken("an unknown optimizer", lambda m: m["families"][0].update(optimizer="sgd"))
    broken("a float64 state", lambda m: m["optimizer_groups"][0]["states"][0].update(dtype="float64"))
    broken("a float64 param", lambda m: m["families"][0].update(dtype="float64"))
    broken("a state shaped otherwise", lambda m: m["optimizer_groups"][0]["states"][0].update(shape="rows"))
    # int64 is for the step counter only, and the step is an int64 scalar, replicated
    adamw = lambda m: next(g for g in m["optimizer_groups"] if g["name"] == "adamw")["states"]
    step_decl = lambda m: next(s for s in adamw(m) if s["name"] == "step")
    broken("an int64 moment", lambda m: adamw(m)[0].update(dtype="int64"))
    broken("a float32 step", lambda m: step_decl(m).update(dtype="float32"))
    broken("a step shaped like the parameter", lambda m: step_decl(m).update(shape="param"))
    broken("a step placed like the parameter", lambda m: step_decl(m).update(placement="param"))
    broken("an int64 param", lambda m: m["families"][0].update(dtype="int64"))
    broken("version 2 with optimizer groups", lambda m: m.update(format_version=2))
    broken("version 2 without its ownership rule", lambda m: m["layout"].pop("ownership_rule"))
    broken("an unknown ownership rule", lambda m: m["layout"].update(ownership_rule="lumpy"))
    broken("version 1 with an ownership rule",
           lambda m: (m.update(format_version=1), m.pop("optimizer_groups"), [f.pop("optimizer") for f in m["families"]]))
    broken("a short sha256", lambda m: m["shards"][0].update(sha256="abc"))
    broken("a seed as a number", lambda m: m["training_state"].update(seed=5))
    broken("an unknown state", lambda m: m["shards"][0].update(state="velocity"))
    broken("a 4-d count", lambda m: m["shards"][0].update(count=[1, 1, 1, 1]))
    broken("an unknown top-level key", lambda m: m.update(extra=1))
    broken("a file outside the step directory", lambda m: m["files"][0].update(name="../rank_0.h5"))

    # version 5: no shard offsets
    def no_offsets(m):
        for s in m["shards"]:
            s.pop("offset", None)
    v5 = copy.deepcopy(manifest)
    v5.update(format_version=5)
    no_offsets(v5)
    if not validator.is_valid(v5):
        failures.append("schema refuses a version 5 manifest")

    # versions up to 4 record the whole file's sha256 and no pieces
    def whole_file(m):
        no_offsets(m)
        for f in m["files"]:
            for k in ("piece_bytes", "pieces", "pieces_sha256"):
                f.pop(k)
            f["sha256"] = "0" * 64
    if not manifest["files"][0].get("pieces"):
        failures.append("written manifest has no piece digests")
    broken("version 4 with pieces", lambda m: m.update(format_version=4))
    v4 = copy.deepcopy(manifest)
    v4.update(format_version=4)
    whole_file(v4)
    if not validator.is_valid(v4):
        failures.append("schema refuses a version 4 manifest")
    v2 = copy.deepcopy(manifest)
    whole_file(v2)
    v2.update(format_version=2, states=["param", "exp_avg", "exp_avg_sq"])
    v2.pop("optimizer_groups")
    for f in v2["families"]:
        f.pop("optimizer")
    if not validator.is_valid(v2):
        failures.append("schema refuses a version 2 manifest")
    # version 3: optimizer groups, AdamW without its step
    v3 = copy.deepcopy(manifest)
    whole_file(v3)
    v3.update(format_version=3, states=[s for s in manifest["states"] if s != "step"])
    for g in v3["optimizer_groups"]:
        g["states"] = [s for s in g["states"] if s["name"] != "step"]
    v3["shards"] = [s for s in v3["shards"] if s["state"] != "step"]
    if not validator.is_valid(v3):
        failures.append("schema refuses a version 3 manifest")

    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(f"test_ckpt_schema: manifest with {len(manifest['shards'])} shards, {len(failures)} failures")
    if not failures:
        shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
