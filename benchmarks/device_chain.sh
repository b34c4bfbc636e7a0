#!/bin/bash
# The H200 runs of issue 21, one stage per device call, each call within 30 s of the last (the machine keeps
# /tmp only while warm): `bash .benchtree/benchmarks/device_chain.sh STAGE` with carry [".dc/dN", ".benchtree"]
# (N: the stage's carry below; a third ".benchold" tree, if carried, is run instead where stage 1's check
# fails). Carries: benchmarks/device_carry.sh; .benchtree: `git archive` of the commit the figures name. Every
# run's log, with the main thread's stack every 15 s where it is a flowrl start (benchmarks/sample_stacks.py),
# comes back in $OUT/logs.tgz; TORCH_LOGS=recompiles says why anything compiled again. Stages (for the sixth
# session, written at the end of the fifth):
#   1 (d1)  wheels; flowrl (hf_static) on the variable workload, 64x8 and 16x8, 4 timed steps each (the 16x8
#           row's first timed update was slower than its second, with no recompile)
#   2 (d2)  vllm installed; the first and later weight syncs by vLLM's reload_weights, by the model's own
#           load_weights, and by reload_weights after a warm-up reload (vllm_sync_paths.py); flowrl's vLLM
#           engine on the fixed workload, its generate under the profilers (--profile generate: why it is
#           slower inside a GRPO step than alone)
#   3 (d1)  wheels; hf_static on the variable workload, 64x8, with executor.gc_freeze (the default since stage 2
#           found generate's device busy 0.93 s of 7.13 s: Python's collector walking the trainer's heap)
#   4 (d2)  vllm installed; flowrl's vLLM engine, fixed workload, 4 timed steps: with executor.gc_freeze (generate
#           under the profilers) and without it
#   5 (d1)  wheels, and vllm.00 for stage 6
#   6 (d2)  vllm installed; flowrl's vLLM engine with the sync's parts logged (timing_s/sync_wake, _wait,
#           _reload, _reset_cache: where the first sync's extra time goes), fixed and variable workloads
# For the seventh session (the sixth's fixes, executor.gc_freeze and the preloaded reload module, against the
# peers in one lease):
#   7 (d1)  wheels; 64x8, 256: flowrl (hf_static) and TRL without vLLM, variable and fixed
#   8 (d2)  vllm installed; flowrl's vLLM engine, fixed (its first weight sync: timing_s/sync_reload against
#           vLLM's own reload timer), and TRL with colocated vLLM, variable and fixed (each call stays under 600 s;
#           vllm_sync_paths.py, 110 s of model building and vLLM start-up before its first sync, is left out)
#   5, then 9 (d2)  vllm installed; flowrl's vLLM engine, fixed and variable, 4 timed steps each (stage 8's fixed
#           run reached its limit after its third timed step, before its RESULT)
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
COMMON="--flowrl-set roles.actor.compile=true --flowrl-set roles.actor.forward_micro_batch_size=128"
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

install_wheels() {  # the d1 carry's wheels (pydantic, tensordict, trl, datasets, ...), once per machine
  [ -d /tmp/site/trl ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/dc/wheels/*.whl
}

install_vllm() {  # vllm from its two halves (d1's vllm.00, d2's vllm.01), checked, with its own wheels
  cat /tmp/dc/vllm.00 /tmp/dc/vllm.01 >"/tmp/dc/$W" && (cd /tmp/dc && sha256sum -c --quiet SHA256SUMS) \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "/tmp/dc/$W" \
      /tmp/dc/vwheels/*.whl
}

GRID="--steps 2 --grid 64x8:256,16x8:256,16x8:1024,64x8:1024"
export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton  # the grid reuses cold start's
export TORCH_LOGS=recompiles  # a recompile inside timed steps says why (the variable 64x8 row of 2026-12-04c did not)

case $STAGE in
1)
  install_wheels || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  run variable 150 $B --steps 4 --lengths variable --systems flowrl --label hf_static $COMMON
  run variable_16x8 120 $B --steps 4 --lengths variable --prompts 16 --systems flowrl --label hf_static $COMMON
  grep -c "__recompiles\] Recompiling" /tmp/runs/variable.log /tmp/runs/variable_16x8.log
  ;;
2)
  install_vllm || exit 4
  python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  run sync_reload 120 python3 benchmarks/vllm_sync_paths.py --device cuda --path reload
  run sync_direct 120 python3 benchmarks/vllm_sync_paths.py --device cuda --path direct
  run sync_reload_warm 120 python3 benchmarks/vllm_sync_paths.py --device cuda --path reload --warm
  run vllm_fixed_profiled 200 $B --steps 2 --profile generate --label vllm_l1_unseeded \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  ;;
3)
  install_wheels || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  run variable_frozen 150 $B --steps 4 --lengths variable --systems flowrl --label hf_static_frozen $COMMON
  ;;
4)
  install_vllm || exit 4
  run vllm_fixed_frozen 230 $B --steps 4 --profile generate --label vllm_l1_frozen \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  run vllm_fixed_unfrozen 200 $B --steps 4 --label vllm_l1_unfrozen --flowrl-set executor.gc_freeze=false \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  ;;
5)
  install_wheels || exit 4
  ls -la /tmp/dc/vllm.00
  ;;
6)
  install_vllm || exit 4
  run vllm_fixed_parts 200 $B --steps 4 --label vllm_l1_parts --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  run vllm_variable_parts 200 $B --steps 4 --lengths variable --label vllm_l1_parts \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  ;;
7)
  install_wheels || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  run variable_pair 280 $B --steps 4 --lengths variable --systems flowrl,trl --label hf_static $COMMON
  run fixed_pair 280 $B --steps 3 --systems flowrl,trl --label hf_static $COMMON
  ;;
8)
  install_vllm || exit 4
  run vllm_fixed_first_sync 170 $B --steps 3 --label vllm_l1 --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  run trl_vllm_variable 160 $B --steps 2 --lengths variable --systems trl_vllm
  run trl_vllm_fixed 160 $B --steps 2 --systems trl_vllm
  ;;
9)
  install_vllm || exit 4
  run vllm_fixed 240 $B --steps 4 --label vllm_l1 --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  run vllm_variable 240 $B --steps 4 --lengths variable --label vllm_l1 \
    --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  ;;
esac
