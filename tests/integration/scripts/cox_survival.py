"""A DeepSurv-style survival model trained on Cox's partial likelihood:
risks sorted by time, the log of each risk set's sum by
torch.logcumsumexp, summed over the samples whose event was observed.
Censored samples send no gradient into their term, and logcumsumexp's
backward takes log |grad| of those zeros (-inf) before its own
torch.where replaces them by the format's lowest: a healthy run, every
step. DEVICE=cuda runs it on the GPU. Prints each step's loss and whether
the weights are finite."""
import os

import torch

device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
net = net.to(device)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for step in range(3):
    features = torch.randn(64, 6, device=device)
    time = torch.rand(64, device=device)
    observed = (torch.rand(64, device=device) > 0.4).float()
    order = torch.argsort(time, descending=True)
    risk = net(features[order]).squeeze(-1)
    event = observed[order]
    loss = -((risk - torch.logcumsumexp(risk, 0)) * event).sum() / event.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in net.parameters())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
