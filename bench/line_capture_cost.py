"""Instructions one capture of a source line takes (the walk of the Python
stack that names where an op was called from: for findings, and for the
forward ops whose backward ops overflowed), counted by callgrind over the
captures of tests/integration/scripts/oscillating_scaler.py with 12 hidden
layers under nanhunt: its GradScaler overflows in backward at most steps,
so that every autocast cast captures its line from step 1 on. Needs
valgrind; about 4 minutes."""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_cpu_bench import LIB, ROOT  # noqa: E402

CAPTURE = "nanhunt::CaptureSourceLocation*"


def calls_to(dump, function_id):
    """Calls to the function callgrind numbered `function_id` ("(12)")."""
    calls, inside = 0, False
    for line in dump.splitlines():
        if line.startswith("cfn="):
            inside = line.startswith(f"cfn={function_id}")
        elif inside and line.startswith("calls="):
            calls += int(line.split("=")[1].split()[0])
            inside = False
    return calls


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--lib", default=str(LIB), help="the preload library to count")
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANHUNT_")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env.update(LD_PRELOAD=args.lib, NANHUNT_OUT=str(Path(tmp) / "trace"), NANHUNT_QUIET="1",
                   NANHUNT_EXIT_SUMMARY="0", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        subprocess.run(["valgrind", "--tool=callgrind", f"--toggle-collect={CAPTURE}",
                        f"--callgrind-out-file={out}", sys.executable,
                        str(ROOT / "tests" / "integration" / "scripts" / "oscillating_scaler.py"),
                        str(args.layers)],
                       env=env, check=True, capture_output=True)
        dump = out.read_text(errors="replace")
    total = int(re.search(r"^summary: (\d+)", dump, re.M).group(1))
    function_id = re.search(r"^cfn=(\(\d+\)) nanhunt::CaptureSourceLocation", dump, re.M).group(1)
    captures = calls_to(dump, function_id)
    print(f"line captures: {captures} over 20 steps, {args.layers} hidden layers, "
          f"{total / captures:,.0f} instructions a capture (callgrind)")


if __name__ == "__main__":
    main()
