#!/usr/bin/env bash
# Configures and builds nanhunt into build/ against the torch in .venv.
# Result: build/bin/nanhunt and build/lib/libnanhunt.so (+ the torch plugin).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${NANHUNT_PYTHON:-$PWD/.venv/bin/python}
# compile_commands.json: scripts/torch_headers_check.py compiles with its commands.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNANHUNT_PYTHON="$python" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build build -j"$(nproc)"
