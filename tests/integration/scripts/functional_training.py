"""JAX-style training with torch.func: functional_call under grad, and a
hand-written SGD update with grad mode on. No torch.optim record, no .grad:
each grad() call is an iteration. At iteration 3 the batch is scaled by
1e30 (a unit bug in preprocessing) and the squared error passes fp32's
range; from there on the parameters are NaN.

Prints each iteration's loss."""
import torch
from torch.func import functional_call, grad

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
params = {name: p.detach() for name, p in model.named_parameters()}


def loss_fn(p, x, y):
    return ((functional_call(model, p, (x,)) - y) ** 2).mean()


for step in range(6):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    if step == 3:
        x = x * 1e30
    g = grad(loss_fn)(params, x, y)
    params = {name: params[name] - 0.01 * g[name] for name in params}
    print(f"step {step} loss {float(loss_fn(params, x, y)):.6f}", flush=True)
