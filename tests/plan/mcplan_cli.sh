#!/bin/sh
# mcplan command line: exit status 0 on a valid plan, 2 with a message naming the option,
# key or rule on bad input; --json is one parseable document with the expected keys.
MCPLAN="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
n=0

# expect STATUS PATTERN ARGS...: run mcplan, check the status and that PATTERN (grep -E)
# occurs in stdout+stderr.
expect() {
  want=$1 pat=$2
  shift 2
  n=$((n + 1))
  "$MCPLAN" "$@" >"$TMP/out" 2>&1
  got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: mcplan $*: exit $got, expected $want"; sed 's/^/    /' "$TMP/out" | tail -5; fails=$((fails + 1))
  elif ! grep -Eq -- "$pat" "$TMP/out"; then
    echo "FAIL: mcplan $*: output lacks /$pat/"; sed 's/^/    /' "$TMP/out" | tail -5; fails=$((fails + 1))
  fi
}

# valid plans
expect 0 '== rank map' 
expect 0 '== stage map'
expect 0 '^E +[0-9.]+ [KM]iB +[0-9.]+ [KM]iB +[0-9.]+ [KM]iB'
expect 0 'layers.01.moe.w1 \[4, 128, 64\]  ep\(dim=0\)'
expect 0 'params, TP-sharded' --device-mem 80GiB
expect 0 'per token: ' --set parallel.tp=2 --set parallel.dp=2 --set train.micro_batch=4
expect 0 'primary r0, 2 copies' --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1 --detail 2
expect 0 'r1 +local \[32:64, 0:64\]' --set parallel.tp=2
expect 0 'selective' --set train.recompute=selective
expect 0 'WARNING: ranks \{0\} do not fit' --device-mem 100MiB
expect 0 'under the 10% margin' --device-mem 280MiB
expect 0 'under the 50% margin' --device-mem 500MiB --margin 50
expect 0 'runtime reserve 0 B' --reserve 0 --device-mem=2GB
echo '{"parallel": {"pp": 2}, "model": {"pattern": "AE|MR"}}' >"$TMP/pp2.json"
expect 0 '^ +1 +2-3 +MR head' --config "$TMP/pp2.json"

n=$((n + 1))
"$MCPLAN" --json --device-mem 100MiB >"$TMP/small.json"
if ! /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert not d["memory"]["fits"]; assert "do not fit" in d["warnings"][0]; assert d["memory"]["ranks"][0]["fit"] == "does_not_fit"' "$TMP/small.json"; then
  echo "FAIL: --json with a too small device"; fails=$((fails + 1))
fi

# bad input: exit 2, message names the option, key, file or rule
expect 2 'tp=3 does not divide' --set parallel.tp=3
expect 2 'ep=3' --set parallel.tp=3 --set parallel.ep=3
expect 2 'tp=3 does not divide.*|ep=3' --set parallel.tp=3 --set parallel.ep=3
expect 2 '\-\-device-mem.*80XB' --device-mem 80XB
expect 2 '\-\-device-mem.*not a memory size' --device-mem=-1GiB
expect 2 '\-\-device-mem needs a value' --device-mem
expect 2 '\-\-margin' --margin 150
expect 2 '\-\-reserve' --reserve lots
expect 2 'unknown argument .--frobnicate.' --frobnicate
expect 2 'parallel.tpp' --set parallel.tpp=2
expect 2 'nonexistent.json' --config "$TMP/nonexistent.json"

# every broken rule is listed, not only the first
n=$((n + 1))
"$MCPLAN" --set parallel.tp=3 --set parallel.ep=3 >"$TMP/out" 2>&1
if [ "$(grep -Ec 'tp=3|ep=3' "$TMP/out")" -lt 2 ]; then
  echo "FAIL: several broken rules should be listed"; cat "$TMP/out"; fails=$((fails + 1))
fi

# --json: one document with the expected keys and one memory entry per rank
n=$((n + 1))
if ! "$MCPLAN" --json --set parallel.tp=2 --set parallel.pp=2 --set model.pattern=AEMRAEMR >"$TMP/plan.json"; then
  echo "FAIL: mcplan --json exited non-zero"; fails=$((fails + 1))
elif ! /usr/bin/python3 - "$TMP/plan.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for k in ("layout", "model", "train", "rank_map", "stage_map", "ownership", "activations", "memory", "flops"):
    assert k in doc, k
assert doc["layout"]["world"] == 4
assert len(doc["rank_map"]) == 4 and len(doc["memory"]["ranks"]) == 4
assert [s["n_layers"] for s in doc["stage_map"]] == [4, 4]
cats = doc["memory"]["categories"]
for r in doc["memory"]["ranks"]:
    assert set(r["bytes"]) == set(cats)
    assert sum(r["bytes"].values()) == r["total"]
for f in doc["ownership"]:
    held = sum(s["numel"] for s in f["shards"] if s["primary"] >= 0)
    n = 1
    for d in f["shape"]:
        n *= d
    assert held == n, f["name"]
assert doc["flops"]["per_token"] > 0
assert doc["warnings"] == [] and doc["memory"]["fits"] is True
act = doc["activations"]["per_layer"]
assert len(doc["activations"]["network_per_stage"]) >= 1
for b in ("A", "E", "M", "R"):
    assert act[b]["full"] <= act[b]["selective"] <= act[b]["none"], b
PY
then
  echo "FAIL: --json document"; fails=$((fails + 1))
fi

echo "mcplan_cli: $n checks, $fails failed"
[ "$fails" -eq 0 ]
