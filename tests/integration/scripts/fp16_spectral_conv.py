# A Fourier neural operator's spectral convolution in fp16 on a GPU, as
# mixed-precision FNO training runs it: torch.fft.rfft of a half CUDA
# tensor is a complex32 spectrum (cuFFT in half precision, for power-of-two
# sizes). At step 2 the input's level rises to 4000: 64 values of 4000 sum
# to 256000 at the zero frequency, past fp16's 65504, inf in the spectrum
# that the inverse FFT spreads over the signal: nanhunt names the FFT. The CPU has no fp16 FFT:
# there (DEVICE unset) it runs in fp32, and overflows nothing.
# scripts/gpu-check.sh runs it with DEVICE=cuda.
import os

import torch

device = os.environ.get("DEVICE", "cpu")
dtype = torch.float16 if device == "cuda" else torch.float32
torch.manual_seed(0)
modes = 16
weight = torch.nn.Parameter(torch.randn(modes, device=device))
opt = torch.optim.SGD([weight], lr=1e-3)
for step in range(4):
    level = 4000.0 if step == 2 else 1.0
    x = (torch.randn(8, 64, device=device) * 0.1 + level).to(dtype)
    spectrum = torch.fft.rfft(x)
    # The mixing in complex64: cuFFT's half precision is where fp16 ends.
    low = spectrum[:, :modes].to(torch.complex64) * weight
    y = torch.fft.irfft(low, n=64)
    loss = y.float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
