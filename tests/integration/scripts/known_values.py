# Computes values whose largest magnitude Python knows, and prints them, so
# a test can compare them with what the trace recorded for each op.
import json

import torch

torch.manual_seed(0)
big = torch.randn(512, 1024)          # large: scanned in parallel chunks
lin = torch.nn.Linear(1024, 256)
out = lin(big)                         # addmm inside linear
scaled = out.mul(30000.0)              # a plain op; past 65504 at the top
mul_max = scaled.abs().max().item()
scaled.add_(5.0)                       # in place
half = scaled.half()                   # a cast to fp16: overflows
print(json.dumps({
    "aten::randn": big.abs().max().item(),
    "aten::addmm": out.abs().max().item(),
    "aten::mul": mul_max,
    "aten::add_": scaled.abs().max().item(),
    "aten::_to_copy": half.float().abs().max().item(),
}))
