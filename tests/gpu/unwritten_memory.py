"""Run by scripts/gpu-check.sh under nanhunt: GPU memory that no op nanhunt
sees writes values into, read by an op that did not make its inf/NaN.

  extension  torch.empty's memory filled by cudaMemset, as a CUDA
             extension's kernel fills its output: all bytes 0xff, NaN in
             fp16. The matmul that first reads it must be named with that
             NaN as its input ("input"), not as its origin.
  compiled   a torch.compile region whose fused (Triton) kernel overflows
             fp16 (100 x 1000 > 65504): the eager matmul after it reads the
             inf first, and the finding is "compiled", naming the region.

Prints one line saying what ran; nanhunt's trace says the rest."""
import ctypes
import sys

import torch

what = sys.argv[1] if len(sys.argv) > 1 else "extension"
w = torch.ones(64, 64, device="cuda", dtype=torch.float16)
if what == "extension":
    x = torch.empty(64, 64, device="cuda", dtype=torch.float16)
    cudart = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
    cudart.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    torch.cuda.synchronize()
    assert cudart.cudaMemset(x.data_ptr(), 0xFF, x.numel() * x.element_size()) == 0
    torch.cuda.synchronize()
else:
    @torch.compile
    def scale(a):
        return a * 1000.0

    x = scale(torch.full((64, 64), 100.0, device="cuda", dtype=torch.float16))
y = x @ w
torch.cuda.synchronize()
print(what, "read:", y.isfinite().all().item())
