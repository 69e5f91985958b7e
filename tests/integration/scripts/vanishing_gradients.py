# fp16 autocast without loss scaling, and a loss that is tiny by
# construction (a weighted auxiliary term): its gradients fall below fp16's
# smallest normal (6.1e-5), so the updates vanish and the loss plateaus,
# with no inf or NaN anywhere. DTYPE=bfloat16: the same values, held.
# Argument `half`: model.half() instead of autocast (fp16 weights, whose
# fp16 gradients GradScaler refuses to unscale).
import os
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
half = sys.argv[1:] == ["half"]
if half:
    model = model.half()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 32), torch.randn(64, 1)
if half:
    x = x.half()
for step in range(6):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=getattr(torch, os.environ.get("DTYPE", "float16")),
                        enabled=not half):
        out = model(x)
    loss = 1e-3 * torch.nn.functional.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)
