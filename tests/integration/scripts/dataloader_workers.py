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
