"""Poisson regression of counts, many of them 0 (visits, clicks, reads),
with F.poisson_nll_loss(full=True): its Stirling term, target *
log(target) - target + 0.5 * log(2 pi target), takes log(0) = -inf at
every zero count, and masks it itself (masked_fill where target <= 1).

    poisson_counts.py log-rate|rate|softplus|half-relu|half-relu-eps

log-rate: the model predicts the log of the rate (log_input=True, the
default): healthy.
rate: the model's raw linear output is the rate (log_input=False), which
goes negative for some inputs: log(input + eps) is NaN at step 0.
softplus: the rate made positive with F.softplus: healthy.
half-relu: model.half(), the rate a ReLU of it, 0 for some inputs: fine in
fp32, where log(0 + eps) is log(1e-8), but that eps is 0 in float16 and
log(0) is -inf, the loss NaN at step 0. half-relu-eps: eps=1e-3, the fix.
DEVICE=cuda runs it on the GPU. Prints each step's loss and whether the
weights are finite."""
import os
import sys

import torch
import torch.nn.functional as F

mode = sys.argv[1]
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
model = torch.nn.Linear(10, 1).to(device)
half = mode.startswith("half")
if half:
    model.half()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(3):
    features = torch.randn(64, 10, device=device)
    counts = torch.poisson(torch.exp(features[:, :1]))
    out = model(features.half() if half else features)
    if mode == "log-rate":
        loss = F.poisson_nll_loss(out, counts, log_input=True, full=True)
    elif half:
        eps = 1e-3 if mode.endswith("-eps") else 1e-8  # 1e-8: its default
        loss = F.poisson_nll_loss(F.relu(out), counts.half(), log_input=False, full=True, eps=eps)
    else:
        rate = F.softplus(out) if mode == "softplus" else out
        loss = F.poisson_nll_loss(rate, counts, log_input=False, full=True)
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"step {step} loss {loss.item():.6g} zero counts {int((counts == 0).sum())} "
          f"weights finite {finite}", flush=True)
