"""Host instructions a GPU op costs under nanhunt, on a machine without a
GPU: tests/cpp/host_gpu_ops.cc's small GPU adds (CUDA tensors over host
memory, shown to the callbacks as torch's dispatcher shows an op) under
callgrind, plain and monitored in one invocation, with
tests/cpp/host_gpu_library.cc standing in for libnanhunt_cuda.so.

What it counts is the plugin's side of a GPU op: the callbacks, the op's
description for its late result, the enqueue path up to the library's
entry point, and, on the drain thread, the judging of the result. What it
cannot count is the real library's part (ring slot, kernel launch, event:
cupti/, timed by scripts/gpu-check.sh on a GPU); the stand-in does a CPU
check of 4 values and a queue push instead. Each figure is the difference
of a run of N2 ops and one of N1, per op, so start-up and exit cancel.
Needs valgrind; about a minute.

`--wall` times the same loop instead, every thread running (about a
minute): the op thread's wall time an op, contention with the drain
thread included, and the process's voluntary context switches."""
import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
PROGRAM = BUILD / "tests" / "host_gpu_ops"
# libnanhunt.so where its plugin finds the stand-in as libnanhunt_cuda.so
# (made by the build: tests/CMakeLists.txt).
STAND_IN_PRELOAD = BUILD / "host-gpu" / "lib" / "libnanhunt.so"

MODES = {
    "plain": {},
    "nanhunt": {},
    "nanhunt-batch": {"NANHUNT_GPU_BATCH": "32"},
}


def thread_totals(out):
    """Instructions per thread of a --separate-threads run: the main
    thread's (file -01), and all the others' together."""
    main, others = 0, 0
    for f in Path(out).parent.glob(Path(out).name + "*"):
        m = re.search(r"-(\d+)$", f.name)
        if not m:
            continue  # the empty file named as asked; threads have -01, -02...
        total = next(int(line.split()[1]) for line in f.read_text().splitlines()
                     if line.startswith("summary:") or line.startswith("totals:"))
        if int(m.group(1)) == 1:
            main += total
        else:
            others += total
    return main, others


def environment(mode, out, preload=STAND_IN_PRELOAD):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANHUNT_") and k != "LD_PRELOAD"}
    env["OMP_NUM_THREADS"] = "1"
    # Results 64 checks behind, as from a GPU behind the host: the drain
    # thread judges every op, as it does on a GPU.
    env["HOST_GPU_LAG"] = "64"
    # The drain thread wakes, delivers what is there, and sleeps 200 us, as
    # the real ring's does (core/check_ring.cc): an enqueue wakes nobody.
    env["HOST_GPU_POLL_US"] = "200"
    if mode != "plain":
        env.update(LD_PRELOAD=str(preload), NANHUNT_OUT=str(out),
                   NANHUNT_EXIT_SUMMARY="0", NANHUNT_QUIET="1", **MODES[mode])
    return env


def run(mode, n, tmp):
    env = environment(mode, tmp / f"out-{mode}-{n}")
    out = tmp / f"{mode}-{n}" / "callgrind.out"
    out.parent.mkdir()
    # --fair-sched: valgrind runs one thread at a time, and by default a
    # thread that never blocks (this loop) keeps the CPU for most of the
    # run: no LateOp came back to the pool while it ran (core/late_op_pool.h:
    # all 12,000 were new), and every op paid a malloc that a process whose
    # drain thread keeps up does not.
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", "--fair-sched=yes",
                    f"--callgrind-out-file={out}", str(PROGRAM), "loop", str(n)],
                   env=env, capture_output=True, text=True, check=True)
    return thread_totals(out)


def wall_run(mode, n, tmp, round_, preload=STAND_IN_PRELOAD):
    """The loop's own wall time (the program times it) and the voluntary
    context switches of the whole run: a thread that blocked on a lock
    another held (the drain thread's, malloc's) switched out."""
    env = environment(mode, tmp / f"wall-{mode}-{round_}", preload)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([str(PROGRAM), "loop", str(n)], env=env, capture_output=True,
                       text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = float(re.search(r"looped \d+ in ([0-9.]+) s", r.stdout).group(1))
    return seconds, after.ru_nvcsw - before.ru_nvcsw


def wall(args):
    """Wall time an op on the training thread, every mode run in turn
    `--rounds` times (medians): what the callbacks cost with the drain
    thread judging results beside them, contention included, which
    callgrind (one thread at a time) cannot show."""
    results = {mode: [] for mode in MODES}
    # Another build's libnanhunt.so (its host-gpu/lib), in the same rounds.
    other = {f"{mode}@other": mode for mode in MODES if mode != "plain"} if args.other else {}
    results.update({name: [] for name in other})
    with tempfile.TemporaryDirectory() as t:
        for round_ in range(args.rounds):
            for mode in MODES:
                results[mode].append(wall_run(mode, args.wall_ops, Path(t), round_))
            for name, mode in other.items():
                results[name].append(wall_run(mode, args.wall_ops, Path(t), round_,
                                              Path(args.other) / "libnanhunt.so"))
    plain = statistics.median(s for s, _ in results["plain"]) / args.wall_ops * 1e6
    print(f"wall time a small GPU op costs, {args.wall_ops} ops a run, median of "
          f"{args.rounds} rounds, modes in turn; stand-in GPU library (no CUDA calls), "
          f"{os.cpu_count()} CPUs")
    print(f"{'mode':<20} {'us an op':>9} {'extra':>7} {'x plain':>8} {'switches/1000 ops':>18}")
    for mode, runs in results.items():
        us = statistics.median(s for s, _ in runs) / args.wall_ops * 1e6
        switches = statistics.median(c for _, c in runs) / args.wall_ops * 1000
        extra = "" if mode == "plain" else f"+{us - plain:.2f}"
        print(f"{mode:<20} {us:>9.2f} {extra:>7} {us / plain:>7.2f}x {switches:>18.1f}")
    print("switches: voluntary context switches of the whole process (a thread that "
          "waited for a lock, or slept)" +
          (f"; @other: the build in {args.other}" if args.other else ""))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--short", type=int, default=2000, help="ops in the shorter run (N1)")
    p.add_argument("--long", type=int, default=12000, help="ops in the longer run (N2)")
    p.add_argument("--wall", action="store_true",
                   help="time the ops instead (no valgrind): wall time an op, all threads running")
    p.add_argument("--wall-ops", type=int, default=300000, help="ops a --wall run")
    p.add_argument("--rounds", type=int, default=5, help="--wall runs of each mode")
    p.add_argument("--other", metavar="DIR",
                   help="with --wall: also run the monitored modes with DIR/libnanhunt.so, "
                        "another build's host-gpu/lib (the commit before, say), in the same rounds")
    args = p.parse_args()
    if args.wall:
        if not PROGRAM.exists() or not STAND_IN_PRELOAD.exists():
            sys.exit("gpu_op_cost: the host GPU programs are missing: run scripts/build.sh")
        wall(args)
        return
    if shutil.which("valgrind") is None:
        sys.exit("gpu_op_cost: valgrind not found (Debian package valgrind)")
    for f in (PROGRAM, STAND_IN_PRELOAD):
        if not f.exists():
            sys.exit(f"gpu_op_cost: {f} is missing: run scripts/build.sh")
    with tempfile.TemporaryDirectory() as t, ThreadPoolExecutor(2) as pool:
        tmp = Path(t)
        jobs = {(mode, n): pool.submit(run, mode, n, tmp)
                for mode in MODES for n in (args.short, args.long)}
        per_op = {}
        for mode in MODES:
            (m1, o1), (m2, o2) = (jobs[(mode, n)].result() for n in (args.short, args.long))
            span = args.long - args.short
            per_op[mode] = ((m2 - m1) / span, (o2 - o1) / span)
    plain = per_op["plain"][0]
    print(f"host instructions a small GPU op (torch.add of 4 fp16 values) costs, callgrind, "
          f"runs of {args.long} minus {args.short} ops; stand-in GPU library (no CUDA calls)")
    print(f"{'mode':<16} {'op thread':>10} {'extra':>8} {'other threads':>14}")
    for mode, (op_thread, others) in per_op.items():
        extra = "" if mode == "plain" else f"+{op_thread - plain:.0f}"
        print(f"{mode:<16} {op_thread:>10.0f} {extra:>8} {others:>14.0f}")
    print("op thread: the training thread's instructions an op (plain: the op computed on the "
          "CPU); other threads: nanhunt's drain thread judging results, the trace writer")


if __name__ == "__main__":
    main()
