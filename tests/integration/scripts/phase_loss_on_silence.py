"""Speech enhancement with a phase-aware loss: a mask network scales the
noisy STFT, and the loss compares the estimate's magnitude and phase with
the clean speech's. The batch's second utterance is padded with silence,
whose STFT frames are exactly 0, so the estimate is 0 there: the complex
angle's backward (`grad * z / |z|^2`) divides 0 by 0, and sgn's (`... /
|z|`) a gradient by 0, and each sets those entries to 0 itself: a healthy
run, whose weights stay finite. DEVICE=cuda runs it on the GPU.

    phase_loss_on_silence.py angle|sgn

angle: the phase difference by torch.angle; sgn: the unit phasors by
torch.sgn. Prints each step's loss and whether the weights are finite."""
import os
import sys

import torch

device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1]
torch.manual_seed(0)
n_fft, hop = 64, 16
window = torch.hann_window(n_fft, device=device)
masker = torch.nn.Sequential(torch.nn.Linear(n_fft // 2 + 1, 64), torch.nn.ReLU(),
                             torch.nn.Linear(64, n_fft // 2 + 1), torch.nn.Sigmoid()).to(device)
opt = torch.optim.Adam(masker.parameters(), lr=1e-3)


def stft(audio):
    return torch.stft(audio, n_fft, hop, window=window, center=False, return_complex=True)


for step in range(3):
    clean = torch.randn(2, 1024, device=device)
    clean[1, 512:] = 0  # padding: the second utterance is half as long
    noisy = clean + 0.1 * torch.randn_like(clean) * (clean != 0)
    spectrum = stft(noisy)  # [batch, freq, frames]
    mask = masker(spectrum.abs().transpose(1, 2)).transpose(1, 2)
    estimate = mask * spectrum
    target = stft(clean)
    loss = (estimate.abs() - target.abs()).pow(2).mean()
    if mode == "angle":
        loss = loss + (1 - torch.cos(torch.angle(estimate) - torch.angle(target))).mean()
    else:
        loss = loss + (torch.sgn(estimate) - torch.sgn(target)).abs().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in masker.parameters())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
