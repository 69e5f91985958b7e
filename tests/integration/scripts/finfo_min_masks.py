# Attention masks as Hugging Face's models build them, from
# torch.finfo(dtype).min rather than -inf: an fp32 model in fp16 autocast.
# - LLaMA's causal mask: full(finfo(fp32).min).triu(1), mul_ by a bool,
#   expanded, cloned, padding masked_fill'ed in through a slice; added to
#   the fp16 scores in eager attention (even steps) or given to
#   scaled_dot_product_attention (odd steps), where autocast casts it to
#   fp16: -inf.
# - BERT's extended mask: (1.0 - mask) * torch.finfo(torch.float32).min.
# - GPT-2's: torch.where(causal, w, torch.full([], finfo(fp16).min)).
# Healthy. With OVERFLOW=<step>, the queries grow 30000-fold at that step
# and the fp16 scores overflow in the eager attention's matmul. DEVICE=cuda
# runs it on a GPU (scripts/gpu-check.sh).
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
B, T, D, H = 4, 8, 32, 4
overflow_step = int(os.environ.get("OVERFLOW", "-1"))
device = os.environ.get("DEVICE", "cpu")
if device != "cpu":
    torch.set_default_device(device)
qkv, proj, head = nn.Linear(D, 3 * D), nn.Linear(D, D), nn.Linear(D, 1)
params = [*qkv.parameters(), *proj.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=1e-3)
causal_bool = torch.tril(torch.ones(T, T, dtype=torch.bool))


def llama_causal_mask(padding):
    min_dtype = torch.finfo(torch.float32).min
    mask = torch.full((T, T), min_dtype).triu(1)
    mask *= torch.arange(T) > torch.arange(T).reshape(-1, 1)
    mask = mask[None, None].expand(B, 1, T, T).clone()
    padded = mask[..., :T] + padding[:, None, None, :]
    mask[..., :T] = mask[..., :T].masked_fill(padded == 0, min_dtype)
    return mask


for step in range(6):
    x = torch.randn(B, T, D)
    padding = torch.ones(B, T)
    padding[0, -3:] = 0
    extended = (1.0 - padding[:, None, None, :]) * torch.finfo(torch.float32).min
    with torch.autocast(device, dtype=torch.float16):
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in qkv(x).split(D, -1))
        if step == overflow_step:
            q = q * 30000.0
        mask = llama_causal_mask(padding)
        if step % 2 == 0:
            w = q @ k.transpose(-1, -2)  # fp16
            mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
            w = torch.where(causal_bool, w, mask_value)
            w = w + mask + extended  # fp32 from here, as the masks are
            y = F.softmax(w, dim=-1).to(v.dtype) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = head(proj(y.transpose(1, 2).reshape(B, T, D)))
    loss = out.float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, "loss", loss.item(), flush=True)
