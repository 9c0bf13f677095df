"""Checkpoint states in narrower element dtypes (mcreshard --state-dtype; docs/checkpoint.md,
"Element dtypes"), checked with independent readers (h5py, numpy, hashlib):

- property test over random layouts and random --state-dtype choices, AdamW and Muon groups:
  an fp32 reference S is resharded to a random layout X converting random state kinds, X to
  another layout Y keeping the dtypes, and Y back to X's layout (X2): X and X2 have the same
  rank files byte for byte; every dataset's sha256 is over its stored bytes; mcaudit --verify
  passes with equal digests on X, Y and X2 and reports each state's dtype; the manifest
  declares each dtype (families[].dtype for param, optimizer_groups for the other kinds); every
  converted value is the numpy conversion of the reference value (round to nearest even, E4M3
  saturating), the others are the reference's bits; widening back to float32 is exact;
- the HDF5 types as h5py sees them (bfloat16 a committed float type read as float32, float16 as
  numpy float16, fp8 uint8 with the float8 attribute), and the fp8 decoder docs/checkpoint.md
  gives;
- a --dry-run that reports the conversion; mctrain --resume from a converted checkpoint;
  --export of a converted checkpoint (F32, the widened values);
- refusals: an unknown state or dtype, a state given twice, a state kind no family has, the
  flag with --export, a dataset whose HDF5 type disagrees with its declared dtype.

usage: test_reshard_dtype.py MCRESHARD MCAUDIT BENCH_RESHARD MCTRAIN MCDATA   (Debian's /usr/bin/python3)
"""
import filecmp
import glob
import hashlib
import json
import os
import random
import shutil
import struct
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
from ckpt_edit import rehash_files, step_dir  # noqa: E402
import checks  # noqa: E402
from checks import check, run  # noqa: E402

MCRESHARD, MCAUDIT, BENCH, MCTRAIN, MCDATA = sys.argv[1:6]
SOURCE = os.environ.get("MC_SOURCE_DIR", ".")
DTYPES = ["float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2"]
# Full layouts of the tiny model (every key given, so none is carried from the source).
LAYOUTS = [
    ["--tp", "1", "--pp", "1", "--dp", "1", "--ep", "1", "--sp", "0", "--zero", "0"],
    ["--tp", "2", "--pp", "1", "--dp", "2", "--ep", "1", "--sp", "0", "--zero", "1"],
    ["--tp", "1", "--pp", "2", "--dp", "2", "--ep", "2", "--sp", "0", "--zero", "0"],
    ["--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--sp", "1", "--zero", "1"],
    ["--tp", "1", "--pp", "4", "--dp", "2", "--ep", "1", "--sp", "0", "--zero", "3"],
]


# ---------------------------------------------------------------- reference conversions

def fp8_to_float32(b, fmt):
    """docs/checkpoint.md's decoder, verbatim."""
    ebits, mbits = (4, 3) if fmt == "e4m3" else (5, 2)
    bias = (1 << (ebits - 1)) - 1
    b = b.astype(np.int64)
    s, e, m = b >> 7, (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
    v = np.where(e == 0, np.ldexp(m, 1 - bias - mbits), np.ldexp((1 << mbits) + m, e - bias - mbits))
    top = e == (1 << ebits) - 1
    if fmt == "e4m3":
        v = np.where(top & (m == 7), np.nan, v)
    else:
        v = np.where(top, np.where(m == 0, np.inf, np.nan), v)
    return np.where(s == 1, -v, v).astype(np.float32)


def narrow(x, dtype):
    """fp32 array -> the stored integers of dtype (uint16/uint8), by numpy alone."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bfloat16":  # round to nearest even on the bits (the data holds no NaN)
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    if dtype == "float16":  # numpy rounds to nearest even, overflow to infinity
        return x.astype(np.float16).view(np.uint16)
    fmt = dtype[-4:]
    codes = np.arange(128, dtype=np.uint8)
    vals = fp8_to_float32(codes, fmt).astype(np.float64)
    ok = np.isfinite(vals)
    codes, vals = codes[ok], vals[ok]  # increasing with the code
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo = hi - 1
    dl, dh = a - vals[lo], vals[hi] - a
    pick = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(codes[lo] & 1, hi, lo)))
    out = codes[pick]
    top = vals[-1]
    if fmt == "e4m3":
        out = np.where(a > top, codes[-1], out)  # saturation at 448
    else:
        ulp = top - vals[-2]
        out = np.where(a > top, np.where(a >= top + ulp / 2, 0x7C, codes[-1]), out)  # to infinity at the tie
    return (out | (np.signbit(x).astype(np.uint8) << 7)).astype(np.uint8)


def widen(stored, dtype):
    if dtype == "float32":
        return stored.view(np.float32)
    if dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    if dtype == "float16":
        return stored.view(np.float16).astype(np.float32)
    return fp8_to_float32(stored, dtype[-4:])


# ---------------------------------------------------------------- reading with h5py

INT_OF = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16,
          "float8_e4m3": np.uint8, "float8_e5m2": np.uint8, "int64": np.uint64}


def stored_bits(d):
    """A dataset's stored elements as unsigned integers, read without any conversion (the
    dataset's own type as the memory type)."""
    dt = d.attrs["dtype"]
    out = np.empty(d.shape, dtype=INT_OF[dt])
    d.id.read(h5py.h5s.ALL, h5py.h5s.ALL, out, mtype=d.id.get_type())
    return out


def datasets(run_dir):
    """{(file, family, state): (attrs dict, stored bits)} of every rank file."""
    out = {}
    for path in sorted(glob.glob(os.path.join(step_dir(run_dir), "rank_*.h5"))):
        with h5py.File(path, "r") as f:
            for fam in f:
                if isinstance(f[fam], h5py.Datatype):
                    continue
                for state in f[fam]:
                    d = f[fam][state]
                    out[(os.path.basename(path), fam, state)] = (dict(d.attrs), stored_bits(d))
    return out


def assemble(run_dir):
    """{(family, state): (dtype, global stored bits)} and the count of bad per-dataset checks
    (sha256 over the stored little-endian bytes, dtype attribute, float8 attribute)."""
    glob_t, bad = {}, []
    for (file, fam, state), (a, bits) in datasets(run_dir).items():
        dt = a["dtype"]
        if hashlib.sha256(bits.astype(bits.dtype.newbyteorder("<")).tobytes()).hexdigest() != a["sha256"]:
            bad.append("sha256 of %s %s/%s" % (file, fam, state))
        if dt.startswith("float8") and a.get("float8") != dt[-4:]:
            bad.append("float8 attribute of %s %s/%s" % (file, fam, state))
        key = (fam, state)
        if key not in glob_t:
            glob_t[key] = (dt, np.zeros(tuple(a["global_shape"]), dtype=bits.dtype))
        sl = tuple(slice(s, s + c) for s, c in zip(a["start"], a["count"]))
        glob_t[key][1][sl] = bits
    return glob_t, bad


def manifest(run_dir):
    with open(os.path.join(step_dir(run_dir), "manifest.json")) as f:
        return json.load(f)


def declared(m):
    """{(family, state): dtype} as the manifest declares them."""
    groups = {g["name"]: {s["name"]: s["dtype"] for s in g["states"]} for g in m["optimizer_groups"]}
    out = {}
    for fam in m["families"]:
        out[(fam["name"], "param")] = fam["dtype"]
        for st, dt in groups[fam["optimizer"]].items():
            out[(fam["name"], st)] = dt
    return out


def audit(run_dir):
    rc, out, err = run(MCAUDIT, run_dir, "--verify", "--json", "--no-progress")
    r = json.loads(out) if out.strip() else {}
    check(rc == 0 and r.get("ok"), "mcaudit --verify %s: %s" % (run_dir, err[-2000:]))
    return ({f["name"]: f["digest_sha256"] for f in r.get("families", [])},
            {f["name"]: f.get("dtype") for f in r.get("families", [])})


def reshard(src, dst, layout, *extra):
    rc, out, err = run(MCRESHARD, src, dst, *layout, "--no-progress", *extra)
    check(rc == 0, "mcreshard %s -> %s %s: %s" % (src, dst, " ".join(extra), err[-2000:]))
    return out


# ---------------------------------------------------------------- the tests

def property_round(tmp, name, ref_dir, rng, kinds):
    j = lambda *p: os.path.join(tmp, *p)
    lx, ly = rng.sample(LAYOUTS, 2)
    conv = {k: rng.choice(DTYPES) for k in kinds if rng.random() < 0.75}
    flag = ",".join("%s=%s" % kv for kv in sorted(conv.items()))
    what = "%s: %s, %s -> %s" % (name, flag or "no conversion", " ".join(lx), " ".join(ly))
    X, Y, X2 = j(name + "_X"), j(name + "_Y"), j(name + "_X2")
    out = reshard(ref_dir, X, lx, *(["--state-dtype", flag] if flag else []))
    check(all(("%s float32 -> %s" % (k, v)) in out for k, v in conv.items() if v != "float32"),
          "%s: the summary reports the conversions: %s" % (what, out))
    reshard(X, Y, ly)
    reshard(Y, X2, lx)
    ref, ref_bad = assemble(ref_dir)
    gx, bad_x = assemble(X)
    gy, bad_y = assemble(Y)
    check(not ref_bad and not bad_x and not bad_y, "%s: per-dataset checks %s" % (what, ref_bad + bad_x + bad_y))
    # the declarations, and each state's values
    dx = declared(manifest(X))
    check(dx.keys() == gx.keys() and all(dx[k] == gx[k][0] for k in gx), "%s: manifest declares what is stored" % what)
    n_conv = wrong = 0
    for (fam, state), (dt, bits) in gx.items():
        want_dt = "int64" if state == "step" else conv.get(state, "float32")  # step: never converted
        if dt != want_dt:
            wrong += 1
            continue
        ref_bits = ref[(fam, state)][1]
        want = narrow(ref_bits.view(np.float32), dt) if dt not in ("float32", "int64") else ref_bits
        n_conv += dt not in ("float32", "int64")
        wrong += not np.array_equal(want, bits)
        # the other layout holds the same stored bits
        wrong += gy[(fam, state)][0] != dt or not np.array_equal(gy[(fam, state)][1], bits)
    check(wrong == 0, "%s: %d tensors differ from the conversion of the reference" % (what, wrong))
    check(n_conv > 0 or all(v == "float32" for v in conv.values()), "%s: some tensor converted" % what)
    # X -> Y -> X gives X's rank files back byte for byte
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(step_dir(X), "rank_*.h5")))
    check(names and all(filecmp.cmp(os.path.join(step_dir(X), n), os.path.join(step_dir(X2), n), shallow=False)
                        for n in names), "%s: X -> Y -> X gives X's rank files back" % what)
    dgx, dtx = audit(X)
    dgy, _ = audit(Y)
    dgx2, _ = audit(X2)
    check(dgx and dgx == dgy == dgx2, "%s: digests equal across layouts" % what)
    check(all(dtx[fam][st] == dt for (fam, st), (dt, _) in gx.items()), "%s: mcaudit reports each dtype" % what)
    # widening back to float32 is exact
    W = j(name + "_W")
    reshard(X, W, ly, "--state-dtype", ",".join("%s=float32" % k for k in kinds))
    gw, _ = assemble(W)
    check(all((gw[k][0] == "int64" and np.array_equal(gw[k][1], gx[k][1])) if k[1] == "step" else
              (gw[k][0] == "float32" and np.array_equal(gw[k][1].view(np.float32).view(np.uint32),
                                                        widen(gx[k][1], gx[k][0]).view(np.uint32))) for k in gx),
          "%s: widening to float32 is exact" % what)
    return X


def h5py_types(X):
    """What h5py makes of each stored type (docs/checkpoint.md's table)."""
    seen = set()
    for path in sorted(glob.glob(os.path.join(step_dir(X), "rank_*.h5"))):
        with h5py.File(path, "r") as f:
            has_bf16 = False
            for fam in f:
                if isinstance(f[fam], h5py.Datatype):
                    continue
                for state in f[fam]:
                    d = f[fam][state]
                    dt = d.attrs["dtype"]
                    bits = stored_bits(d)
                    if dt == "int64":  # AdamW's step: h5py gives the int64 as stored
                        v = d[()]
                        check(v.dtype == np.int64 and np.array_equal(v.view(np.uint64), bits), "%s %s: d[()] of int64" % (path, d.name))
                        seen.add(dt)
                        continue
                    exact = widen(bits, dt)
                    if dt == "bfloat16":
                        has_bf16 = True
                        t = d.id.get_type()
                        check(t.committed() and t.get_size() == 2 and t.get_fields() == (15, 7, 8, 0, 7)
                              and t.get_ebias() == 127, "%s %s: bfloat16 type fields" % (path, d.name))
                        v = d[()]
                        check(v.dtype == np.float32 and np.array_equal(v, exact), "%s %s: d[()] of bfloat16" % (path, d.name))
                        check(np.array_equal(d.astype("float32")[()], exact), "%s %s: astype of bfloat16" % (path, d.name))
                    elif dt == "float16":
                        v = d[()]
                        check(v.dtype == np.float16 and np.array_equal(v.view(np.uint16), bits), "%s %s: d[()] of float16" % (path, d.name))
                        check(np.array_equal(d.astype("float32")[()], exact), "%s %s: astype of float16" % (path, d.name))
                    elif dt.startswith("float8"):
                        v = d[()]
                        check(v.dtype == np.uint8 and np.array_equal(fp8_to_float32(v, d.attrs["float8"]), exact, equal_nan=True),
                              "%s %s: fp8 bytes and the documented decoder" % (path, d.name))
                    seen.add(dt)
            check(has_bf16 == ("bfloat16" in f), "%s: the committed /bfloat16 type exactly when used" % path)
    return seen


def decoder_tables():
    """The documented fp8 decoder against the formats' defining values."""
    e4 = fp8_to_float32(np.arange(256, dtype=np.uint8), "e4m3")
    e5 = fp8_to_float32(np.arange(256, dtype=np.uint8), "e5m2")
    check(e4[0x7E] == 448 and np.isnan(e4[0x7F]) and np.isnan(e4[0xFF]) and e4[0x01] == 2.0 ** -9 and e4[0x38] == 1
          and e4[0xC0] == -2 and np.isfinite(e4[:0x7F]).all(), "E4M3 decoder")
    check(e5[0x7B] == 57344 and e5[0x7C] == np.inf and e5[0xFC] == -np.inf and np.isnan(e5[0x7D]) and e5[0x01] == 2.0 ** -16
          and e5[0x3C] == 1, "E5M2 decoder")
    # the numpy reference narrowing against the formats' rules
    check(list(narrow(np.array([448, 449, 1e30, -500, 2.0 ** -10, 1.5 * 2.0 ** -10], np.float32), "float8_e4m3"))
          == [0x7E, 0x7E, 0x7E, 0xFE, 0x00, 0x01], "reference E4M3 narrowing")
    check(list(narrow(np.array([57344, 61439, 61440, -1e30], np.float32), "float8_e5m2")) == [0x7B, 0x7B, 0x7C, 0xFC],
          "reference E5M2 narrowing")


def refusals(tmp, adamw_dir, X):
    j = lambda *p: os.path.join(tmp, *p)
    cases = [
        (["--state-dtype", "velocity=bfloat16"], 2, "'velocity' is not a state kind"),
        (["--state-dtype", "exp_avg=bf16"], 2, "'bf16' is not an element dtype"),
        (["--state-dtype", "exp_avg=bfloat16", "--state-dtype", "exp_avg=float16"], 2, "state exp_avg is given twice"),
        (["--state-dtype", "exp_avg"], 2, "is not STATE=DTYPE"),
        (["--state-dtype", "exp_avg=int64"], 2, "int64 is no conversion target"),
        (["--state-dtype", "step=float32"], 2, "state step is an int64 counter and stays int64"),
        (["--state-dtype", "momentum=bfloat16"], 1, "no family of %s has a momentum state" % adamw_dir),
    ]
    for args, want_rc, msg in cases:
        rc, out, err = run(MCRESHARD, adamw_dir, j("refused"), "--no-progress", *args)
        check(rc == want_rc and msg in err and not os.path.exists(j("refused")),
              "refused %s: rc %d, %s" % (args, rc, err))
    rc, out, err = run(MCRESHARD, adamw_dir, "--export", j("e.safetensors"), "--state-dtype", "param=bfloat16")
    check(rc == 2 and "--state-dtype describes a reshard" in err, "--state-dtype with --export: %s" % err)
    # a dataset whose HDF5 type disagrees with its declaration (whole-file sizes and hashes
    # recorded again, so the dataset checks are what finds it)
    T = j("tampered")
    shutil.copytree(X, T)
    victim = None
    for path in sorted(glob.glob(os.path.join(step_dir(T), "rank_*.h5"))):
        with h5py.File(path, "r+") as f:
            for fam in f:
                if victim or isinstance(f[fam], h5py.Datatype):
                    continue
                for state in f[fam]:
                    d = f[fam][state]
                    if d.attrs["dtype"] == "bfloat16" and not victim:
                        attrs, data = dict(d.attrs), d[()]
                        del f[fam][state]
                        nd = f[fam].create_dataset(state, data=data.astype(np.float16))
                        for k, v in attrs.items():
                            nd.attrs[k] = v
                        victim = (os.path.basename(path), "/%s/%s" % (fam, state))
    rehash_files(T)
    if victim:
        rc, out, err = run(MCAUDIT, T, "--no-progress")
        check(rc == 1 and ("%s: dataset %s is not bfloat16 of the recorded count" % victim) in out + err,
              "a float16 dataset declared bfloat16 is refused naming file and dataset: %s %s" % (out[-1500:], err))
        rc, out, err = run(MCRESHARD, T, j("from_tampered"), "--no-progress")
        check(rc == 1 and "is not bfloat16 of the recorded count" in err, "mcreshard refuses it: " + err)
    check(victim is not None, "a bfloat16 dataset to tamper with")


def dry_run(tmp, X):
    j = lambda *p: os.path.join(tmp, *p)
    rc, out, err = run(MCRESHARD, X, j("dry"), "--dry-run", "--summary", "--state-dtype", "param=float32")
    m = declared(manifest(X))
    src_param = next(v for (f, s), v in m.items() if s == "param")
    line = [ln for ln in out.splitlines() if ln.startswith("element dtypes:")]
    want = "param %s -> float32" % src_param if src_param != "float32" else "param float32"
    check(rc == 0 and line and want in line[0] and not os.path.exists(j("dry")), "dry run reports the dtypes: " + out + err)
    rc, out, err = run(MCRESHARD, X, j("dry"), "--dry-run", "--summary", "--json", "--state-dtype", "param=float16")
    r = json.loads(out) if rc == 0 else {}
    check(r.get("dtypes", {}).get("param") == {"source": src_param, "target": "float16"}, "dry run JSON dtypes: " + out[-500:])


def resume(tmp):
    """mctrain on the tiny config, its checkpoint converted, then resumed."""
    j = lambda *p: os.path.join(tmp, *p)
    files = sorted(glob.glob(os.path.join(SOURCE, "docs", "*.md")))[:6]
    rc, out, err = run(MCDATA, "-o", j("corpus.h5"), *files)
    check(rc == 0, "mcdata: " + out + err)
    for name, cfg, conv in [("adamw", "tiny.json", "param=bfloat16,exp_avg=float16,exp_avg_sq=bfloat16"),
                            ("muon", "tiny-muon.json", "param=float16,momentum=bfloat16,exp_avg=bfloat16")]:
        run_dir, conv_dir = j("train_" + name), j("conv_" + name)
        rc, out, err = run(MCTRAIN, "--config", os.path.join(SOURCE, "configs", cfg), "--set", "train.steps=4",
                           "--until", "2", "--set", "data.path=" + j("corpus.h5"), "--set", "checkpoint.dir=" + run_dir,
                           "--set", "checkpoint.every=2")
        check(rc == 0, "mctrain %s: %s" % (name, (out + err)[-2000:]))
        reshard(run_dir, conv_dir, [], "--state-dtype", conv)
        d = declared(manifest(conv_dir))
        check(all(d[k] == ("int64" if k[1] == "step" else dict(c.split("=") for c in conv.split(",")).get(k[1], "float32"))
                  for k in d),
              "%s: declared dtypes after conversion" % name)
        rc, out, err = run(MCTRAIN, "--resume", conv_dir, "--set", "checkpoint.dir=" + conv_dir)
        check(rc == 0 and "finished at step 4" in out + err, "mctrain --resume from the converted %s checkpoint: %s"
              % (name, (out + err)[-2000:]))
        # the trainer saves float32 again
        d = declared(manifest(conv_dir))
        check(set(d.values()) == {"float32", "int64"}, "%s: the resumed run saves float32 (and the int64 step)" % name)


def export_widened(tmp, X):
    """--export of a converted checkpoint: the safetensors file holds the widened values (F32)."""
    path = os.path.join(tmp, "x.safetensors")
    rc, out, err = run(MCRESHARD, X, "--export", path, "--names", "megac", "--no-progress")
    check(rc == 0, "export of a converted checkpoint: " + err)
    if rc != 0:
        return
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr, base = json.loads(raw[8:8 + n]), 8 + n
    g, _ = assemble(X)
    wrong = 0
    for (fam, state), (dt, bits) in g.items():
        if state != "param":
            continue
        t = hdr[fam]
        got = np.frombuffer(raw[base + t["data_offsets"][0]:base + t["data_offsets"][1]], "<f4").reshape(t["shape"])
        wrong += t["dtype"] != "F32" or not np.array_equal(got.view(np.uint32), widen(bits, dt).view(np.uint32))
    check(wrong == 0, "export: %d tensors are not the widened stored values" % wrong)


def main():
    tmp = tempfile.mkdtemp(prefix="mc_reshard_dtype_")
    j = lambda *p: os.path.join(tmp, *p)
    seed = int(os.environ.get("MC_TEST_SEED", "19"))
    rng = random.Random(seed)
    print("test_reshard_dtype: seed %d (MC_TEST_SEED)" % seed)
    try:
        decoder_tables()
        rc, _, err = run(BENCH, "--synth", j("S"), "--tiny")
        check(rc == 0, "synthesize: " + err)
        rc, _, err = run(BENCH, "--synth", j("M"), "--tiny", "--groups", "muon:matrices,adamw:all")
        check(rc == 0, "synthesize with Muon groups: " + err)
        seen = set()
        xs = []
        for i in range(3):
            xs.append(property_round(tmp, "adamw%d" % i, j("S"), rng, ["param", "exp_avg", "exp_avg_sq"]))
            xs.append(property_round(tmp, "muon%d" % i, j("M"), rng, ["param", "exp_avg", "exp_avg_sq", "momentum"]))
        # every dtype at least once, whatever the draw
        reshard(j("S"), j("all_a_fixed"), LAYOUTS[1], "--state-dtype", "param=bfloat16,exp_avg=float16,exp_avg_sq=float8_e4m3")
        reshard(j("M"), j("all_m_fixed"), LAYOUTS[3], "--state-dtype", "momentum=float8_e5m2,param=bfloat16")
        for X in xs + [j("all_a_fixed"), j("all_m_fixed")]:
            if os.path.isdir(X):
                seen |= h5py_types(X)
        check(seen == set(DTYPES) | {"int64"}, "every dtype was stored and read with h5py: %s" % sorted(seen))
        refusals(tmp, j("S"), j("all_a_fixed"))
        export_widened(tmp, j("all_a_fixed"))
        dry_run(tmp, j("all_a_fixed"))
        resume(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_reshard_dtype: %d failures" % checks.failures)
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
