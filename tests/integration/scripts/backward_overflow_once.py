"""A model.half() regression whose division's gradient overflows once, at
step 3, while its forward pass stays finite: dy/dw = -x / w^2 passes fp16's
65504 when the divisor shrinks a hundredfold. Nothing overflows again: the
NaN it leaves in w only propagates, so no later backward finding of the
division captures its forward op's line. With "branch", the forward pass
gains an op of another name from step 4 on (a data-dependent branch): the
division's node is numbered one later than in step 3, and is still the
step's first division. With "checked", the loop checks its weights after
each update with grad on (torch.isfinite on each parameter): those nodes
begin the next step, and step 0 has none before its forward pass. DEVICE=cuda runs it on the GPU. Prints each step's loss."""
import os
import sys

import torch

branch = "branch" in sys.argv[1:]
checked = "checked" in sys.argv[1:]
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
w = torch.nn.Parameter(torch.full((8,), 1.0, dtype=torch.float16, device=device))
layer = torch.nn.Linear(8, 8).half().to(device)
opt = torch.optim.SGD([w, *layer.parameters()], lr=1e-3)
for step in range(6):
    x = torch.full((4, 8), 50.0, dtype=torch.float16, device=device)
    h = layer(x)
    if branch and step >= 4:
        h = h * 0.5
    shrink = 0.01 if step == 3 else 1.0
    y = x / (w * shrink)
    loss = (y.float() + h.float()).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if checked:
        print("weights finite", all(torch.isfinite(p).all().item() for p in [w, *layer.parameters()]))
    print(step, loss.item(), flush=True)
