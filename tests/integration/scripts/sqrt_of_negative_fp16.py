# A standard deviation by hand in fp16, E[x^2] - E[x]^2, that rounding makes
# negative: sqrt gives NaN, in fp32 too.
import torch

x = torch.full((1000,), 3.0, dtype=torch.float16) + torch.linspace(0, 0.01, 1000).half()
var = (x * x).mean() - x.mean() ** 2
print("var", var.item(), "std", torch.sqrt(var).item())
