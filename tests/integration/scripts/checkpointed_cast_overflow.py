# A block run under activation checkpointing (recomputed during backward)
# whose fp32 activations are cast to fp16: at step 4 they pass 65504.
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x, scale):
        h = self.a(x) * scale
        return self.b(h.half().float())


block, head = Block(), nn.Linear(16, 1)
opt = torch.optim.SGD(list(block.parameters()) + list(head.parameters()), lr=0.01)
for step in range(6):
    x = torch.randn(8, 16)
    scale = torch.tensor(1e6 if step == 4 else 1.0)
    loss = head(checkpoint(block, x, scale, use_reentrant=False)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, "loss", loss.item())
