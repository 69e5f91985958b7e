#!/usr/bin/env bash
# Installs everything nanhunt needs to build and test, idempotently:
# Debian packages (compiler, abseil, SQLite, GoogleTest, Chart.js, Chromium,
# valgrind for bench/cpu_instructions.py)
# and a Python virtual environment (.venv) with the pinned torch.
# Re-running it does nothing when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(cmake g++ make pkg-config libabsl-dev libsqlite3-dev sqlite3
              libgtest-dev python3-venv libjs-chart.js chromium valgrind)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${VENV_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi
# Reuse what is installed: pip is only asked when a pin is not satisfied.
if ! .venv/bin/python - <<'PY' 2>/dev/null
import importlib.metadata as md, re, sys
for line in open("requirements.txt"):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = re.split(r"==", line)
    if md.version(name) != version:
        sys.exit(1)
PY
then
  # torch with its CUDA libraries takes about 5.5 GB installed and about as
  # much again while pip unpacks it: say so before pip fails half-way.
  need_gb=12
  free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  tmp_free_gb=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt "$need_gb" ] || [ "$tmp_free_gb" -lt "$need_gb" ]; then
    echo "setup: warning: $free_gb GB free here and $tmp_free_gb GB in ${TMPDIR:-/tmp};" \
         "installing torch needs about $need_gb GB" >&2
  fi
  echo "setup: installing Python requirements (torch is large: a few minutes)"
  # --no-cache-dir: a copy of every wheel in ~/.cache would double the space.
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check -r requirements.txt
fi
echo "setup: ready (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
