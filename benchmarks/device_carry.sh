#!/bin/bash
# Packs what benchmarks/device_chain.sh needs on the device into .dc/c1 .. .dc/c4 (each under ~55 MiB, so a call's
# transfer with the working tree and .benchtree stays under 64 MiB): the wheels flowrl and TRL need beyond the
# image (.realcarry/part1/wheels), SmolLM2's GGUF file (.realcarry, benchmarks/real_model_carry.py) and vllm
# 0.26.0's trimmed wheel with its own wheels (.vllmcarry, ../shared/device/vllm/make.sh), cut as one byte stream:
#   c1: wheels + gguf.00 (48 MiB)   c2: gguf.01 + vllm.00   c3: vllm.01   c4: vllm.02 + vllm's other wheels
# Run from the project root, with /.dc/ in .git/info/exclude.
set -euo pipefail
G=SmolLM2-135M-Instruct.Q4_1.gguf
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cat .realcarry/part1/$G.part0 .realcarry/part2/$G.part1 > "$T/$G"
cat .vllmcarry/part1/$W.part0 .vllmcarry/part2/$W.part1 > "$T/$W"
rm -rf .dc && mkdir -p .dc/c1 .dc/c2 .dc/c3 .dc/c4/vwheels
cp -r .realcarry/part1/wheels .dc/c1/
split -b 48M -d -a 2 "$T/$G" .dc/c1/gguf.      # gguf.00 (48 MiB), gguf.01 (the rest)
mv .dc/c1/gguf.01 .dc/c2/
split -b 8M -d -a 2 "$T/$W" "$T/v."             # 8 MiB pieces: 00 to c2, 01-07 to c3, the rest to c4
cat "$T/v.00" > .dc/c2/vllm.00
cat "$T"/v.0[1-7] > .dc/c3/vllm.01
cat $(ls "$T"/v.* | sort | tail -n +9) > .dc/c4/vllm.02
have=$(ls .realcarry/part1/wheels | sed 's/-[0-9].*//')
for f in .vllmcarry/part2/wheels/*.whl; do  # the wheels c1 already brings stay out
  echo "$have" | grep -qx "$(basename "$f" | sed 's/-[0-9].*//')" || cp "$f" .dc/c4/vwheels/
done
(cd "$T" && sha256sum "$G" "$W") > .dc/c4/SHA256SUMS
cp .dc/c4/SHA256SUMS .dc/c2/
du -sh .dc/c*
