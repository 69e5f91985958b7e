# -inf masks beyond attention, as language-model and mixture-of-experts
# code writes them: banned tokens by index (logits[..., banned] = -inf, an
# index_fill_), by scatter(-1, banned, -inf), at positions (index_put_), by a
# boolean index (masked_fill_),
# nn.MultiheadAttention with a key_padding_mask (baddbmm with the mask),
# top-k routing through full_like(-inf).scatter and a top-k filter.
# Healthy. With MASKED_TARGET=<step>, a target at that step is a banned
# token: cross-entropy over a masked position is +inf, the loss itself.
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, D, B, T = 32, 16, 4, 8
masked_target = int(os.environ.get("MASKED_TARGET", "-1"))
emb, head, gate = nn.Embedding(V, D), nn.Linear(D, V), nn.Linear(D, 4)
mha = nn.MultiheadAttention(D, 2, batch_first=True)
params = [*emb.parameters(), *head.parameters(), *gate.parameters(), *mha.parameters()]
opt = torch.optim.AdamW(params, lr=1e-3)
banned = torch.tensor([3, 5, 7])
for step in range(4):
    ids = torch.randint(8, V, (B, T))
    if step == masked_target:
        ids[1, 2] = 5
    x = emb(ids)
    padded = torch.zeros(B, T, dtype=torch.bool)
    padded[0, -2:] = True
    a, _ = mha(x, x, x, key_padding_mask=padded)
    logits = head(a)
    by_index = logits.clone()
    by_index[..., banned] = float("-inf")
    by_scatter = logits.scatter(-1, banned.expand(B, T, 3), float("-inf"))
    by_position = logits.clone()
    by_position[torch.arange(B), torch.zeros(B, dtype=torch.long), 0] = float("-inf")
    low = logits.clone()
    low[low < -1] = float("-inf")
    g = gate(a)
    top, chosen = g.topk(2, dim=-1)
    routed = torch.full_like(g, float("-inf")).scatter(-1, chosen, top).softmax(-1)
    kth = torch.topk(logits, 5, dim=-1).values[..., -1:]
    filtered = logits.masked_fill(logits < kth, float("-inf"))
    loss = (F.cross_entropy(by_index.view(-1, V), ids.view(-1))
            + F.cross_entropy(by_scatter.view(-1, V), ids.view(-1))
            + low.logsumexp(-1).mean() + filtered.log_softmax(-1).amax(-1).mean()
            + routed.sum() * 0.01 + by_position.amax(-1).mean())
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, "loss", loss.item(), flush=True)
