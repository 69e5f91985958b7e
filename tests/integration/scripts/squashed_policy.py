"""A tanh-squashed Gaussian policy (SAC's), whose log_prob of replayed
actions inverts the tanh with atanh: an action stored as exactly ±1
(tanh rounds to 1 in fp32 from |x| of about 9) gives atanh = ±inf, and
the loss is NaN at step 0.

    squashed_policy.py replayed|clamped

clamped: the replayed actions clamped into (-1 + 1e-5, 1 - 1e-5) first:
healthy. Prints each step's loss."""
import sys

import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

torch.manual_seed(0)
# A replay buffer of 3 batches of actions: the saturated ones are exactly ±1.
buffer = torch.tanh(torch.randn(3, 32, 2) * 10)
if sys.argv[1] == "clamped":
    buffer = buffer.clamp(-1 + 1e-5, 1 - 1e-5)
policy = torch.nn.Linear(6, 4)
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
for step, replayed in enumerate(buffer):
    observations = torch.randn(32, 6)
    mean, log_std = policy(observations).chunk(2, -1)
    base = Normal(mean, log_std.clamp(-5, 2).exp(), validate_args=False)
    policy_dist = TransformedDistribution(base, [TanhTransform()], validate_args=False)
    advantages = torch.randn(32)
    loss = -(policy_dist.log_prob(replayed).sum(-1) * advantages).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
