"""Glow's invertible 1x1 convolution, trained by maximum likelihood: its
weight starts as a random rotation (the Q of a QR decomposition), and the
change of variables adds H * W * log |det W| to the log-likelihood. Taken
with torch.logdet, that is NaN when det W is negative, as a random
rotation's is half the time (-1): here the loss is nan from step 0, though
the weights stay finite (logdet's gradient, W^-T, is finite either way).

    invertible_conv_flow.py [logdet|slogdet|logdet-positive]

slogdet: torch.linalg.slogdet(W).logabsdet, which Glow uses, finite for
either sign. logdet-positive: torch.logdet of a rotation whose det is +1,
healthy; torch.logdet places a NaN for a negative determinant on every
call, and leaves it out. Prints each step's loss and whether the weights
are finite."""
import sys

import torch
import torch.nn.functional as F

mode = sys.argv[1] if len(sys.argv) > 1 else "logdet"
torch.manual_seed(0)
channels = 8
rotation = torch.linalg.qr(torch.randn(channels, channels))[0]
if (torch.linalg.det(rotation) > 0) != (mode == "logdet-positive"):
    rotation[:, 0] = -rotation[:, 0]  # the other sign, for a run that shows both
weight = torch.nn.Parameter(rotation)
opt = torch.optim.Adam([weight], lr=1e-3)
for step in range(4):
    x = torch.randn(16, channels, 8, 8) * torch.linspace(0.5, 2, channels)[:, None, None]
    z = F.conv2d(x, weight[:, :, None, None])
    height, width = z.shape[2:]
    if mode == "slogdet":
        log_det = torch.linalg.slogdet(weight).logabsdet
    else:
        log_det = torch.logdet(weight)
    log_likelihood = -0.5 * z.pow(2).sum((1, 2, 3)) + height * width * log_det
    loss = -log_likelihood.mean() / (channels * height * width)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f} weights finite {bool(weight.isfinite().all())}")
