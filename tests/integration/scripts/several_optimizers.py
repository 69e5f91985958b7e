# Several optimizer steps in each iteration, 4 iterations; the third
# overflows in fp16 (autocast). The program's own loop counts iterations:
# the overflow is in its iteration 2.
#
# argv[1], where the optimizer steps are:
#   two-optimizers  two parameters with an optimizer each, stepped one after
#                   the other (dense and sparse parameters, one per module)
#   in-backward     an optimizer per parameter, stepped in the backward pass
#                   as each gradient is ready (torch's recipe for fusing the
#                   update into backward: post-accumulate-grad hooks)
#   gradscaler      two-optimizers through a GradScaler (its scale starts at
#                   1): iteration 2's inf makes it skip both
#   recreated       one optimizer, made anew each iteration (one step each)
#   gan             w2 a discriminator, w1 a generator: each updated by its
#                   own optimizer after its own forward and backward pass;
#                   the loss scaled in backward is the generator's
#   gan-gradscaler  gan through a GradScaler: iteration 2's inf makes it
#                   skip the generator alone in backward, both in forward
#   next-phase      a fine-tuning in two phases: an optimizer of w2 alone
#                   (the head) for iterations 0-1, then a new one of both
# argv[2], where it overflows: forward (the input scaled past 65504 by the
# matmul) or backward (the loss scaled so its gradient does). DEVICE=cuda:
# on the GPU (scripts/gpu-check.sh).
import os
import sys

import torch

layout, phase = sys.argv[1], sys.argv[2]
device = os.environ.get("DEVICE", "cpu")
w1 = torch.nn.Parameter(torch.full((16, 16), 0.1, device=device))
w2 = torch.nn.Parameter(torch.full((16, 16), 0.1, device=device))
scaler = torch.amp.GradScaler(device, init_scale=1.0,
                              enabled=layout in ("gradscaler", "gan-gradscaler"))
if layout in ("two-optimizers", "gradscaler"):
    opts = [torch.optim.SGD([w1], lr=1e-3), torch.optim.Adam([w2], lr=1e-3)]
elif layout == "in-backward":
    per_parameter = {p: torch.optim.SGD([p], lr=1e-3) for p in (w1, w2)}

    def step_now(p):
        per_parameter[p].step()
        per_parameter[p].zero_grad()

    for p in per_parameter:
        p.register_post_accumulate_grad_hook(step_now)
    opts = []
elif layout in ("gan", "gan-gradscaler"):
    discriminator, generator = torch.optim.SGD([w2], lr=1e-3), torch.optim.SGD([w1], lr=1e-3)
elif layout not in ("recreated", "next-phase"):
    sys.exit(f"several_optimizers: layout {layout!r}: two-optimizers, in-backward, "
             "gradscaler, recreated, gan, gan-gradscaler or next-phase")


def loss_of(y, big):
    scale = 1e6 if big and phase == "backward" else 1.0
    return scaler.scale(y.float().sum() * scale)


for step in range(4):
    if layout == "recreated":
        opts = [torch.optim.SGD([w1, w2], lr=1e-3)]
    elif layout == "next-phase" and step in (0, 2):
        opts = [torch.optim.SGD([w2] if step == 0 else [w1, w2], lr=1e-3)]
    big = step == 2
    x = torch.full((8, 16), 50000.0 if big and phase == "forward" else 1.0, device=device)
    if layout in ("gan", "gan-gradscaler"):
        # The discriminator's update on the generator's output, then the
        # generator's through the discriminator.
        with torch.autocast(device, dtype=torch.float16):
            y = (x @ w1).detach() @ w2
        loss_of(y, False).backward()
        scaler.step(discriminator)
        discriminator.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            y = (x @ w1) @ w2
        loss_of(y, big).backward()
        scaler.step(generator)
        generator.zero_grad()
        w2.grad = None
        scaler.update()
        print("iteration", step, "done")
        continue
    with torch.autocast(device, dtype=torch.float16):
        y = (x @ w1) @ w2
    loss_of(y, big).backward()
    for opt in opts:
        scaler.step(opt)
        opt.zero_grad()
    if layout == "next-phase":
        w1.grad = None  # not updated in the head's phase
    scaler.update()
    print("iteration", step, "done")
