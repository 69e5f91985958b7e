# An overflow that comes back: every fifth step a batch of large values
# makes the first layer's matmul pass 65504 in fp16 autocast (steps 5, 10,
# 15...). Like the production runs sample mode is for: the first one may
# pass unsampled, the next one must be caught at its origin.
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
with torch.no_grad():
    model[0].weight.mul_(8)  # a layer with large weights
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for step in range(30):
    x = torch.randn(32, 64)
    if step % 5 == 0 and step > 0:
        x = x * 8000.0  # a burst of large feature values (still fit in fp16)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = out.float().pow(2).mean()
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)
