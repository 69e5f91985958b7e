"""An optimal-transport loss between predicted and target point sets, by
Sinkhorn's iterations with a small entropic eps (0.05): K = exp(-C / eps)
underflows where the squared distances pass about 5, the scaling vectors
u = a / (K @ v) and v = b / (K^T @ u) grow past 1e30 within the first
forward pass, and the backward pass overflows fp32 at step 0, before any
update. The weights go NaN.

    sinkhorn_transport.py scaling|log

log: the same iterations in the log domain with torch.logsumexp, the fix.
Prints each step's loss and whether the weights are finite."""
import math
import sys

import torch

log_domain = sys.argv[1] == "log"
torch.manual_seed(0)
predictor = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(predictor.parameters(), lr=0.01)
eps, n = 0.05, 16
for step in range(3):
    points = predictor(torch.randn(n, 8))
    targets = torch.randn(n, 4)
    cost = torch.cdist(points, targets) ** 2
    log_a = log_b = torch.full((n,), -math.log(n))
    if log_domain:
        f, g = torch.zeros(n), torch.zeros(n)
        for _ in range(20):
            f = eps * log_a - eps * torch.logsumexp((g[None] - cost) / eps, 1)
            g = eps * log_b - eps * torch.logsumexp((f[:, None] - cost) / eps, 0)
        plan = torch.exp((f[:, None] + g[None] - cost) / eps)
    else:
        K = torch.exp(-cost / eps)
        u, v = torch.ones(n), torch.ones(n)
        for _ in range(20):
            u = log_a.exp() / (K @ v)
            v = log_b.exp() / (K.t() @ u)
        plan = u[:, None] * K * v[None]
    loss = (plan * cost).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in predictor.parameters())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
