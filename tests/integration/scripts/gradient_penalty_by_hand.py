"""A WGAN-GP critic whose gradient penalty takes the norm by hand,
grad.pow(2).sum(1).sqrt(). At step 2 a sample lies where the critic's first
ReLU is dead (every input negative): d critic / d x is exactly 0 there, and
the square root's backward at 0 makes -inf, which the ReLU's own backward
then zeroes: no weight ever holds it. With "norm" the penalty uses
torch.linalg.vector_norm, whose gradient at a zero vector is 0. Prints each
step's loss."""
import sys

import torch

by_hand = "norm" not in sys.argv[1:]
torch.manual_seed(0)
critic = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                             torch.nn.Linear(32, 1))
opt = torch.optim.Adam(critic.parameters(), lr=1e-4)
for step in range(5):
    real = torch.randn(8, 16)
    fake = torch.randn(8, 16)
    if step == 2:  # a sample of every feature negative: the first ReLU is dead on it
        real[0] = -1.0 - real[0].abs()
        fake[0] = -1.0 - fake[0].abs()
    mix = torch.rand(8, 1)
    x = (mix * real + (1 - mix) * fake).requires_grad_(True)
    grad, = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    norm = grad.pow(2).sum(1).sqrt() if by_hand else torch.linalg.vector_norm(grad, dim=1)
    penalty = ((norm - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
