#!/usr/bin/env bash
# The main job: an unmodified fp16 training script (demo/train.py, a
# ranking model whose custom attention scales after q @ k^T) goes NaN;
# nanhunt, injected with zero code change, names the op where it began and
# shows the warnings that came before.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
# torch's fp16 kernels on the CPU round differently with each instruction
# set (a CPU with fp16 arithmetic of its own, AVX512-FP16, overflows at step
# 22 instead of 26): pinned to AVX2, so that the run is the README's on
# every x86 machine, as in the tests (tests/integration/conftest.py).
if [[ $(uname -m) == x86_64 ]]; then
  export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2}
fi
out=${DEMO_OUT:-nanhunt-out/demo}
rm -rf "$out"
echo
echo "== python demo/train.py, under nanhunt (the script is not changed)"
echo
build/bin/nanhunt run --out "$out" -- .venv/bin/python demo/train.py
echo
echo "== the same, as a report for the browser"
build/bin/nanhunt report -o "$out/report.html" "$out"
