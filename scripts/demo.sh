#!/usr/bin/env bash
# The main job: an unmodified fp16 training script (demo/train.py, a
# ranking model whose custom attention scales after q @ k^T) goes NaN;
# nanhunt, injected with zero code change, names the op where it began and
# shows the warnings that came before.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
out=${DEMO_OUT:-nanhunt-out/demo}
rm -rf "$out"
echo
echo "== python demo/train.py, under nanhunt (the script is not changed)"
echo
build/bin/nanhunt run --out "$out" -- .venv/bin/python demo/train.py
echo
echo "== the same, as a report for the browser"
build/bin/nanhunt report -o "$out/report.html" "$out"
