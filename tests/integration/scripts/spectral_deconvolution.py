# Deconvolution in the frequency domain: the signal's spectrum divided by
# the blur kernel's. The kernel [0.5, 0.5] averages neighbours, and its
# spectrum is exactly 0 at the Nyquist frequency, so the division there is
# inf/NaN (0/0), complex64 values that the inverse transform spreads over
# the whole signal. Before nanhunt read complex tensors, the inverse
# transform (aten::_fft_c2r) looked like it made NaN from finite inputs.
import torch

torch.manual_seed(0)
n = 64
kernel = torch.zeros(n)
kernel[:2] = 0.5
signal = torch.randn(4, n)
blurred = torch.fft.irfft(torch.fft.rfft(signal) * torch.fft.rfft(kernel), n=n)
restored = torch.fft.irfft(torch.fft.rfft(blurred) / torch.fft.rfft(kernel), n=n)
print("restored finite:", restored.isfinite().all().item())
