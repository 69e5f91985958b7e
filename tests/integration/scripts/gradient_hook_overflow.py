# A gradient hook that rescales a half-precision layer's weight gradient
# (as hand-rolled gradient scaling and per-layer learning-rate tricks do):
# at step 2 it multiplies by 1e4, past fp16's range. The op that overflows
# runs in the backward pass but was called by the hook's line, which is
# the line to change.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 8).half()
factor = {"value": 1.0}
model.weight.register_hook(lambda grad: grad * factor["value"])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(4, 8, dtype=torch.float16)
for step in range(4):
    factor["value"] = 1e4 if step == 2 else 1.0
    loss = model(x).float().pow(2).sum() * 10
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
