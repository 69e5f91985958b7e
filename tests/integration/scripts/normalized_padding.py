"""Cosine similarities of token embeddings, F.normalize'd, where token 0 is
padding (padding_idx=0: a zero vector). The norm's backward divides by the
norm, 0 / 0 at the padding rows, and sets those entries to 0 itself: a
healthy run, whose every weight stays finite. DEVICE=cuda runs it on the
GPU.

    normalized_padding.py [half|half-eps]

half: the model in float16 (model.half()), where F.normalize's eps of
1e-12 is 0 (float16's smallest value is 6e-8): the padding rows are 0 / 0
in the forward pass, and the weights go NaN. half-eps: eps=1e-3, the fix
(1e-6 is not enough: the backward divides by its square; nor is the
norm in fp32 with 1e-12, whose gradient of 1e12 at a zero vector
overflows float16 on its way back). Prints each step's loss and whether
the weights are finite."""
import os
import sys

import torch

device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
torch.manual_seed(0)
embedding = torch.nn.Embedding(10, 8, padding_idx=0).to(device)
if mode.startswith("half"):
    embedding.half()
opt = torch.optim.SGD(embedding.parameters(), lr=0.1)
tokens = torch.tensor([[0, 1, 2], [3, 0, 4]], device=device)
eps = 1e-3 if mode == "half-eps" else 1e-12
for step in range(3):
    z = torch.nn.functional.normalize(embedding(tokens), dim=-1, eps=eps)
    loss = (z @ z.transpose(1, 2)).float().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = bool(torch.isfinite(embedding.weight).all())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
