"""12 linear layers under fp16 autocast with a GradScaler whose scale grows
at every good step: the scaled gradients overflow in backward at most
steps, so nanhunt captures the line of each autocast cast (the forward op
of the overflowing backward op) from step 1 on. Prints the median step time;
bench/line_capture_cost.py counts what the captures cost. Knows nothing
of nanhunt."""
import statistics
import sys
import time

import torch

torch.manual_seed(0)
layers = []
for _ in range(12):
    layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_factor=2.0**6, growth_interval=1)
x, y = torch.randn(64, 128), torch.randn(64, 1)
times = []
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 60):
    t0 = time.perf_counter()
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    times.append(time.perf_counter() - t0)
print(f"step_ms {statistics.median(times[5:]) * 1000:.3f}")
