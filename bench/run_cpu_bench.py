"""Runs bench/cpu_transformer.py in each mode, interleaved over a few rounds
(so that drift of the machine hits every mode alike), and prints each mode's
step time and its ratio to the plain run of the same invocation."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "build" / "lib" / "libnanhunt.so"


def run_mode(mode, steps, out_dir):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANHUNT_") and k != "LD_PRELOAD"}
    if mode in ("nanhunt", "sample"):
        env.update(LD_PRELOAD=str(LIB), NANHUNT_OUT=out_dir,
                   NANHUNT_EXIT_SUMMARY="0", NANHUNT_QUIET="1")
    if mode == "sample":  # 1% of op calls and the gradients of every step
        env.update(NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01",
                   NANHUNT_SAMPLE_STEPS="0")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_transformer.py"),
                        "--mode", mode, "--steps", str(steps)],
                       env=env, capture_output=True, text=True, check=True)
    return float(r.stdout.split()[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    modes = ["plain", "nanhunt", "sample", "anomaly"]
    times = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as out_dir:
        for _ in range(args.rounds):
            for m in modes:
                times[m].append(run_mode(m, args.steps, out_dir))
    # Median of the rounds: step times on a shared 2-core machine swing by
    # a third between runs of the same mode, and the middle round is the
    # fairest comparison (the best round rewards one lucky plain run).
    best = {m: statistics.median(t) for m, t in times.items()}
    print(f"small transformer, CPU, {args.steps} steps x {args.rounds} rounds, "
          f"modes interleaved (median step of each run, median run)")
    print(f"{'mode':<28}{'step ms':>10}{'vs plain':>10}")
    labels = {"plain": "plain", "nanhunt": "nanhunt (every op checked)",
              "sample": "nanhunt sample (1% of ops)",
              "anomaly": "set_detect_anomaly(True)"}
    for m in modes:
        print(f"{labels[m]:<28}{best[m]:>10.1f}{best[m] / best['plain']:>9.2f}x")


if __name__ == "__main__":
    main()
