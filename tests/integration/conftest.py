"""Shared helpers: every test runs real processes (Python + torch, or the
LibTorch test binary) under the real preload library, and reads the real
SQLite trace back through `nanhunt view --json`."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
NANHUNT = BUILD / "bin" / "nanhunt"
LIBNANHUNT = BUILD / "lib" / "libnanhunt.so"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
DEMO = ROOT / "demo" / "train.py"
PYTHON = sys.executable


# torch's fp16 kernels on the CPU round differently with each instruction
# set: where the CPU has fp16 arithmetic of its own (AVX512-FP16, Sapphire
# Rapids) the demo's scores overflow at step 22, elsewhere at step 26. The
# tests pin AVX2 (ATen's kernels and oneDNN's matmuls) so that every x86
# machine trains the same numbers, the ones the README quotes.
SAME_KERNELS_EVERYWHERE = (
    {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    if platform.machine() == "x86_64" else {})


def clean_env(**extra):
    """The environment without any NANHUNT_* or LD_PRELOAD of the caller,
    with the CPU's kernels pinned (SAME_KERNELS_EVERYWHERE)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANHUNT_") and k != "LD_PRELOAD"}
    env.update(SAME_KERNELS_EVERYWHERE)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env=None, timeout=300, **kw):
    return subprocess.run([str(c) for c in cmd], env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def nanhunt_run(cmd, out, env=None, timeout=300):
    """`nanhunt run --out OUT -- CMD...`"""
    return run([NANHUNT, "run", "--out", out, "--", *cmd], env=env,
               timeout=timeout)


def preload_run(cmd, out, timeout=300, **settings):
    """`LD_PRELOAD=libnanhunt.so CMD...` with NANHUNT_OUT=OUT."""
    env = clean_env(LD_PRELOAD=LIBNANHUNT, NANHUNT_OUT=out, **settings)
    return run(cmd, env=env, timeout=timeout)


def plain_and_monitored(cmd, out, **settings):
    """Runs CMD unmonitored, then under the preload, with the same SETTINGS
    in the environment: both succeed and print the same (bit-identical
    losses: do no harm). Returns (monitored, plain)."""
    plain = run(cmd, env=clean_env(**settings))
    monitored = preload_run(cmd, out, **settings)
    assert plain.returncode == 0 and monitored.returncode == 0, monitored.stderr
    assert monitored.stdout == plain.stdout, (monitored.stdout, plain.stdout)
    return monitored, plain


def compiled_runs(script, out, tmp_path):
    """plain_and_monitored for a torch.compile script, with one fresh
    inductor cache for both runs."""
    return plain_and_monitored([PYTHON, script], out,
                               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))


def preload_script(script, source, out, **settings):
    """Writes the Python program `source` to `script`, runs it under the
    preload (preload_run) and checks that it succeeded."""
    script.write_text(source)
    r = preload_run([PYTHON, script], out, **settings)
    assert r.returncode == 0, r.stderr
    return r


def view_json(*paths):
    r = run([NANHUNT, "view", "--json", *paths])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def origin_of_failing_run(cmd, out, printed):
    """Runs CMD under the preload: it succeeds and prints PRINTED (a NaN
    loss). Returns the view's first origin and diagnosis."""
    r = preload_run(cmd, out)
    assert r.returncode == 0 and printed in r.stdout, r.stdout + r.stderr
    j = view_json(out)
    return j["first_origin"], j["diagnosis"]


def findings(out, kind=None):
    """All findings of the traces in OUT, straight from SQLite."""
    import sqlite3
    rows = []
    for trace in sorted(Path(out).glob("*.sqlite")):
        db = sqlite3.connect(trace)
        db.row_factory = sqlite3.Row
        rows += [dict(r) for r in db.execute("SELECT * FROM findings ORDER BY id")]
        db.close()
    return [r for r in rows if kind is None or r["kind"] == kind]


@pytest.fixture
def out(tmp_path):
    return tmp_path / "nanhunt-out"
