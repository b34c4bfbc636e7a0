#!/bin/bash
# The device runs of issue 46 (flowrl beside verl), one stage per device call, each call within 30 s of the last
# (the machine keeps /tmp only while warm): `bash .verlcarry/bench/verl_chain.sh STAGE` from the project root,
# carry [".verlcarry/cN", ".verlcarry/bench"] (cN: benchmarks/verl_carry.sh's carries; stage C also carries
# ".verlcarry/c5", vLLM's server-path wheels: 37 MiB with c3; bench: this script and
# grpo_vs_verl.py, verl_system.py, verl_reward.py, bench_report.py, verl_preflight.py, verl_preflight_fakes.py,
# verl_preflight_setup.py, verl_preflight_actor.py, verl_preflight_rollout.py and verl_preflight_v1.py of the commit the figures name, laid
# over the device's copy of the project). Each run's output and verl's own log come back in $OUT/logs_STAGE.tgz,
# the RESULT lines in $OUT/runs_STAGE.jsonl.
# Before verl's D and E runs benchmarks/verl_preflight.py runs verl's CPU-side rollout path on that run's
# workload in verl's packages (about a minute): a refusal ends the stage with its `preflight FAILED at STAGE:
# REASON` line and exit 6, before verl's 5 minutes of start-up. The verl run's limits shrink where the call's 600 s
# would end first (left; CALL_S=N where the device time left is under 600 s), so that it still ends, and its logs
# are packed, inside the call.
#   A (c1)  flowrl's and verl's wheels into /tmp/site and /tmp/vsite, imports and a Ray start checked; flowrl
#           (`train.device=cuda` alone), Qwen2.5-0.5B shape 64x8, 256 new tokens, fixed (cold start), then
#           variable (D's flowrl row, moved here so that D's call holds verl's 5-minute start and its steps)
#   B (c2)  vllm's first half kept
#   F       flowrl, Qwen2.5-1.5B shape 16x8, 1024 new tokens, variable (micro-batches of 16 on a card under 100 GB)
#   C (c3, c5) vllm and its wheels, and the server path's (benchmarks/verl_server_wheels.txt) installed; an import
#           of what verl's vLLM server imports checked (exit 5 if one fails); verl, 64x8, 256, fixed (cold start;
#           its preflight passed on the device on 2026-12-07)
#   T       after C: verl, 64x8, 256, fixed, with FSDP2 and larger token budgets
#   D       the preflight (exit 6) and verl, 64x8, 256, variable
#   E       the preflight (exit 6), then verl, 1.5B shape 16x8, 1024, variable
#   G       after B (carry c3, c5 as C does; vllm installed here where C has not run): flowrl with vLLM
#           in-process, then with vLLM's own OpenAI server as the replica (roles.rollout.engine=vllm_server),
#           64x8, 256, fixed (issue 45.5); both eager (the server path always is), both with half the card for
#           vLLM (the in-process default)
#   L1, L2, L3  the learning plot (issue 46.3), after A (and B for L3's vllm): L1 (carry .realcarry/part1, bench)
#           SmolLM2's GGUF first half and the gguf wheel; L2 (.realcarry/part2, bench) the model imported, the word
#           problems written, flowrl's GRPO on them (benchmarks/real_model_learning.py, 40 steps); L3 (c3, c5,
#           bench) verl on the same (benchmarks/real_model_verl.py, its overrides, data and reward checked on the
#           CPU by real_model_verl_preflight.py), to the call's end. Each run's folder in $OUT/NAME.tgz; plot
#           here: python benchmarks/plot_learning.py flowrl_learning verl_learning --x wall
set -u
STAGE=$1
ROOT=$(pwd)
GG=SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/tmp/site:/tmp/bt PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false VERL_SITE=/tmp/vsite \
  TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton
mkdir -p /tmp/vc /tmp/runs
rm -rf /tmp/bt && mkdir /tmp/bt && tar -C "$ROOT" --exclude=./.verlcarry --exclude=./.vllmcarry --exclude=./.git \
  -cf - . | tar -C /tmp/bt -xf - && cp "$ROOT"/.verlcarry/bench/*.py /tmp/bt/benchmarks/ \
  && ln -sfn ../algorithms /tmp/bt/flowrl/algorithms || exit 3
cd /tmp/bt || exit 3  # flowrl.algorithms is pyproject's mapping of algorithms/: a link stands in for the install
B="python3 benchmarks/grpo_vs_verl.py --device cuda --steps 3 --jsonl $OUT/runs_$STAGE.jsonl"
V="--systems verl --verl-fallback trainer.use_v1=False"
BIG="--shape qwen1.5b --prompts 16 --new-tokens 1024 --lengths variable"
P="python3 benchmarks/verl_preflight.py --steps 3"

run() {  # NAME SECONDS COMMAND...: output in /tmp/runs/NAME.log (verl's own in NAME.verl.log), logs packed
  local name=$1 limit=$2
  shift 2
  echo "=== $name $(date +%T)"
  timeout "$limit" "$@" --verl-log "/tmp/runs/$name.verl.log" >"/tmp/runs/$name.log" 2>&1
  echo "rc=$? $(date +%T)"
  grep -E "^RESULT|GRPO step|FAILED|rror|flowrl step|verl:|s/step|tokenizer check" "/tmp/runs/$name.log" | cut -c1-900 | tail -14
  [ -f "/tmp/runs/$name.verl.log" ] && grep -E "Error|error|Traceback|step:[0-9]" "/tmp/runs/$name.verl.log" \
    | grep -v Warning | cut -c1-400 | tail -12
  tar -czf "$OUT/logs_$STAGE.tgz" -C /tmp/runs . 2>/dev/null
}

learn() {  # NAME SECONDS COMMAND...: a learning run writing /tmp/runs/NAME/, its output in NAME.log, both packed
  local name=$1 limit=$2
  shift 2
  echo "=== $name $(date +%T)"
  timeout "$limit" "$@" --output "/tmp/runs/$name" >"/tmp/runs/$name.log" 2>&1
  echo "rc=$? $(date +%T)"
  grep -vE "it/s\]|s/it\]|Warning|warn" "/tmp/runs/$name.log" | tail -20 | cut -c1-400
  tar -czf "$OUT/$name.tgz" -C /tmp/runs --exclude="$name/final" --exclude="$name/checkpoints" \
    --exclude="$name/ckpt" --exclude="$name/trainer" "$name.log" "$name" 2>/dev/null
}

preflight() {  # NAME COMMAND...: the preflight of the verl run NAME (output in /tmp/runs/NAME.preflight.log);
  # its lines shown, and where it fails, its reason and exit 6 (verl not started)
  local name=$1 log=/tmp/runs/$1.preflight.log rc
  shift
  echo "=== $name preflight $(date +%T)"
  timeout 240 "$@" >"$log" 2>&1
  rc=$?
  echo "rc=$rc $(date +%T)"
  grep -E "^preflight" "$log" | cut -c1-700
  tar -czf "$OUT/logs_$STAGE.tgz" -C /tmp/runs . 2>/dev/null
  [ "$rc" = 0 ] && return 0
  if ! grep -q "^preflight FAILED" "$log"; then  # killed by the timeout, or the project's side (model, data) failed
    local why="rc=$rc"
    [ "$rc" = 124 ] && why="still running after 240 s"
    echo "preflight FAILED before a verdict ($why): $(grep -v '^[[:space:]]*$' "$log" | tail -1 | cut -c1-400)"
  fi
  exit 6
}

install_vllm() {  # vllm (B's first half and c3's second), its wheels and the server path's (c5) into /tmp/site, once
  # per machine; then an import of what verl's vLLM server imports (exit 5 if one fails), at once instead of 450 s
  # into verl's start
  (cd "$ROOT" && bash benchmarks/vllm_from_carries.sh) || exit $?
  PYTHONPATH=/tmp/vsite:/tmp/site timeout 60 python3 -c "
import vllm, vllm.entrypoints.openai.api_server, vllm.entrypoints.cli.serve, prometheus_fastapi_instrumentator
import verl.workers.rollout.vllm_rollout.vllm_async_server
print('vllm', vllm.__version__, 'server path imports')" >/tmp/runs/imports.log 2>&1
  local rc=$?
  grep -vi warn /tmp/runs/imports.log | tail -3
  [ $rc = 0 ] || exit 5
}

left() {  # SECONDS: that many, or fewer where the call's CALL_S (600 unless given: the device time left may be
  # less) less 15 s to pack the logs end first
  local t=$((${CALL_S:-600} - 15 - SECONDS))
  echo $((t < $1 ? t : $1))
}

case $STAGE in
A)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/.verlcarry/c1/site/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite \
      "$ROOT"/.verlcarry/c1/vsite/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  PYTHONPATH=/tmp/vsite:/tmp/site timeout 90 python3 -c "
import ray, verl, hydra, omegaconf, tensordict, transformers, transfer_queue, torch
import verl.workers.engine_workers, verl.experimental.agent_loop, verl.trainer.ppo.v1
print('vsite', verl.__version__, ray.__version__, tensordict.__version__, transformers.__version__, torch.__version__)
ray.init(num_cpus=4, include_dashboard=False); print('ray', ray.cluster_resources()); ray.shutdown()" 2>&1 \
    | grep -vi warn | tail -5
  # INSTALL_ONLY=1: the wheels alone, where only G follows on this machine (its runs are its own baseline)
  [ "${INSTALL_ONLY:-0}" = 1 ] && exit 0
  # VARIABLE_ONLY=1: D's flowrl row alone (the fixed workload measured on this card kind before)
  [ "${VARIABLE_ONLY:-0}" = 1 ] || run flowrl_fixed 200 $B --systems flowrl
  # D's flowrl row (D's call is verl's alone); FIXED_ONLY=1 leaves it out where D will not run on this machine
  [ "${FIXED_ONLY:-0}" = 1 ] || run flowrl_variable 150 $B --systems flowrl --lengths variable
  ;;
B)
  cp "$ROOT/.verlcarry/c2/vllm.00" /tmp/vc/ || exit 4
  ;;
F)
  # flowrl's micro-batch of 32 rows of up to 1280 tokens needs about 102 GiB at 1.5B (its memory check refuses it
  # on an 80 GB card): there flowrl runs micro-batches of 16 (what `flowrl plan --cluster found` picks on an H100;
  # verl's update is bounded by its token budget, ppo_max_token_len_per_gpu, either way)
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  MICRO=""
  [ "${MIB:-0}" -lt 100000 ] && MICRO="--micro 16" && echo "F: a card of $MIB MiB: flowrl with --micro 16"
  run flowrl_big 300 $B --systems flowrl $BIG $MICRO
  ;;
C)
  install_vllm
  # the fixed workload's preflight passed on the device (2026-12-07, H100): its 90 s go to verl's steps now
  t=$(left 560)
  run verl_fixed "$t" $B $V --verl-deadline $((t - 25))
  ;;
T)
  install_vllm  # once per machine: carry c3 and c5 where no stage before installed it
  # after C: verl 64x8, 256, fixed, with FSDP2 and larger token budgets (verl's perf-tuning page: logprob passes
  # may take twice the update's), both of which verl's fused kernels (on by default since 2026-12-07) allow
  t=$(left 560)
  run verl_tuned "$t" $B $V --verl-set actor_rollout_ref.actor.strategy=fsdp2 \
    --verl-set actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
    --verl-set actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536 \
    --verl-set actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=65536 --verl-deadline $((t - 25))
  ;;
D)
  install_vllm  # once per machine: carry c3 and c5 where no stage before installed it
  preflight verl_variable $P --lengths variable
  t=$(left 560)
  run verl_variable "$t" $B $V --lengths variable --verl-deadline $((t - 25))
  ;;
G)
  install_vllm  # after B, and C where it ran first
  # vLLM's OpenAI server imports uvicorn, which c1 brings for verl (/tmp/vsite): the server path needs it in /tmp/site
  [ -d /tmp/site/uvicorn ] || cp -r /tmp/vsite/uvicorn /tmp/vsite/uvicorn-*.dist-info /tmp/site/ || exit 4
  # SERVER_ONLY=1: the server's run alone (the in-process one measured on this card kind before)
  [ "${SERVER_ONLY:-0}" = 1 ] || run flowrl_vllm_inproc 200 $B --systems flowrl --flowrl-set roles.rollout.engine=vllm \
    --label vllm
  run flowrl_vllm_server "$(left 330)" $B --systems flowrl --flowrl-set roles.rollout.engine=vllm_server \
    --flowrl-set 'roles.rollout.server_args=["--gpu-memory-utilization","0.5"]' --label vllm_server
  ;;
L1)
  mkdir -p /tmp/rc && cp "$ROOT/.realcarry/part1/$GG.part0" /tmp/rc/ || exit 3
  [ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$ROOT"/.realcarry/part1/wheels/gguf-*.whl || exit 4
  ;;
L2)
  test -f "/tmp/rc/$GG.part0" || exit 3
  cat "/tmp/rc/$GG.part0" "$ROOT/.realcarry/part2/$GG.part1" >"/tmp/rc/$GG" \
    && (cd /tmp/rc && sha256sum -c --quiet "$ROOT/.realcarry/part2/SHA256SUMS") || exit 4
  python3 -m flowrl.cli model import "/tmp/rc/$GG" --output /tmp/smollm2 2>&1 | tail -1
  python3 -m flowrl.cli data wordproblems --output /tmp/wp | tail -1
  learn flowrl_learning "$(left 560)" python3 benchmarks/real_model_learning.py --model /tmp/smollm2 --data /tmp/wp \
    --device cuda --set roles.actor.compile=false --algorithm grpo --steps 40 --no-rescore
  ;;
L3)
  install_vllm  # once per machine
  test -d /tmp/smollm2 || exit 3
  t=$(left 570)
  learn verl_learning "$t" python3 benchmarks/real_model_verl.py --model /tmp/smollm2 --data /tmp/wp --steps 40 \
    --deadline $((t - 20))
  ;;
E)
  install_vllm  # once per machine: carry c3 and c5 where no stage before installed it
  preflight verl_big $P $BIG
  t=$(left 560)
  run verl_big "$t" $B $V $BIG --verl-deadline $((t - 40))
  ;;
esac
