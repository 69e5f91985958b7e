"""An RMSNorm written by hand, x * rsqrt(mean(x**2) + eps), over features
that grow from step 2 on (|x| past 256): fp16 squares them past 65504 into
inf, rsqrt(inf) is 0, and the layer zeroes those rows. No NaN, a finite
loss, wrong values: silent. Prints each step's loss and how many rows the
norm zeroed.

    rmsnorm_by_hand.py [autocast|half]

autocast: fp32 weights under fp16 autocast (NANHUNT_FP32_OPS=aten::pow
fixes it without code change); half: model.half(), no autocast."""
import sys

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "autocast"
torch.manual_seed(0)


class RMSNorm(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        self.normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.normed * self.weight


norm = RMSNorm(64)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), norm, torch.nn.Linear(64, 1))
if mode == "half":
    model = model.half()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
dtype = torch.float16 if mode == "half" else torch.float32
for step in range(5):
    x = (torch.randn(8, 16) * (400 if step >= 2 else 1)).to(dtype)
    with torch.autocast("cpu", dtype=torch.float16, enabled=mode == "autocast"):
        out = model(x)
    loss = out.float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    zeroed = int((norm.normed == 0).all(-1).sum())
    print(f"step {step} loss {loss.item():.6f} zeroed rows {zeroed}")
