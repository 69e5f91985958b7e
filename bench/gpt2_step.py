"""One GPT-2-small-sized training run (12 layers, d=768, 12 heads, 1024
tokens... by default), fp16 autocast with GradScaler, AdamW, on CUDA; prints
the median step time in ms measured with CUDA events. Knows nothing of
nanhunt: bench/gpt2_bench.py runs it plain, under the preload and with
set_detect_anomaly. Also prints the forward and backward's GPU time and the
host's time to issue them (medians). `--device cpu --tiny` is a smoke test for machines
without a GPU."""
import argparse
import statistics
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


# (start, stop), called around the measured steps: bench/batch_replay.py
# records their ops.
STEP_HOOK = None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--anomaly", action="store_true")
    # AdamW's foreach implementation, CUDA's default, also on the CPU.
    p.add_argument("--foreach", action="store_true")
    # GPT-2 small's depth with --tiny's widths: its op stream on a CPU.
    p.add_argument("--layers", type=int, default=None)
    a = p.parse_args()
    vocab, d, layers, heads, seq, batch = (
        (512, 64, 2, 4, 64, 2) if a.tiny else (50257, 768, 12, 12, 1024, 8))
    layers = a.layers or layers
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = GPT(vocab, d, layers, heads, seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True if a.foreach else None)
    scaler = torch.amp.GradScaler(dev.type)
    torch.autograd.set_detect_anomaly(a.anomaly)
    data = torch.randint(0, vocab, (batch, seq + 1), device=dev)
    times, fb_gpu, fb_host = [], [], []
    cuda = dev.type == "cuda"
    for step in range(a.steps + 3):  # 3 warm-up steps
        if step == 3 and STEP_HOOK:
            STEP_HOOK[0]()
        # Forward and backward: the GPU's time (events) against the host's
        # time to issue them (GradScaler's step waits for the GPU only
        # after). Host time at or above GPU time: the GPU waited for the
        # host, and host work per op sets the step time.
        t0 = time.perf_counter()
        if cuda:
            start, after_backward, end = (torch.cuda.Event(enable_timing=True)
                                          for _ in range(3))
            start.record()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16):
            logits = model(data[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().view(-1, vocab),
                                               data[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        t1 = time.perf_counter()
        if cuda:
            after_backward.record()
        scaler.step(opt)
        scaler.update()
        if cuda:
            end.record()
            end.synchronize()
            ms, fb_ms = start.elapsed_time(end), start.elapsed_time(after_backward)
        else:
            ms, fb_ms = (time.perf_counter() - t0) * 1000, (t1 - t0) * 1000
        if step >= 3:
            times.append(ms)
            fb_gpu.append(fb_ms)
            fb_host.append((t1 - t0) * 1000)
    if STEP_HOOK:
        STEP_HOOK[1]()
    print(f"step_ms {statistics.median(times):.3f} loss {loss.item():.4f} "
          f"fb_gpu_ms {statistics.median(fb_gpu):.3f} "
          f"fb_host_ms {statistics.median(fb_host):.3f}")


if __name__ == "__main__":
    main()
