"""Generalized-mean (GeM) pooling, as image retrieval trains it: a learned
exponent p, mean(x ** p) ** (1 / p) over each feature map. The gradient of
p is x ** p * log(x): at x = 0, log(0) = -inf, which torch's own backward
masks (where x == 0 and p >= 0) before it reaches p.

    gem_pooling.py relu|signed|clamped

relu: after a ReLU, whose zeros give that -inf on every step: healthy.
signed: after a batch norm with no ReLU, p starting at 2 (a root mean
square, finite over negative values): log(x) of a negative x is NaN,
unmasked, so p's gradient is NaN at step 0, then every weight.
clamped: the usual GeM, x.clamp(min=1e-6) ** p: healthy, no inf made.
DEVICE=cuda runs it on the GPU. Prints each step's loss, p and whether
the weights are finite."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

mode = sys.argv[1]
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)


class GeM(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.tensor(2.0 if mode == "signed" else 3.0))

    def forward(self, x):
        if mode == "clamped":
            x = x.clamp(min=1e-6)
        return F.avg_pool2d(x.pow(self.p), x.shape[-2:]).pow(1.0 / self.p).flatten(1)


layers = [nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)]
if mode != "signed":
    layers.append(nn.ReLU())
model = nn.Sequential(*layers, GeM(), nn.Linear(16, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(3):
    images = torch.randn(8, 3, 24, 24, device=device)
    labels = torch.randint(0, 10, (8,), device=device)
    loss = F.cross_entropy(model(images), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(t).all()) for t in model.parameters())
    print(f"step {step} loss {loss.item():.6g} p {model[-2].p.item():.6g} weights finite {finite}",
          flush=True)
