"""Supervised fine-tuning of a tiny causal language model under fp16
autocast, with the prompt's tokens masked out of the loss (label -100),
as instruction tuning does. The conversations are cut into chunks of 16
tokens; at step 3 a chunk holds only prompt, so every label is -100, and
F.cross_entropy's mean over no targets is 0/0 = NaN.

    prompt_only_chunk.py [plain|guarded]

guarded: the program skips the loss of a chunk without a target, as the
fix says. Prints each step's loss and whether the weights are finite."""
import sys

import torch
import torch.nn.functional as F

guarded = (sys.argv[1] if len(sys.argv) > 1 else "plain") == "guarded"
torch.manual_seed(0)
VOCAB, WIDTH, CHUNK, BATCH = 50, 32, 16, 2
embed = torch.nn.Embedding(VOCAB, WIDTH)
mix = torch.nn.Linear(WIDTH, WIDTH)
unembed = torch.nn.Linear(WIDTH, VOCAB)
params = [*embed.parameters(), *mix.parameters(), *unembed.parameters()]
opt = torch.optim.AdamW(params, lr=1e-3)

for step in range(6):
    tokens = torch.randint(0, VOCAB, (BATCH, CHUNK + 1))
    labels = tokens[:, 1:].clone()
    prompt_ends = [10, 4] if step != 3 else [CHUNK, CHUNK]  # step 3: prompt only
    for row, end in enumerate(prompt_ends):
        labels[row, :end] = -100
    with torch.autocast("cpu", dtype=torch.float16):
        h = embed(tokens[:, :-1])
        h = h + torch.tanh(mix(h)).cumsum(1) / torch.arange(1, CHUNK + 1)[:, None]
        logits = unembed(h)
    if guarded and not (labels != -100).any():
        print(f"step {step} skipped: no target")
        continue
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(torch.isfinite(p).all()) for p in params)
    print(f"step {step} loss {loss.item():.6f} weights finite {finite}")
