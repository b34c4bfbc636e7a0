#!/bin/bash
# Packs what benchmarks/device_chain.sh needs on the device into .dc/d1 and .dc/d2 (each under ~46 MiB, so a
# call's transfer with the working tree and .benchtree stays under 64 MiB): the wheels flowrl and TRL need beyond
# the image (.realcarry/part1/wheels) and vllm 0.26.0's trimmed wheel with its own wheels (.vllmcarry,
# ../shared/device/vllm/make.sh), the wheel cut as one byte stream:
#   d1: wheels + vllm.00 (the wheel's first 40 MiB)   d2: vllm.01 (the rest) + vllm's other wheels + SHA256SUMS
# Run from the project root, with /.dc/ in .git/info/exclude.
set -euo pipefail
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cat .vllmcarry/part1/$W.part0 .vllmcarry/part2/$W.part1 > "$T/$W"
rm -rf .dc && mkdir -p .dc/d1 .dc/d2/vwheels
cp -r .realcarry/part1/wheels .dc/d1/
split -b 40M -d -a 2 "$T/$W" "$T/v."   # v.00 (40 MiB), v.01 (the rest)
mv "$T/v.00" .dc/d1/vllm.00
mv "$T/v.01" .dc/d2/vllm.01
have=$(ls .realcarry/part1/wheels | sed 's/-[0-9].*//')
for f in .vllmcarry/part2/wheels/*.whl; do  # the wheels d1 already brings stay out
  echo "$have" | grep -qx "$(basename "$f" | sed 's/-[0-9].*//')" || cp "$f" .dc/d2/vwheels/
done
(cd "$T" && sha256sum "$W") > .dc/d2/SHA256SUMS
du -sh .dc/d*
