#!/usr/bin/env bash
# Run HERE (a Debian machine with apt): downloads the Debian packages the
# build needs (abseil, SQLite, GoogleTest) into .gpu-deps/, to carry to a GPU
# machine that cannot fetch anything. scripts/gpu-check.sh unpacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
cd .gpu-deps
apt-get download libabsl-dev libabsl20220623 libsqlite3-dev libsqlite3-0 \
  libgtest-dev googletest >/dev/null
ls -1 *.deb
