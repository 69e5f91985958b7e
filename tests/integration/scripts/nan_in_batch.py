# A NaN planted in one data batch (as from a corrupt record), fed through a
# DataLoader: the report must blame the data, not an op.
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

data = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
data[37, 3] = np.nan  # in the third batch of 16
loader = DataLoader(TensorDataset(torch.from_numpy(data)), batch_size=16)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (batch,) in enumerate(loader):
    opt.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    opt.step()
    print(step, loss.item())
