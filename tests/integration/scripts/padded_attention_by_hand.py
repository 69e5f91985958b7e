# Attention written by hand over padded sequences: padded keys are masked
# with -inf, so the softmax rows of an all-padding sequence are NaN. MODE
# (argv[1]) says what becomes of that NaN:
#   dropped  zeroed right after (masked_fill), as padded queries are; its
#            backward makes NaN there too, which masked_fill's backward
#            zeroes: no weight or gradient ever holds any
#   leak     not zeroed: it reaches the weights
#   buffer   zeroed, but first averaged into a running statistic
#   kept     zeroed, but the softmax is kept in a list (logged for later)
#   checked  dropped, and the loop checks the loss between backward and the
#            optimizer step (grad mode on), stepping only when it is finite
# Prints whether the weights and the statistic ended finite. DEVICE=cuda
# runs it on a GPU (scripts/gpu-check.sh), where each step's results come
# in after its optimizer step.
import os
import sys

import torch

mode = sys.argv[1]
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
B, T, D = 4, 8, 16
proj = torch.nn.Linear(D, 3 * D).to(device)
out = torch.nn.Linear(D, 1).to(device)
opt = torch.optim.SGD([*proj.parameters(), *out.parameters()], lr=0.01)
lengths = torch.tensor([8, 5, 3, 0], device=device)  # the last sequence is all padding
keep = torch.arange(T, device=device)[None] < lengths[:, None]
stats = torch.zeros(T, device=device)
logged = []


def attend(x):
    q, k, v = proj(x).chunk(3, -1)
    scores = (q @ k.transpose(1, 2)) / D ** 0.5
    scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
    weights = scores.softmax(-1)
    attn = weights if mode == "leak" else weights.masked_fill(~keep[:, :, None], 0.0)
    if mode == "buffer":
        with torch.no_grad():
            stats.mul_(0.9).add_(weights.mean((0, 1)) * 0.1)
    if mode == "kept":
        logged.append(weights)
    return (attn @ v).sum(1)


for step in range(4):
    x, y = torch.randn(B, T, D, device=device), torch.randn(B, 1, device=device)
    loss = torch.nn.functional.mse_loss(out(attend(x)), y)
    opt.zero_grad()
    loss.backward()
    if mode == "checked" and not torch.isfinite(loss):
        continue
    opt.step()
weights_finite = all(torch.isfinite(p).all().item() for p in proj.parameters())
print(f"weights finite {weights_finite}, statistic finite {torch.isfinite(stats).all().item()}")
