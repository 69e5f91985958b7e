# A slow training loop whose gradients hold a NaN at every odd step; the
# weights are printed as a checksum each step. Used to switch
# NANHUNT_SKIP_NONFINITE_STEPS in a running process through its config file.
import time

import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.ones(8))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(160):
    loss = (w * torch.randn(8)).sum()
    opt.zero_grad()
    loss.backward()
    if step % 2 == 1:
        w.grad[3] = float("nan")
    opt.step()
    print("step", step, "finite" if torch.isfinite(w).all() else "nan", flush=True)
    time.sleep(0.05)
