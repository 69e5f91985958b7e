"""What the step guard's optimizer hooks cost a step when nothing is
switched on but their naming of each optimizer (every mode installs them).
Run under nanhunt, which installs them at the first optimizer step:

    build/bin/nanhunt run --out /tmp/hooks -- .venv/bin/python bench/step_hook_cost.py

Prints the pre- and post-hook's time a step (20,000 calls, against the real
plugin), and that time against a whole monitored AdamW step of a 12-layer,
768-wide MLP on the CPU, timed in the same invocation."""
import sys
import time

import torch

model = torch.nn.Sequential(*[torch.nn.Linear(768, 768) for _ in range(12)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model(torch.randn(4, 768)).sum().backward()
opt.step()  # nanhunt installs its hooks here
guard = sys.modules.get("nanhunt_step_guard")
if guard is None:
    sys.exit("step_hook_cost: run it under nanhunt (nanhunt run -- python bench/step_hook_cost.py)")

calls = 20000
start = time.perf_counter()
for _ in range(calls):
    guard._before_step(opt, (), {})
    guard._after_step(opt, (), {})
hooks = (time.perf_counter() - start) / calls

steps = 20
start = time.perf_counter()
for _ in range(steps):
    opt.step()
step = (time.perf_counter() - start) / steps
print(f"hooks {hooks * 1e6:.2f} us a step; a monitored AdamW step of 12 x 768 x 768 "
      f"{step * 1e3:.2f} ms; hooks / step {hooks / step:.5f}")
