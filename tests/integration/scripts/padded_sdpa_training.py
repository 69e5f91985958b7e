"""A transformer block over padded sequences of 50 tokens, trained under
fp16 autocast with F.scaled_dot_product_attention and a boolean padding
mask: healthy. DEVICE=cuda trains on a GPU with the memory-efficient
kernel (scripts/gpu-check.sh), whose log-sum-exp for the backward is padded
to a multiple of 32 queries with +inf by design: a workspace, no finding.
Prints each step's loss as a float's hex (equal text, equal bits)."""
import contextlib
import os

import torch
import torch.nn.functional as F

device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
B, T, D, H = 4, 50, 64, 4
qkv = torch.nn.Linear(D, 3 * D).to(device)
proj = torch.nn.Linear(D, D).to(device)
head = torch.nn.Linear(D, 1).to(device)
params = [*qkv.parameters(), *proj.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=1e-3)
lengths = torch.tensor([50, 41, 17, 3], device=device)
keys_kept = torch.arange(T, device=device)[None] < lengths[:, None]  # every row keeps a key
mask = keys_kept[:, None, None, :]  # (B, 1, 1, T): True attends


def efficient_kernel():
    if device != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])


for step in range(4):
    x = torch.randn(B, T, D, device=device)
    y = torch.randn(B, 1, device=device)
    with torch.autocast(device, dtype=torch.float16), efficient_kernel():
        q, k, v = qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = proj(attn.transpose(1, 2).reshape(B, T, D))
        pooled = (h * keys_kept[..., None]).sum(1) / lengths[:, None]
        loss = F.mse_loss(head(pooled).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item().hex()}")
