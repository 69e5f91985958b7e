#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit tests (ctest), the
# torch-facing sources compiled against older torch releases, and the
# integration tests (pytest: real Python + torch and a real LibTorch program
# under the preload library).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
echo "== unit tests"
(cd build && ctest --output-on-failure -j2)
echo "== the torch-facing sources against older torch releases' headers"
.venv/bin/python scripts/torch_headers_check.py
echo "== integration tests"
.venv/bin/python -m pytest -q tests/integration "$@"
