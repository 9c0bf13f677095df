#!/bin/bash
# mctrain under mpirun against the single-process run (tests/dist/dist.cmake registers it):
#   mctrain_mpi.sh MODE   (equal | resume | stop | kill | stall | errors | pp | async)
# equal:  10 steps in one process, then under mpirun for tp2 x dp2 zero 1, tp2+sp x dp2 zero 3,
#         dp2 x ep2 zero 1 (expert parallelism) and tp4+sp (4 kv heads, against one process of
#         that model; observed 1.7e-6 on losses, 1.8e-5 on gradient norms):
#         every step's loss and gradient norm, and val_loss at steps 5 and 10, within 1e-4
#         relative of the one-process run. Then train.dtype=bf16 (bf16 product tensors, the
#         expert rows travelling in bf16 under EP) as one process, as dp2 x ep2, as tp2, as
#         tp2 x dp2 zero 1 and as tp2+sp x dp2 zero 3 (bf16 product tensors under TP, their SP
#         shards gathered in bf16): losses within 2e-4 relative,
#         gradient norms within 5e-3 (bf16 roundings flip as the DP sums' order differs; a
#         stale expert-gradient buffer, as 299a2c5 had, moved the losses by 3e-3 by step 3);
#         under TP, whose products split their sums over the ranks, within 1e-3 and 1e-2
#         (observed up to 4.7e-4 by step 8).
# resume: tp2 x dp2 zero 1 saves step 5 (and runs to 10); resuming step 5 as one process, as
#         dp4 zero 3 and as dp4 zero 0 gives steps 6-10 within 1e-4 relative of the
#         uninterrupted run; the logged load reads the checkpoint's bytes once under mpirun
#         (as many as one process reads), where rank by rank dp4 zero 0 would read 4 times.
# stop:   SIGTERM to one rank of dp2 ends both after the same step with a checkpoint of it.
# kill:   SIGKILL to one stage of a pp=2 x dp=2 run after a checkpoint is committed (the
#         other ranks wait in a pipeline receive or a collective): the job ends within 30 s
#         with mpirun naming the killed rank, and the last committed checkpoint still verifies.
# stall:  SIGSTOP to one rank of dp2 (the other waits in a collective): with MC_COMM_TIMEOUT_S=5
#         the waiting rank aborts the job within 30 s naming the collective (docs/reliability.md).
# errors: a rank count that does not match the layout, tp=2 without mpirun and tp=2 with ep=2
#         without sp are clear errors.
# pp:     pipeline stages: pp=2 against one process (losses, gradient norms, val_loss), its
#         step-5 checkpoint resumed as one process and at pp=2 under the split AEM|R,
#         pp=2 x dp=2 zero 1, and pp=2 x dp=2 x ep=2 zero 1 (pipeline with expert parallelism).
# nam_medium: configs/nam-medium.json's own pattern (24 layers, AEMEAEMEAEMR x 2), experts
#         (16, top-2) and layout (dp2 x ep2 zero 1, global batch 16 in micro-batches of 1) at
#         CPU size (d 64, seq 16, vocab 256, fp32, no recompute): 10 steps under mpirun against
#         one process, losses and gradient norms within 1e-4 relative; rank 0's moe.scratch
#         arena equals mcplan's.
# async:  checkpoint.async_save under mpirun (the ranks' save threads meet through marker files):
#         dp2 and tp2 x dp2 with checkpoint.every=2 write the same checkpoints, byte for byte (every
#         rank file; the manifest but for its checkpoint.async_save line), as with async_save=false;
#         the stall is logged; resuming the last async checkpoint continues the losses; a save failing
#         on rank 1 ends the run non-zero with rank 0 naming rank 1; SIGKILL of one rank while a
#         save is in flight leaves `latest` on a checkpoint that mcaudit --verify accepts.
# output: dp=2 with output to a file: progress from rank 0 only, in plain lines (no \r or
#         terminal codes, though Open MPI gives each rank a pseudo-terminal); an error every rank
#         hits (a missing dataset, a bad --set) is printed once, by rank 0, no MPI_ABORT; an error
#         of rank 1 alone is printed by rank 1, tagged `rank 1`, and ends the job.
set -u
B=${MC_BINARY_DIR:?}
S=${MC_SOURCE_DIR:?}
MODE=${1:?mode}
MPIRUN=${MC_MPIRUN:-mpirun}
W=$(mktemp -d /tmp/mc_dist_e2e.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail=0
die() { echo "FAIL: $*"; fail=1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# Every split width divisible by 2 and by the sequence shard; seconds per run on 2 cores.
SMALL=(--set model.d_model=32 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=8
       --set model.expert_hidden=32 --set model.mamba_inner=64 --set model.mamba_head_dim=16
       --set model.ssm_state=8 --set model.rec_width=32 --set model.seq_len=16 --set model.init_std=0.1
       --set train.global_batch=8 --set train.micro_batch=2 --set train.warmup_steps=2 --set train.steps=10
       --set train.log_every=1 --set train.eval_every=0 --set checkpoint.keep=0 --set checkpoint.every=0)

find "$S/train" "$S/docs" -maxdepth 1 -type f \( -name '*.c' -o -name '*.md' \) | sort > files.txt
"$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; echo "FAIL: mcdata"; exit 1; }
COMMON=("${SMALL[@]}" --set data.path=corpus.h5)

field() { grep "\"step\": $3," "$1" | sed -n "s/.*\"$2\": \([-0-9.eE+a-z]*\).*/\1/p" | tail -1; }
# same_losses A B FIRST LAST [LOSS_BAND [NORM_BAND]]: the loss and the gradient norm (clipping)
# of every step within the bands, relative (default 1e-4 both)
same_losses() {
  for s in $(seq "$3" "$4"); do
    for k in loss grad_norm; do
      x=$(field "$1" $k "$s"); y=$(field "$2" $k "$s")
      band=${5:-1e-4}
      [ $k = grad_norm ] && band=${6:-$band}
      awk -v a="$x" -v b="$y" -v t="$band" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t * (a < 0 ? -a : a)) }' \
        || die "step $s: $k $y, reference run $x ($1 vs $2, band $band)"
    done
  done
}

# wait_for_steps DIR N: until DIR holds a committed checkpoint and DIR/metrics.jsonl logs N
# steps (60 s at most)
wait_for_steps() {
  for i in $(seq 1 600); do
    [ -e "$1/latest" ] && [ "$(grep -c '"step"' "$1/metrics.jsonl" 2>/dev/null)" -ge "$2" ] 2>/dev/null && return 0
    sleep 0.1
  done
}
# kill_one_rank MPID N: SIGKILL to the last of mpirun MPID's N mctrain ranks; the job must end
# within 30 s (a hang is killed and fails the test). Leaves the job's status in $killed_rc.
kill_one_rank() {
  local ranks
  ranks=$(pgrep -P "$1" mctrain)
  [ "$(echo $ranks | wc -w)" = "$2" ] || die "expected the $2 mctrain ranks as children of mpirun, found: $ranks"
  kill -KILL $(echo $ranks | awk '{ print $NF }')
  for i in $(seq 1 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then
    kill -KILL $ranks "$1" 2>/dev/null
    die "the job was still running 30 s after one rank was killed (a hang)"
  fi
  wait "$1"
  killed_rc=$?
}

case "$MODE" in
equal)
  COMMON+=(--set train.eval_every=5 --set train.eval_batches=1) # 8 validation sequences, split over DP
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-process run failed"; }
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=a --set parallel.tp=2 \
    --set parallel.dp=2 --set parallel.zero=1 > a.log 2>&1 || { cat a.log; die "tp2 x dp2 zero 1 failed"; }
  same_losses one/metrics.jsonl a/metrics.jsonl 1 10
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=b --set parallel.tp=2 \
    --set parallel.sp=true --set parallel.dp=2 --set parallel.zero=3 > b.log 2>&1 || { cat b.log; die "tp2+sp x dp2 zero 3 failed"; }
  same_losses one/metrics.jsonl b/metrics.jsonl 1 10
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=c --set parallel.dp=2 \
    --set parallel.ep=2 --set parallel.zero=1 > c.log 2>&1 || { cat c.log; die "dp2 x ep2 zero 1 failed"; }
  same_losses one/metrics.jsonl c/metrics.jsonl 1 10
  grep -q '"ep":[[:space:]]*2' c/step_10/manifest.json || die "the manifest does not record ep=2"
  # four members in every SP segment (whole sequences from four shards): tp4 + sp, with
  # four kv heads so that tp divides them, against one process of that model
  "$B/mctrain" "${COMMON[@]}" --set model.n_kv_heads=4 --set checkpoint.dir=one_kv4 > one_kv4.log 2>&1 \
    || { cat one_kv4.log; die "one-process run (4 kv heads) failed"; }
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set model.n_kv_heads=4 --set checkpoint.dir=d \
    --set parallel.tp=4 --set parallel.sp=true > d.log 2>&1 || { cat d.log; die "tp4+sp failed"; }
  same_losses one_kv4/metrics.jsonl d/metrics.jsonl 1 10
  for s in 5 10; do
    for run in a b c; do
      x=$(field one/metrics.jsonl val_loss $s); y=$(field $run/metrics.jsonl val_loss $s)
      awk -v a="$x" -v b="$y" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-4 * a) }' \
        || die "step $s: val_loss $y in $run, one-process run $x"
    done
  done
  [ "$(grep -c '"step": ' a/metrics.jsonl)" = 10 ] || die "a/metrics.jsonl should hold 10 steps once (rank 0 writes it)"
  grep -q '"tp":[[:space:]]*2' a/step_10/manifest.json || die "the manifest does not record tp=2"
  echo "losses at step 10: one process $(field one/metrics.jsonl loss 10), tp2 x dp2 zero 1 $(field a/metrics.jsonl loss 10), tp2+sp x dp2 zero 3 $(field b/metrics.jsonl loss 10), dp2 x ep2 zero 1 $(field c/metrics.jsonl loss 10)"
  "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=one16 > one16.log 2>&1 \
    || { cat one16.log; die "one-process bf16 run failed"; }
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=c16 \
    --set parallel.dp=2 --set parallel.ep=2 > c16.log 2>&1 || { cat c16.log; die "bf16 dp2 x ep2 failed"; }
  same_losses one16/metrics.jsonl c16/metrics.jsonl 1 10 2e-4 5e-3
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=t16 \
    --set parallel.tp=2 > t16.log 2>&1 || { cat t16.log; die "bf16 tp2 failed"; }
  same_losses one16/metrics.jsonl t16/metrics.jsonl 1 10 1e-3 1e-2
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=a16 \
    --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1 > a16.log 2>&1 || { cat a16.log; die "bf16 tp2 x dp2 zero 1 failed"; }
  same_losses one16/metrics.jsonl a16/metrics.jsonl 1 10 1e-3 1e-2
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set train.dtype=bf16 --set checkpoint.dir=b16 \
    --set parallel.tp=2 --set parallel.sp=true --set parallel.dp=2 --set parallel.zero=3 > b16.log 2>&1 \
    || { cat b16.log; die "bf16 tp2+sp x dp2 zero 3 failed"; }
  same_losses one16/metrics.jsonl b16/metrics.jsonl 1 10 1e-3 1e-2
  echo "bf16 losses at step 10: one process $(field one16/metrics.jsonl loss 10), dp2 x ep2 $(field c16/metrics.jsonl loss 10), tp2 $(field t16/metrics.jsonl loss 10), tp2 x dp2 zero 1 $(field a16/metrics.jsonl loss 10), tp2+sp x dp2 zero 3 $(field b16/metrics.jsonl loss 10)"
  ;;
resume)
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=a --set parallel.tp=2 \
    --set parallel.dp=2 --set parallel.zero=1 --set checkpoint.every=5 --set checkpoint.async_save=false > a.log 2>&1 \
    || { cat a.log; die "tp2 x dp2 zero 1 failed"; }
  [ -d a/step_5 ] || die "no checkpoint a/step_5"
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=c --resume a/step_5 > c.log 2>&1 || { cat c.log; die "one-process resume failed"; }
  grep -q "resumed from .*step_5 at step 5" c.log || die "one-process resume did not start at step 5"
  same_losses a/metrics.jsonl c/metrics.jsonl 6 10
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=d --set parallel.dp=4 \
    --set parallel.zero=3 --resume a/step_5 > d.log 2>&1 || { cat d.log; die "dp4 zero 3 resume failed"; }
  same_losses a/metrics.jsonl d/metrics.jsonl 6 10
  # dp4 zero 0: every rank needs every stored byte; the shared load reads each once
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=z --set parallel.dp=4 \
    --set parallel.zero=0 --resume a/step_5 > z.log 2>&1 || { cat z.log; die "dp4 zero 0 resume failed"; }
  same_losses a/metrics.jsonl z/metrics.jsonl 6 10
  loaded() { sed -n "s/.*loaded \([0-9]*\) bytes from disk once ($2 rank[a-z ]* own boxes would have read \([0-9]*\)).*/\1 \2/p" "$1"; }
  read -r n1 m1 <<< "$(loaded c.log 1)"; read -r n3 m3 <<< "$(loaded d.log 4)"; read -r n0 m0 <<< "$(loaded z.log 4)"
  [ -n "$n1" ] && [ "$n1" = "$m1" ] || { grep loaded c.log; die "one process: no load line, or it read other than its own share"; }
  [ -n "$n3" ] && [ "$n3" = "$n1" ] && [ "$m3" -gt "$n3" ] || { grep loaded d.log; die "dp4 zero 3 should read the $n1 bytes once, fewer than rank by rank"; }
  [ -n "$n0" ] && [ "$n0" = "$n1" ] && [ "$m0" = $((4 * n1)) ] || { grep loaded z.log; die "dp4 zero 0 should read $n1 bytes once where 4 ranks would read $((4 * n1))"; }
  echo "bytes read at load: one process $n1; dp4 zero 3 $n3 (rank by rank $m3); dp4 zero 0 $n0 (rank by rank $m0)"
  # verify before parsing: the four ranks check the rank files' pieces once between them, as one process does
  checked() { sed -n "s/.* \([0-9]*\) bytes of rank files checked against their piece digests.*/\1/p" "$1"; }
  k1=$(checked c.log); k3=$(checked d.log); k0=$(checked z.log)
  [ -n "$k1" ] && [ "$k3" = "$k1" ] && [ "$k0" = "$k1" ] || { grep -h loaded c.log d.log z.log; die "the rank files' pieces should be checked once in the job ($k1 bytes): dp4 zero 3 checked $k3, dp4 zero 0 $k0"; }
  echo "rank-file bytes checked against their pieces: one process $k1, dp4 zero 3 $k3, dp4 zero 0 $k0"
  grep -h "mctrain: loaded" z.log
  echo "loss at step 10: uninterrupted $(field a/metrics.jsonl loss 10), one process $(field c/metrics.jsonl loss 10), dp4 zero 3 $(field d/metrics.jsonl loss 10), dp4 zero 0 $(field z/metrics.jsonl loss 10)"
  ;;
stop)
  # SIGTERM to one rank only: every rank ends after the same step, the checkpoint of that step
  # is committed, and resuming it (as one process) matches an uninterrupted run.
  long=("${COMMON[@]}" --set train.steps=2000 --set checkpoint.async_save=false)
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${long[@]}" --set checkpoint.dir=s --set parallel.dp=2 > s.log 2>&1 &
  mpid=$!
  for i in $(seq 1 300); do
    [ "$(grep -c '"step"' s/metrics.jsonl 2>/dev/null)" -ge 3 ] 2>/dev/null && break
    sleep 0.1
  done
  ranks=$(pgrep -P $mpid mctrain)
  [ "$(echo $ranks | wc -w)" = 2 ] || die "expected the 2 mctrain ranks as children of mpirun, found: $ranks"
  kill -TERM $(echo $ranks | awk '{ print $NF }')
  wait $mpid
  rc=$?
  [ $rc != 0 ] || die "the stopped run exited with status 0"
  n=$(sed -n 's/.*interrupted at step \([0-9]*\).*/\1/p' s.log)
  [ -n "$n" ] && [ -d "s/step_$n" ] && grep -q "step_$n" s/latest || { cat s.log; die "no checkpoint of the interrupted step"; }
  grep -q "stopped by signal 15" s.log || { cat s.log; die "no message naming signal 15"; }
  "$B/mctrain" "${long[@]}" --set checkpoint.dir=s --resume latest --until $((n + 2)) > s2.log 2>&1 || { cat s2.log; die "resume after SIGTERM failed"; }
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${long[@]}" --set checkpoint.dir=t --set parallel.dp=2 --until $((n + 2)) > t.log 2>&1 \
    || { cat t.log; die "uninterrupted run failed"; }
  same_losses t/metrics.jsonl s/metrics.jsonl $((n + 1)) $((n + 2))
  echo "SIGTERM to one of 2 ranks at step $n: both stopped, checkpoint saved, resumed run matches"
  ;;
stall)
  # Synchronous saves: every wait of the job is then an MPI call under the collective timeout,
  # whose message the test checks. (With async saves the ranks' save threads meet through
  # marker files, whose limit, MC_CKPT_SYNC_TIMEOUT, defaults to MC_COMM_TIMEOUT_S: a rank
  # stopped during a save is found by that, with the barrier's message.)
  long=("${COMMON[@]}" --set train.steps=5000 --set checkpoint.every=2 --set checkpoint.keep=2 --set checkpoint.async_save=false)
  MC_COMM_TIMEOUT_S=5 "$MPIRUN" --oversubscribe -x MC_COMM_TIMEOUT_S -np 2 "$B/mctrain" "${long[@]}" \
    --set checkpoint.dir=st --set parallel.dp=2 > st.log 2>&1 &
  mpid=$!
  wait_for_steps st 4
  ranks=$(pgrep -P $mpid mctrain)
  [ "$(echo $ranks | wc -w)" = 2 ] || die "expected the 2 mctrain ranks as children of mpirun, found: $ranks"
  t0=$(date +%s)
  kill -STOP $(echo $ranks | awk '{ print $NF }')
  for i in $(seq 1 300); do kill -0 $mpid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $mpid 2>/dev/null; then
    kill -KILL $ranks $mpid 2>/dev/null
    die "the job was still running 30 s after one rank was stopped (a hang)"
  fi
  wait $mpid
  st_rc=$?
  echo "one of 2 ranks stopped: the job ended in $(( $(date +%s) - t0 )) s with status $st_rc"
  [ $st_rc != 0 ] || die "the job with a stalled rank exited with status 0"
  grep -q "no completion after 5 s (MC_COMM_TIMEOUT_S)" st.log || { tail -20 st.log; die "no collective-timeout message"; }
  "$B/mcaudit" st --verify --no-progress > st_audit.log 2>&1 || { cat st_audit.log; die "the last committed checkpoint does not verify"; }
  ;;
kill)
  long=("${COMMON[@]}" --set train.steps=5000 --set checkpoint.every=2 --set checkpoint.keep=2)
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${long[@]}" --set checkpoint.dir=k --set parallel.pp=2 \
    --set parallel.dp=2 > k.log 2>&1 &
  mpid=$!
  wait_for_steps k 4
  t0=$(date +%s)
  kill_one_rank $mpid 4
  echo "one of 4 ranks killed: the job ended in $(( $(date +%s) - t0 )) s with status $killed_rc"
  [ $killed_rc != 0 ] || die "the job with a killed rank exited with status 0"
  grep -q "process rank [0-9]* with PID .* exited on signal 9" k.log || { tail -20 k.log; die "no message naming the killed rank"; }
  "$B/mcaudit" k --verify --no-progress > k_audit.log 2>&1 || { cat k_audit.log; die "the last committed checkpoint does not verify"; }
  ;;
errors)
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=e --set parallel.tp=2 \
    --set parallel.dp=2 > e.log 2>&1 && die "4-rank layout on 2 ranks succeeded"
  grep -q "does not equal the 2 ranks launched\|world size" e.log || { cat e.log; die "no clear world-size message"; }
  "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=f --set parallel.tp=2 > f.log 2>&1 && die "tp=2 in one process succeeded"
  grep -q "world size\|ranks launched" f.log || { cat f.log; die "no clear world-size message without mpirun"; }
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=g --set parallel.tp=2 \
    --set parallel.ep=2 > g.log 2>&1 && die "tp=2 with ep=2 without sp succeeded"
  grep -q "ep=2 requires sp" g.log || { cat g.log; die "no message naming the tp/ep/sp rule"; }
  ;;
output)
  "$MPIRUN" -np 2 "$B/mctrain" "${COMMON[@]}" --set train.steps=4 --set checkpoint.dir=o1 --set parallel.dp=2 > o1.log 2> o1.err \
    || { cat o1.log o1.err; die "dp=2 run failed"; }
  [ "$(grep -c '^step 4/4 ' o1.log)" = 1 ] || { cat o1.log; die "step 4's progress line should appear once (rank 0)"; }
  [ "$(grep -c '^mctrain: model ' o1.log)" = 1 ] || die "the start line should appear once"
  [ "$(grep -c '^memory after step 1' o1.log)" = 1 ] || die "the memory report should appear once"
  if grep -q "$(printf '\r')" o1.log || grep -q "$(printf '\033')" o1.log; then die "progress off a terminal has \\r or escape codes"; fi
  [ ! -s o1.err ] || { cat o1.err; die "a good run wrote to stderr"; }
  "$MPIRUN" -np 2 "$B/mctrain" "${COMMON[@]}" --set data.path=nope.h5 --set checkpoint.dir=o2 --set parallel.dp=2 > o2.log 2>&1 \
    && die "a missing dataset succeeded"
  [ "$(grep -c 'nope.h5' o2.log)" = 1 ] || { cat o2.log; die "an error of every rank should be printed once"; }
  grep -q '^mctrain: rank 0: dataset nope.h5: .*(every rank failed alike)' o2.log || { cat o2.log; die "not rank 0's single line"; }
  grep -q MPI_ABORT o2.log && die "an error of every rank aborted the job"
  "$MPIRUN" -np 2 "$B/mctrain" "${COMMON[@]}" --set train.bogus=1 --set parallel.dp=2 > o3.log 2>&1 && die "a bad --set succeeded"
  [ "$(grep -c 'train.bogus' o3.log)" = 1 ] || { cat o3.log; die "a bad --set should be reported once"; }
  # rank 1 alone fails (its dataset is missing); rank 0 waits in a collective until rank 1 ends the job
  "$MPIRUN" -np 2 sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then d=nope.h5; else d=corpus.h5; fi; exec "$0" "$@" --set data.path=$d' \
    "$B/mctrain" "${SMALL[@]}" --set checkpoint.dir=o4 --set parallel.dp=2 > o4.log 2>&1 && die "a failing rank 1 did not fail the job"
  grep -q '^mctrain: rank 1: dataset nope.h5: ' o4.log || { cat o4.log; die "rank 1's error is not tagged rank 1"; }
  grep -q 'rank 0:\|every rank' o4.log && { cat o4.log; die "rank 1's error was reported as rank 0's or every rank's"; }
  ;;
pp)
  # pp=2 (equal split, a checkpoint every 5 steps) against one process: losses, gradient norms,
  # val_loss; its step 5 resumed as one process and at pp=2 split AEM|R; pp=2 x dp=2 zero 1.
  PPC=("${COMMON[@]}" --set model.pattern=AEMR --set train.eval_every=5 --set train.eval_batches=1)
  close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-4 * (a < 0 ? -a : a)) }'; }
  "$B/mctrain" "${PPC[@]}" --set checkpoint.dir=one > one.log 2>&1 || { cat one.log; die "one-process run failed"; }
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${PPC[@]}" --set checkpoint.dir=a --set parallel.pp=2 \
    --set checkpoint.every=5 --set checkpoint.async_save=false > a.log 2>&1 || { cat a.log; die "pp=2 run failed"; }
  same_losses one/metrics.jsonl a/metrics.jsonl 1 10
  for s in 5 10; do
    close "$(field one/metrics.jsonl val_loss $s)" "$(field a/metrics.jsonl val_loss $s)" \
      || die "step $s: val_loss $(field a/metrics.jsonl val_loss $s) at pp=2, one-process run $(field one/metrics.jsonl val_loss $s)"
  done
  [ "$(grep -c '"step": ' a/metrics.jsonl)" = 10 ] || die "a/metrics.jsonl should hold 10 steps once (rank 0 writes it)"
  grep -q '"pp":[[:space:]]*2' a/step_5/manifest.json || die "the manifest does not record pp=2"
  [ -d a/step_5 ] || die "no checkpoint a/step_5"

  "$B/mctrain" "${PPC[@]}" --set checkpoint.dir=c --resume a/step_5 > c.log 2>&1 || { cat c.log; die "one-process resume failed"; }
  grep -q "resumed from .*step_5 at step 5" c.log || die "one-process resume did not start at step 5"
  same_losses a/metrics.jsonl c/metrics.jsonl 6 10
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${PPC[@]}" --set checkpoint.dir=d --set parallel.pp=2 \
    --set 'parallel.pp_split=AEM|R' --resume a/step_5 > d.log 2>&1 || { cat d.log; die "pp=2 AEM|R resume failed"; }
  same_losses a/metrics.jsonl d/metrics.jsonl 6 10

  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${PPC[@]}" --set checkpoint.dir=e --set parallel.pp=2 \
    --set parallel.dp=2 --set parallel.zero=1 > e.log 2>&1 || { cat e.log; die "pp=2 x dp=2 zero 1 failed"; }
  same_losses one/metrics.jsonl e/metrics.jsonl 1 10
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${PPC[@]}" --set checkpoint.dir=x --set parallel.pp=2 \
    --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1 > x.log 2>&1 || { cat x.log; die "pp=2 x dp=2 x ep=2 zero 1 failed"; }
  same_losses one/metrics.jsonl x/metrics.jsonl 1 10

  echo "loss at step 10: one process $(field one/metrics.jsonl loss 10), pp2 $(field a/metrics.jsonl loss 10), resumed as one process $(field c/metrics.jsonl loss 10), as pp2 AEM|R $(field d/metrics.jsonl loss 10), pp2 x dp2 zero 1 $(field e/metrics.jsonl loss 10), pp2 x dp2 x ep2 zero 1 $(field x/metrics.jsonl loss 10)"
  ;;
nam_medium)
  # Text that does not change with the repository (Debian's base-files): with 16 experts a
  # near-tied router choice can flip between the layouts' rounding, and a corpus made of the
  # project's own docs made that depend on the latest docs edit (grad norm 2.7e-4 apart once).
  "$B/mcdata" -o nam_corpus.h5 /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > nam_mcdata.log 2>&1 \
    || { cat nam_mcdata.log; die "mcdata of the fixed corpus"; }
  NAM=(--config "$S/configs/nam-medium.json" --set model.vocab_size=256 --set model.d_model=64 --set model.head_dim=4
       --set model.expert_hidden=32 --set model.mamba_inner=128 --set model.mamba_head_dim=16 --set model.ssm_state=16
       --set model.rec_width=64 --set model.seq_len=16 --set model.init_std=0.1
       --set train.recompute=none --set train.device=cpu --set train.dtype=fp32 --set train.warmup_steps=2
       --set train.steps=10 --set train.log_every=1 --set train.eval_every=0
       --set checkpoint.keep=0 --set checkpoint.every=0 --set data.path=nam_corpus.h5)
  grep -q '"pattern": "AEMEAEMEAEMRAEMEAEMEAEMR"' "$S/configs/nam-medium.json" && grep -q '"ep": 2' "$S/configs/nam-medium.json" \
    || die "configs/nam-medium.json no longer has the pattern and ep this test shrinks"
  "$B/mctrain" "${NAM[@]}" --set parallel.dp=1 --set parallel.ep=1 --set parallel.zero=0 --set checkpoint.dir=one > one.log 2>&1 \
    || { cat one.log; die "one-process run failed"; }
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${NAM[@]}" --set checkpoint.dir=a > a.log 2>&1 || { cat a.log; die "nam-medium layout failed"; }
  grep -q '"ep":[[:space:]]*2' a/step_10/manifest.json || die "the run's manifest does not record ep=2"
  same_losses one/metrics.jsonl a/metrics.jsonl 1 10
  grep -qE '^  moe.scratch +[0-9]+ +[0-9]+ +1.000' a.log || { grep moe a.log; die "rank 0's moe.scratch is not mcplan's"; }
  echo "nam-medium layout (dp2 x ep2 zero 1) at CPU size: loss at step 10 $(field a/metrics.jsonl loss 10), one process $(field one/metrics.jsonl loss 10); $(grep -E '^  moe.scratch' a.log | tr -s ' ' | tr '\n' ';')"
  ;;
async)
  for lay in "dp2 2 --set parallel.dp=2" "tp2dp2 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1"; do
    set -- $lay
    name=$1 np=$2
    shift 2
    for mode in sync async; do
      mkdir -p $name-$mode
      (cd $name-$mode && "$MPIRUN" --oversubscribe -np $np "$B/mctrain" "${SMALL[@]}" --set data.path="$W/corpus.h5" \
        --set checkpoint.dir=ck --set checkpoint.every=2 --set checkpoint.async_save=$([ $mode = async ] && echo true || echo false) \
        "$@" > run.log 2>&1) || { cat $name-$mode/run.log; die "$name async_save=$mode failed"; }
    done
    grep -q "checkpoint step 8 queued (training paused [0-9.]* s)" $name-async/run.log || { cat $name-async/run.log; die "$name: no stall logged"; }
    [ -e $name-async/ck/.async_sync ] && die "$name: the sync markers were left behind"
    for s in 2 4 6 8 10; do
      [ -d $name-async/ck/step_$s ] || die "$name: no async checkpoint step_$s"
      for f in $name-sync/ck/step_$s/rank_*.h5; do
        cmp -s "$f" "$name-async/ck/step_$s/$(basename "$f")" || die "$name step $s: $(basename "$f") differs from the synchronous save"
      done
      [ "$(ls $name-sync/ck/step_$s | wc -l)" = "$(ls $name-async/ck/step_$s | wc -l)" ] || die "$name step $s: other files"
      cmp -s <(grep -v '"async_save"' $name-sync/ck/step_$s/manifest.json) <(grep -v '"async_save"' $name-async/ck/step_$s/manifest.json) \
        || die "$name step $s: manifests differ (beyond checkpoint.async_save)"
    done
    same_losses $name-sync/ck/metrics.jsonl $name-async/ck/metrics.jsonl 1 10
    echo "$name: async checkpoints 2..10 equal the synchronous ones; $(grep -o 'checkpoint step 8 queued (training paused [0-9.]* s)' $name-async/run.log)"
  done
  # resume the last async checkpoint before the end (step 8) and continue to 10
  "$MPIRUN" --oversubscribe -np 4 "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=res --set parallel.tp=2 --set parallel.dp=2 \
    --set parallel.zero=1 --set checkpoint.every=2 --resume tp2dp2-async/ck/step_8 > res.log 2>&1 || { cat res.log; die "resume of async step 8 failed"; }
  same_losses tp2dp2-async/ck/metrics.jsonl res/metrics.jsonl 9 10
  # a save failing on rank 1 only (ENOSPC at its rank file's fsync): non-zero, rank 0 names rank 1
  "$MPIRUN" --oversubscribe -np 2 bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export MC_CKPT_FAULT=fsync_file; fi; exec "$0" "$@"' \
    "$B/mctrain" "${COMMON[@]}" --set checkpoint.dir=f --set parallel.dp=2 --set checkpoint.every=2 > f.log 2>&1 \
    && die "a run whose save failed on rank 1 exited with status 0"
  grep -q "mctrain: rank 0: asynchronous checkpoint failed on rank 1: .*fsync_file" f.log || { cat f.log; die "rank 0 did not name rank 1"; }
  [ -e f/latest ] && die "a failed save committed"
  # SIGKILL of one rank while a save is in flight (a save every step)
  long=("${COMMON[@]}" --set train.steps=5000 --set checkpoint.every=1 --set checkpoint.keep=3)
  "$MPIRUN" --oversubscribe -np 2 "$B/mctrain" "${long[@]}" --set checkpoint.dir=k --set parallel.dp=2 > k.log 2>&1 &
  mpid=$!
  wait_for_steps k 6
  inflight=0
  for i in $(seq 1 2000); do ls -d k/step_*.tmp > /dev/null 2>&1 && { inflight=1; break; }; done
  kill_one_rank $mpid 2
  [ $killed_rc != 0 ] || die "the job with a killed rank exited with status 0"
  "$B/mcaudit" k --verify --no-progress > k_audit.log 2>&1 || { cat k_audit.log; die "latest does not verify after SIGKILL during an async save"; }
  echo "SIGKILL during an async save (a step_N.tmp was seen: $inflight): latest $(tr -d '\n' < k/latest | sed 's/.*"step":[[:space:]]*\([0-9]*\).*/\1/') verifies"
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
[ $fail = 0 ] && echo "mctrain_mpi $MODE: ok"
exit $fail
