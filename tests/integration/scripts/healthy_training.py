# A small regression trained in fp16 autocast that stays well inside fp16's
# range: nothing to report.
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(8):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)
