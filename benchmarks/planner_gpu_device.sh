#!/bin/bash
# Issue 43.7 on the device (one call): the planner's chosen layout against the hand grid, benchmarks/planner_one_gpu.py.
# Carry [.gpu/p3]: flowrl's wheels beyond the image (pydantic, tensordict, datasets, math-verify, gguf and their
# own; `pip download --no-deps` them, cp312 manylinux, with /.gpu/ in .git/info/exclude). vLLM is not carried: where
# the image has it (vLLM 0.26) the planner and the grid's vLLM rows (graphs and eager) use it; where it has none
# the planner leaves it out (flowrl.runtime.layout.auto_plan.installed_engines) and so does the grid (no row, no crash).
# Args: SHAPES STEPS LIMIT_S; one JSON line per run as it ends. RUNS=chosen,LABEL,...: only those runs (the models
# and each run's line stay in /tmp/planner while the machine is warm, so a shape's runs can span calls).
set -u
SHAPES=${1:-0.5B}; STEPS=${2:-3}; LIMIT=${3:-400}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/p3/*.whl || exit 4
# vLLM for the grid's vLLM rows and the planner's vLLM candidates, where verl_chain.sh's stage B ran first on this
# machine (/tmp/vc/vllm.00) and this call carries .verlcarry/c3 and .verlcarry/c5 (verl_carry.sh's second half and
# the wheels vLLM needs beyond p3)
if [ -f /tmp/vc/vllm.00 ] && [ -d .verlcarry/c3 ]; then
  bash benchmarks/vllm_from_carries.sh || exit $?
fi
ln -sfn ../algorithms flowrl/algorithms  # pyproject maps algorithms/ to flowrl.algorithms; no install here
# flashinfer is not carried: vLLM's sampler falls back to its own (without this, vLLM 0.26 failed its first
# generation on the H100, "No module named 'flashinfer'", 2026-12-07)
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
date +%T
timeout "$LIMIT" python3 benchmarks/planner_one_gpu.py --shapes "$SHAPES" --steps "$STEPS" --workdir /tmp/planner \
  ${RUNS:+--runs "$RUNS"} 2>&1 | grep --line-buffered -v -E '^[^{].*[Ww]arn'  # a run's JSON line stays even where its error names a warning
echo "rc=${PIPESTATUS[0]} $(date +%T)"
