"""A token classifier whose embedding keeps a padding row, which
nn.Embedding(padding_idx=0) starts at zeros, normalised with an eps of 0:
a padded position's row is all zeros, its variance 0, and 1 / sqrt(0 + 0)
is +inf, (0 - 0) * inf NaN, from the first forward pass.

    normalization_eps_zero.py layer|group|rms|default

layer: nn.LayerNorm(d, eps=0.0); group: nn.GroupNorm(4, d, eps=0.0) over
the tokens' features; rms: nn.RMSNorm(d, eps=0.0), whose rsqrt of the
padded rows' mean square of 0 is +inf; default: nn.LayerNorm(d) (eps
1e-5): healthy, the padded rows normalise to 0. Prints each step's loss. DEVICE=cuda runs it on the GPU."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1]
torch.manual_seed(0)
d, vocab, classes = 32, 50, 5


class GroupOverFeatures(nn.Module):
    """GroupNorm over each token's features: (N, C) rows are (tokens, d)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(4, d, eps=0.0)

    def forward(self, h):
        return self.norm(h.reshape(-1, d)).reshape(h.shape)


norm = {"layer": lambda: nn.LayerNorm(d, eps=0.0), "group": GroupOverFeatures,
        "rms": lambda: nn.RMSNorm(d, eps=0.0), "default": lambda: nn.LayerNorm(d)}[mode]().to(device)
embedding = nn.Embedding(vocab, d, padding_idx=0).to(device)
head = nn.Linear(d, classes).to(device)
params = [*embedding.parameters(), *norm.parameters(), *head.parameters()]
opt = torch.optim.SGD(params, lr=0.1)
for step in range(3):
    tokens = torch.randint(1, vocab, (4, 12))
    tokens[:, 9:] = 0  # every sequence padded to 12
    labels = torch.randint(0, classes, (4, 12))
    labels[tokens == 0] = -100
    tokens, labels = tokens.to(device), labels.to(device)
    logits = head(norm(embedding(tokens)))
    loss = F.cross_entropy(logits.reshape(-1, classes), labels.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
