# Ten thousand small training steps, as a run of days looks to the trace:
# per-step statistics pile up while nothing goes wrong.
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(4, 8), torch.randn(4, 1)
for step in range(10000):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("done", loss.item())
