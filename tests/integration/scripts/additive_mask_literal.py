"""Attention over padded sequences in a model.half() model, masked the way
older code did it: an additive mask, (1.0 - keep) * -1e9, added to the
scores. -1e9 is past float16's range: the mask is -inf there, which works
as long as every row keeps a position.

    additive_mask_literal.py padded|empty-sample|finfo-min

padded: some keys of one sample are padding: healthy (the -inf is a mask,
not an overflow). empty-sample: at step 1 a sample is padding only (an
empty retrieved context): its rows are all -inf, and their softmax NaN.
finfo-min: the fix, torch.finfo(dtype).min put in the masked places with
masked_fill, on the same batches: healthy. Prints each step's loss."""
import sys

import torch

mode = sys.argv[1]
torch.manual_seed(0)
query = torch.nn.Linear(16, 16).half()
opt = torch.optim.SGD(query.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(2, 6, 16).half()
    keep = torch.ones(2, 6)
    keep[0, 4:] = 0
    if step == 1 and mode != "padded":
        keep[1, :] = 0
    scores = query(x) @ x.transpose(1, 2) / 4
    if mode == "finfo-min":
        scores = scores.masked_fill(keep[:, None, :] == 0, torch.finfo(scores.dtype).min)
    else:
        scores = scores + (1.0 - keep[:, None, :].half()) * -1e9
    out = scores.softmax(-1) @ x
    loss = (out.float().pow(2).sum(-1) * keep).sum() / keep.sum().clamp_min(1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
