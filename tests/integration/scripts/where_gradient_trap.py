"""The entropy of a distribution with empty bins, made "safe" by hand:
-(p * torch.where(p > 0, p.log(), 0)).sum(). The forward is finite, but
where's backward sends 0 into log's gradient at the empty bins, and
LogBackward's 0 / 0 is NaN: the weights go NaN at step 2, the first batch
with an empty bin.

    where_gradient_trap.py [where|double-where]

double-where: torch.where(p > 0, p, 1).log() inside the where, the fix.
Prints each step's entropy and whether the weights are finite."""
import sys

import torch

double_where = (sys.argv[1] if len(sys.argv) > 1 else "where") == "double-where"
torch.manual_seed(0)
scorer = torch.nn.Linear(8, 6)
opt = torch.optim.SGD(scorer.parameters(), lr=0.1)
for step in range(4):
    x = torch.randn(16, 8)
    counts = scorer(x).relu()  # empty bins where the score is negative
    if step < 2:
        counts = counts + 0.1  # no empty bin yet
    p = counts / counts.sum(-1, keepdim=True).clamp_min(1e-6)
    if double_where:
        log_p = torch.where(p > 0, torch.where(p > 0, p, 1).log(), 0)
    else:
        log_p = torch.where(p > 0, p.log(), 0)
    entropy = -(p * log_p).sum(-1).mean()
    opt.zero_grad()
    (-entropy).backward()
    opt.step()
    finite = all(bool(torch.isfinite(w).all()) for w in scorer.parameters())
    print(f"step {step} entropy {entropy.item():.6f} weights finite {finite}")
