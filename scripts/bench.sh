#!/usr/bin/env bash
# Benchmark: a small transformer trained on the CPU four ways in one
# invocation (plain, under nanhunt with every op checked, nanhunt's sample
# mode, and autograd's anomaly detection), printing step-time ratios
# against plain.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
scripts/build.sh >/dev/null
.venv/bin/python bench/run_cpu_bench.py "$@"
