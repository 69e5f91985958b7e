"""Features standardised by hand, (h - h.mean(0)) / (h.std(0) + eps), where
one feature is dead (always 0): its std is 0, and std's backward divides
the gradient by it, 0 / 0, then sets those entries to 0 itself. A healthy
run. Prints each step's loss."""
import torch

torch.manual_seed(0)
project = torch.nn.Linear(4, 4)
head = torch.nn.Linear(4, 1)
opt = torch.optim.SGD([*project.parameters(), *head.parameters()], lr=0.01)
alive = torch.tensor([1.0, 1.0, 0.0, 1.0])
for step in range(3):
    h = project(torch.randn(32, 4)) * alive
    z = (h - h.mean(0)) / (h.std(0) + 1e-5)
    loss = (head(z) - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
