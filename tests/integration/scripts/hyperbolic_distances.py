"""Hyperbolic embeddings trained on all-pairs distances, a batch's
distance matrix with its diagonal (a point and itself) masked out of a
softmax after the acosh, as a contrastive loss over neighbours does.

    hyperbolic_distances.py lorentz|poincare|clamped

lorentz: points on the hyperboloid, d = acosh(-<x, y>_L); on the diagonal
-<x, x>_L is 1 only up to rounding, and acosh of the entries that round
below 1 is NaN (step 0).
poincare: points in the Poincare ball, d = acosh(1 + 2|u - v|^2 / ((1 -
|u|^2)(1 - |v|^2))), exactly 1 on the diagonal: acosh(1) = 0 is finite,
but its derivative 1 / sqrt(x^2 - 1) is infinite there, and 0 (the masked
entries' gradient) times inf is NaN in every weight after step 0.
clamped: poincare with the argument clamped at 1 + 1e-5: healthy.
Prints each step's loss and whether the weights are finite."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

mode = sys.argv[1]
torch.manual_seed(0)
points = nn.Embedding(50, 8)
nn.init.uniform_(points.weight, -0.5 if mode == "lorentz" else -0.05, 0.5 if mode == "lorentz" else 0.05)
opt = torch.optim.SGD(points.parameters(), lr=0.1)


def lorentz_argument(v):
    x = torch.cat([torch.sqrt(1 + (v * v).sum(-1, keepdim=True)), v], -1)
    return x[:, :1] @ x[:, :1].t() - x[:, 1:] @ x[:, 1:].t()


def poincare_argument(u):
    squared = (u * u).sum(-1)
    gaps = (u[:, None] - u[None]).pow(2).sum(-1)
    return 1 + 2 * gaps / ((1 - squared)[:, None] * (1 - squared)[None])


for step in range(4):
    batch = points(torch.randint(0, 50, (16,)))
    argument = lorentz_argument(batch) if mode == "lorentz" else poincare_argument(batch)
    if mode == "clamped":
        argument = argument.clamp_min(1 + 1e-5)
    distances = torch.acosh(argument)
    itself = torch.eye(16, dtype=torch.bool)
    logits = (-distances).masked_fill(itself, float("-inf"))
    loss = F.cross_entropy(logits, (torch.arange(16) + 1) % 16)
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = bool(torch.isfinite(points.weight).all())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
