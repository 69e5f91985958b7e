"""Rotary position embeddings (RoPE) as older Hugging Face LLaMA code wrote
them: the cos/sin table is grown when a longer position comes, from
torch.arange(n, dtype=self.inv_freq.dtype). After model.half() that buffer
is float16, so the positions are counted in fp16.

    long_context_rotary.py half-positions|float-positions

The model reads a long document in chunks of 64 tokens at their absolute
positions. half-positions: at step 2 the chunk at positions 65500-65563
comes; the table is grown to 65564 positions, and fp16's arange has no
value past 65504 (from 65520 on it is +inf): cos and sin of inf are NaN,
and so is the loss. float-positions: the fix, positions and angles in
float32, the table cast to the model's dtype: healthy. DEVICE=cuda runs it
on the GPU. Prints each step's loss and whether the weights are finite."""
import os
import sys

import torch
import torch.nn.functional as F

mode = sys.argv[1]
device = os.environ.get("DEVICE", "cpu")


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, dim, max_positions=2048, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2).float() / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._grow(max_positions)

    def _grow(self, n):
        self.cached = n
        if mode == "float-positions":
            t = torch.arange(n, device=self.inv_freq.device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.float())
        else:
            t = torch.arange(n, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
            freqs = torch.outer(t, self.inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", angles.cos().to(self.inv_freq.dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(self.inv_freq.dtype), persistent=False)

    def forward(self, x, positions):
        if int(positions.max()) + 1 > self.cached:
            self._grow(int(positions.max()) + 1)
        cos, sin = self.cos[positions], self.sin[positions]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class Attention(torch.nn.Module):
    def __init__(self, vocab=100, dim=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.rotary = RotaryEmbedding(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, positions):
        h = self.embed(tokens)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.head(attn @ v + h)


torch.manual_seed(0)
model = Attention().to(device).half()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
document = torch.randint(0, 100, (65600,), device=device)
for step, start in enumerate([0, 64, 65500, 128]):
    positions = torch.arange(start, start + 64, device=device)
    tokens = document[positions]
    logits = model(tokens[None, :-1], positions[None, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"step {step} positions {start}-{start + 63} loss {loss.item():.6g} "
          f"weights finite {finite}", flush=True)
