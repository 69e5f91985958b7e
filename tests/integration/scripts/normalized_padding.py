"""Cosine similarities of token embeddings, F.normalize'd, where token 0 is
padding (padding_idx=0: a zero vector). The norm's backward divides by the
norm, 0 / 0 at the padding rows, and sets those entries to 0 itself: a
healthy run, whose every weight stays finite. DEVICE=cuda runs it on the
GPU. Prints each step's loss."""
import os

import torch

device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
embedding = torch.nn.Embedding(10, 8, padding_idx=0).to(device)
opt = torch.optim.SGD(embedding.parameters(), lr=0.1)
tokens = torch.tensor([[0, 1, 2], [3, 0, 4]], device=device)
for step in range(3):
    z = torch.nn.functional.normalize(embedding(tokens), dim=-1)
    loss = (z @ z.transpose(1, 2)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
