# A program with a dynamic loss scaler of its own, as fairseq's and
# Megatron's FP16 optimizers and DeepSpeed's fp16 engine have: an fp16
# model, fp32 master weights, the loss scaled by hand. When the scaled
# gradients overflow, the scale is halved and the iteration ends without an
# optimizer step. Prints one line per iteration: "<it> skip|step <scale>".
#
# argv[1], how it goes about it:
#   set-to-none  zero_grad(set_to_none=True) frees the gradients (fairseq)
#   in-place     grad.zero_() overwrites them (Megatron's grad buffers)
#   accumulate   two micro-batches per update, checked after both
#   stalled      the scale doubles after every good update: half are skipped
#   no-check     no overflow check: non-finite gradients reach the weights
# argv[2]: how many iterations (30). DEVICE=cuda: on the GPU
# (scripts/gpu-check.sh).
import os
import sys

import torch

mode = sys.argv[1]
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1)).half().to(device)
master = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
opt = torch.optim.Adam(master, lr=1e-3)
scale, good = 2.0**24, 0
grow_after = 1 if mode == "stalled" else 4
micro_batches = 2 if mode == "accumulate" else 1
x, y = torch.randn(64, 32).half().to(device), torch.randn(64, 1).to(device)
for it in range(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    if mode == "in-place":
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
    else:
        model.zero_grad(set_to_none=True)
    for _ in range(micro_batches):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        (loss * scale).backward()
    # The verdict on the gradients is one value (a norm), kept past the
    # iteration as such loops keep it.
    norm = torch.norm(torch.stack([p.grad.float().norm() for p in model.parameters()]))
    if mode != "no-check" and not torch.isfinite(norm):
        scale /= 2
        good = 0
        print(it, "skip", scale, flush=True)
        continue
    for m, p in zip(master, model.parameters()):
        m.grad = p.grad.float() / scale
    opt.step()
    with torch.no_grad():
        for m, p in zip(master, model.parameters()):
            p.copy_(m)
    good += 1
    if good == grow_after:
        scale *= 2
        good = 0
    print(it, "step", scale, loss.item(), flush=True)
