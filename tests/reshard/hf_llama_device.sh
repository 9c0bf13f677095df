#!/bin/bash
# The transformers check of the Hugging Face export (docs/export.md):
#
#   bash tests/reshard/hf_llama_device.sh prepare BUILD_DIR WORK_DIR   # MegaC side (any CPU host)
#   bash tests/reshard/hf_llama_device.sh check WORK_DIR               # needs torch + transformers
#   bash tests/reshard/hf_llama_device.sh all BUILD_DIR WORK_DIR       # both, on one machine
#
# prepare: BUILD_DIR holds mcdata, mctrain, mcreshard and mceval (any build: the MegaC side
# runs on the CPU). A small dense model (AEAEAEAE: four Llama layers, GQA 4/2, head_dim 16,
# vocabulary 256 padded to 300, rope_theta 500) is trained for 10 steps on the project's docs;
# WORK_DIR then holds hf32/ (fp32 export, Llama names, config.json, 5 shards of at most
# 200KB), hf16/ (bf16 export), and mceval's logits of the checkpoint (logits32.npy) and of the
# checkpoint mcreshard --import makes from hf16 (logits16.npy, the same bf16 weights), with
# their tokens (*.tokens.npy). When MegaC cannot be built on the machine with transformers
# (the device machine has no cJSON/HDF5), copy WORK_DIR/hf32, hf16 and *.npy (about 2 MB)
# there and run check on that copy.
# check: LlamaForCausalLM.from_pretrained on hf32 and hf16 against those logits
# (tests/reshard/hf_llama_check.py; each must agree to 1e-3 + 1e-3 |logit|). Exit status 0
# when both pass.
set -u
MODE=${1:?usage: hf_llama_device.sh prepare BUILD_DIR WORK_DIR | check WORK_DIR | all BUILD_DIR WORK_DIR}
S=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}

prepare() {
  local B W
  B=$(cd "$1" && pwd) || exit 1
  W=$2
  mkdir -p "$W" && cd "$W" || exit 1
  rm -rf run hf32 hf16 imp16 corpus.h5 ./*.npy
  set -x
  "$B/mcdata" -o corpus.h5 "$S"/docs/*.md > mcdata.log 2>&1 || { cat mcdata.log; exit 1; }
  "$B/mctrain" --set model.pattern=AEAEAEAE --set model.n_experts=1 --set model.top_k=1 --set model.d_model=64 \
    --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=16 --set model.expert_hidden=160 \
    --set model.seq_len=64 --set model.vocab_pad=100 --set model.init_std=0.1 --set model.rope_theta=500 \
    --set train.steps=10 --set train.global_batch=8 --set train.micro_batch=4 --set train.lr=1e-2 \
    --set train.warmup_steps=2 --set train.device=cpu --set train.dtype=fp32 \
    --set data.path=corpus.h5 --set checkpoint.dir=run > train.log 2>&1 || { tail -20 train.log; exit 1; }
  "$B/mcreshard" run --export hf32/ --max-shard-size 200KB --no-progress || exit 1
  "$B/mcreshard" run --export hf16/ --dtype bf16 --no-progress || exit 1
  "$B/mcreshard" --import hf16 imp16 --no-progress || exit 1
  "$B/mceval" run --data corpus.h5 --dump-logits logits32.npy || exit 1
  "$B/mceval" imp16 --data corpus.h5 --dump-logits logits16.npy || exit 1
  { set +x; } 2>/dev/null
}

check() {
  local W=$1 rc=0
  echo "== 1. fp32 export vs the checkpoint"
  "$PY" "$S/tests/reshard/hf_llama_check.py" "$W/hf32" "$W/logits32.npy" || rc=1
  echo "== 2. bf16 export vs the checkpoint imported from it"
  "$PY" "$S/tests/reshard/hf_llama_check.py" "$W/hf16" "$W/logits16.npy" || rc=1
  echo "hf_llama_device: $([ $rc = 0 ] && echo PASS || echo FAIL) (work dir $W)"
  return $rc
}

case "$MODE" in
prepare) prepare "${2:?BUILD_DIR}" "${3:?WORK_DIR}" ;;
check) W=$(cd "${2:?WORK_DIR}" && pwd) && check "$W" ;;
all) mkdir -p "${3:?WORK_DIR}" && W=$(cd "$3" && pwd) && prepare "${2:?BUILD_DIR}" "$W" && check "$W" ;;
*) echo "unknown mode $MODE (prepare, check or all)" >&2; exit 2 ;;
esac
