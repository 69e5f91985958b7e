"""A training loop that skips the iterations whose loss is not finite
(`if not torch.isfinite(loss): continue`), as many scripts do: batches 3
and 4 are scaled up until the first linear overflows fp16, and those
iterations end before their backward pass.

  skip_nonfinite_loss.py continue      the loop above: 10 iterations
  skip_nonfinite_loss.py gradscaler    the same loop with an fp32 model under
                                       fp16 autocast and a GradScaler (whose
                                       scale settles in the first steps)
  skip_nonfinite_loss.py two-views     each iteration runs the model on two
                                       views and backpropagates one loss of
                                       both (contrastive learning): view 1
                                       of batch 3 overflows, no skip (its
                                       NaN reaches the weights: every later
                                       loss is NaN too)
  skip_nonfinite_loss.py rnn           the first layer applied to the batch
                                       twice a pass, its output added (an
                                       RNN cell over two time steps);
                                       batch 3 overflows, as above

With a second argument `first`, the batches that overflow are 0 and 1 (in
two-views and rnn, batch 0): before any backward pass has run.

Prints each iteration's loss. DEVICE=cuda runs it on a GPU."""
import os
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
mode = sys.argv[1]
bad_batches = (0, 1) if sys.argv[2:] == ["first"] else (3, 4)
device = os.environ.get("DEVICE", "cpu")
gives_up = mode in ("continue", "gradscaler")
autocast = mode == "gradscaler"
first = nn.Linear(32, 32).to(device)
head = nn.Linear(32, 4).to(device)
if not autocast:
    first.half()
    head.half()
with torch.no_grad():
    first.weight.mul_(8)
params = list(first.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=1e-3)
scaler = torch.amp.GradScaler(device, enabled=autocast)


def model(x):
    h = torch.relu(first(x))
    if mode == "rnn":
        h = torch.relu(first(x.flip(0)) + h)
    return head(h)


def batch(i, view=0):
    bad = i in bad_batches if gives_up else i == bad_batches[0] and view < 2
    x = torch.rand(16, 32) * (2e4 if bad else 1.0)
    return (x if autocast else x.half()).to(device)


for i in range(10):
    with torch.autocast(device, dtype=torch.float16, enabled=autocast):
        if mode == "two-views":
            loss = (model(batch(i, 1)).float().pow(2).mean()
                    + model(batch(i, 2)).float().pow(2).mean())
        else:
            loss = model(batch(i)).float().pow(2).mean()
    print(f"iteration {i} loss {loss.item():.4f}", flush=True)
    if gives_up and not torch.isfinite(loss):
        continue
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
