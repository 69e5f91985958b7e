"""A policy's entropy bonus written by hand, -(p * p.log()).sum(-1), over a
softmax whose inputs grow (unnormalised observations): from step 2 on some
probabilities are exactly 0 in fp32, log(0) is -inf, and 0 * -inf is NaN.
The entropy, and from there the weights, are NaN.

    entropy_by_hand.py [probabilities|logits]

logits: the entropy from log_softmax, -(logp.exp() * logp).sum(-1), which
is 0 where p is 0, with a finite gradient. Prints each step's entropy."""
import sys

import torch

from_logits = sys.argv[1:] == ["logits"]
torch.manual_seed(0)
policy = torch.nn.Linear(8, 6)
opt = torch.optim.SGD(policy.parameters(), lr=0.1)
for step in range(5):
    obs = torch.randn(32, 8) * (1 + 40 * step)
    logits = policy(obs)
    if from_logits:
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1).mean()
    else:
        p = torch.softmax(logits, dim=-1)
        entropy = -(p * p.log()).sum(-1).mean()
    loss = -entropy
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} entropy {entropy.item():.6g}", flush=True)
