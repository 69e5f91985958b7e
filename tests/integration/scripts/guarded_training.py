# A training loop that overflows in fp16 at step 3 and catches nanhunt's
# NaN guard exception, the way a user would wrap a run.
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
opt = torch.optim.SGD([w], lr=0.0)
try:
    for step in range(6):
        opt.zero_grad()
        scale = 300.0 if step == 3 else 1.0
        x = torch.full((4,), scale, dtype=torch.float16)
        loss = (x * w) @ x
        loss.float().backward()
        opt.step()
        print("finished step", step, flush=True)
except FloatingPointError as e:
    print("caught", type(e).__name__, "|", e)
