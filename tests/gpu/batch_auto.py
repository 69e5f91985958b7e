"""Run by scripts/gpu-check.sh under nanhunt with NANHUNT_GPU_BATCH=auto:
checks are held back for batches until the process loads a library that
launches CUDA kernels of its own (here build/tests/foreign's probe, linked
against the CUDA runtime, as an extension is); from then on they go op by
op. The checker reads the trace: batches before, the probe named in
`gpu_batch_stopped`, and as many checks as ops' outputs."""
import ctypes
import sys

import torch

x = torch.ones(1024, 1024, device="cuda", dtype=torch.float16)
for _ in range(100):  # several batches' worth of outputs
    x = (x * 1.0001).relu()
ctypes.CDLL(sys.argv[1])  # an extension with kernels of its own
for _ in range(100):
    x = (x * 1.0001).relu()
torch.cuda.synchronize()
print("done")
