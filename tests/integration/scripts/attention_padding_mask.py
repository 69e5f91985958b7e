"""A sequence classifier over nn.MultiheadAttention, given the batch's
Hugging Face-style attention_mask (1 at real tokens, 0 at padding).

    attention_padding_mask.py as-is|inverted

as-is: key_padding_mask=attention_mask.bool(). nn.MultiheadAttention
masks where True, so every real token is masked and only the padding is
attended to; the batch's longest sequence has no padding, every key of it
masked: its softmax rows are NaN, and so is the loss, from step 0.
inverted: key_padding_mask=~attention_mask.bool(), healthy. Prints each
step's loss. DEVICE=cuda runs it on the GPU."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1]
torch.manual_seed(0)
d, vocab, classes = 16, 30, 3
embedding = nn.Embedding(vocab, d, padding_idx=0).to(device)
attention = nn.MultiheadAttention(d, 4, batch_first=True).to(device)
head = nn.Linear(d, classes).to(device)
params = [*embedding.parameters(), *attention.parameters(), *head.parameters()]
opt = torch.optim.SGD(params, lr=0.1)
for step in range(3):
    lengths = torch.tensor([12, 9, 6, 4], device=device)
    attention_mask = (torch.arange(12, device=device)[None, :] < lengths[:, None]).long()
    tokens = torch.randint(1, vocab, (4, 12)).to(device) * attention_mask
    padding = attention_mask.bool() if mode == "as-is" else ~attention_mask.bool()
    h = embedding(tokens)
    h, _ = attention(h, h, h, key_padding_mask=padding)
    pooled = (h * attention_mask[..., None]).sum(1) / lengths[:, None]
    loss = F.cross_entropy(head(pooled), torch.randint(0, classes, (4,)).to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
