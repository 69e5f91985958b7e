"""A regression MLP whose training diverges, or whose batch explodes.

    diverging_learning_rate.py diverging|autocast|batch|layernorm [steps]

diverging: fp32, SGD with lr=0.5, too high for it: the updates grow tenfold
and more each step from step 2 on, until the loss passes fp32's range at
step 5 (then NaN). autocast: the same under fp16 autocast, where an fp16
matmul overflows first, at step 4. batch: lr=0.01, a healthy run, until
the batch of step 5 is scaled by 1e30 (a unit bug in preprocessing).
layernorm: the same batch into a model whose first layer is an
nn.LayerNorm (eps 1e-5), whose variance of values past 1.8e19 passes
fp32's range: NaN.
steps: how many (10); 5 stops a diverging run before its inf. DEVICE=cuda
trains on a GPU (scripts/gpu-check.sh), where the update's values are GPU
results that arrive after their step.

Prints each step's loss."""
import os
import sys

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "diverging"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
if mode == "layernorm":
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), *model)
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01 if mode in ("batch", "layernorm") else 0.5)
x = torch.randn(256, 16).to(device)
y = x.sum(-1, keepdim=True)
for step in range(steps):
    batch = x * 1e30 if mode in ("batch", "layernorm") and step == 5 else x
    with torch.autocast(device, dtype=torch.float16, enabled=mode == "autocast"):
        loss = torch.nn.functional.mse_loss(model(batch).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
