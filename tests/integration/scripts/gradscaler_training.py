# fp16 autocast with GradScaler on the CPU; non-finite gradients planted at
# steps 2 and 5. Prints the scale after each update and whether the step
# was skipped, as the user would log them.
#
#     gradscaler_training.py [metric]
#
# metric: the batch's RMSE, computed from the model's output between
# backward and the optimizer step, with grad mode on, as loops log it.
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=3)
x, y = torch.randn(16, 8), torch.randn(16, 1)
for step in range(8):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
    if step in (2, 5):
        loss = loss * float("inf")
    before = scaler.get_scale()
    scaler.scale(loss).backward()
    if sys.argv[1:] == ["metric"]:
        rmse = (out.float() - y).pow(2).mean().sqrt()
    scaler.step(opt)
    scaler.update()
    after = scaler.get_scale()
    print(f"step {step} scale {after} skipped {int(after < before)}", flush=True)
