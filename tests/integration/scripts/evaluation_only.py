"""An evaluation script: a small fp16 model run over 8 batches, training
nothing. Batch 5 is scaled up until the first linear overflows fp16.

  evaluation_only.py no_grad          under torch.no_grad()
  evaluation_only.py inference_mode   under torch.inference_mode()
  evaluation_only.py grad             grad mode left on (a forgotten no_grad)
  evaluation_only.py attention        grad mode left on, and self-attention
      between the linears: many ops on activations, whose memory the
      allocator hands from one to the next within a pass
  evaluation_only.py validate-then-train
      two evaluation batches, then three training steps, the overflow in
      training step 2 (the evaluation batches are no steps of training)

Prints whether each output was finite. DEVICE=cuda runs it on a GPU
(scripts/gpu-check.sh)."""
import contextlib
import os
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
mode = sys.argv[1]
device = os.environ.get("DEVICE", "cpu")
# Set-up that reads each parameter more than once, before any pass: a move
# (to where the model already is, on the CPU), a cast, a scaling.


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, h):
        h = h.unflatten(0, (4, 4))
        return (h + self.attention(h, h, h)[0]).flatten(0, 1)


middle = SelfAttention() if mode == "attention" else nn.ReLU()
model = nn.Sequential(nn.Linear(32, 64), middle, nn.Linear(64, 8)).to(device).half()
with torch.no_grad():
    model[0].weight.mul_(8)
context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
           "grad": contextlib.nullcontext,
           "attention": contextlib.nullcontext}.get(mode, torch.no_grad)


def batch(scale):
    return (torch.rand(16, 32) * scale).half().to(device)


if mode == "validate-then-train":
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch.no_grad():
        for _ in range(2):
            print("validation finite:", bool(torch.isfinite(model(batch(1.0))).all()))
    for step in range(3):
        y = model(batch(2e4 if step == 2 else 1.0))
        loss = y.float().pow(2).mean()
        print("step", step, "finite:", bool(torch.isfinite(loss)))
        opt.zero_grad()
        loss.backward()
        opt.step()
else:
    with context():
        for b in range(8):
            y = model(batch(2e4 if b == 5 else 1.0))
            print("batch", b, "finite:", bool(torch.isfinite(y).all()))
