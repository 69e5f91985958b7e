"""Cosine similarities of token embeddings, F.normalize'd, where token 0 is
padding (padding_idx=0: a zero vector). The norm's backward divides by the
norm, 0 / 0 at the padding rows, and sets those entries to 0 itself: a
healthy run, whose every weight stays finite. DEVICE=cuda runs it on the
GPU.

    normalized_padding.py [half|half-eps|half-cosine|half-cosine-eps|half-cosine-loss|half-cosine-loss-eps]

half: the model in float16 (model.half()), where F.normalize's eps of
1e-12 is 0 (float16's smallest value is 6e-8): the padding rows are 0 / 0
in the forward pass, and the weights go NaN. half-eps: eps=1e-3, the fix
(1e-6 is not enough: the backward divides by its square; nor is the
norm in fp32 with 1e-12, whose gradient of 1e12 at a zero vector
overflows float16 on its way back). half-cosine: the similarities by
F.cosine_similarity, whose default eps of 1e-8 is 0 in float16 too (it
clamps each norm with it): the padding rows are 0 / 0. half-cosine-eps:
eps=1e-3, the fix. half-cosine-loss: nn.CosineEmbeddingLoss over pairs
of the tokens, whose eps, 1e-12, torch's C++ fixes; half-cosine-loss-eps:
the same loss from F.cosine_similarity with eps=1e-3, the fix (the loss
in fp32 is not: its gradient at a zero vector, about 1e6, overflows
float16 on its way back). Prints each step's loss and
whether the weights are finite."""
import os
import sys

import torch
import torch.nn.functional as F

device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
torch.manual_seed(0)
embedding = torch.nn.Embedding(10, 8, padding_idx=0).to(device)
if mode.startswith("half"):
    embedding.half()
opt = torch.optim.SGD(embedding.parameters(), lr=0.1)
tokens = torch.tensor([[0, 1, 2], [3, 0, 4]], device=device)
eps = 1e-3 if mode.endswith("-eps") else 1e-12
for step in range(3):
    e = embedding(tokens)
    if mode == "half-cosine":  # its default eps, 1e-8
        loss = F.cosine_similarity(e[:, :, None], e[:, None, :], dim=-1).float().mean()
    elif mode == "half-cosine-eps":
        loss = F.cosine_similarity(e[:, :, None], e[:, None, :], dim=-1, eps=eps).float().mean()
    elif mode == "half-cosine-loss":  # every pair similar: 1 - cos
        pairs = e.reshape(3, 2, 8)
        same = torch.ones(3, device=device)
        loss = F.cosine_embedding_loss(pairs[:, 0], pairs[:, 1], same).float()
    elif mode == "half-cosine-loss-eps":
        pairs = e.reshape(3, 2, 8)
        loss = (1 - F.cosine_similarity(pairs[:, 0], pairs[:, 1], dim=-1, eps=eps)).float().mean()
    else:
        z = F.normalize(e, dim=-1, eps=eps)
        loss = (z @ z.transpose(1, 2)).float().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = bool(torch.isfinite(embedding.weight).all())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
