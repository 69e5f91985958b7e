"""Volume rendering as in NeRF: a small MLP gives each sample along a ray a
density, alpha = 1 - exp(-sigma * delta), and the transmittance is the
cumulative product of (1 - alpha) along the ray, without the usual 1e-10.
Where a ray meets the solid blob (density 1e4), exp(-1000) is 0 in fp32:
alpha is exactly 1 and a factor of the product is 0. cumprod's backward
divides by its input and keeps only what lies before the first zero, so
its x / 0 and 0 / 0 there are its own, masked: a healthy run, whose
weights stay finite. DEVICE=cuda runs it on the GPU. Prints each step's
loss and whether the weights are finite."""
import os

import torch

device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
field = torch.nn.Sequential(torch.nn.Linear(3, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to(device)
opt = torch.optim.Adam(field.parameters(), lr=1e-3)
samples = torch.linspace(0.0, 2.0, 24, device=device)
delta = samples[1] - samples[0]


def blob(points):
    # A solid object of radius 0.3 at (1, 0, 0): known geometry (a
    # density grid of an earlier stage), added to the field's own.
    return 1e4 * ((points - torch.tensor([1.0, 0.0, 0.0], device=device)).norm(dim=-1) < 0.3)


for step in range(3):
    origins = torch.zeros(16, 3, device=device)
    directions = torch.nn.functional.normalize(torch.randn(16, 3, device=device), dim=-1)
    directions[:4] = torch.tensor([1.0, 0.0, 0.0], device=device)  # rays at the object
    points = origins[:, None] + directions[:, None] * samples[None, :, None]
    out = field(points)
    sigma = torch.nn.functional.softplus(out[..., 0]) + blob(points)
    rgb = torch.sigmoid(out[..., 1:])
    alpha = 1.0 - torch.exp(-sigma * delta)
    transmittance = torch.cumprod(1.0 - alpha, dim=-1)
    weights = alpha * torch.cat([torch.ones_like(transmittance[:, :1]), transmittance[:, :-1]], -1)
    color = (weights[..., None] * rgb).sum(1)
    loss = ((color - 0.5) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in field.parameters())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
