"""A SincNet front end: learnable band-pass filters built of torch.sinc
over taps t = -K..K, whose centre tap is t = 0 for every filter, so sinc
is evaluated at 0 each step. sinc's backward, (pi x cos(pi x) - sin(pi x))
/ (pi x^2), is 0 / 0 there, and torch sets it to 0 itself (a torch.where
on x == 0): a healthy run, whose weights stay finite. DEVICE=cuda runs it
on the GPU. Prints each step's loss and whether the weights are finite."""
import os

import torch

device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
sample_rate, taps, filters = 16000, 65, 16
low_hz = torch.nn.Parameter(torch.linspace(30, 4000, filters, device=device))
band_hz = torch.nn.Parameter(torch.full((filters,), 300.0, device=device))
classifier = torch.nn.Linear(filters, 4).to(device)
opt = torch.optim.Adam([low_hz, band_hz, *classifier.parameters()], lr=1e-3)
t = torch.arange(-(taps // 2), taps // 2 + 1, device=device) / sample_rate
window = torch.hamming_window(taps, device=device)


def band_pass():
    low = low_hz.abs()[:, None]
    high = low + band_hz.abs()[:, None]
    kernel = 2 * high * torch.sinc(2 * high * t) - 2 * low * torch.sinc(2 * low * t)
    return (kernel * window / kernel.abs().amax(1, keepdim=True))[:, None]


for step in range(3):
    audio = torch.randn(8, 1, 4000, device=device)
    labels = torch.randint(0, 4, (8,), device=device)
    features = torch.nn.functional.conv1d(audio, band_pass()).abs().mean(-1)
    loss = torch.nn.functional.cross_entropy(classifier(torch.log1p(features)), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in [low_hz, band_hz, *classifier.parameters()])
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
