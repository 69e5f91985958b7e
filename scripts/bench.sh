#!/usr/bin/env bash
# Benchmark: a small transformer trained on the CPU three ways in one
# invocation (plain, under nanhunt with every op checked, and with
# autograd's anomaly detection), printing step-time ratios against plain.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
scripts/build.sh >/dev/null
.venv/bin/python bench/run_cpu_bench.py "$@"
