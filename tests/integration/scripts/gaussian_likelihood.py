"""A heteroscedastic regression: a network predicts a mean and a scale, and
the loss is the negative log-likelihood of torch.distributions' Normal,
with argument validation switched off for speed, as RL and probabilistic
codebases often do.

    gaussian_likelihood.py relu|softplus

relu: the scale is a ReLU of the network's output, exactly 0 for some
samples: Normal.log_prob's log(scale) is -inf and the loss NaN at step 0,
though the program's line writes no log. softplus: F.softplus(raw) + 1e-4,
healthy. Prints each step's loss. DEVICE=cuda runs it on the GPU."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Distribution, Normal

device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1]
Distribution.set_default_validate_args(False)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)).to(device)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(64, 4)
    y = (x.sum(-1, keepdim=True) + 0.1 * torch.randn(64, 1)).to(device)
    x = x.to(device)
    mean, raw = net(x).chunk(2, dim=-1)
    scale = F.relu(raw) if mode == "relu" else F.softplus(raw) + 1e-4
    loss = -Normal(mean, scale).log_prob(y).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
