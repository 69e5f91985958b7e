# A tabular regressor whose first layer, nn.BatchNorm1d, normalises raw
# features (age in years, income in dollars, a 0-1 score), made fp16 with
# model.half(). Income's batch variance (about 1e8) overflows the fp16
# running_var at the first step; training normalises by the batch's own
# statistics and its loss stays finite, but evaluation divides by
# sqrt(inf): income drops out of every prediction. argv[1] "fp32-bn" keeps
# the batch norm in fp32 (the fix nanhunt suggests first); "save PATH"
# saves the trained model there, "evaluate PATH" only loads and evaluates
# it. DEVICE=cuda trains on the GPU.
import os
import sys

import torch

torch.manual_seed(0)
device = os.environ.get("DEVICE", "cpu")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
model = torch.nn.Sequential(
    torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
).half().to(device)
if mode == "fp32-bn":
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.float()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)


def batch(n):
    age = torch.rand(n, 1) * 50 + 20
    income = torch.rand(n, 1) * 40000 + 20000
    score = torch.rand(n, 1)
    x = torch.cat([age, income, score], dim=1)
    y = (income - 40000) / 20000 + score  # what the model should learn
    return x.half().to(device), y.half().to(device)


for step in range(0 if mode == "evaluate" else 8):
    x, y = batch(64)
    loss = (model(x).float() - y.float()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)

if mode == "save":
    torch.save(model.state_dict(), sys.argv[2])
if mode == "evaluate":
    model.load_state_dict(torch.load(sys.argv[2]))
model.eval()
with torch.no_grad():
    x, y = batch(256)
    err = (model(x).float() - y.float()).pow(2).mean().item()
print("eval mse", err, "running_var", model[0].running_var.float().tolist(), flush=True)
