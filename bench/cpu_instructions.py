"""Counts the instructions one training step of bench/cpu_transformer.py
executes, plain and in nanhunt's sample mode (every op checked on request),
under valgrind's cachegrind.

Step times on a shared 2-core machine swing by a fifth between runs (see
run_cpu_bench.py), which hides an overhead of a few percent; an instruction
count repeats run after run. It is not a time (a cache miss costs more than
an add), but nanhunt's sample-mode overhead is bookkeeping on the CPU, not
memory traffic, so its share of the instructions is a fair, repeatable
reading of its share of the time.

A step's count is the difference between a long and a short run of the same
mode divided by their difference in steps, so that importing torch, the
warm-up steps and the process's start and end cancel out."""
import argparse
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_cpu_bench import run_mode  # noqa: E402

# One OpenMP thread: idle OpenMP workers spin for a while before they sleep,
# and how long they spin depends on timing, not on the work.
DETERMINISTIC_ENV = {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def total_instructions(mode, steps, warmup, out_dir):
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "cachegrind.out"
        run_mode(mode, steps, out_dir, DETERMINISTIC_ENV, ["--warmup", str(warmup)],
                 prefix=["valgrind", "--tool=cachegrind", "--cache-sim=no",
                         f"--cachegrind-out-file={counts}"])
        for line in counts.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"cachegrind wrote no summary for mode {mode}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--short", type=int, default=2, help="steps timed in the short run")
    p.add_argument("--long", type=int, default=8, help="steps timed in the long run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="plain,sample",
                   help="of plain, sample, nanhunt (every op checked: slowest under valgrind)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="valgrind runs side by side")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("cpu_instructions: valgrind not found (Debian package valgrind)")
    if args.long <= args.short:
        sys.exit(f"cpu_instructions: --long ({args.long}) must be more than --short ({args.short})")
    labels = {"plain": "plain", "nanhunt": "nanhunt (every op checked)",
              "sample": "nanhunt sample (1% of ops)"}
    modes = args.modes.split(",")
    for m in modes:
        if m not in labels:
            sys.exit(f"cpu_instructions: --modes: unknown mode '{m}' "
                     f"(allowed: {', '.join(labels)})")
    runs = [(m, steps) for m in modes for steps in (args.short, args.long)]
    with tempfile.TemporaryDirectory() as out, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        # Counts do not depend on what else runs: the runs go side by side.
        totals = dict(zip(runs, pool.map(
            lambda run: total_instructions(run[0], run[1], args.warmup, out), runs)))
    per_step = {m: (totals[m, args.long] - totals[m, args.short]) / (args.long - args.short)
                for m in modes}
    print(f"small transformer, CPU, instructions a step under cachegrind "
          f"(runs of {args.warmup}+{args.short} and {args.warmup}+{args.long} steps, "
          f"one OpenMP thread)")
    print(f"{'mode':<28}{'Minstr/step':>12}{'vs plain':>10}")
    base = per_step.get("plain")
    for m in modes:
        ratio = f"{per_step[m] / base:>9.3f}x" if base else ""
        print(f"{labels[m]:<28}{per_step[m] / 1e6:>12.1f}{ratio}")


if __name__ == "__main__":
    main()
