#!/bin/bash
# The H200 runs of 2026-12-04, one stage per device call, each call within 30 s of the last (the machine keeps
# /tmp only while warm): `bash .benchtree/benchmarks/device_chain.sh STAGE` with carry [".dc/cSTAGE",
# ".benchtree"] (stage 5: [".benchtree"]). Carries: benchmarks/device_carry.sh; .benchtree: `git archive` of
# the commit the figures name. Stages:
#   1  wheels; issue 21: cold start to the first GRPO step, empty compile caches, then warm (the same caches);
#      hf_static on the variable-length workload (grpo_vs_trl.py)
#   2  issue 22: SmolLM2 imported from the GGUF file, GRPO 40 steps alone (wall clock against TRL's run)
#   3  issue 22: RLOO 25 steps (strict greedy accuracy)
#   4  vllm installed; issue 25: async settings on the GPU (steps/s, GPU idle fraction)
#   5  issue 21: flowrl's vLLM engine without per-row seeds, sleep level 2; and on the variable workload
set -u
STAGE=$1
ROOT=$(pwd)
C=$ROOT/.dc
G=SmolLM2-135M-Instruct.Q4_1.gguf
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
export PYTHONPATH=/tmp/site:/tmp/bt PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/dc /tmp/runs
[ -d "$C/c$STAGE" ] && cp -r "$C/c$STAGE"/. /tmp/dc/
rm -rf /tmp/bt && cp -r "$ROOT/.benchtree" /tmp/bt && ln -s ../algorithms /tmp/bt/flowrl/algorithms || exit 3
cd /tmp/bt  # flowrl.algorithms is pyproject's mapping of algorithms/: a link stands in for the install
LEARN="python3 benchmarks/real_model_learning.py --model /tmp/smollm2 --data /tmp/wp --device cuda \
  --set roles.actor.compile=false --no-rescore"
B="python3 benchmarks/grpo_vs_trl.py --device cuda --jsonl $OUT/runs.jsonl"
COMMON="--flowrl-set roles.actor.compile=true --flowrl-set train.forward_micro_batch_size=128"
VLLM="--systems flowrl --flowrl-set roles.rollout.engine=vllm --flowrl-set roles.rollout.enforce_eager=false \
  --flowrl-set roles.rollout.gpu_memory_utilization=0.3 --flowrl-set roles.rollout.max_num_seqs=512 \
  --flowrl-set roles.rollout.seed_rows=false $COMMON"

run() {  # NAME SECONDS COMMAND...: output in /tmp/runs/NAME.log, its tail printed, the logs packed into $OUT
  local name=$1 limit=$2
  shift 2
  echo "=== $name $(date +%T)"
  timeout "$limit" "$@" >"/tmp/runs/$name.log" 2>&1
  echo "rc=$? $(date +%T)"
  grep -vE "it/s\]|s/it\]|Warning|warn" "/tmp/runs/$name.log" | grep -E "^\{|RESULT|step|rror|accuracy|\|" \
    | tail -12 | cut -c1-600
  tar -czf "$OUT/logs.tgz" -C /tmp/runs --exclude="*/final" --exclude="*/checkpoints" --exclude="*/trainer" \
    . 2>/dev/null
}

case $STAGE in
1)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/dc/wheels/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  run cold 230 python3 benchmarks/cold_start.py --eval-prompts 0 --cache-dir /tmp/cc --child-log /tmp/runs/cold_child.log
  run warm 150 python3 benchmarks/cold_start.py --eval-prompts 0 --cache-dir /tmp/cc --child-log /tmp/runs/warm_child.log
  run static_variable 180 $B --steps 3 --lengths variable --systems flowrl --label hf_static \
    --flowrl-set roles.rollout.engine=hf_static $COMMON
  ;;
2)
  cat /tmp/dc/gguf.00 /tmp/dc/gguf.01 >"/tmp/dc/$G" && (cd /tmp/dc && grep "$G" SHA256SUMS | sha256sum -c --quiet) \
    || exit 4
  python3 -m flowrl.cli model import "/tmp/dc/$G" --output /tmp/smollm2 2>&1 | tail -1
  python3 -m flowrl.cli data wordproblems --output /tmp/wp | tail -1
  run grpo 450 $LEARN --algorithm grpo --steps 40 --output /tmp/runs/grpo
  ;;
3)
  run rloo 280 $LEARN --algorithm rloo --steps 25 --output /tmp/runs/rloo
  ;;
4)
  cat /tmp/dc/vllm.00 /tmp/dc/vllm.01 /tmp/dc/vllm.02 >"/tmp/dc/$W" \
    && (cd /tmp/dc && grep "$W" SHA256SUMS | sha256sum -c --quiet) \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "/tmp/dc/$W" \
      /tmp/dc/vwheels/*.whl || exit 4
  python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  run async 480 python3 benchmarks/async_gpu.py --engine vllm --deadline 440
  ;;
5)
  run vllm_fixed_l2 270 $B --steps 6 --label vllm_l2_unseeded --flowrl-set roles.rollout.free_cache_engine=2 $VLLM
  run vllm_variable 270 $B --steps 6 --lengths variable --label vllm_l1_unseeded \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  ;;
esac
