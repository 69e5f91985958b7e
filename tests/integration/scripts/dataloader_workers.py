# DataLoader with two forked workers: they run ops (collation) too, and must
# neither crash nor write into the parent's trace.
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
ds = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = DataLoader(ds, batch_size=32, num_workers=2)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
print("done", loss.item())

# A worker killed with SIGTERM (as DataLoader does to workers that hang on
# shutdown) must take only itself down. (Here torch's worker already handles
# SIGTERM itself, so this run did not reproduce the hazard that made forked
# children drop nanhunt's handlers; it guards the scenario, not that fix.)
import os
import signal

it = iter(DataLoader(ds, batch_size=32, num_workers=1))
next(it)
worker = it._workers[0]
os.kill(worker.pid, signal.SIGTERM)
worker.join(timeout=10)
print("worker exit code", worker.exitcode)
del it
print("parent alive")
