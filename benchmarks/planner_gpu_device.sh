#!/bin/bash
# Issue 43.7 on the device (one call): the planner's chosen layout against the hand grid, benchmarks/planner_one_gpu.py.
# Carry [.gpu/p3]: flowrl's wheels beyond the image (pydantic, tensordict, datasets, math-verify, gguf and their
# own; `pip download --no-deps` them, cp312 manylinux, with /.gpu/ in .git/info/exclude). vLLM is not carried: where
# the image has it (vLLM 0.26) the planner and the grid's vLLM rows (graphs and eager) use it; where it has none
# the planner leaves it out (flowrl.runtime.layout.auto_plan.installed_engines) and so does the grid (no row, no crash).
# Args: SHAPES STEPS LIMIT_S; one JSON line per run as it ends.
set -u
SHAPES=${1:-0.5B}; STEPS=${2:-3}; LIMIT=${3:-400}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/p3/*.whl || exit 4
ln -sfn ../algorithms flowrl/algorithms  # pyproject maps algorithms/ to flowrl.algorithms; no install here
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
date +%T
timeout "$LIMIT" python3 benchmarks/planner_one_gpu.py --shapes "$SHAPES" --steps "$STEPS" 2>&1 | grep --line-buffered -v -E '^[^{].*[Ww]arn'  # a run's JSON line stays even where its error names a warning
echo "rc=${PIPESTATUS[0]} $(date +%T)"
