"""Calls single torch ops in tight loops, one kind after another, for
bench/op_cost.py to count the instructions each call takes under callgrind.
Knows nothing of nanhunt. Before and after each measured loop it calls
time.sleep(0), at which callgrind (--dump-before=time_sleep) starts a new
count: the counts between come from that loop alone."""
import argparse
import time

import torch
import torch.nn.functional as F

# What each kind stands for in a training step's op stream: most ops a
# monitored GPU step sees are views and composites, which nanhunt checks
# nowhere (a view's values are another op's), and autocast's casts.
KINDS = {
    "view": "a.view(-1): a view, checked nowhere",
    "add": "torch.add(a, b): a small op whose output is checked",
    "mul_": "a.mul_(1.0): in place, its argument checked before",
    "linear": "F.linear(x, w): a composite (t, addmm)",
    "autocast-linear": "F.linear under fp16 autocast (casts, t, addmm)",
}


def loop(kind, n, a, b, x, w):
    if kind == "view":
        for _ in range(n):
            a.view(-1)
    elif kind == "add":
        for _ in range(n):
            torch.add(a, b)
    elif kind == "mul_":
        for _ in range(n):
            a.mul_(1.0)
    elif kind == "linear":
        for _ in range(n):
            F.linear(x, w)
    elif kind == "autocast-linear":
        with torch.autocast("cpu", dtype=torch.float16):
            for _ in range(n):
                F.linear(x, w)
    else:
        raise SystemExit(f"op_calls: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--kinds", default=",".join(KINDS))
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    a, b = torch.randn(4), torch.randn(4)
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    for kind in args.kinds.split(","):
        loop(kind, args.warmup, a, b, x, w)
        time.sleep(0)  # callgrind: what came before is one count
        loop(kind, args.calls, a, b, x, w)
        time.sleep(0)  # ... and this loop the next


if __name__ == "__main__":
    main()
