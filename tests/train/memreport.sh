#!/bin/bash
# The step-1 memory report of mctrain (train/memreport.h), on the CPU:
# - the table lists every memory category once, with the measured (arena) bytes where the
#   trainer keeps an arena and mcplan's prediction for rank 0;
# - the metrics log holds the same figures as one record, and its predictions are exactly
#   what `mcplan --json` prints for the same config;
# - a resumed run keeps the record (once) and does not add another;
# - under mpirun (dp=2, ZeRO 1 and ZeRO 3) rank 0 alone reports, with the sharded optimizer
#   arenas (ZeRO 1 with its dist.staging arena of reduction packs, ZeRO 3 with zero3.buffers);
# - under expert parallelism (dp2 x ep2, pp2 x dp2 x ep2) the moe.scratch arena is measured,
#   equal to mcplan's figure, and the rows the exchanges used are at most those it reserves;
# - train.recompute=selective and full: the same agreement with mcplan, smaller activations,
#   and the losses and gradient norms of none exactly.
set -u
B=${MC_BINARY_DIR:?}
S=${MC_SOURCE_DIR:?}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/mc_memreport.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail=0
die() { echo "FAIL: $*"; fail=1; }
CFG=(--set model.d_model=32 --set model.n_heads=2 --set model.n_kv_heads=1 --set model.head_dim=16
     --set model.expert_hidden=32 --set model.mamba_inner=64 --set model.mamba_head_dim=32
     --set model.ssm_state=8 --set model.rec_width=32 --set model.seq_len=16
     --set train.global_batch=4 --set train.micro_batch=2 --set train.steps=4 --set train.eval_every=0
     --set checkpoint.keep=0)
find "$S/docs" -maxdepth 1 -name '*.md' | sort > files.txt
"$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; echo "FAIL: mcdata"; exit 1; }
CATS="params.replicated params.tp params.ep grads optimizer.master.decay optimizer.master.no_decay
optimizer.moments.decay optimizer.moments.no_decay zero3.buffers dist.staging activations pipeline.buffers moe.scratch
runtime.reserve allocator.overhead"

# check_run LOG METRICS [MCPLAN ARGS...]: the table and the record agree with each other and
# with mcplan --json for rank 0.
check_run() {
  local log=$1 metrics=$2 Z3=- EP=- DS=-; shift 2
  case " $* " in *parallel.zero=3*) Z3=zero3 ;; *parallel.dp=2*) DS=staging ;; esac
  case " $* " in *parallel.ep=2*) EP=ep ;; esac
  [ "$(grep -c '^memory after step 1, rank 0' "$log")" = 1 ] || die "$log: expected one memory table"
  for c in $CATS; do
    [ "$(grep -cE "^  $c +" "$log")" = 1 ] || die "$log: category $c is not listed once"
  done
  "$B/mcplan" "$@" --json > plan.json 2> plan.err || { cat plan.err; die "mcplan failed"; return; }
  "$PY" - "$log" "$metrics" plan.json "$Z3" "$EP" "$DS" <<'PY' || die "$log: table, record and mcplan disagree"
import json, sys
log, metrics, plan = sys.argv[1:4]
recs = [json.loads(l) for l in open(metrics) if l.strip()]
mem = [r["memory"] for r in recs if "memory" in r]
assert len(mem) == 1, "%d memory records" % len(mem)
cats = mem[0]["categories"]
p = json.load(open(plan))
pb = [r for r in p["memory"]["ranks"] if r["rank"] == 0][0]["bytes"]
rows = {}
for line in open(log):
    f = line.split()
    if len(f) == 4 and f[0] in cats:
        rows[f[0]] = f
bad = []
for c, v in cats.items():
    if v["predicted"] != pb[c]: bad.append("%s predicted %s, mcplan %s" % (c, v["predicted"], pb[c]))
    m = "-" if v["measured"] is None else str(v["measured"])
    if rows[c][1] != m or rows[c][2] != str(v["predicted"]): bad.append("%s table %s vs record %s" % (c, rows[c], v))
zero3, ep, staging = sys.argv[4] == "zero3", sys.argv[5] == "ep", sys.argv[6] == "staging"
if ep and not (cats["moe.scratch"]["predicted"] > 0 and cats["moe.scratch"]["measured"] == cats["moe.scratch"]["predicted"]):
    bad.append("moe.scratch under ep: %s" % cats["moe.scratch"])
arenas = (["zero3.buffers"] if zero3 else []) + (["dist.staging"] if staging else []) + (["moe.scratch"] if ep else []) + ["params.replicated", "params.tp", "params.ep", "grads", "optimizer.master.decay",
          "optimizer.master.no_decay", "optimizer.moments.decay", "optimizer.moments.no_decay", "optimizer.scratch", "activations"]
for c in arenas:
    if cats[c]["measured"] is None or cats[c]["measured"] % 256: bad.append("%s: no arena or unaligned size" % c)
for c in set(cats) - set(arenas):
    if cats[c]["measured"] is not None: bad.append("%s measured without an arena" % c)
if bad:
    print("\n".join(bad)); sys.exit(1)
PY
}

"$B/mctrain" "${CFG[@]}" --set data.path=corpus.h5 --set checkpoint.dir=a > a.log 2>&1 || { cat a.log; die "mctrain failed"; }
check_run a.log a/metrics.jsonl "${CFG[@]}"

# train.recompute=selective and full (train/net.c): the same table checks against mcplan for
# the policy, the activations arena below none's (full below selective), and every step's
# loss, aux loss and gradient norm in the metrics log exactly those of run a
prev=$(sed -n 's/.*"activations": {"measured": \([0-9]*\).*/\1/p' a/metrics.jsonl)
for pol in selective full; do
  "$B/mctrain" "${CFG[@]}" --set train.recompute=$pol --set data.path=corpus.h5 --set checkpoint.dir=$pol > $pol.log 2>&1 \
    || { cat $pol.log; die "mctrain train.recompute=$pol failed"; }
  check_run $pol.log $pol/metrics.jsonl "${CFG[@]}" --set train.recompute=$pol
  act=$(sed -n 's/.*"activations": {"measured": \([0-9]*\).*/\1/p' $pol/metrics.jsonl)
  [ -n "$act" ] && [ "$act" -lt "$prev" ] || die "train.recompute=$pol: activations $act bytes, not below $prev"
  echo "train.recompute=$pol: activations $act bytes (the previous policy: $prev)"
  prev=$act
  "$PY" - a/metrics.jsonl $pol/metrics.jsonl <<'PY' || die "train.recompute=$pol: the losses differ from none's"
import json, sys
def steps(path):
    return [(r["step"], r["loss"], r["aux_loss"], r["grad_norm"]) for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a and a == b, "%s vs %s" % (a, b)
PY
done

# stop at step 2, resume to 4: the record of the first part is kept, none is added
"$B/mctrain" "${CFG[@]}" --set data.path=corpus.h5 --set checkpoint.dir=b --until 2 > b1.log 2>&1 || { cat b1.log; die "mctrain --until 2 failed"; }
"$B/mctrain" "${CFG[@]}" --set data.path=corpus.h5 --set checkpoint.dir=b --resume latest > b2.log 2>&1 || { cat b2.log; die "resume failed"; }
grep -q '^memory after step 1' b2.log && die "a resumed run printed a memory table"
[ "$(grep -c '"memory"' b/metrics.jsonl)" = 1 ] || die "the resumed log should keep one memory record"
cmp <(grep '"memory"' a/metrics.jsonl) <(grep '"memory"' b/metrics.jsonl) || die "the memory records of a and b differ"

if [ -n "${MC_MPIRUN:-}" ]; then
  P=(--set parallel.dp=2 --set parallel.zero=1)
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
    "$MC_MPIRUN" -np 2 "$B/mctrain" "${CFG[@]}" "${P[@]}" --set data.path=corpus.h5 --set checkpoint.dir=m > m.log 2>&1 \
    || { cat m.log; die "mpirun mctrain failed"; }
  check_run m.log m/metrics.jsonl "${CFG[@]}" "${P[@]}"
  # ZeRO 1 halves the moments of rank 0 (up to alignment) against the one-rank run
  a_mom=$(sed -n 's/.*"optimizer.moments.decay": {"measured": \([0-9]*\).*/\1/p' a/metrics.jsonl)
  m_mom=$(sed -n 's/.*"optimizer.moments.decay": {"measured": \([0-9]*\).*/\1/p' m/metrics.jsonl)
  [ -n "$m_mom" ] && [ "$m_mom" -lt "$a_mom" ] || die "dp=2 zero=1 moments $m_mom not below one rank's $a_mom"
  # ZeRO 3: the gathered layer's arena is measured too
  P=(--set parallel.dp=2 --set parallel.zero=3)
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
    "$MC_MPIRUN" -np 2 "$B/mctrain" "${CFG[@]}" "${P[@]}" --set data.path=corpus.h5 --set checkpoint.dir=z > z.log 2>&1 \
    || { cat z.log; die "mpirun mctrain zero=3 failed"; }
  check_run z.log z/metrics.jsonl "${CFG[@]}" "${P[@]}"
  # expert parallelism: the exchange buffers' arena, and the rows step 1 used of it
  for P in "--set parallel.dp=2 --set parallel.ep=2" "--set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2"; do
    np=2; case "$P" in *pp=2*) np=4 ;; esac
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
      "$MC_MPIRUN" -np $np "$B/mctrain" "${CFG[@]}" $P --set data.path=corpus.h5 --set checkpoint.dir=ep$np > ep$np.log 2>&1 \
      || { cat ep$np.log; die "mpirun mctrain $P failed"; }
    check_run ep$np.log ep$np/metrics.jsonl "${CFG[@]}" $P
    line=$(grep '^  moe.scratch: ' ep$np.log)
    used=$(echo "$line" | sed -n 's/.*at most \([0-9]*\) used.*/\1/p')
    held=$(echo "$line" | sed -n 's/.*: \([0-9]*\) routed rows per exchange reserved.*/\1/p')
    [ -n "$used" ] && [ -n "$held" ] && [ "$used" -gt 0 ] && [ "$used" -le "$held" ] || die "ep$np: rows used vs reserved: '$line'"
    echo "$P: $(grep -E '^  moe.scratch ' ep$np.log | tr -s ' ');$line"
  done
fi
[ $fail = 0 ] && echo "memreport: ok"
exit $fail
