# Forward stays finite in fp16; only the backward overflows:
# y = x / w = 5000 (and their sum 40000), but dy/dw = -x / w^2 = -5e5.
import torch

w = torch.full((8,), 0.01, dtype=torch.float16, requires_grad=True)
x = torch.full((8,), 50.0, dtype=torch.float16)
y = x / w
print("forward max", y.abs().max().item())
y.sum().backward()
print("grad", w.grad[0].item())
