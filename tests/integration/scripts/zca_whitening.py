"""ZCA whitening of a layer's features inside the model (a decorrelated
batch norm), taken through torch.linalg.eigh of their covariance: two of
the four ReLU units are dead, zero for every sample, so the covariance
has a repeated eigenvalue (its eps, twice). eigh's backward divides by the
differences of the eigenvalues: the gradient is NaN at step 0, and so are
the weights.

    zca_whitening.py [eigh|svd|cholesky]

svd: the same through torch.linalg.svd of the centred features, whose two
zero singular values repeat. cholesky: whitening by the inverse of the
covariance's Cholesky factor, whose gradient stays finite (the fix).
Prints each step's loss and whether the weights are finite."""
import sys

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "eigh"
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU())
with torch.no_grad():
    net[0].bias[2:] = -100.0  # two dead units
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(3):
    h = net(torch.randn(32, 6))
    h = h - h.mean(0)
    cov = h.T @ h / 31 + 1e-3 * torch.eye(4)
    if mode == "eigh":
        evals, evecs = torch.linalg.eigh(cov)
        white = h @ evecs @ torch.diag(evals.rsqrt()) @ evecs.T
    elif mode == "svd":
        u, _, vh = torch.linalg.svd(h, full_matrices=False)
        white = u @ vh * 31 ** 0.5
    else:
        factor = torch.linalg.cholesky(cov)
        white = torch.linalg.solve_triangular(factor, h.T, upper=False).T
    loss = (white[:, 0] - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(p.isfinite().all()) for p in net.parameters())
    print(f"step {step} loss {loss.item():.4f} weights finite {finite}", flush=True)
    if not finite:
        break  # eigh and svd of a NaN matrix fail to converge
