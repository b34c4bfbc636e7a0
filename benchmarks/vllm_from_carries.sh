#!/bin/bash
# vLLM 0.26 into /tmp/site from verl_carry.sh's carries, once per machine: the wheel's first half that
# verl_chain.sh's stage B copied to /tmp/vc/vllm.00, its second half and checksum (.verlcarry/c3), the wheels it
# needs beyond flowrl's (c3/vwheels) and the server path's (c5). Run from the project root. Exit 0 where it is
# installed already or now, 3 where the first half is not on this machine, 4 where the checksum or the install fails.
# Used by verl_chain.sh (install_vllm) and planner_gpu_device.sh.
set -u
W=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
ROOT=$(pwd)
[ -d /tmp/site/vllm ] && exit 0
test -f /tmp/vc/vllm.00 || exit 3
cat /tmp/vc/vllm.00 "$ROOT/.verlcarry/c3/vllm.01" >"/tmp/vc/$W" && (cd /tmp/vc && sha256sum -c --quiet \
  "$ROOT/.verlcarry/c3/SHA256SUMS") && python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/site "/tmp/vc/$W" "$ROOT"/.verlcarry/c3/vwheels/*.whl "$ROOT"/.verlcarry/c5/*.whl || exit 4
