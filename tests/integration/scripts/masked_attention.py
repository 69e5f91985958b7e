# Causal self-attention as nanoGPT writes it without flash attention: scores
# masked with masked_fill(-inf) (or, at odd steps, torch.where with a -inf
# tensor), plus an additive -inf mask built with torch.full(...).triu(1).
# Healthy. With FULLY_MASKED=<step>, one query row is masked entirely at
# that step: its softmax is 0/0, NaN.
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
T, D = 8, 16
fully_masked = int(os.environ.get("FULLY_MASKED", "-1"))
qkv = nn.Linear(D, 3 * D)
head = nn.Linear(D, 1)
opt = torch.optim.AdamW(list(qkv.parameters()) + list(head.parameters()), lr=1e-3)
causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
additive = torch.full((T, T), float("-inf")).triu(1)
for step in range(6):
    x = torch.randn(4, T, D)
    q, k, v = qkv(x).split(D, dim=-1)
    att = (q @ k.transpose(-2, -1)) * D ** -0.5
    keep = causal.clone()
    if step == fully_masked:
        keep[2] = False  # query 2 may attend to nothing
    if step % 2 == 0:
        att = att.masked_fill(~keep, float("-inf"))
    else:
        att = torch.where(keep, att, torch.tensor(float("-inf")))
    att = F.softmax(att + additive, dim=-1)
    loss = head(att @ v).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, "loss", loss.item())
