"""scripts/gpu-check.sh runs only on a lent GPU, a few minutes of device
time a task when there is one at all: a script that breaks there loses
the lease. Here it runs without a GPU (GPU_CHECK_WITHOUT_GPU=1: no CUDA
device asked for, kernels built for sm_90). It must build, run every part,
note each part that needs a GPU as failed, pass the parts that need none,
and reach its summary with no error of its own (an unset variable, a
missing command, a bad option: `tail -5` over several logs once ended it
there, before the GPT-2 benchmark)."""
import re
import shutil
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, clean_env, run

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
# Each needs a GPU: without one it fails, and is named in the summary.
NEEDS_A_GPU = [
    "kernel benchmark", "demo on CUDA", "raise on CUDA", "finfo.min masks on CUDA",
    "Adam foreach on CUDA", "own loss scaler on CUDA", "several optimizers on CUDA",
    "padded attention on CUDA", "evaluation on CUDA", "given-up iterations on CUDA",
    "streams and devices", "CUDA graph capture", "held-back checks", "batch replay",
    "GPT-2 benchmark"]
# These need none (the GPU tests skip without a device).
NEEDS_NONE = ["GPU tests", "GPU library tests", "CUPTI tests", "unit tests", "mutex cost",
              "ring cost", "torch_compat fallbacks", "empty callbacks' build"]


@pytest.mark.skipif(not Path(NVCC).exists(), reason="no CUDA toolkit: the script builds kernels")
def test_the_gpu_check_reaches_its_summary_without_a_gpu(tmp_path):
    env = clean_env(GPU_CHECK_WITHOUT_GPU="1", GPU_BUILD_DIR=tmp_path / "build",
                    NANHUNT_PYTHON=PYTHON)
    r = run(["bash", ROOT / "scripts" / "gpu-check.sh"], env=env, timeout=2400)
    output = r.stdout + r.stderr
    for broken in ("unbound variable", "command not found", "syntax error",
                   "option used in invalid context", "bad substitution"):
        assert broken not in output, output[-3000:]
    assert r.returncode == 1, output[-3000:]
    assert "== summary" in r.stdout, output[-3000:]
    summary = r.stdout.split("== summary", 1)[1]
    failed = set(re.findall(r"^FAILED: (.+)$", summary, re.M))
    assert set(NEEDS_A_GPU) <= failed, summary
    assert not failed & set(NEEDS_NONE), summary
    # What needs no GPU still brings its figures: the ring's cost here.
    assert re.search(r"^check ring \(ns a check.*ring, single checks", summary, re.M), summary
