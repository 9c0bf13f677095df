#!/bin/bash
# mctrain on several GPUs (NCCL) against the one-GPU run (tests/train/train.cmake registers it):
#   nccl_train.sh layouts|zero3|muon|bf16|resume|kill|stall|nodes|launchers
# layouts:  fp32, 10 steps of a small AEMR model on one GPU, then (2 GPUs) tp2, tp2+sp, dp2 zero
#           0/1/3, pp2 with the explicit split AE|MR and the weighted split, dp2 x ep2; (4 GPUs)
#           tp2 x pp2, dp4 x ep2 zero 1, tp2+sp x dp2 x ep2 zero 1, pp2 x dp2 x ep2: every step's
#           loss and gradient norm within BAND (relative; default 1e-5) of the one-GPU run.
# zero3:    fp32 ZeRO 3 (its gathers and reduce-scatters on the side queue, beside TP, expert and
#           pipeline traffic on the compute stream): (2 GPUs) dp2 x ep2 and pp2 (AE|MR); (4 GPUs)
#           tp2+sp x dp2, dp4 x ep2, pp2 x dp2 x ep2: losses and gradient norms within BAND of one GPU.
# muon:     optim.groups=muon:matrices,adamw:all: tp2, tp2+sp, dp2 zero 1 and 3, pp2 against
#           the one-GPU Muon run within MUON_BAND (1e-4, see below); a dp2 zero 1 step 5 resumed on one GPU (4 GPUs:
#           tp2 x dp2 zero 1 too).
# bf16:     train.dtype=bf16: tp2, tp2+sp, dp2, pp2, dp2 x ep2, dp2 zero 1 and 3, pp2 zero 3 (and on 4
#           GPUs tp2 x dp2 zero 1, tp2+sp x dp2 zero 3) against the one-GPU bf16 run, losses
#           within BF16_BAND (relative; default 1e-2); the dp2 zero 1 and zero 3 runs' step-5
#           checkpoints resumed on one GPU continue their losses.
# resume:   a 4-GPU tp2 x dp2 zero 1 run (2 GPUs: dp2) saves step 5; resumed on 2 GPUs as pp2 and
#           on 1 GPU by load-time resharding, and after mcreshard to tp2 on 2 GPUs: steps 6-10
#           within BAND of the uninterrupted run.
# kill:     SIGKILL to one worker of mctrain --nproc-per-node 2 after a checkpoint: the job ends
#           within 30 s, non-zero, rank 0 names the killed rank; the checkpoint verifies.
# stall:    SIGSTOP to one worker of a dp2 zero 3 run (stream-ordered NCCL: the collectives only
#           queue, so the watchdog thread holds the timeout) with MC_COMM_TIMEOUT_S=5: the job ends
#           within 60 s, non-zero, and the waiting rank names the operation and the timeout.
# nodes:    (4 GPUs) two "nodes" of 2 GPUs (CUDA_VISIBLE_DEVICES 0,1 and 2,3), each started by
#           mctrain --nproc-per-node 2 --nnodes 2 --node-rank K, train tp2 x dp2 as one job: losses
#           within BAND of the one-GPU run.
# launchers: the same dp2 run started four ways (--nproc-per-node, mpirun, torchrun-style
#           variables set by hand, and torchrun itself where installed) gives the same losses within BAND (GPU runs are not bitwise
#           repeatable: two --nproc-per-node runs differ by about 1e-7); progress comes from rank 0 only, in
#           plain lines (no carriage return) when stdout is not a terminal.
# With fewer than 2 GPUs (or no CUDA/NCCL in the build) it prints "SKIP: ..." and passes.
set -u
B=${MC_BINARY_DIR:?}
S=${MC_SOURCE_DIR:?}
MODE=${1:?mode}
BAND=${MC_NCCL_BAND:-1e-5}
BF16_BAND=${MC_NCCL_BF16_BAND:-1e-2}
# Muon under TP: the TP ranks' products round differently from one GPU's (~1e-7), and
# Newton-Schulz amplifies rounding in a matrix's small singular directions (up to ~3.4 per
# iteration, train.test_muon); measured on 2 H100s: 2.2e-5 at the gradient-norm spike of step 5
# for tp2 (dp and pp layouts: under 4e-6).
MUON_BAND=${MC_NCCL_MUON_BAND:-1e-4}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$NGPU" -lt 2 ]; then echo "SKIP: $NGPU CUDA device(s); multi-GPU tests need 2"; exit 0; fi
W=$(mktemp -d /tmp/mc_nccl_train.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail=0
die() { echo "FAIL: $*"; fail=1; }
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

SMALL=(--set model.d_model=64 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=16
       --set model.expert_hidden=64 --set model.mamba_inner=128 --set model.mamba_head_dim=16
       --set model.ssm_state=8 --set model.rec_width=64 --set model.seq_len=32 --set model.init_std=0.1
       --set model.pattern=AEMR --set train.global_batch=8 --set train.micro_batch=2 --set train.warmup_steps=2
       --set train.steps=10 --set train.log_every=1 --set train.eval_every=0 --set checkpoint.keep=0
       --set checkpoint.every=0 --set train.device=cuda)
find "$S/train" "$S/docs" -maxdepth 1 -type f \( -name '*.c' -o -name '*.md' \) | sort > files.txt
"$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; echo "FAIL: mcdata"; exit 1; }
COMMON=("${SMALL[@]}" --set data.path=corpus.h5)

field() { grep "\"step\": $3," "$1" | sed -n "s/.*\"$2\": \([-0-9.eE+a-z]*\).*/\1/p" | tail -1; }
# same NAME A B FIRST LAST BAND KEYS...: KEYS of steps FIRST..LAST of run B within BAND of run A
same() {
  local name=$1 a=$2 b=$3 first=$4 last=$5 band=$6 worst=0; shift 6
  for s in $(seq "$first" "$last"); do
    for k in "$@"; do
      x=$(field "$a" "$k" "$s"); y=$(field "$b" "$k" "$s")
      r=$(awk -v a="$x" -v b="$y" 'BEGIN { if (a == "" || b == "") { print "missing"; exit } d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; print (m > 0 ? d / m : d) }')
      if [ "$r" = missing ] || awk -v r="$r" -v t="$band" 'BEGIN { exit !(r > t) }'; then
        die "$name step $s: $k $y against $x (relative difference $r, band $band)"
      fi
      [ "$r" != missing ] && worst=$(awk -v r="$r" -v w="$worst" 'BEGIN { print (r > w ? r : w) }')
    done
  done
  echo "$name: steps $first-$last within $band of the reference (largest relative difference $worst; loss at $last: $(field "$b" loss "$last"))"
}
# launch N DIR LOG ARGS...: mctrain --nproc-per-node N into checkpoint.dir DIR
launch() {
  local n=$1 dir=$2 log=$3; shift 3
  "$B/mctrain" --nproc-per-node "$n" "${COMMON[@]}" --set checkpoint.dir="$dir" "$@" > "$log" 2>&1 \
    || { tail -30 "$log"; die "$dir: mctrain --nproc-per-node $n $* failed"; }
}

case "$MODE" in
layouts)
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-GPU run failed"; }
  launch 2 tp2 tp2.log --set parallel.tp=2
  launch 2 tp2sp tp2sp.log --set parallel.tp=2 --set parallel.sp=true
  for z in 0 1 3; do launch 2 dp2z$z dp2z$z.log --set parallel.dp=2 --set parallel.zero=$z; done
  launch 2 pp2x pp2x.log --set parallel.pp=2 --set 'parallel.pp_split=AE|MR'
  launch 2 pp2w pp2w.log --set parallel.pp=2 --set parallel.pp_split=weighted
  launch 2 dp2ep2 dp2ep2.log --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1
  for r in tp2 tp2sp dp2z0 dp2z1 dp2z3 pp2x pp2w dp2ep2; do same "$r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$BAND" loss grad_norm; done
  if [ "$NGPU" -ge 4 ]; then
    launch 4 tp2pp2 tp2pp2.log --set parallel.tp=2 --set parallel.pp=2
    launch 4 dp4ep2 dp4ep2.log --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=1
    launch 4 tp2spep2 tp2spep2.log --set parallel.tp=2 --set parallel.sp=true --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1
    launch 4 pp2dp2ep2 pp2dp2ep2.log --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2
    for r in tp2pp2 dp4ep2 tp2spep2 pp2dp2ep2; do same "$r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$BAND" loss grad_norm; done
  else
    echo "4-GPU layouts not run: $NGPU GPUs"
  fi
  ;;
zero3)
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-GPU run failed"; }
  Z=(--set parallel.zero=3)
  launch 2 dp2ep2z3 dp2ep2z3.log "${Z[@]}" --set parallel.dp=2 --set parallel.ep=2
  launch 2 pp2z3 pp2z3.log "${Z[@]}" --set parallel.pp=2 --set 'parallel.pp_split=AE|MR'
  for r in dp2ep2z3 pp2z3; do same "$r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$BAND" loss grad_norm; done
  if [ "$NGPU" -ge 4 ]; then
    launch 4 tp2spdp2z3 tp2spdp2z3.log "${Z[@]}" --set parallel.tp=2 --set parallel.sp=true --set parallel.dp=2
    launch 4 dp4ep2z3 dp4ep2z3.log "${Z[@]}" --set parallel.dp=4 --set parallel.ep=2
    launch 4 pp2dp2ep2z3 pp2dp2ep2z3.log "${Z[@]}" --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2
    for r in tp2spdp2z3 dp4ep2z3 pp2dp2ep2z3; do same "$r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$BAND" loss grad_norm; done
  else
    echo "4-GPU layouts not run: $NGPU GPUs"
  fi
  ;;
muon)
  # optim.groups with Muon: the whole-matrix gathers over TP (row and column splits) and over
  # the ZeRO group, against the one-GPU run; a dp2 zero 1 checkpoint resumed on one GPU
  M=(--set optim.groups=muon:matrices,adamw:all)
  "$B/mctrain" "${COMMON[@]}" "${M[@]}" --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-GPU Muon run failed"; }
  launch 2 tp2 tp2.log "${M[@]}" --set parallel.tp=2
  launch 2 tp2sp tp2sp.log "${M[@]}" --set parallel.tp=2 --set parallel.sp=true
  for z in 1 3; do launch 2 dp2z$z dp2z$z.log "${M[@]}" --set parallel.dp=2 --set parallel.zero=$z; done
  launch 2 pp2x pp2x.log "${M[@]}" --set parallel.pp=2 --set 'parallel.pp_split=AE|MR'
  launch 2 dp2z1s dp2z1s.log "${M[@]}" --set parallel.dp=2 --set parallel.zero=1 --set checkpoint.every=5 \
    --set checkpoint.async_save=false
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=z1r --resume dp2z1s/step_5 > z1r.log 2>&1 \
    || { cat z1r.log; die "Muon dp2 zero 1 step 5 resumed on one GPU failed"; }
  for r in tp2 tp2sp dp2z1 dp2z3 pp2x; do same "muon $r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$MUON_BAND" loss grad_norm; done
  same "muon dp2 zero 1 -> one GPU" dp2z1s/metrics.jsonl z1r/metrics.jsonl 6 10 "$MUON_BAND" loss grad_norm
  if [ "$NGPU" -ge 4 ]; then
    launch 4 tp2dp2z1 tp2dp2z1.log "${M[@]}" --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1
    same "muon tp2 x dp2 zero 1" one/metrics.jsonl tp2dp2z1/metrics.jsonl 1 10 "$MUON_BAND" loss grad_norm
  fi
  ;;
bf16)
  "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-GPU bf16 run failed"; }
  launch 2 tp2 tp2.log --set train.dtype=bf16 --set parallel.tp=2
  launch 2 tp2sp tp2sp.log --set train.dtype=bf16 --set parallel.tp=2 --set parallel.sp=true
  launch 2 dp2 dp2.log --set train.dtype=bf16 --set parallel.dp=2
  launch 2 pp2 pp2.log --set train.dtype=bf16 --set parallel.pp=2
  launch 2 dp2ep2 dp2ep2.log --set train.dtype=bf16 --set parallel.dp=2 --set parallel.ep=2
  launch 2 dp2z1 dp2z1.log --set train.dtype=bf16 --set parallel.dp=2 --set parallel.zero=1 --set checkpoint.every=5 \
    --set checkpoint.async_save=false
  launch 2 dp2z3 dp2z3.log --set train.dtype=bf16 --set parallel.dp=2 --set parallel.zero=3 --set checkpoint.every=5 \
    --set checkpoint.async_save=false
  launch 2 pp2z3 pp2z3.log --set train.dtype=bf16 --set parallel.pp=2 --set parallel.zero=3
  for r in tp2 tp2sp dp2 pp2 dp2ep2 dp2z1 dp2z3 pp2z3; do same "bf16 $r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$BF16_BAND" loss; done
  # ZeRO 1 keeps each rank's rows of the fp32 master, ZeRO 3 its fp32 shard: their step-5
  # checkpoints resumed on one GPU
  for z in 1 3; do
    "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=z${z}r --resume dp2z$z/step_5 > z${z}r.log 2>&1 \
      || { cat z${z}r.log; die "bf16 dp2 zero $z step 5 resumed on one GPU failed"; }
    same "bf16 dp2 zero $z -> one GPU" dp2z$z/metrics.jsonl z${z}r/metrics.jsonl 6 10 "$BF16_BAND" loss
  done
  if [ "$NGPU" -ge 4 ]; then
    launch 4 tp2dp2z1 tp2dp2z1.log --set train.dtype=bf16 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1
    launch 4 tp2spdp2z3 tp2spdp2z3.log --set train.dtype=bf16 --set parallel.tp=2 --set parallel.sp=true \
      --set parallel.dp=2 --set parallel.zero=3
    for r in tp2dp2z1 tp2spdp2z3; do same "bf16 $r" one/metrics.jsonl $r/metrics.jsonl 1 10 "$BF16_BAND" loss; done
  fi
  ;;
resume)
  if [ "$NGPU" -ge 4 ]; then A=(4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1); AN="tp2 x dp2 zero 1 on 4 GPUs"
  else A=(2 --set parallel.dp=2 --set parallel.zero=1); AN="dp2 zero 1 on 2 GPUs"; fi
  launch "${A[0]}" a a.log "${A[@]:1}" --set checkpoint.every=5 --set checkpoint.async_save=false
  [ -d a/step_5 ] || die "no checkpoint a/step_5 ($AN)"
  launch 2 b b.log --set parallel.pp=2 --resume a/step_5
  grep -q "resumed from .*step_5 at step 5" b.log || die "pp2 resume did not start at step 5"
  same "$AN -> pp2 on 2 GPUs (load-time resharding)" a/metrics.jsonl b/metrics.jsonl 6 10 "$BAND" loss grad_norm
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=c --resume a/step_5 > c.log 2>&1 || { cat c.log; die "one-GPU resume failed"; }
  same "$AN -> one GPU (load-time resharding)" a/metrics.jsonl c/metrics.jsonl 6 10 "$BAND" loss grad_norm
  "$B/mcreshard" a/step_5 r --tp 2 --dp 1 --pp 1 --no-progress > r.log 2>&1 || { cat r.log; die "mcreshard to tp2 failed"; }
  launch 2 d d.log --set parallel.tp=2 --resume r
  same "$AN -> mcreshard tp2 -> 2 GPUs" a/metrics.jsonl d/metrics.jsonl 6 10 "$BAND" loss grad_norm
  ;;
kill)
  "$B/mctrain" --nproc-per-node 2 "${COMMON[@]}" --set checkpoint.dir=k --set parallel.dp=2 --set train.steps=100000 \
    --set checkpoint.every=2 --set checkpoint.keep=2 > k.log 2>&1 &
  lp=$!
  for i in $(seq 1 600); do
    [ -e k/latest ] && [ "$(grep -c '"step"' k/metrics.jsonl 2>/dev/null)" -ge 4 ] 2>/dev/null && break
    sleep 0.1
  done
  workers=$(pgrep -P $lp)
  [ "$(echo $workers | wc -w)" = 2 ] || die "expected 2 workers under the launcher, found: $workers"
  t0=$(date +%s.%N)
  kill -KILL $(echo $workers | awk '{ print $NF }')
  for i in $(seq 1 300); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
  if kill -0 $lp 2>/dev/null; then kill -KILL $lp $workers 2>/dev/null; die "the job still ran 30 s after a worker was killed"; fi
  wait $lp; rc=$?
  echo "one of 2 GPU workers killed: the job ended in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s with status $rc"
  [ $rc != 0 ] || die "the job with a killed worker exited 0"
  grep -q "rank 1 of 2 ended before the job finished" k.log || { tail -20 k.log; die "rank 0 did not name the killed rank 1"; }
  "$B/mcaudit" k --verify --no-progress > audit.log 2>&1 || { cat audit.log; die "the last checkpoint does not verify"; }
  ;;
stall)
  MC_COMM_TIMEOUT_S=5 "$B/mctrain" --nproc-per-node 2 "${COMMON[@]}" --set checkpoint.dir=st --set parallel.dp=2 \
    --set parallel.zero=3 --set train.steps=100000 > st.log 2>&1 &
  lp=$!
  for i in $(seq 1 600); do
    [ "$(grep -c '"step"' st/metrics.jsonl 2>/dev/null)" -ge 3 ] 2>/dev/null && break
    sleep 0.1
  done
  workers=$(pgrep -P $lp)
  [ "$(echo $workers | wc -w)" = 2 ] || die "expected 2 workers under the launcher, found: $workers"
  stopped=$(echo $workers | awk '{ print $NF }')
  t0=$(date +%s.%N)
  kill -STOP "$stopped"
  for i in $(seq 1 600); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
  if kill -0 $lp 2>/dev/null; then kill -KILL $lp $workers 2>/dev/null; die "the job still ran 60 s after a worker was stopped"; fi
  wait $lp; rc=$?
  kill -KILL "$stopped" 2>/dev/null
  echo "one of 2 GPU workers stopped: the job ended in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s with status $rc"
  [ $rc != 0 ] || die "the job with a stopped worker exited 0"
  grep -q "not complete after 5 s (MC_COMM_TIMEOUT_S)" st.log || { tail -20 st.log; die "no rank reported the timeout"; }
  grep -m1 "MC_COMM_TIMEOUT_S" st.log
  ;;
nodes)
  if [ "$NGPU" -lt 4 ]; then echo "SKIP: nodes needs 4 GPUs ($NGPU)"; exit 0; fi
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-GPU run failed"; }
  port=$((20000 + RANDOM % 20000))
  for k in 0 1; do
    CUDA_VISIBLE_DEVICES=$((2 * k)),$((2 * k + 1)) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$B/mctrain" --nproc-per-node 2 --nnodes 2 --node-rank $k "${COMMON[@]}" --set checkpoint.dir=n \
      --set parallel.tp=2 --set parallel.dp=2 > node$k.log 2>&1 &
    pids[$k]=$!
  done
  wait ${pids[0]} || { tail -20 node0.log; die "node 0 failed"; }
  wait ${pids[1]} || { tail -20 node1.log; die "node 1 failed"; }
  same "two nodes of 2 GPUs, tp2 x dp2" one/metrics.jsonl n/metrics.jsonl 1 10 "$BAND" loss grad_norm
  if grep -q "^step" node1.log; then die "node 1 (ranks 2-3) printed progress: $(grep -m 3 '^step' node1.log)"; fi
  ;;
launchers)
  launch 2 a a.log --set parallel.dp=2
  mpirun -np 2 -x NCCL_NVLS_ENABLE "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=m --set parallel.dp=2 > m.log 2>&1 \
    || { tail -20 m.log; die "mpirun -np 2 failed"; }
  port=$((20000 + RANDOM % 20000))
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=t --set parallel.dp=2 > t$r.log 2>&1 &
    pids[$r]=$!
  done
  wait ${pids[0]} || { tail -20 t0.log; die "torchrun-style rank 0 failed"; }
  wait ${pids[1]} || { tail -20 t1.log; die "torchrun-style rank 1 failed"; }
  if command -v torchrun > /dev/null; then
    torchrun --nproc-per-node 2 --master-port $((port + 1)) --no-python "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=tr \
      --set parallel.dp=2 > tr.log 2>&1 || { tail -20 tr.log; die "torchrun --nproc-per-node 2 failed"; }
    same "torchrun" a/metrics.jsonl tr/metrics.jsonl 1 10 "$BAND" loss grad_norm
  else
    echo "torchrun not installed: the torchrun launch itself not run"
  fi
  same "mpirun" a/metrics.jsonl m/metrics.jsonl 1 10 "$BAND" loss grad_norm
  same "torchrun-style variables" a/metrics.jsonl t/metrics.jsonl 1 10 "$BAND" loss grad_norm
  ! grep -q $'\r' a.log || die "progress written with carriage returns when stdout is not a terminal"
  [ "$(grep -c '^step *10\b\|step 10/' a.log)" -le 1 ] || die "step 10 reported more than once: $(grep 'step 10' a.log)"
  [ ! -s t1.log ] || die "rank 1 printed: $(head -3 t1.log)"
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
[ $fail = 0 ] && echo "nccl_train $MODE: ok"
exit $fail
