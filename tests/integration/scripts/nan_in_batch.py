# A NaN planted in one data batch (as from a corrupt record), fed through a
# DataLoader: the report must blame the data, not an op. With "cast", the
# records are numpy's float64 and each batch is cast with .float(), as
# most pipelines do (aten::to around _to_copy: the first op to see them).
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

cast = sys.argv[1:] == ["cast"]
data = np.random.default_rng(0).standard_normal((64, 8))
if not cast:
    data = data.astype(np.float32)
data[37, 3] = np.nan  # in the third batch of 16
loader = DataLoader(TensorDataset(torch.from_numpy(data)), batch_size=16)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (batch,) in enumerate(loader):
    if cast:
        batch = batch.float()
    opt.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    opt.step()
    print(step, loss.item())
