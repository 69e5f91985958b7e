"""How long the viewer takes on a long run's trace: a demo trace grown to a
million op_stats rows (bench/big_trace.py), then `nanhunt view`, `view
--json` and `report` on it, best of 3 each. Run from the repository root:
.venv/bin/python bench/viewer_bench.py"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NANHUNT = ROOT / "build" / "bin" / "nanhunt"

with tempfile.TemporaryDirectory() as work:
    work = Path(work)
    env = dict(os.environ, LD_PRELOAD=str(ROOT / "build/lib/libnanhunt.so"),
               NANHUNT_OUT=str(work / "run"), NANHUNT_QUIET="1", NANHUNT_EXIT_SUMMARY="0")
    subprocess.run([sys.executable, ROOT / "demo/train.py"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    [trace] = (work / "run").glob("*.sqlite")
    subprocess.run([sys.executable, ROOT / "bench/big_trace.py", trace, work / "big.sqlite",
                    "1000000"], check=True)
    print(f"viewer on a 1,000,000-row trace ({os.cpu_count()} cores), best of 3")
    for name, args in [("nanhunt view", ["view"]), ("nanhunt view --json", ["view", "--json"]),
                       ("nanhunt report", ["report", "-o", str(work / "r.html")])]:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([NANHUNT, *args, work / "big.sqlite"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            best = min(best, time.perf_counter() - t0)
        print(f"{name:28s} {best:8.2f} s")
