# -inf masks passed through ops that only move or pick values, as policy
# and text models write them: invalid-action masking under
# torch.distributions.Categorical (log_prob broadcasts the masked logits),
# masked logits stacked (hstack, vstack, concat), broadcast, tiled,
# repeated, split, cast (type_as), rotated, put on a diagonal or in blocks,
# unfolded into windows, and max-pooled over masked time steps.
# Healthy. With MASK_SUMMED=<step>, the masked logits are summed into the
# loss at that step: a sum over masked entries is real -inf.
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
masked_sum = int(os.environ.get("MASK_SUMMED", "-1"))
policy, conv = nn.Linear(4, 6), nn.Conv1d(6, 6, 1)
opt = torch.optim.Adam([*policy.parameters(), *conv.parameters()], lr=1e-3)
invalid = torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool)
for step in range(4):
    logits = policy(torch.randn(5, 4)).masked_fill(invalid, float("-inf"))
    actions = torch.distributions.Categorical(logits=logits)
    taken = actions.sample()
    loss = -(actions.log_prob(taken) * torch.randn(5)).mean() - 0.01 * actions.entropy().mean()
    # The masked logits, moved around: every result still holds the mask.
    pairs = torch.broadcast_tensors(torch.zeros(2, 1, 1), logits)[1]
    moved = [torch.hstack([logits, logits]), torch.vstack([logits, logits]),
             torch.concat([logits, logits]), torch.atleast_3d(logits), pairs,
             logits.tile(2, 1), logits.repeat_interleave(2, dim=0),
             logits.type_as(torch.zeros(1, dtype=torch.float64)),
             torch.fmax(logits, logits - 1), *logits.unsafe_chunk(2, 0)]
    loss = loss + sum(m.flatten(1).logsumexp(-1).sum() * 0 for m in moved)
    # Rotated, on a diagonal, in blocks, in windows, taken by index: whole
    # columns are masked, so each is summed over all its entries.
    placed = [torch.rot90(logits), torch.diag_embed(logits[0]), torch.diag(logits[0]),
              torch.block_diag(logits, logits), logits.unfold(1, 2, 1).contiguous(),
              torch.take(logits, torch.tensor([3, 4, 5])),
              F.unfold(logits[None, None], (1, 2))]
    loss = loss + sum(m.flatten().logsumexp(0) * 0 for m in placed)
    # Max over time in a text CNN, with the padded steps at -inf.
    features = conv(logits.detach().clamp(min=-3).t()[None])
    padded = torch.zeros(1, 1, 5, dtype=torch.bool)
    padded[..., -2:] = True
    pooled = F.max_pool1d(features.masked_fill(padded, float("-inf")), 5)
    loss = loss + pooled.mean()
    if step == masked_sum:
        loss = loss + torch.hstack([logits]).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
