#!/bin/bash
# The transformers check of the Hugging Face export (docs/export.md), for a machine with torch,
# transformers and safetensors (the device machine; no internet needed):
#
#   bash tests/reshard/hf_llama_device.sh BUILD_DIR [WORK_DIR]
#
# BUILD_DIR holds mcdata, mctrain, mcreshard and mceval (any build: the MegaC side runs on the
# CPU). A small dense model (AEAEAEAE: four Llama layers, GQA 4/2, head_dim 16, vocabulary 256
# padded to 300) is trained for 10 steps on the project's docs, then:
#   1. fp32 export (Llama names, config.json, 5 shards of at most 200KB) -> LlamaForCausalLM.from_pretrained ->
#      logits against mceval --dump-logits of the checkpoint;
#   2. bf16 export -> LlamaForCausalLM (weights widened to fp32) against mceval of the
#      checkpoint that mcreshard --import makes from that same bf16 export (the same weights);
# each must agree to 1e-3 + 1e-3 |logit|. Exit status 0 when both pass.
set -u
B=$(cd "${1:?usage: hf_llama_device.sh BUILD_DIR [WORK_DIR]}" && pwd)
S=$(cd "$(dirname "$0")/../.." && pwd)
W=${2:-$(mktemp -d /tmp/mc_hf_device.XXXXXX)}
mkdir -p "$W" && cd "$W" || exit 1
PY=${PYTHON:-python3}
set -x
"$B/mcdata" -o corpus.h5 "$S"/docs/*.md || exit 1
rm -rf run hf32 hf16 imp16
"$B/mctrain" --set model.pattern=AEAEAEAE --set model.n_experts=1 --set model.top_k=1 --set model.d_model=64 \
  --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=16 --set model.expert_hidden=160 \
  --set model.seq_len=64 --set model.vocab_pad=100 --set model.init_std=0.1 --set model.rope_theta=10000 \
  --set train.steps=10 --set train.global_batch=8 --set train.micro_batch=4 --set train.lr=1e-2 \
  --set train.warmup_steps=2 --set train.device=cpu --set train.dtype=fp32 \
  --set data.path=corpus.h5 --set checkpoint.dir=run > train.log 2>&1 || { tail -20 train.log; exit 1; }
"$B/mcreshard" run --export hf32/ --max-shard-size 200KB --no-progress || exit 1
"$B/mcreshard" run --export hf16/ --dtype bf16 --no-progress || exit 1
"$B/mcreshard" --import hf16 imp16 --no-progress || exit 1
"$B/mceval" run --data corpus.h5 --dump-logits logits32.npy || exit 1
"$B/mceval" imp16 --data corpus.h5 --dump-logits logits16.npy || exit 1
set +x
rc=0
echo "== 1. fp32 export vs the checkpoint"
"$PY" "$S/tests/reshard/hf_llama_check.py" hf32 logits32.npy || rc=1
echo "== 2. bf16 export vs the checkpoint imported from it"
"$PY" "$S/tests/reshard/hf_llama_check.py" hf16 logits16.npy || rc=1
echo "hf_llama_device: $([ $rc = 0 ] && echo PASS || echo FAIL) (work dir $W)"
exit $rc
