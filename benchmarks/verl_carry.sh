#!/bin/bash
# Packs what benchmarks/verl_chain.sh needs on the device into four carries, each under ~55 MiB (a call sends
# at most 64 MiB with the working tree; c3 and c5 travel together, 37 MiB):
#   c1: verl 0.9.1 and what it needs beyond the image, for /tmp/vsite (ray 2.55.1 repacked without its Java jar and
#       dashboard build, hydra-core 1.3.2, omegaconf 2.3.0, antlr4 4.9.3 (built here: PyPI has only its sdist),
#       tensordict 0.10.0 and transformers 5.9.0 (verl's pins) with tokenizers 0.22.1 (transformers 5.9.0 refuses
#       the image's 0.23.2), TransferQueue (verl's v1 trainer), uvicorn, ...),
#       and flowrl's wheels for /tmp/site (pydantic, tensordict 0.15.3, ...: from vllm's carry);
#   c2: the first 50 MiB of vllm 0.26.0's trimmed wheel (../shared/device/vllm/make.sh's .vllmcarry);
#   c3: the rest of it and vllm's own wheels, with SHA256SUMS;
#   c5: what vLLM's OpenAI server path (verl starts vLLM through it) imports beyond the in-process path:
#       benchmarks/verl_server_wheels.txt, each pin's reason beside it (0.6 MiB);
#   bench: verl_chain.sh and the scripts it lays over the device's copy of the project (re-run the last lines, or
#       copy them again, after changing one).
# Run from the project root with /.verlcarry/ and /.vllmcarry/ in .git/info/exclude, after
# `bash ../shared/device/vllm/make.sh`. pip download --no-deps: every wheel the image lacks is named here.
set -euo pipefail
OUTD=${1:-.verlcarry}
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
SHARED=$(cd "$(dirname "$0")/../../shared/device/vllm" 2>/dev/null && pwd || echo /work/shared/device/vllm)
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any"
VERL_WHEELS="verl==0.9.1 ray==2.55.1 hydra-core==1.3.2 omegaconf==2.3.0 codetiming==1.4.0 tensordict==0.10.0
  torchdata==0.11.0 pylatexenc==2.11 datasets==5.2.0 multiprocess==0.70.19 orjson==3.13.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 transformers==5.9.0
  transferqueue==0.1.11 uvicorn==0.55.0 nvtx==0.2.17 importlib_metadata==10.2.0 tokenizers==0.22.1"
SERVER_WHEELS=$(grep -v '^#' "$(dirname "$0")/verl_server_wheels.txt" | tr '\n' ' ')
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
rm -rf "$OUTD" && mkdir -p "$OUTD/c1/vsite" "$OUTD/c1/site" "$OUTD/c2" "$OUTD/c3/vwheels" "$OUTD/c5"
python3 -m pip download -q --no-deps --only-binary=:all: $PLAT -d "$T/dl" $VERL_WHEELS
python3 -m pip wheel -q --no-deps -w "$T/dl" antlr4-python3-runtime==4.9.3   # pure Python, sdist only
python3 -m pip download -q --no-deps --only-binary=:all: $PLAT -d "$OUTD/c5" $SERVER_WHEELS
python3 - "$SHARED" "$T/dl" <<'EOF'   # ray without its Java jar and dashboard web build (neither runs here)
import glob, sys
sys.path.insert(0, sys.argv[1])
import trim_wheel
trim_wheel.REMOVE = ("ray/jars/", "ray/dashboard/client/build/")
src = glob.glob(sys.argv[2] + "/ray-*.whl")[0]
sys.argv = ["trim_wheel.py", src, sys.argv[2] + "/trimmed"]
trim_wheel.main()
EOF
mv "$T"/dl/trimmed/ray-*.whl "$T"/dl/ && rmdir "$T/dl/trimmed"
mv "$T"/dl/*.whl "$OUTD/c1/vsite/"
for f in pydantic- pydantic_core- annotated_types- typing_inspection- tensordict-0.15 pyvers- msgspec- pyzmq-; do
  cp .vllmcarry/part2/wheels/$f*.whl "$OUTD/c1/site/" 2>/dev/null || true  # flowrl's (and vllm's) first wheels
done
cat .vllmcarry/part1/$W.part0 .vllmcarry/part2/$W.part1 > "$T/$W"
split -b 50M -d -a 2 "$T/$W" "$T/v."
mv "$T/v.00" "$OUTD/c2/vllm.00" && mv "$T/v.01" "$OUTD/c3/vllm.01"
for f in .vllmcarry/part2/wheels/*.whl; do
  [ -e "$OUTD/c1/site/$(basename "$f")" ] || cp "$f" "$OUTD/c3/vwheels/"
done
(cd "$T" && sha256sum "$W") > "$OUTD/c3/SHA256SUMS"
# bench: the chain and the scripts it lays over the device's copy of the project (verl_chain.sh's header)
B=$(dirname "$0")
mkdir -p "$OUTD/bench" && cp "$B"/{verl_chain.sh,grpo_vs_verl.py,verl_system.py,verl_reward.py,bench_report.py,real_model_verl.py} \
  "$B"/verl_preflight*.py "$OUTD/bench/"
du -sh "$OUTD"/c* "$OUTD/bench"
