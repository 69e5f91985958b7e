"""Run by scripts/gpu-check.sh under nanhunt, in sample mode with step
skipping on: a whole training step (forward, backward, optimizer step)
captured into a CUDA graph with torch's default "global" capture mode,
while a check of an earlier op is still in flight (the GPU is held busy by
torch.cuda._sleep), then replayed. nanhunt must leave the capture valid
(no check enqueued into it, no event query or host read during it), and
the replays must train exactly as an unmonitored run's replays do: the
script prints the parameters' checksum for the checker to compare."""
import torch

torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
x = torch.randn(32, 64, device=device)
y = torch.randn(32, 1, device=device)


def step():
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


# Warm-up on a side stream, as torch's CUDA graph docs ask.
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(side)

# A checked op queued behind ~20 ms of GPU work: its result is still in
# flight, and polled by nanhunt's drain thread, during the capture.
torch.cuda._sleep(40_000_000)
busy = x * 2.0

graph = torch.cuda.CUDAGraph()
with torch.cuda.stream(side):
    graph.capture_begin()  # capture_error_mode "global", torch's default
    static_loss = step()
    graph.capture_end()
torch.cuda.current_stream().wait_stream(side)
for _ in range(20):
    graph.replay()
torch.cuda.synchronize()
checksum = sum(float(p.double().sum()) for p in model.parameters())
print(f"replayed loss {float(static_loss):.6f} checksum {checksum:.12e}")
