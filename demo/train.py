"""A small learning-to-rank model trained with fp16 autocast, the way the
incident in docs/incidents (the ranking model) was: it knows nothing about
nanhunt.

What goes wrong, as in the real incident:
  * the custom attention block computes q @ k^T and scales *after* the
    matmul, so under autocast the raw scores live in fp16;
  * the loss is a hand-written log-sum-exp;
  * there is autocast but no GradScaler, so nothing skips a bad step.
The item features are raw popularity counts (not normalised), and the log
is in time order, so the counts - and with them the attention scores -
grow from batch to batch until the scores pass fp16's 65504.
"""
import argparse

import torch
import torch.nn as nn


class RawAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-1, -2)  # fp16 under autocast
        scores = scores * self.scale      # scaled too late
        return torch.softmax(scores, dim=-1) @ v


class Ranker(nn.Module):
    def __init__(self, features, dim):
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.attention = RawAttention(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, items):
        h = self.embed(items)
        h = h + self.attention(h)
        return self.head(h).squeeze(-1)


def listwise_loss(logits, target):
    # Hand-written log-sum-exp (no max subtraction) on the model's logits.
    lse = torch.log(torch.exp(logits).sum(dim=-1))
    return (lse - logits.gather(1, target[:, None]).squeeze(1)).mean()


def batches(steps, batch, items, features, generator):
    for step in range(steps):
        base = torch.rand(batch, items, features, generator=generator)
        target = torch.randint(0, items, (batch,), generator=generator)
        # Popularity counts keep growing along the (time-ordered) log.
        yield base * (10.0 + 10.0 * step), target


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                        default="float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu",
                        help="cpu, or cuda for the same run on a GPU")
    parser.add_argument("--stop-at-nan", action="store_true",
                        help="stop at the first non-finite loss")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = Ranker(features=8, dim=64).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(args.seed)
    use_autocast = args.dtype != "float32"
    amp_dtype = getattr(torch, args.dtype)
    for step, (items, target) in enumerate(
            batches(args.steps, 16, 12, 8, generator)):
        items, target = items.to(device), target.to(device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_autocast):
            logits = model(items)
        loss = listwise_loss(logits.float(), target)
        loss.backward()
        optimizer.step()
        print(f"step {step:3d}  loss {loss.item():.4f}  ({loss.item().hex()})",
              flush=True)
        if args.stop_at_nan and not torch.isfinite(loss):
            break


if __name__ == "__main__":
    main()
