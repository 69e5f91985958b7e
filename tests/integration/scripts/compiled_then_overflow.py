# torch.compile traces with fake tensors (no memory behind them); monitoring
# must survive that and still catch the overflow that comes after.
import torch


@torch.compile
def f(x, y):
    return (x @ y).relu() * 2


torch.manual_seed(0)
print(f(torch.randn(64, 64), torch.randn(64, 64)).sum().item())
z = torch.full((4,), 300.0, dtype=torch.float16)
print(z @ z)
