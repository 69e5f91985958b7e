# A small fp16 language model (model.half()) trained with a static loss
# scale of 1024, so that small fp16 gradients do not flush to 0, and
# clip_grad_norm_ on the scaled gradients against the scaled threshold.
# Every gradient is finite (below 20), but their norm (about 5e5) is not
# in fp16: clip_grad_norm_ multiplies them all by 1024 / inf = 0, and the
# loss stays where it started, finite. argv[1] "fp32-norm" takes the norm in
# fp32 and clips by hand (nanhunt's second suggestion).
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab, hidden, scale = 1000, 256, 1024.0
model = torch.nn.Sequential(
    torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
    torch.nn.Linear(hidden, vocab)).half()
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.1)
tokens = torch.randint(0, vocab, (4096,))
targets = torch.roll(tokens, 1)
for step in range(4):
    loss = F.cross_entropy(model(tokens).float(), targets, reduction="sum")
    opt.zero_grad()
    (loss * scale).backward()
    if len(sys.argv) > 1 and sys.argv[1] == "fp32-norm":
        norm = torch.stack([p.grad.float().norm() for p in params]).norm()
        for p in params:
            p.grad.mul_(min(1.0, scale / (norm.item() + 1e-6)))
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0 * scale)
    for p in params:
        p.grad.div_(scale)
    opt.step()
    print(step, "loss", round(loss.item(), 1), "norm", norm.item(), flush=True)
