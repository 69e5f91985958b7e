# GradScaler with an aggressive schedule (a huge initial scale that grows at
# every good step): scaled gradients overflow fp16 in the backward pass most
# steps, the scaler skips them, and training stalls without a NaN in the
# loss. With a number N, N hidden layers come first: a cast a layer, each
# capturing its line once its backward op overflowed (bench/line_capture_cost.py).
import sys

import torch

torch.manual_seed(0)
hidden = [torch.nn.Linear(16, 16) for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 0)]
model = torch.nn.Sequential(*hidden, torch.nn.Linear(16, 1)) if hidden else torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_factor=2.0**6,
                              growth_interval=1)
x, y = torch.randn(32, 16), torch.randn(32, 1)
for step in range(20):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    print(step, loss.item(), scaler.get_scale(), flush=True)
