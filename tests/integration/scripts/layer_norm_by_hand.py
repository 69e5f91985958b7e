"""A layer norm written by hand, (h - mean) * rsqrt(var + eps) with var =
E[h^2] - E[h]^2, over raw readings whose offset (3000) dwarfs their spread
(0.01): E[h^2] and E[h]^2 are 9e6 each, and fp32's rounding there (0.5)
makes their difference negative in some rows, whose rsqrt is NaN though
the program added an eps.

    layer_norm_by_hand.py by-hand|var

var: the same with h.var(-1, unbiased=False), which subtracts the mean
first: healthy. Prints each step's loss."""
import sys

import torch
import torch.nn.functional as F

mode = sys.argv[1]
torch.manual_seed(0)
head = torch.nn.Linear(64, 3)
opt = torch.optim.SGD(head.parameters(), lr=1e-3)
for step in range(3):
    readings = 3000.0 + 0.01 * torch.randn(32, 64)
    mean = readings.mean(-1, keepdim=True)
    if mode == "var":
        var = readings.var(-1, unbiased=False, keepdim=True)
    else:
        var = (readings * readings).mean(-1, keepdim=True) - mean * mean
    normalized = (readings - mean) * torch.rsqrt(var + 1e-5)
    loss = F.cross_entropy(head(normalized), torch.randint(0, 3, (32,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
