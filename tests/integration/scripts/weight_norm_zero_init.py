"""A classifier head zero-initialised so that it starts at 0, as residual
nets do with their last layers, under weight normalisation, w = g * v /
|v|.

    weight_norm_zero_init.py zeroed-weight|zeroed-scale

zeroed-weight: the weight zeroed before weight_norm: v is all zeros, and
v / |v| is 0 / 0 = NaN from the first forward pass.
zeroed-scale: weight_norm applied to a random weight, then its scale g
zeroed: the layer starts at 0 and trains. Prints each step's loss."""
import sys

import torch
from torch.nn.utils.parametrizations import weight_norm

mode = sys.argv[1]
torch.manual_seed(0)
body = torch.nn.Linear(8, 16)
head = torch.nn.Linear(16, 4)
if mode == "zeroed-weight":
    torch.nn.init.zeros_(head.weight)
head = weight_norm(head)
if mode == "zeroed-scale":
    torch.nn.init.zeros_(head.parametrizations.weight.original0)
opt = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1)
for step in range(3):
    x = torch.randn(32, 8)
    logits = head(torch.relu(body(x)))
    loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, 4, (32,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
