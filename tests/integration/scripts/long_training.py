# Trains until killed; prints each step so a test knows it is running.
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)
step = 0
while True:
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    print("step", step, flush=True)
    step += 1
