#!/bin/bash
# The H200 runs of docs/benchmarks.md (issue 21): `bash benchmarks/h200_chain.sh STAGE` from the project root
# of the device's copy, one stage per device call, each call within 30 s of the last (the machine keeps /tmp
# only while warm). Carries (64 MiB a call at most), built here first:
#   .vllmcarry/c1 (stage 1): the first 44 MiB of shared/device/vllm's trimmed vllm 0.26.0 wheel, and the wheels
#     flowrl and TRL 1.13 need beyond the image (pydantic, tensordict, trl, datasets, multiprocess, dill);
#   .vllmcarry/c2 (stage 2): the rest of the vllm wheel, its SHA256SUMS line and vllm's other wheels;
#   .benchtree: `git archive` of the commit the figures name (the working tree may hold others' edits).
# Each system runs in a process of its own (one sleep-mode vLLM per process); every result is one line of
# $OUT/runs.jsonl (print the ratios with `grpo_vs_trl.py --report runs.jsonl`), each log under $OUT.
set -u
STAGE=$1
ROOT=$(pwd)
TREE=$ROOT/.benchtree
C=$ROOT/.vllmcarry
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
B="python3 $TREE/benchmarks/grpo_vs_trl.py --device cuda --jsonl $OUT/runs.jsonl"
COMMON="--flowrl-set roles.actor.compile=true --flowrl-set roles.actor.forward_micro_batch_size=128"
STATIC="--systems flowrl --label hf_static --flowrl-set roles.rollout.engine=hf_static $COMMON"
VLLM="--systems flowrl --flowrl-set roles.rollout.engine=vllm --flowrl-set roles.rollout.enforce_eager=false \
  --flowrl-set roles.rollout.gpu_memory_utilization=0.3 --flowrl-set roles.rollout.max_num_seqs=512 $COMMON"

run() {  # NAME SECONDS COMMAND...: the command's log in $OUT/NAME.log, its results and errors printed
  local name=$1 limit=$2
  shift 2
  echo "=== $name $(date +%T)"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "rc=$? $(date +%T)"
  grep -E "^flowrl step" "$OUT/$name.log" | tail -2 | cut -c1-700
  grep -E "^RESULT" "$OUT/$name.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line[7:]); res = r['result']
    keep = {k: res.get(k) for k in ('s_per_step', 'useful_tok_per_step_s', 'rollout_tok_s', 'peak_gib', 'error',
            'first_step_s_since_start', 'logprob_diff_mean', 'logprob_diff_max', 'draws_taken', 'memory_max')}
    keep['timing_s'] = {k: round(v, 3) for k, v in (res.get('timing_s') or {}).items()}
    print(r['system'], r['workload']['lengths'], json.dumps(keep))"
  grep -E "Error|error:" "$OUT/$name.log" | grep -v Warning | tail -4 | cut -c1-400
}

case $STAGE in
1)
  mkdir -p /tmp/vc && cp "$C/c1/$W.part0" /tmp/vc/ || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/c1/wheels/*.whl
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, pyarrow, trl, datasets; print(torch.__version__, transformers.__version__, \
pyarrow.__version__, trl.__version__, datasets.__version__)"
  ls ~/.cache/torch 2>/dev/null; ls /tmp | head
  run static_fixed_cold 290 $B --steps 3 $STATIC
  run trl_fixed 110 $B --steps 2 --systems trl
  run static_variable 170 $B --steps 3 --lengths variable $STATIC
  ;;
2)
  test -f "/tmp/vc/$W.part0" || exit 3
  cd /tmp/vc && cat "$W.part0" "$C/c2/$W.part1" >"$W" && cp "$C/c2/SHA256SUMS" . && sha256sum -c --quiet SHA256SUMS \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W" "$C"/c2/wheels/*.whl \
    || exit 4
  cd "$ROOT"
  run trl_variable 100 $B --steps 2 --systems trl --lengths variable
  run vllm_fixed_l1 240 $B --steps 19 --label vllm_l1 --flowrl-set roles.rollout.free_cache_engine=1 $VLLM
  run trl_vllm_fixed 150 $B --steps 2 --systems trl_vllm
  ;;
3)
  run vllm_variable_l2 220 $B --steps 19 --lengths variable --label vllm_l2 \
    --flowrl-set roles.rollout.free_cache_engine=2 $VLLM
  run trl_vllm_variable 150 $B --steps 2 --systems trl_vllm --lengths variable
  run static_variable_again 150 $B --steps 3 --lengths variable $STATIC
  ;;
esac
