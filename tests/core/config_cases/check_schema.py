"""schemas/config.schema.json agrees with the C configuration parser.

Usage: check_schema.py PATH/TO/test_config   (env MC_SOURCE_DIR = source tree)

- the schema is a valid draft 2020-12 schema with additionalProperties false everywhere;
- its keys are exactly those of the canonical JSON of the defaults (test_config --dump);
- configs/*.json and config_cases/good_*.json validate, and the C parser accepts them;
- each bad case of config_cases/expect.tsv is rejected by C, and by the schema unless the
  row says the schema cannot express the rule (then the schema must accept it, so the row
  stays truthful);
- probes at the edges of every key (range ends, one past them, wrong JSON types, each
  allowed value and a wrong one) get the same verdict from the schema and from C.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

from jsonschema import Draft202012Validator

SRC = os.environ.get("MC_SOURCE_DIR", ".")
TOOL = sys.argv[1]
CASES = os.path.join(SRC, "tests", "core", "config_cases")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def c_verdicts(paths):
    """True/False (accepted) and the C message, for each file, from one test_config run."""
    out = subprocess.run([TOOL, "--check", *paths], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == len(paths), out
    return [(ln == "ok", ln) for ln in lines]


with open(os.path.join(SRC, "schemas", "config.schema.json")) as f:
    schema = json.load(f)
Draft202012Validator.check_schema(schema)
validator = Draft202012Validator(schema)


def schema_ok(doc):
    return validator.is_valid(doc)


# additionalProperties false at the top and in every section.
if schema.get("additionalProperties") is not False:
    fail("top level allows additional properties")
for name, sec in schema["properties"].items():
    if sec.get("additionalProperties") is not False:
        fail(f"section {name} allows additional properties")

# Same keys as the C table (through the canonical JSON of the defaults).
dump = json.loads(subprocess.run([TOOL, "--dump"], capture_output=True, text=True, check=True).stdout)
c_keys = {(s, k) for s, sec in dump.items() for k in sec}
s_keys = {(s, k) for s, sec in schema["properties"].items() for k in sec["properties"]}
if c_keys != s_keys:
    fail(f"keys only in C: {sorted(c_keys - s_keys)}; only in the schema: {sorted(s_keys - c_keys)}")
if not schema_ok(dump):
    fail("the canonical defaults do not validate")
# The schema's defaults are the C defaults.
for s, k in sorted(c_keys & s_keys):
    d = schema["properties"][s]["properties"][k].get("default")
    if d != dump[s][k]:
        fail(f"{s}.{k}: schema default {d!r} != C default {dump[s][k]!r}")

# Good files.
good = sorted(os.path.join(SRC, "configs", n) for n in os.listdir(os.path.join(SRC, "configs")) if n.endswith(".json"))
good += sorted(os.path.join(CASES, n) for n in os.listdir(CASES) if n.startswith("good_") and n.endswith(".json"))
for path, (ok, msg) in zip(good, c_verdicts(good)):
    with open(path) as f:
        doc = json.load(f)
    errs = [e.message for e in validator.iter_errors(doc)]
    if errs:
        fail(f"{path}: schema rejects a good file: {errs}")
    if not ok:
        fail(f"{path}: C rejects a good file: {msg}")

# Bad cases.
rows = []
with open(os.path.join(CASES, "expect.tsv")) as f:
    for line in f:
        if line.startswith("#") or not line.strip():
            continue
        name, verdict, _ = line.rstrip("\n").split("\t", 2)
        rows.append((name, verdict))
seen = {}
for name, verdict in rows:
    seen.setdefault(name, set()).add(verdict)
for name, verdicts in seen.items():
    if len(verdicts) != 1:
        fail(f"{name}: rows disagree about the schema: {verdicts}")
names = sorted(seen)
paths = [os.path.join(CASES, n) for n in names]
for name, path, (ok, msg) in zip(names, paths, c_verdicts(paths)):
    verdict = next(iter(seen[name]))
    if ok:
        fail(f"{name}: C accepts a bad case")
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError:
        if verdict != "invalid-json":
            fail(f"{name}: not JSON, but expect.tsv says {verdict}")
        continue
    if verdict == "invalid-json":
        fail(f"{name}: expect.tsv says invalid JSON but Python parses it")
    elif verdict == "reject" and schema_ok(doc):
        fail(f"{name}: the schema accepts it")
    elif verdict == "accept" and not schema_ok(doc):
        fail(f"{name}: expect.tsv says the schema cannot express this rule, but it rejects it")
print(f"bad cases: {len(names)} files")


# Probes at the edges of every key.
def probes_for(spec):
    vals = [None, [1], {"a": 1}]
    t = spec.get("type")
    if "oneOf" in spec:  # train.seed: integer up to 2^53 or a decimal string
        return vals + [0, 1, 2**53, 2**53 + 2, -1, 1.5, "0", "123", "18446744073709551615", "-1", "0x10", "", "1e3", True]
    if t == "integer":
        vals += ["1", True, 1.5]
        if "enum" in spec:
            e = spec["enum"]
            vals += e + [min(e) - 1, max(e) + 1] + [v for v in range(min(e), max(e)) if v not in e]
        else:
            lo, hi = spec["minimum"], spec["maximum"]
            vals += [lo, hi, lo - 1, hi + 1, (lo + hi) // 2, float(lo)]
    elif t == "number":
        vals += ["1", True]
        lo = spec.get("minimum", spec.get("exclusiveMinimum"))
        hi = spec.get("maximum", spec.get("exclusiveMaximum"))
        eps = lambda v: max(abs(v) * 1e-6, 1e-6)
        vals += [lo, hi, lo - eps(lo), hi + eps(hi), lo + eps(lo), hi - eps(hi), (lo + hi) / 2]
    elif t == "boolean":
        vals += [True, False, 0, 1, "true"]
    elif t == "string":
        vals += [5, True]
        if "enum" in spec:
            vals += spec["enum"] + ["bogus"] + [v.upper() for v in spec["enum"]]
        elif "minLength" in spec:
            lo, hi = spec["minLength"], spec["maxLength"]
            vals += ["", "a", "a" * hi, "a" * (hi + 1), "a" * lo]
        else:  # block patterns (model.pattern, parallel.pp_split)
            vals += ["AEMR", "AE|MR", "A|E|M|R", "", "|AE", "AE|", "A||E", "AEXR", "aemr", "A E",
                     "A" * 256, "A" * 257, "A|" * 255 + "A", "A|" * 256 + "A", "AM" * 128 + "|",
                     "equal", "weighted", "balanced", "EQUAL"]
    return vals


docs, labels = [], []
for s, sec in schema["properties"].items():
    for k, spec in sec["properties"].items():
        for v in probes_for(spec):
            if (s, k) == ("parallel", "pp_split") and v == "explicit":
                continue  # needs pipes in model.pattern: a cross-key rule the schema cannot express
            docs.append({s: {k: v}})
            labels.append(f"{s}.{k} = {json.dumps(v)[:60]}")
# Structure probes.
for doc, label in [({}, "empty"), ({"bogus": {}}, "unknown section"), ({"model": {"bogus": 1}}, "unknown key"),
                   ({"model": 1}, "section not an object"), ([], "array top level"), ("x", "string top level"),
                   ({"model": {"pattern": "AE|MR"}, "parallel": {"pp_split": "explicit"}}, "explicit with pipes")]:
    docs.append(doc)
    labels.append(label)

with tempfile.TemporaryDirectory() as tmp:
    paths = []
    for i, doc in enumerate(docs):
        p = os.path.join(tmp, f"probe_{i}.json")
        with open(p, "w") as f:
            json.dump(doc, f)
        paths.append(p)
    verdicts = c_verdicts(paths)
mismatch = 0
for doc, label, (ok, msg) in zip(docs, labels, verdicts):
    if ok != schema_ok(doc):
        mismatch += 1
        fail(f"probe {label}: C {'accepts' if ok else 'rejects'} ({msg[:160]}), schema {'accepts' if schema_ok(doc) else 'rejects'}")
print(f"probes: {len(docs)}, disagreements: {mismatch}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("config schema: all checks passed")
