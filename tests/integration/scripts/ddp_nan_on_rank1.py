# DistributedDataParallel on two CPU ranks (gloo), launched by torchrun, with
# a NaN planted in rank 1's batch at step 3 only: the gradient all-reduce
# spreads it to rank 0. Each rank saves its final parameters to
# argv[1]/params-<rank>.pt.
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# A rank that aborts (one CI run saw "terminate called without an active
# exception" in rank 0 at exit, never reproduced since) prints every
# thread's C++ stack, so the next one says where.
torch._C._set_print_stack_traces_on_fatal_signal(True)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(rank)
for step in range(6):
    x, y = torch.randn(16, 8, generator=data), torch.randn(16, 1, generator=data)
    if rank == 1 and step == 3:
        x[0, 0] = float("nan")  # a corrupt record on one rank
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
torch.save({k: v.clone() for k, v in model.module.state_dict().items()},
           os.path.join(sys.argv[1], f"params-{rank}.pt"))
dist.destroy_process_group()
