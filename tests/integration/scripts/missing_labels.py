"""Multi-task regression whose dataset stores missing labels as NaN, the
way pandas and many label files do, and a loss that leaves them out.

    missing_labels.py [masked-after|masked-before|filled]

masked-after: ((pred - y) ** 2)[known].mean(): the forward's loss is
finite, but the square's backward computes with the NaN it saved (a zero
gradient times NaN), and every weight is NaN after step 0. masked-before:
((pred[known] - y[known]) ** 2).mean(). filled: y = torch.nan_to_num(y),
then masked after: both train. Prints each step's loss and whether the
weights are finite."""
import sys

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "masked-after"
torch.manual_seed(0)
x, y = torch.randn(64, 8), torch.randn(64, 3)
y[torch.rand(64, 3) < 0.3] = float("nan")  # missing labels, as the dataset stores them
model = torch.nn.Linear(8, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    xb, yb = x[step * 16:(step + 1) * 16], y[step * 16:(step + 1) * 16]
    pred = model(xb)
    known = ~torch.isnan(yb)
    if mode == "masked-before":
        loss = ((pred[known] - yb[known]) ** 2).mean()
    else:
        if mode == "filled":
            yb = torch.nan_to_num(yb, nan=0.0)
        loss = ((pred - yb) ** 2)[known].mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    print(f"step {step} loss {loss.item():.4f} weights finite {finite}", flush=True)
