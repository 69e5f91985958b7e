# Logistic regression in float32 with a hand-written binary cross-entropy:
# when the inputs grow at step 5 the sigmoid saturates to exactly 1 and
# log(1 - p) is log(0) = -inf. Nothing to do with fp16.
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(8):
    x = torch.randn(16, 4) * (20 if step >= 5 else 1)
    y = (torch.rand(16, 1) > 0.5).float()
    p = torch.sigmoid(model(x))
    loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, "loss", loss.item())
