"""mcreshard and mcaudit end to end, checked with independent readers (h5py, numpy, hashlib,
jsonschema): content and hashes preserved across layouts, the refusals and their messages,
dry-run JSON, audit digests and map, corruption, safetensors export/import; planning from a
metadata-only checkpoint (sim_scale --write-metadata, mcreshard --dry-run) and its refusals;
a checkpoint with mixed optimizer groups (Muon's momentum beside AdamW's moments).

usage: test_reshard_cli.py MCRESHARD MCAUDIT BENCH_RESHARD SIM_SCALE   (Debian's /usr/bin/python3)
"""
import filecmp
import glob
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
from ckpt_edit import step_dir, strip_file_hashes  # noqa: E402
import checks  # noqa: E402
from checks import check, run  # noqa: E402

MCRESHARD, MCAUDIT, BENCH, SIM = sys.argv[1:5]
SOURCE = os.environ.get("MC_SOURCE_DIR", ".")


def assemble(run_dir):
    """Global tensors {(family, state): array} from the rank files' attributes alone."""
    out, shards = {}, 0
    for path in sorted(glob.glob(os.path.join(step_dir(run_dir), "rank_*.h5"))):
        with h5py.File(path, "r") as f:
            for fam in f:
                for state in f[fam]:
                    d = f[fam][state]
                    a = d.attrs
                    data = d[()]
                    et = "<i8" if a["dtype"] == "int64" else "<f4"  # AdamW's step: int64
                    check(hashlib.sha256(data.astype(et).tobytes()).hexdigest() == a["sha256"],
                          "sha256 attribute of %s %s/%s" % (path, fam, state))
                    key = (fam, state)
                    if key not in out:  # float64 holds every float32 and the steps of these runs exactly
                        out[key] = np.full(tuple(a["global_shape"]), np.nan, dtype=np.float64)
                    sl = tuple(slice(s, s + c) for s, c in zip(a["start"], a["count"]))
                    check(np.isnan(out[key][sl]).all(), "overlapping shards of %s/%s" % key)
                    out[key][sl] = data
                    shards += 1
    for key, arr in out.items():
        check(not np.isnan(arr).any(), "gap in %s/%s" % key)
    return out, shards


def stored(state, arr):
    """A global tensor's bytes as stored: float32, AdamW's step as int64."""
    return arr.astype("<i8" if state == "step" else "<f4").tobytes()


def same_content(x, y, what):
    check(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x), what)


def audit_json(path, *extra):
    rc, out, err = run(MCAUDIT, path, "--json", *extra)
    return rc, (json.loads(out) if out.strip() else {}), err


def digests(report):
    return {f["name"]: f["digest_sha256"] for f in report.get("families", [])}


def main():
    tmp = tempfile.mkdtemp(prefix="mc_reshard_cli_")
    try:
        body(tmp)
        os.mkdir(os.path.join(tmp, "meta"))
        metadata_only(os.path.join(tmp, "meta"))
        os.mkdir(os.path.join(tmp, "groups"))
        groups(os.path.join(tmp, "groups"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_reshard_cli: %d failures" % checks.failures)
    return 1 if checks.failures else 0


def body(tmp):
    j = lambda *p: os.path.join(tmp, *p)
    rc, _, err = run(BENCH, "--synth", j("S"), "--tiny")
    check(rc == 0, "synthesize: " + err)
    rc, out, err = run(MCRESHARD, j("S"), j("A"), "--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--sp", "1",
                       "--zero", "1", "--no-progress")
    check(rc == 0 and "GB/s" in out and "peak RSS" in out, "S -> A: %s %s" % (out, err))
    A, nA = assemble(j("A"))
    S, _ = assemble(j("S"))
    same_content(S, A, "S and A hold the same global tensors")

    rc, out, err = run(MCRESHARD, j("A"), j("B"), "--tp", "1", "--pp", "4", "--dp", "2", "--ep", "1", "--sp", "0",
                       "--zero", "3", "--split", "AE|M|R|", "--no-progress")
    check(rc != 0, "a split with an empty stage is refused")
    rc, out, err = run(MCRESHARD, j("A"), j("B"), "--tp", "1", "--pp", "4", "--dp", "2", "--ep", "1", "--sp", "0",
                       "--zero", "3", "--no-progress")
    check(rc == 0, "A -> B: " + err)
    B, nB = assemble(j("B"))
    same_content(A, B, "A and B hold the same global tensors")
    with open(os.path.join(step_dir(j("B")), "manifest.json")) as f:
        manifest = json.load(f)
    check(manifest["layout"]["pp"] == 4 and manifest["layout"]["zero"] == 3, "B's manifest layout")
    with open(os.path.join(step_dir(j("A")), "manifest.json")) as f:
        check(json.load(f)["training_state"] == manifest["training_state"], "training state carried unchanged")
    try:
        import jsonschema
        src = os.environ.get("MC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
        with open(os.path.join(src, "schemas", "manifest.schema.json")) as f:
            jsonschema.validate(manifest, json.load(f))
    except ImportError:
        print("jsonschema not available: schema check skipped")
    except Exception as e:  # a validation error
        check(False, "B's manifest against the schema: %s" % e)

    # Refusals name the rule.
    rc, _, err = run(MCRESHARD, j("A"), j("B"), "--dp", "1", "--no-progress")
    check(rc != 0 and "--force" in err, "existing DST refused: " + err)
    rc, _, err = run(MCRESHARD, j("A"), j("C"), "--tp", "3")
    check(rc != 0 and "tp=3 does not divide" in err and not os.path.exists(j("C")), "tp=3 refused: " + err)
    with open(j("layout.json"), "w") as f:
        json.dump({"model": {"d_model": 128}, "parallel": {"tp": 1}}, f)
    rc, _, err = run(MCRESHARD, j("A"), j("C"), "--layout", j("layout.json"))
    check(rc != 0 and "model change: d_model 64 -> 128" in err, "model change refused: " + err)
    with open(j("layout.json"), "w") as f:
        json.dump({"parallel": {"tp": 1, "dp": 4, "pp": 1, "zero": 0}}, f)
    rc, out, err = run(MCRESHARD, j("A"), j("C"), "--layout", j("layout.json"), "--ep", "4", "--no-progress")
    check(rc == 0, "--layout FILE: " + err)
    C, _ = assemble(j("C"))
    same_content(A, C, "--layout FILE content")
    # --config and --set, applied in order: the last assignment wins; model keys are refused.
    rc, out, err = run(MCRESHARD, j("A"), j("G"), "--config", j("layout.json"), "--set", "parallel.dp=2",
                       "--set", "parallel.zero=3", "--no-progress")
    check(rc == 0 and "dp=2" in out and "zero=3" in out, "--config/--set target: " + out + err)
    G, _ = assemble(j("G"))
    same_content(A, G, "--config/--set content")
    rc, _, err = run(MCRESHARD, j("A"), j("F"), "--set", "model.n_heads=8")
    check(rc != 0 and "model change" in err and not os.path.exists(j("F")), "--set model key refused: " + err)
    rc, _, err = run(MCRESHARD, j("A"), j("F"), "--set", "parallel.zero=2")
    check(rc != 0 and "parallel.zero" in err and not os.path.exists(j("F")), "--set bad value names the key: " + err)

    # Dry run: the plan's pieces cover every target exactly; nothing is written.
    rc, out, err = run(MCRESHARD, j("A"), j("D"), "--consolidate", "--dry-run", "--json")
    check(rc == 0 and not os.path.exists(j("D")), "dry run: " + err)
    plan = json.loads(out)
    vol = lambda c: int(np.prod(c))
    check(all(sum(vol(p["count"]) for p in t["pieces"]) == vol(t["count"]) for t in plan["targets"]),
          "dry-run pieces cover their targets")
    check(plan["target"]["world"] == 1 and plan["totals"]["target_shards"] == len(plan["targets"]), "dry-run totals")
    check(plan["totals"]["bytes"] == 4 * sum(a.size for a in A.values()), "dry-run bytes")
    rc, out, _ = run(MCRESHARD, j("A"), j("D"), "--consolidate", "--dry-run")
    check(rc == 0 and "totals:" in out and "<- rank" in out, "dry-run text")

    # Audit: digests are layout independent and equal sha256 of the global tensors.
    rc, ra, err = audit_json(j("A"), "--verify")
    check(rc == 0 and ra.get("ok") and ra.get("verified"), "audit A: " + err)
    rc, rb, err = audit_json(j("B"), "--verify", "--map", j("B.svg"))
    check(rc == 0 and rb.get("ok"), "audit B: " + err)
    check(digests(ra) == digests(rb) and digests(ra), "digests equal across layouts")
    d = digests(ra)
    check(all(d[fam][state] == hashlib.sha256(stored(state, arr)).hexdigest() for (fam, state), arr in A.items()),
          "digest is sha256 of the row-major global tensor")
    ET.parse(j("B.svg"))
    check(len(rb["ranks"]) == 8 and sum(r["stored_bytes"] for r in rb["ranks"]) == sum(len(stored(k[1], a)) for k, a in B.items()),
          "stored bytes per rank add up")
    check(all(sum(r["categories"].values()) == sum(r["held_bytes"].values()) for r in rb["ranks"]),
          "per-rank categories (core/holdings.h) partition the held bytes")
    opt = [r["optimizer_bytes"] for r in rb["ranks"]]
    check(all(r["optimizer_bytes"] == sum(r["held_bytes"].values()) for r in rb["ranks"]) and
          abs(rb["balance"]["optimizer_largest_over_mean"] - max(opt) / (sum(opt) / len(opt))) < 1e-9 and
          rb["balance"]["ownership_rule"] == "balanced-v2", "optimizer balance per rank and largest/mean")
    rc, out, _ = run(MCAUDIT, j("B"), "--map", j("B.html"))
    check(rc == 0 and "stage 3" in out and os.path.getsize(j("B.html")) > 1000, "text audit and html map")
    rc, _, err = run(MCAUDIT, j("B"), "--map", j("B.png"))
    check(rc != 0 and ".svg" in err, "map extension refused")
    # --config/--set: the checkpoint against a run configuration (B is tp1 pp4 dp2 ep1 zero3).
    want = ["--set", "parallel.pp=4", "--set", "parallel.dp=2", "--set", "parallel.zero=3"]
    rc, out, err = run(MCAUDIT, j("B"), *want)
    check(rc == 0 and "ok: no problems found" in out, "audit B against its own layout: " + err)
    rc, _, err = run(MCAUDIT, j("B"), *want[:4], "--set", "parallel.zero=1", "--set", "model.d_model=32")
    check(rc != 0 and "parallel.zero is 3 in the checkpoint, 1 in the config" in err and "model.d_model" in err,
          "audit B against another layout and model: " + err)
    rc, _, err = run(MCAUDIT, j("B"), "--set", "parallel.nope=1")
    check(rc == 2 and "parallel.nope" in err, "audit --set with an unknown key: " + err)

    # Corruption: mcaudit --verify lists it; mcreshard refuses it; no DST.
    sd = step_dir(j("B"))
    with h5py.File(os.path.join(sd, "rank_3.h5"), "r") as f:
        name = "/" + next(iter(f)) + "/param"
        off = f[name].id.get_offset()
    with open(os.path.join(sd, "rank_3.h5"), "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    # The piece digests stop every reader before the file is parsed (verify before parsing).
    for args in ((MCAUDIT, j("B"), "--verify", "--no-progress"), (MCAUDIT, j("B")),
                 (MCRESHARD, j("B"), j("E"), "--consolidate", "--no-progress")):
        rc, _, err = run(*args)
        check(rc == 1 and "rank_3.h5" in err and "hash mismatch in piece" in err and not os.path.exists(j("E")),
              os.path.basename(args[0]) + " refuses the corrupted file before parsing it: " + err)
    # Without file digests (an older manifest), the shard hashes catch it and name the dataset.
    strip_file_hashes(j("B"))
    rc, _, err = run(MCAUDIT, j("B"), "--verify", "--no-progress")
    check(rc == 1 and name in err and "rank_3.h5" in err, "audit lists the corrupted shard: " + err)
    rc, _, err = run(MCAUDIT, j("B"))
    check(rc == 0, "audit without --verify does not read hashes: " + err)
    rc, _, err = run(MCRESHARD, j("B"), j("E"), "--consolidate", "--no-progress")
    check(rc == 1 and name in err and "SHA-256" in err and not os.path.exists(j("E")), "corrupted source refused: " + err)

    # Safetensors export, read by numpy; import into another layout.
    rc, out, err = run(MCRESHARD, j("A"), "--export", j("w.safetensors"), "--no-progress")
    check(rc == 0, "export: " + err)
    with open(j("w.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__")
    check(set(header) == {fam for fam, st in A if st == "param"}, "one tensor per family")
    for fam, t in header.items():
        b0, b1 = t["data_offsets"]
        arr = np.frombuffer(data[b0:b1], dtype="<f4").reshape(t["shape"])
        check(t["dtype"] == "F32" and np.array_equal(arr, A[(fam, "param")]), "exported %s" % fam)
        check(meta["sha256." + fam] == hashlib.sha256(data[b0:b1]).hexdigest(), "exported hash of %s" % fam)
    rc, out, err = run(MCRESHARD, "--import", j("w.safetensors"), j("F"), "--tp", "2", "--no-progress")
    check(rc == 0, "import: " + err)
    Fc, _ = assemble(j("F"))
    check(all(np.array_equal(Fc[(fam, "param")], A[(fam, "param")]) for fam in header), "imported params")
    check(all(not Fc[k].any() for k in Fc if k[1] != "param"), "imported moments are zero")


def metadata_only(tmp):
    """Planning from metadata alone: bench/sim_scale --write-metadata writes a checkpoint
    without data (manifest.json, manifest.sha256, latest; no rank file), `mcreshard --dry-run`
    plans from it and forecasts the target checkpoint, and everything that needs data refuses
    it naming the missing rank file (timed at 4096 ranks in docs/reshard.md)."""
    j = lambda *p: os.path.join(tmp, *p)
    layout = ["--config", os.path.join(SOURCE, "configs", "tiny.json"), "--set", "parallel.dp=4", "--set", "parallel.ep=2",
              "--set", "parallel.zero=1", "--set", "train.global_batch=32"]
    rc, out, err = run(SIM, *layout, "--write-metadata", j("M"))
    check(rc == 0 and "metadata-only checkpoint written" in out, "sim_scale --write-metadata: " + out + err)
    sim = json.loads(out.strip().splitlines()[-1]) if rc == 0 else {}
    step = j("M", "step_0")
    check(os.path.exists(j("M", "latest")) and os.path.exists(os.path.join(step, "manifest.sha256")), "latest and manifest.sha256")
    check(not glob.glob(os.path.join(step, "*.h5")), "no rank file written")
    with open(os.path.join(step, "manifest.json")) as f:
        manifest = json.load(f)
    check(manifest["layout"]["ownership_rule"] == "balanced-v2" and manifest["layout"]["world"] == 4, "recorded layout")
    check(len(manifest["files"]) == 4 and all(s["sha256"] == "0" * 64 for s in manifest["shards"]),
          "four rank files listed, no digest")
    check(len(manifest["shards"]) == sim.get("shards") and sim.get("written_manifest_bytes") == os.path.getsize(
        os.path.join(step, "manifest.json")), "sim_scale reports the shards and the manifest it wrote")
    try:
        import jsonschema
        with open(os.path.join(SOURCE, "schemas", "manifest.schema.json")) as f:
            jsonschema.validate(manifest, json.load(f))
    except ImportError:
        print("jsonschema not available: schema check skipped")

    # the dry run plans from the manifest alone
    rc, out, err = run(MCRESHARD, "--dry-run", "--summary", j("M"), j("D"), "--dp", "2")
    check(rc == 0 and "planned from it alone" in out and "2 rank files of 2 ranks" in out and "predicted save" in out
          and "->" not in out.split("totals:")[0].split("(world 2)")[-1], "dry run --summary: " + out + err)
    check(not os.path.exists(j("D")), "a dry run writes nothing")
    rc, out, err = run(MCRESHARD, "--dry-run", j("M"), j("D"), "--dp", "2")
    lines = [l for l in out.splitlines() if " -> rank " in l]
    tot = [l for l in out.splitlines() if l.startswith("totals:")]
    check(rc == 0 and tot and ("-> %d target shards" % len(lines)) in tot[0], "dry run lists every target shard: " + err)
    rc, out, err = run(MCRESHARD, "--dry-run", "--json", "--summary", "--node-gbps", "4", "--ranks-per-node", "2", j("M"),
                       j("D"), "--dp", "2")
    plan = json.loads(out) if rc == 0 else {}
    fc = plan.get("forecast", {})
    check("targets" not in plan and fc.get("node_gbps") == 4 and fc.get("ranks_per_node") == 2 and fc.get("files") == 2 and
          fc.get("shards") == plan["totals"]["target_shards"], "dry run --json --summary forecast: " + out[-400:] + err)
    # to the same layout the forecast is the source checkpoint sim_scale described
    rc, out, err = run(MCRESHARD, "--dry-run", "--json", "--summary", j("M"), j("D"))
    fc = json.loads(out).get("forecast", {}) if rc == 0 else {}
    check(fc.get("shards") == sim.get("shards") and fc.get("bytes") == sim.get("bytes") and
          abs(fc.get("writer_largest_over_mean", 0) - sim.get("writer_largest_over_mean", -1)) < 1e-3 and
          fc.get("manifest_bytes") == sim.get("manifest_bytes"), "forecast of the same layout = sim_scale's: %s %s" % (fc, sim))

    # flags that describe a dry run mean nothing without it; bad values are refused
    rc, _, err = run(MCRESHARD, "--summary", j("M"), j("D"), "--dp", "2")
    check(rc == 2 and "--dry-run" in err and not os.path.exists(j("D")), "--summary without --dry-run refused: " + err)
    rc, _, err = run(MCRESHARD, "--node-gbps", "3", j("M"), j("D"), "--dp", "2")
    check(rc == 2 and "--dry-run" in err, "--node-gbps without --dry-run refused: " + err)
    rc, _, err = run(MCRESHARD, "--json", j("M"), j("D"), "--dp", "2")
    check(rc == 2 and "--dry-run" in err and not os.path.exists(j("D")), "--json without --dry-run refused: " + err)
    # an export's dry run plans from the manifest too: it lists the tensors and writes nothing
    rc, out, err = run(MCRESHARD, "--dry-run", j("M"), "--export", j("w.safetensors"))
    check(rc == 0 and "dry run" in out and "layers.00.attn.wq F32 [64, 64]" in out and
          not glob.glob(j("w.safetensors*")), "--dry-run --export: " + out + err)
    rc, _, err = run(MCRESHARD, "--dry-run", "--node-gbps", "0", j("M"), j("D"))
    check(rc == 2 and "--node-gbps 0" in err, "--node-gbps 0 refused: " + err)

    # anything that reads data refuses it, naming the missing rank file, and leaves nothing
    rc, _, err = run(MCRESHARD, j("M"), j("D"), "--dp", "2", "--no-progress")
    check(rc == 1 and "rank_0.h5: missing shard file" in err and not os.path.exists(j("D")) and
          not glob.glob(j("D*")), "real reshard refused: " + err)
    rc, _, err = run(MCRESHARD, j("M"), "--export", j("w.safetensors"))
    check(rc == 1 and "rank_0.h5: missing shard file" in err and not os.path.exists(j("w.safetensors")),
          "export refused: " + err)
    rc, out, err = run(MCAUDIT, j("M"))
    check(rc != 0 and "rank_0.h5: missing shard file" in out + err, "audit refused: " + out + err)


def rank_datasets(run_dir):
    """{(file, dataset): (sha256 attribute, raw bytes)} of a checkpoint's rank files."""
    out = {}
    for path in sorted(glob.glob(os.path.join(step_dir(run_dir), "rank_*.h5"))):
        with h5py.File(path, "r") as f:
            for fam in f:
                for state in f[fam]:
                    d = f[fam][state]
                    out[(os.path.basename(path), fam + "/" + state)] = (d.attrs["sha256"], d[()].astype("<f4").tobytes())
    return out


def groups(tmp):
    """optim.groups muon:matrices,adamw:all: each family stores param and its optimizer's
    states only; A -> B -> A gives A's rank files back byte for byte; mcaudit passes,
    lists each family's optimizer and a momentum digest (sha256 of the global tensor, the same
    in both layouts); a reshard that would change the groups is refused."""
    j = lambda *p: os.path.join(tmp, *p)
    g = "muon:matrices,adamw:all"
    rc, _, err = run(BENCH, "--synth", j("S"), "--tiny", "--groups", g)
    check(rc == 0, "synthesize with Muon groups: " + err)
    rc, _, err = run(MCRESHARD, j("S"), j("A"), "--tp", "2", "--dp", "2", "--zero", "1", "--no-progress")
    check(rc == 0, "S -> A (Muon groups): " + err)
    rc, _, err = run(MCRESHARD, j("A"), j("B"), "--pp", "2", "--dp", "2", "--tp", "1", "--ep", "2", "--sp", "0",
                     "--zero", "0", "--no-progress")
    check(rc == 0, "A -> B (Muon groups): " + err)
    time.sleep(1.1)  # a file with HDF5 object timestamps (seconds) would now differ from A's
    rc, _, err = run(MCRESHARD, j("B"), j("A2"), "--tp", "2", "--dp", "2", "--pp", "1", "--ep", "1", "--zero", "1",
                     "--no-progress")
    check(rc == 0, "B -> A2 (Muon groups): " + err)
    da, da2 = rank_datasets(j("A")), rank_datasets(j("A2"))
    check(da and da == da2, "A -> B -> A gives A's datasets back byte for byte (%d vs %d)" % (len(da), len(da2)))
    # A was written by a reshard too, so the rank files themselves are the same bytes (no
    # object timestamps in them)
    fa = sorted(os.path.basename(p) for p in glob.glob(os.path.join(step_dir(j("A")), "rank_*.h5")))
    check(fa and all(filecmp.cmp(os.path.join(step_dir(j("A")), n), os.path.join(step_dir(j("A2")), n), shallow=False)
                     for n in fa), "A -> B -> A gives A's rank files back byte for byte")
    rc, ra, err = audit_json(j("A"), "--verify")
    check(rc == 0 and ra.get("ok"), "audit of the Muon checkpoint A: " + err)
    rc, rb, err = audit_json(j("B"), "--verify")
    check(rc == 0 and rb.get("ok"), "audit of the Muon checkpoint B: " + err)
    check(digests(ra) == digests(rb) and digests(ra), "digests equal across layouts (Muon groups)")
    opt = {f["name"]: f.get("optimizer") for f in rb.get("families", [])}
    kinds = {"adamw": {"param", "exp_avg", "exp_avg_sq", "step"}, "muon": {"param", "momentum"}}
    B, _ = assemble(j("B"))
    held = {}
    for fam, state in B:
        held.setdefault(fam, set()).add(state)
    check(opt and all(held.get(f) == kinds.get(o) for f, o in opt.items()) and opt.get("layers.00.attn.wq") == "muon"
          and opt.get("layers.00.norm.weight") == "adamw", "each family stores its optimizer's kinds: %s" % held)
    d = digests(rb)
    check(all(set(d[f]) == kinds[o] for f, o in opt.items()), "a digest for each kind a family has")
    check(all(d[fam][state] == hashlib.sha256(stored(state, arr)).hexdigest() for (fam, state), arr in B.items())
          and any(state == "momentum" for _, state in B), "momentum digests are sha256 of the global tensors")
    check(all(r["held_bytes"].get("momentum", 0) > 0 for r in rb["ranks"]), "every rank holds momentum bytes")
    rc, out, _ = run(MCAUDIT, j("B"))
    check(rc == 0 and "    momentum " in out and "  muon" in out and "ok: no problems found" in out,
          "text audit lists momentum and the optimizers")
    # against a run configuration: the optimizer groups are compared family by family
    want = ["--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set", "parallel.ep=2"]
    rc, _, err = run(MCAUDIT, j("B"), *want)
    check(rc == 1 and "family layers.00.attn.wq is trained by muon in the checkpoint, by adamw under the config's "
          "optim.groups 'adamw:all' (15 families differ)" in err, "audit against AdamW-only groups: " + err)
    rc, out, err = run(MCAUDIT, j("B"), *want, "--set", "optim.groups=muon:matrices , adamw:vectors,adamw:all")
    check(rc == 0 and "ok: no problems found" in out, "audit against the same groups, spelled otherwise: " + err)
    rc, _, err = run(MCRESHARD, j("A"), j("C"), "--set", "optim.groups=adamw:all", "--no-progress")
    check(rc == 1 and "would change optim.groups 'muon:matrices,adamw:all' -> 'adamw:all'" in err and
          not os.path.exists(j("C")), "a reshard that changes the optimizer groups is refused: " + err)


if __name__ == "__main__":
    sys.exit(main())
