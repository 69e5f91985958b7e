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
  released: y = x * 2 is finite and held; its storage then gives its memory
    back without any op (`untyped_storage().resize_(0)`, as FSDP frees
    parameters), and exp(20) = inf lands in it. The held check must be
    dropped (meta outputs_released_before_check), never launched over the
    inf: the first origin is aten::exp, never aten::mul.
  unrelated-writes: 200 ops whose outputs are held, each followed by casts
    that copy into new tensors (copy_ writes, but nothing held): batches
    stay full (the checker wants 16 or more checks a batch).

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
    elif scenario == "released":
        twenty = torch.full((n,), 20.0, device="cuda", dtype=torch.float16)
        y = x * 2.0
        y.untyped_storage().resize_(0)
        e = torch.exp(twenty)  # the same size: the allocator reuses y's block
        del e, twenty
    elif scenario == "unrelated-writes":
        s = torch.ones(1024, device="cuda", dtype=torch.float16)
        for _ in range(200):
            s = (s * 1.0001).float().half()
    else:
        sys.exit(f"unknown scenario {scenario}")
torch.cuda.synchronize()
print("done")
