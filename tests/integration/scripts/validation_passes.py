"""Training with a validation pass after every optimizer step, as most
training loops do. nn.TransformerEncoder in eval mode takes its fast path:
a padded batch becomes a nested tensor (torch.nested), which has no sizes
or strides of its own. At step 3 an fp16 product overflows.

  validation_passes.py          the overflow is a plain fp16 product
  validation_passes.py nested   the overflow is in a nested tensor's values

Prints every loss and validation result, so that a monitored run can be
compared with a plain one."""
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
D = 16
encoder = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(D, 2, 32, batch_first=True), 2, enable_nested_tensor=True)
head = nn.Linear(D, 1)
params = [*encoder.parameters(), *head.parameters()]
opt = torch.optim.SGD(params, lr=0.01)
x = torch.randn(3, 5, D)
padding = torch.zeros(3, 5, dtype=torch.bool)
padding[0, 3:] = True
padding[1, 4:] = True

for step in range(4):
    encoder.train()
    loss = head(encoder(x, src_key_padding_mask=padding)).pow(2).mean()
    if step == 3:
        big = torch.full((4, 3), 300.0, dtype=torch.float16)
        if sys.argv[1:] == ["nested"]:
            rows = torch.nested.nested_tensor([big[:2], big[:4]])
            squares = torch.cat([r.flatten() for r in (rows * rows).unbind()])
        else:
            squares = big * big
        print("squares", squares.float().sum().item())
    opt.zero_grad()
    loss.backward()
    opt.step()
    encoder.eval()
    with torch.no_grad():
        valid = head(encoder(x, src_key_padding_mask=padding))
        valid = valid.masked_fill(padding[..., None], 0)
    print(step, loss.item(), valid.sum().item())
