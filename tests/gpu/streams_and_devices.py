"""Run by scripts/gpu-check.sh under nanhunt (issue 3, part 6): ops on a side
stream, and, with two GPUs, on cuda:1 while cuda:0 stays finite. At step 2
the matmul on the last device's side stream overflows fp16 (64 x 300 x 300
> 65504); the checker expects that origin, at that step, and every output
checked (no "NOT checked" line)."""
import torch

devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 2))]
weights = [torch.ones(64, 64, device=d, dtype=torch.float16, requires_grad=True)
           for d in devices]
opt = torch.optim.SGD(weights, lr=0.0)
streams = [torch.cuda.Stream(device=d) for d in devices]
for step in range(4):
    opt.zero_grad()
    losses = []
    for d, w, s in zip(devices, weights, streams):
        x = torch.ones(64, 64, device=d, dtype=torch.float16)
        if step == 2 and d == devices[-1]:
            x = x * 300.0
        s.wait_stream(torch.cuda.current_stream(d))
        with torch.cuda.stream(s):
            y = x @ (w * (300.0 if step == 2 and d == devices[-1] else 1.0))
        torch.cuda.current_stream(d).wait_stream(s)
        losses.append(y.float().mean().to(devices[0]))
    torch.stack(losses).sum().backward()
    opt.step()
torch.cuda.synchronize()
print("devices", len(devices))
