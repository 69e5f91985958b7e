"""VICReg's variance term written with std and without its eps,
F.relu(1 - z.std(0)).mean(), over a projector whose last ReLU has a dead
unit (always 0). The dead feature's std is 0 and the term's gradient
there is -1 / features: std's backward divides it by 2 * 0, -inf, and
sets those entries to 0 itself. A healthy run, whose weights stay finite
(the dead unit stays dead: the paper's sqrt(var + 1e-4) has a gradient at
0). Prints each step's loss and whether the weights are finite."""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
projector = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8),
                                torch.nn.ReLU())
with torch.no_grad():
    projector[2].weight[3] = 0  # the dead unit: no input reaches it
    projector[2].bias[3] = -1
opt = torch.optim.SGD(projector.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(64, 8)
    z_a = projector(x + 0.1 * torch.randn_like(x))
    z_b = projector(x + 0.1 * torch.randn_like(x))
    invariance = F.mse_loss(z_a, z_b)
    variance = F.relu(1 - z_a.std(0)).mean() + F.relu(1 - z_b.std(0)).mean()
    loss = 25 * invariance + 25 * variance
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in projector.parameters())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
