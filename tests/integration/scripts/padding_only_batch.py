"""A token-level loss averaged over a padding mask by hand, (nll * mask).sum()
/ mask.sum(). Step 2's batch holds only empty sequences (lengths 0, as a
shard of empty transcripts gives), so its mask selects nothing: 0 / 0 is
NaN, and Adam writes NaN into every weight.

    padding_only_batch.py [float|bool|clamped]

float: the mask as float; bool: a boolean mask, whose sum is an integer;
clamped: mask.sum().clamp_min(1), a loss of 0 for that batch. Prints each
step's loss and whether the weights are finite."""
import sys

import torch
import torch.nn.functional as F

mode = sys.argv[1] if len(sys.argv) > 1 else "float"
torch.manual_seed(0)
vocabulary, length = 50, 12
embedding = torch.nn.Embedding(vocabulary, 16)
head = torch.nn.Linear(16, vocabulary)
params = [*embedding.parameters(), *head.parameters()]
opt = torch.optim.Adam(params, lr=1e-3)
for step in range(4):
    tokens = torch.randint(1, vocabulary, (4, length))
    lengths = torch.zeros(4, dtype=torch.long) if step == 2 else torch.tensor([12, 7, 3, 9])
    mask = torch.arange(length)[None] < lengths[:, None]
    if mode != "bool":
        mask = mask.float()
    nll = F.cross_entropy(head(embedding(tokens)).transpose(1, 2), tokens, reduction="none")
    count = mask.sum().clamp_min(1) if mode == "clamped" else mask.sum()
    loss = (nll * mask).sum() / count
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(p.isfinite().all()) for p in params)
    print(f"step {step} loss {loss.item():.4f} weights finite {finite}")
