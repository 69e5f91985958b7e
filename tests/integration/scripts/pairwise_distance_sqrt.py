"""A contrastive loss over pairwise distances written by hand,
sqrt(((a_i - b_j)**2).sum()), with the zero distance of each anchor to
itself masked out by torch.where. The forward is finite (sqrt(0) = 0), but
the square root's derivative at 0 is infinite: SqrtBackward divides the
zero gradient where left there by 0, and the weights go NaN at step 2,
the first batch whose positives are the anchors themselves.

    pairwise_distance_sqrt.py [where|eps]

eps: (d2 + 1e-12).sqrt(), the fix. Prints each step's loss and whether
the weights are finite."""
import sys

import torch

torch.manual_seed(0)
embed = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(embed.parameters(), lr=0.05)


def distances(a, b):
    d2 = ((a[:, None] - b[None]) ** 2).sum(-1)
    if sys.argv[1:] == ["eps"]:
        return (d2 + 1e-12).sqrt()
    return torch.where(d2 > 0, d2.sqrt(), 0.0)


for step in range(4):
    x = torch.randn(12, 8)
    anchors = embed(x)
    others = embed(x if step >= 2 else torch.randn(12, 8))
    loss = torch.relu(1.0 - distances(anchors, others)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(w).all()) for w in embed.parameters())
    print(f"step {step} loss {loss.item():.6f} weights finite {finite}")
