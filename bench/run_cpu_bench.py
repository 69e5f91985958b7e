"""Runs bench/cpu_transformer.py in each mode, interleaved over a few rounds
(so that drift of the machine hits every mode alike), and prints each mode's
step time and its ratio to the plain run of the same invocation."""
import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "build" / "lib" / "libnanhunt.so"


def run_mode(mode, steps, out_dir, extra_env=(), args=(), prefix=()):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANHUNT_") and k != "LD_PRELOAD"}
    if mode in ("nanhunt", "sample"):
        env.update(LD_PRELOAD=str(LIB), NANHUNT_OUT=out_dir,
                   NANHUNT_EXIT_SUMMARY="0", NANHUNT_QUIET="1")
    if mode == "sample":  # 1% of op calls and the gradients of every step
        env.update(NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01",
                   NANHUNT_SAMPLE_STEPS="0")
    env.update(extra_env)
    r = subprocess.run([*prefix, sys.executable, str(ROOT / "bench" / "cpu_transformer.py"),
                        "--mode", mode, "--steps", str(steps), *args],
                       env=env, capture_output=True, text=True, check=True)
    return r.stdout.split()


def step_ms(mode, steps, out_dir):
    return float(run_mode(mode, steps, out_dir)[1])


def sample_mode_costs(steps):
    """Sample mode's costs measured inside one process, where the machine's
    drift between runs does not reach: the share of the step its checks took
    at 1% of op calls (NANHUNT_BUDGET's own accounting, read from the first
    sample_rate event), and the gradient check's time a step."""
    with tempfile.TemporaryDirectory() as out:
        run_mode("sample", steps, out, {"NANHUNT_BUDGET": "50%"})
        [trace] = Path(out).glob("*.sqlite")
        db = sqlite3.connect(trace)
        row = db.execute("SELECT detail FROM events WHERE kind = 'sample_rate' "
                         "ORDER BY rowid").fetchone()
        db.close()
        # Timed in a sample-mode process of its own (the budget above soon
        # raises the share of ops checked, and those checks would be timed).
        words = run_mode("sample", steps, out, args=["--time-gradient-check"])
    checks = float(row[0].split("checks took ")[1].split("%")[0]) if row else float("nan")
    return checks, float(words[words.index("gradient_check_ms") + 1])


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q[0], statistics.median(values), q[2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    modes = ["plain", "nanhunt", "sample", "anomaly"]
    times = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            # Each round starts with a different mode, so that no mode always
            # follows another (or always runs first, on a cold page cache).
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                times[m].append(step_ms(m, args.steps, out))
    # Step times on a shared 2-core machine swing by a fifth between runs of
    # the same mode, even in CPU time with one thread: the machine itself
    # changes speed. The median run of each mode is compared with plain's
    # (a ratio per round is noisier still: neighbouring runs do not share
    # the machine's state), and the middle half of each mode's runs is
    # printed so that the noise is seen next to the ratio.
    print(f"small transformer, CPU, {args.steps} steps x {args.rounds} rounds, "
          f"modes interleaved (median step of each run, median run, middle half of runs)")
    print(f"{'mode':<28}{'step ms':>10}{'vs plain':>10}   middle half (ms)")
    labels = {"plain": "plain", "nanhunt": "nanhunt (every op checked)",
              "sample": "nanhunt sample (1% of ops)",
              "anomaly": "set_detect_anomaly(True)"}
    plain = statistics.median(times["plain"])
    for m in modes:
        low, mid, high = quartiles(times[m])
        print(f"{labels[m]:<28}{mid:>10.1f}{mid / plain:>9.2f}x   {low:.1f}-{high:.1f}")
    checks, gradient_check = sample_mode_costs(args.steps)
    print(f"sample mode measured in one process: checks {checks:.2f}% of the step at 1% "
          f"of op calls; gradient check {gradient_check:.2f} ms a step "
          f"({100 * gradient_check / plain:.2f}% of plain's step)")


if __name__ == "__main__":
    main()
