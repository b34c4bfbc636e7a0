#!/bin/bash
# The H200 runs of issue 21, one stage per device call, each call within 30 s of the last (the machine keeps
# /tmp only while warm): `bash .benchtree/benchmarks/device_chain.sh STAGE` with carry [".dc/dN", ".benchtree"]
# (N: the stage's carry below; a third ".benchold" tree, if carried, is run instead where stage 1's check
# fails). Carries: benchmarks/device_carry.sh; .benchtree: `git archive` of the commit the figures name. Every
# run's log, with the main thread's stack every 15 s where it is a flowrl start (benchmarks/sample_stacks.py),
# comes back in $OUT/logs.tgz; TORCH_LOGS=recompiles says why anything compiled again. Stages (fifth session's
# second lease, after the train passes' widths became multiples of 8 and the layers' compiles skip inductor's
# mix-order size guard, and vLLM returns flat logprobs):
#   1 (d1)  wheels; flowrl (hf_static), variable workload with 4 timed steps and fixed with 3; cold start
#   2 (d2)  vllm installed; vllm_engine_speed.py at level 0 (flat against nested logprobs, gc seconds); flowrl's
#           vLLM engine (sleep level 1), variable and fixed workloads
set -u
STAGE=$1
ROOT=$(pwd)
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
export PYTHONPATH=/tmp/site:/tmp/bt PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/dc /tmp/runs
for d in "$ROOT"/.dc/d*; do [ -d "$d" ] && cp -r "$d"/. /tmp/dc/; done
TREE=.benchtree; [ -f /tmp/use_old ] && TREE=.benchold  # stage 1's check failed: the code before the change
rm -rf /tmp/bt && cp -r "$ROOT/$TREE" /tmp/bt && ln -s ../algorithms /tmp/bt/flowrl/algorithms || exit 3
echo "tree: $TREE"
cd /tmp/bt  # flowrl.algorithms is pyproject's mapping of algorithms/: a link stands in for the install
S="python3 benchmarks/sample_stacks.py 15"
B="$S benchmarks/grpo_vs_trl.py --device cuda --jsonl $OUT/runs.jsonl"
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
  grep -vE "it/s\]|s/it\]|Warning|warn|^  |^---" "/tmp/runs/$name.log" | grep -E "^\{|RESULT|step|rror|\|" \
    | tail -12 | cut -c1-700
  tar -czf "$OUT/logs.tgz" -C /tmp/runs --exclude="*/final" --exclude="*/checkpoints" . 2>/dev/null
}

GRID="--steps 2 --grid 64x8:256,16x8:256,16x8:1024,64x8:1024"
export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton  # the grid reuses cold start's
export TORCH_LOGS=recompiles  # a recompile inside timed steps says why (the variable 64x8 row of 2026-12-04c did not)

case $STAGE in
1)
  [ -d /tmp/site/trl ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/dc/wheels/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  run variable 150 $B --steps 4 --lengths variable --systems flowrl --label hf_static $COMMON
  run fixed 120 $B --steps 3 --systems flowrl --label hf_static $COMMON
  C="python3 benchmarks/cold_start.py --eval-prompts 0 --cache-dir /tmp/cc_cold --stacks-every 15"
  run cold 120 $C --timeout-s 115 --child-log /tmp/runs/cold_child.log
  grep -c "__recompiles\] Recompiling" /tmp/runs/variable.log /tmp/runs/fixed.log
  ;;
2)
  cat /tmp/dc/vllm.00 /tmp/dc/vllm.01 >"/tmp/dc/$W" && (cd /tmp/dc && sha256sum -c --quiet SHA256SUMS) \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "/tmp/dc/$W" \
      /tmp/dc/vwheels/*.whl || exit 4
  python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  run speed_l0 150 python3 benchmarks/vllm_engine_speed.py --device cuda --level 0
  run vllm_variable 180 $B --steps 3 --lengths variable --label vllm_l1_unseeded \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  run vllm_fixed 180 $B --steps 3 --label vllm_l1_unseeded --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  grep -c "__recompiles\] Recompiling" /tmp/runs/vllm_variable.log /tmp/runs/vllm_fixed.log
  grep -c "cumem_allocator" /tmp/runs/vllm_variable.log /tmp/runs/vllm_fixed.log
  ;;
esac
