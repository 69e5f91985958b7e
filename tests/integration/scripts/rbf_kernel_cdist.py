"""An RBF kernel over pairwise distances of the batch's embeddings,
torch.cdist(z, z), whose diagonal is 0 (each point with itself). The
distance's backward divides the gradient by the distance, x / 0 there, and
sets those entries to 0 itself: a healthy run. It checks its weights after
each update with grad on (torch.isfinite on each parameter), as some loops
do. Prints each step's loss."""
import torch

torch.manual_seed(0)
encoder = torch.nn.Linear(8, 16)
opt = torch.optim.SGD(encoder.parameters(), lr=0.01)
for step in range(3):
    z = encoder(torch.randn(64, 8))
    loss = torch.exp(-torch.cdist(z, z)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(torch.isfinite(p).all().item() for p in encoder.parameters())
    print(f"step {step} loss {loss.item():.6g} weights finite {finite}", flush=True)
