"""Times training steps of a small transformer on the CPU, one way per
process (so that the library under test is only in the process that uses
it). Prints one line: `<mode> <median step ms> <steps>`.

Modes: plain (no monitoring), anomaly (torch.autograd.set_detect_anomaly),
and nanhunt (plain code; run it under LD_PRELOAD=libnanhunt.so)."""
import argparse
import statistics
import time

import torch
import torch.nn as nn


def time_gradient_check(opt):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "interpose" / "torch" / "step_guard.py"
    spec = importlib.util.spec_from_file_location("nanhunt_step_guard", path)
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    times = []
    for _ in range(100):
        start = time.perf_counter()
        guard._sentinel_later(guard._gradients(opt))  # what sample mode runs
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["plain", "anomaly", "nanhunt", "sample"], required=True)
    p.add_argument("--time-gradient-check", action="store_true",
                   help="after training, time sample mode's per-step gradient "
                        "check (step_guard.py) on this model's gradients")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512,
                                       dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(1000, 128), nn.TransformerEncoder(layer, 2),
                          nn.Linear(128, 1000))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 1000, (16, 64))
    targets = torch.randint(0, 1000, (16, 64))
    if args.mode == "anomaly":
        torch.autograd.set_detect_anomaly(True)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 1000), targets.reshape(-1))
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    print(f"{args.mode} {1000 * statistics.median(times):.3f} {args.steps}")
    if args.time_gradient_check:
        print(f"gradient_check_ms {time_gradient_check(opt):.3f}")


if __name__ == "__main__":
    main()
