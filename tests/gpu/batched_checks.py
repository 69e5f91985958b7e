"""Run by scripts/gpu-check.sh under nanhunt with NANHUNT_GPU_BATCH=32:
checks held back for a batch must still see what each op left, although
the tensor is written again before the batch is enqueued.

  same-stream: y = x * 2 is finite; y.mul_(40000) then overflows it in
    place on the same stream. The held check of `mul` must run before
    `mul_` (an op that writes flushes the batch), so the first origin is
    aten::mul_, never aten::mul.
  other-stream: z = x * 3 is finite on the default stream; a side stream
    waits for the default stream (an event nanhunt does not see), then
    overflows z in place. The held check of `mul` is enqueued on the default
    stream after that event, so the side stream must be made to wait for it
    (CudaChecks::OrderAfterChecks); the default stream is kept busy first
    so that, without that wait, the write would race the check.

Each prints "done"; the checker reads the first origin from the trace."""
import sys

import torch

scenario = sys.argv[1]
n = 1 << 26  # 64M values: the check and the write each take a while
x = torch.ones(n, device="cuda", dtype=torch.float16)
busy = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for step in range(2):
    if scenario == "same-stream":
        y = x * 2.0
        y.mul_(40000.0)
    elif scenario == "other-stream":
        for _ in range(20):  # the default stream busy for a while
            busy = (busy @ busy).clamp_(-1, 1)
        z = x * 3.0
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            z.mul_(40000.0)
        torch.cuda.current_stream().wait_stream(side)
    else:
        sys.exit(f"unknown scenario {scenario}")
torch.cuda.synchronize()
print("done")
