#!/usr/bin/env bash
# What a periodic asynchronous checkpoint costs a GPU training run (issue 15), measured in
# the trainer: for each config (default dense-a and nam-small, bf16 on one GPU), mctrain with
# checkpoint.every=EVERY up to step UNTIL, every step logged. Per run: the steady step time
# (median of steps 4..EVERY, before the first save), each save's training pause (the
# trainer's "training paused" line), and the steps after each save up to the next one: the
# worst and median step-time excess over steady, and the training time lost per save (pause
# + the excess of those steps). Step times come from metrics.jsonl's wall-clock `time` of
# consecutive steps, the pause taken out of the step it fell in.
# Binaries: NEW_BIN (and BASE_BIN, when given, run the same way first: before/after in one
# invocation). In the same call: the disk's raw write and read speed (dd, 64 MiB blocks, fsync;
# the read after the file's pages were dropped) on the checkpoint directory's file system; with
# RESUME=1 a cold-cache resume from each run's last checkpoint (mctrain's load time); and the PyTorch peer (bench/dcp_peer.py, DCP async_save
# plain and pinned, or PEER_MODES; each followed by a cold dcp.load of its last checkpoint)
# when PEER=1.
# Usage (repository root, GPU machine): OUT=DIR NEW_BIN=DIR [BASE_BIN=DIR] [CONFIGS="dense-a nam-small"]
#   [UNTIL=100] [EVERY=40] [PEER=1] [RESUME=1] [VARIANTS=...] [CKPT_ROOT=DIR] [MC_COMMIT=SHA] bash bench/ckpt_stall.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?}
NEW=${NEW_BIN:?}
BASE=${BASE_BIN:-}
CONFIGS=${CONFIGS:-dense-a nam-small}
UNTIL=${UNTIL:-100}
EVERY=${EVERY:-40}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
R=$OUT/ckpt_stall.txt
{
  echo "# date: $(date -u +%FT%TZ)"
  echo "# commit: ${MC_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# card: /'
  echo "# mctrain --until $UNTIL --set checkpoint.every=$EVERY (async), train.log_every=1; work dir $W ($(df -h --output=source,fstype "$W" | tail -1))"
} | tee -a "$R"
find . -path ./build\* -prune -o -path ./gpubuild -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.md' \) -print |
  sort > "$W/files.txt"
"$NEW/mcdata" -o "$W/corpus.h5" $(cat "$W/files.txt") > "$W/mcdata.log" 2>&1 || { cat "$W/mcdata.log"; exit 1; }

# raw write of 4 GiB, fsync included
sync
t0=$(date +%s.%N)
dd if=/dev/urandom of="$W/raw.in" bs=64M count=64 status=none
t1=$(date +%s.%N)
dd if="$W/raw.in" of="$W/raw.out" bs=64M oflag=direct conv=fsync status=none
t2=$(date +%s.%N)
python3 -c "print('# raw write: 4.29 GB in %.2f s = %.2f GB/s (dd oflag=direct conv=fsync)' % ($t2-$t1, 4.294967296/($t2-$t1)))" | tee -a "$R"
# raw read of the same file after its pages were dropped (64 MiB blocks, through the page cache)
drop_cache() { python3 - "$@" <<'PY'
import os, sys
for top in sys.argv[1:]:
    for r, _, fs in (os.walk(top) if os.path.isdir(top) else [("", None, [top])]):
        for f in fs:
            fd = os.open(os.path.join(r, f), os.O_RDONLY)
            os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
PY
}
drop_cache "$W/raw.out"
t1=$(date +%s.%N)
dd if="$W/raw.out" of=/dev/null bs=64M status=none
t2=$(date +%s.%N)
RAW_READ=$(python3 -c "print('%.2f' % (4.294967296/($t2-$t1)))")
echo "# raw read: 4.29 GB in $(python3 -c "print('%.2f' % ($t2-$t1))") s = $RAW_READ GB/s (dd bs=64M, pages dropped first)" | tee -a "$R"
rm -f "$W/raw.in" "$W/raw.out"

printf '%-10s %-5s %10s %9s %22s %22s %16s\n' config bin state_GB steady_s "pauses_s" "worst/median excess" lost_s/save | tee -a "$R"
# VARIANTS="name:--set k=v ..." (one per line; default "new:" alone) runs the NEW binaries once per
# variant with those extra mctrain arguments; CKPT_ROOT puts the run directories elsewhere (e.g.
# /dev/shm, to take the disk out of the measurement).
run() {
  local cfg=$1 tag=$2 bin=$3 dir="${CKPT_ROOT:-$W}/$1-$2"; shift 3
  rm -rf "$dir"
  timeout 400 "$bin/mctrain" --config "configs/$cfg.json" --set data.path="$W/corpus.h5" --set checkpoint.dir="$dir" \
    --set checkpoint.every="$EVERY" --set checkpoint.async_save=true --set train.log_every=1 --set train.eval_every=0 \
    --until "$UNTIL" "$@" > "$OUT/run_$cfg-$tag.log" 2>&1 || { echo "$cfg $tag: FAILED ($(tail -1 "$OUT/run_$cfg-$tag.log"))" | tee -a "$R"; return; }
  python3 - "$dir" "$OUT/run_$cfg-$tag.log" "$cfg" "$tag" "$EVERY" <<'PY' | tee -a "$R"
import json, os, re, statistics, sys
d, log, cfg, tag, every = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
recs = {r["step"]: r for r in (json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))) if "step" in r}
pause = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"checkpoint step (\d+) queued \(training paused ([0-9.]+) s\)", open(log).read())}
steps = sorted(recs)
dt = {s: recs[s]["time"] - recs[p]["time"] for p, s in zip(steps, steps[1:])}
for s in pause:  # the pause fell in the step after the save
    if s + 1 in dt: dt[s + 1] -= pause[s]
steady = statistics.median(dt[s] for s in dt if 4 <= s <= every)
excess, lost = [], []
for s in sorted(pause):
    win = [dt[k] for k in range(s + 1, s + every) if k in dt]
    excess += [t / steady - 1 for t in win]
    lost.append(pause[s] + sum(max(0.0, t - steady) for t in win))
size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(d, "step_%d" % max(pause))) for f in fs) if pause else 0
ps = ", ".join("%.3f" % pause[s] for s in sorted(pause))
print("%-10s %-5s %10.2f %9.4f %22s %10.1f%% / %8.1f%% %16s" % (cfg, tag, size / 1e9, steady, ps,
      100 * max(excess), 100 * statistics.median(excess), ", ".join("%.2f" % x for x in lost)))
for s in sorted(pause):  # where the excess sits: the first steps after each save, in ms
    print("#   after the save at step %d: steps %s ms (steady %.1f)" % (s, " ".join(
        "%d:%.1f" % (k, 1e3 * dt[k]) for k in range(s + 1, s + 6) if k in dt), 1e3 * steady))
# each async save's time from its call to its durable commit (metrics.jsonl's save_s) and the
# rate it wrote the checkpoint's bytes at
for c in (json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))):
    if "checkpoint" in c and c.get("save_s", 0) > 0:
        print("#   save at step %d: %.2f s call to commit, %.2f GB/s" % (c["checkpoint"], c["save_s"], size / 1e9 / c["save_s"]))
PY
  # RESUME=1: the run's last checkpoint loaded by a new mctrain with its pages dropped first
  # (verified, as the trainer's default), its load time as mctrain reports it
  if [ "${RESUME:-0}" = 1 ]; then
    drop_cache "$dir"
    timeout 300 "$bin/mctrain" --config "configs/$cfg.json" --set data.path="$W/corpus.h5" --set checkpoint.dir="$dir" \
      --set checkpoint.every=0 --set train.log_every=1 --set train.eval_every=0 --resume latest --until $((UNTIL + 1)) "$@" \
      > "$OUT/resume_$cfg-$tag.log" 2>&1 || echo "$cfg $tag resume: FAILED ($(tail -1 "$OUT/resume_$cfg-$tag.log"))" | tee -a "$R"
    sed -n 's/.*mctrain: loaded \([0-9]*\) bytes.*; \([0-9.]*\) s from open to device memory (\([0-9.]*\) GB\/s).*/\1 \2 \3/p' \
      "$OUT/resume_$cfg-$tag.log" | while read -r b t g; do
      echo "#   resume (cold, verified): $b bytes in $t s = $g GB/s, $(python3 -c "print('%.0f%%' % (100 * $g / $RAW_READ))") of raw read" | tee -a "$R"
    done
    grep "mctrain: loaded" "$OUT/resume_$cfg-$tag.log" | sed 's/^/#     /' | tee -a "$R"
  fi
}
for cfg in $CONFIGS; do
  [ -n "$BASE" ] && run "$cfg" base "$BASE"
  while IFS= read -r v; do
    [ -n "$v" ] || continue
    # shellcheck disable=SC2086 # the variant's arguments are words
    run "$cfg" "${v%%:*}" "$NEW" ${v#*:}
    rm -rf "${CKPT_ROOT:-$W}/$cfg-${v%%:*}"
  done <<< "${VARIANTS:-new:}"
done
if [ "${PEER:-0}" = 1 ]; then
  for mode in ${PEER_MODES:-plain pinned}; do
    rm -rf "$W/dcp-$mode"
    timeout 400 python3 bench/dcp_peer.py --dir "$W/dcp-$mode" --mode "$mode" --steps "$UNTIL" --every "$EVERY" --load \
      > "$OUT/dcp_$mode.json" 2> "$OUT/dcp_$mode.log" || echo "dcp $mode: FAILED ($(tail -2 "$OUT/dcp_$mode.log" | tr '\n' ' '))" | tee -a "$R"
    [ -s "$OUT/dcp_$mode.json" ] && python3 - "$OUT/dcp_$mode.json" <<'PY' | tee -a "$R"
import json, sys
r = json.load(open(sys.argv[1]))
print("%-10s %-5s %10.2f %9.4f %22s %10s / %9s" % ("dense-a", "dcp-" + r["peer"].split("(")[1][:-1], r["state_bytes"] / 1e9, r["steady_step_s"],
      ", ".join("%.3f" % p for p in r["pauses_s"]),
      "-" if r["drain_worst_slowdown"] is None else "%.1f%%" % (100 * r["drain_worst_slowdown"]),
      "-" if r["drain_median_slowdown"] is None else "%.1f%%" % (100 * r["drain_median_slowdown"])))
if "load_s" in r:
    print("#   dcp.load (cold, into the GPU tensors, no hashes): %d bytes in %.3f s = %.2f GB/s" % (
          r["load_file_bytes"], r["load_s"], r["load_GBps"]))
PY
  done
fi
