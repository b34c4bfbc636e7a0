#!/bin/bash
# The H200 runs of docs/real_model.md (issue 22): `bash benchmarks/real_model_chain.sh STAGE` from the project
# root of the device's copy, one stage per device call, each call within 30 s of the last (the machine keeps
# /tmp only while warm). Carries (64 MiB a call at most), built here first:
#   .realcarry/part1 (stage 1): the first half of SmolLM2's GGUF file and the wheels the image lacks (pydantic,
#     tensordict, trl, datasets, gguf, ...): python benchmarks/real_model_carry.py
#   .realcarry/part2 (stage 2): the rest of the file and its SHA256SUMS line;
#   .benchtree: `git archive` of the commit the figures name (the working tree may hold others' edits).
# Each run's files come back as one $OUT/NAME.tgz (metrics.jsonl, wall_clock.jsonl, final_score.json, log).
set -u
STAGE=$1
ROOT=$(pwd)
C=$ROOT/.realcarry
G=SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
rm -rf /tmp/bt && cp -r "$ROOT/.benchtree" /tmp/bt && ln -s ../algorithms /tmp/bt/flowrl/algorithms || exit 3
cd /tmp/bt  # flowrl.algorithms is pyproject's mapping of algorithms/: a link stands in for the install
LEARN="python3 benchmarks/real_model_learning.py --model /tmp/smollm2 --data /tmp/wp --device cuda \
  --set roles.actor.compile=false"  # eager train passes: no cold compile for a 135M model

run() {  # NAME SECONDS COMMAND...: the command's output in $OUT/NAME.log, then NAME's folder packed
  local name=$1 limit=$2
  shift 2
  echo "=== $name $(date +%T)"
  timeout "$limit" "$@" >"/tmp/runs/$name.log" 2>&1
  echo "rc=$? $(date +%T)"
  grep -vE "it/s\]|s/it\]|Warning|warn" "/tmp/runs/$name.log" | tail -25 | cut -c1-400
  tar -czf "$OUT/$name.tgz" -C /tmp/runs --exclude="$name/final" --exclude="$name/checkpoints" \
    --exclude="$name/trainer" "$name.log" "$name" 2>/dev/null
}

case $STAGE in
1)
  mkdir -p /tmp/rc /tmp/runs && cp "$C/part1/$G.part0" /tmp/rc/ || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/part1/wheels/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, trl, datasets, pydantic, tensordict, gguf; print(torch.__version__, \
transformers.__version__, trl.__version__, datasets.__version__, pydantic.__version__, tensordict.__version__)"
  # issue 26's figures ride on this call (they need only the wheels): padded vs packed, Qwen2.5-0.5B shape
  PYTHONPATH=/tmp/site:/tmp/bt timeout 380 python3 benchmarks/packing.py --device cuda | tee "$OUT/packing.jsonl"
  ;;
1b)  # stage 1's wheels, then packed vs padded logprobs in fp32 and bf16 (FlexAttention on CUDA)
  mkdir -p /tmp/rc /tmp/runs && cp "$C/part1/$G.part0" /tmp/rc/ || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/part1/wheels/*.whl || exit 4
  PYTHONPATH=/tmp/site:/tmp/bt timeout 150 python3 benchmarks/packing_agreement.py --device cuda \
    | tee "$OUT/packing_agreement.jsonl"
  ;;
2)
  test -f "/tmp/rc/$G.part0" || exit 3
  cat "/tmp/rc/$G.part0" "$C/part2/$G.part1" >"/tmp/rc/$G" && (cd /tmp/rc && sha256sum -c --quiet "$C/part2/SHA256SUMS") \
    || exit 4
  time python3 -m flowrl.cli model import "/tmp/rc/$G" --output /tmp/smollm2 2>&1 | tail -1
  python3 -c "from transformers import AutoTokenizer as A; t = A.from_pretrained('/tmp/smollm2'); \
print('tokenizer eos/pad/bos', t.eos_token_id, t.pad_token_id, t.bos_token_id)"
  python3 -m flowrl.cli data wordproblems --output /tmp/wp
  # GRPO alone on the GPU (the RLOO run of the first session shared it), then the export re-scored
  run grpo 500 $LEARN --algorithm grpo --steps 40 --output /tmp/runs/grpo
  ;;
2r)  # as stage 2, RLOO in place of GRPO: 25 steps, no re-score (the device time left)
  test -f "/tmp/rc/$G.part0" || exit 3
  cat "/tmp/rc/$G.part0" "$C/part2/$G.part1" >"/tmp/rc/$G" && (cd /tmp/rc && sha256sum -c --quiet "$C/part2/SHA256SUMS") \
    || exit 4
  python3 -m flowrl.cli model import "/tmp/rc/$G" --output /tmp/smollm2 2>&1 | tail -1
  python3 -m flowrl.cli data wordproblems --output /tmp/wp
  run rloo 230 $LEARN --algorithm rloo --steps 25 --no-rescore --output /tmp/runs/rloo
  ;;
3)
  run trl 560 python3 benchmarks/real_model_trl.py --model /tmp/smollm2 --data /tmp/wp --output /tmp/runs/trl \
    --steps 35
  ;;
esac
