"""Instructions one op call takes, plain and under nanhunt checking every op
(every-op mode, the default), for a few kinds of op (bench/op_calls.py), in
one invocation; with the part spent in nanhunt's own callbacks.

Most ops of a monitored GPU training step are ones nanhunt checks nowhere
(views, composites) or whose check runs on the GPU, yet each pays the
plugin's callbacks and torch's RecordFunction with boxed arguments on the
host: this is the cost that is the same on a CPU and on a GPU machine, and
it repeats where timings on a shared machine do not. An instruction count
is not a time, but the work counted here is bookkeeping, not memory
traffic. Needs valgrind (scripts/setup.sh installs it); about 3 minutes."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_calls import KINDS  # noqa: E402
from run_cpu_bench import LIB, ROOT  # noqa: E402

CALLBACKS = ("OnStart(at::RecordFunction const&)",
             "OnEnd(at::RecordFunction const&, at::ObserverContext*)")


# torch's per-op callbacks asking for inputs and outputs, doing nothing
# (bench/empty_op_callbacks.cc): torch's part of what nanhunt adds.
EMPTY_CALLBACKS = ROOT / "build" / "lib" / "libempty_op_callbacks.so"


def run(mode, kinds, calls, tmp):
    """Per kind, the measured loop's instructions (callgrind dump files) and,
    under nanhunt, those of its callbacks inside it. Modes: plain, empty
    (torch's callbacks, empty), nanhunt."""
    monitored = mode == "nanhunt"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANHUNT_") and k != "LD_PRELOAD"}
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    if monitored:
        env.update(LD_PRELOAD=str(LIB), NANHUNT_OUT=str(tmp / "out"),
                   NANHUNT_EXIT_SUMMARY="0", NANHUNT_QUIET="1")
    out = tmp / mode / "callgrind.out"
    out.parent.mkdir(parents=True)
    program = [str(ROOT / "bench" / "op_calls.py"), "--calls", str(calls),
               "--kinds", ",".join(kinds)]
    if mode == "empty":
        program[:0] = [str(ROOT / "bench" / "with_empty_op_callbacks.py"), str(EMPTY_CALLBACKS)]
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=time_sleep", "--compress-strings=no",
                    f"--callgrind-out-file={out}", sys.executable, *program],
                   env=env, capture_output=True, text=True, check=True)
    results = {}
    for i, kind in enumerate(kinds):
        # Dump 1: start-up and the first warm-up; then each kind's measured
        # loop, and the next kind's warm-up.
        dump = Path(f"{out}.{2 * i + 2}")
        total = next(int(line.split()[1]) for line in dump.read_text().splitlines()
                     if line.startswith("summary:"))
        callbacks = 0
        if monitored:
            listing = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no",
                                      "--threshold=100", str(dump)],
                                     capture_output=True, text=True, check=True).stdout
            for name in CALLBACKS:
                counts = [int(m.group(1).replace(",", "")) for m in
                          re.finditer(r"^\s*([\d,]+) .*" + re.escape(name), listing, re.M)]
                callbacks += max(counts, default=0)
        results[kind] = (total / calls, callbacks / calls)
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--kinds", default=",".join(KINDS))
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("op_cost: valgrind not found (Debian package valgrind)")
    if not EMPTY_CALLBACKS.exists():
        sys.exit(f"op_cost: {EMPTY_CALLBACKS} is missing: run scripts/build.sh")
    kinds = args.kinds.split(",")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        plain, empty, monitored = pool.map(lambda m: run(m, kinds, args.calls, Path(tmp)),
                                           ("plain", "empty", "nanhunt"))
    print(f"instructions an op call (callgrind, one thread, {args.calls} calls of each kind "
          f"after 500 to warm up; plain, torch's callbacks empty, and every op checked, "
          f"same invocation)")
    print(f"{'op':<16} {'plain':>8} {'nanhunt':>8} {'extra':>8} {'ratio':>6} {'torch':>7} "
          f"{'callbacks':>9}  what it stands for")
    for kind in kinds:
        base, (mon, cb) = plain[kind][0], monitored[kind]
        torch_part = empty[kind][0] - base
        print(f"{kind:<16} {base:>8.0f} {mon:>8.0f} {mon - base:>+8.0f} {mon / base:>5.2f}x "
              f"{torch_part:>+7.0f} {cb:>9.0f}  {KINDS[kind]}")
    print("torch: the same calls with torch's callbacks on and empty, less plain (RecordFunction, "
          "inputs and outputs boxed: bench/empty_op_callbacks.cc); callbacks: nanhunt's OnStart "
          "and OnEnd (inclusive); what neither holds is nanhunt's effect on torch's own work "
          "(a reference it keeps moves a release)")


if __name__ == "__main__":
    main()
