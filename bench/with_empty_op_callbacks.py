"""Runs a Python script with torch's per-op callbacks on and empty: imports
torch, loads build/lib/libempty_op_callbacks.so (bench/empty_op_callbacks.cc:
one global RecordFunction callback that asks for every op's inputs and
outputs, as nanhunt's does, and does nothing), then runs the script as
__main__ with the arguments after it. At exit it prints `op_callbacks N`
on stdout: the records the callback saw (0: it was never called). Knows
nothing of nanhunt.

  .venv/bin/python bench/with_empty_op_callbacks.py build/lib/libempty_op_callbacks.so \\
      bench/gpt2_step.py --device cpu --tiny
"""
import atexit
import ctypes
import runpy
import sys
from pathlib import Path

import torch  # noqa: F401  (the library's callback needs torch's loaded)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: with_empty_op_callbacks.py LIBRARY SCRIPT [ARGS...]")
    library = ctypes.CDLL(sys.argv[1])
    library.empty_op_callbacks_calls.restype = ctypes.c_uint64
    atexit.register(lambda: print(f"op_callbacks {library.empty_op_callbacks_calls()}",
                                  flush=True))
    script = sys.argv[2]
    sys.argv = sys.argv[2:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
