# Pure fp16 training: model.half() and Adam on the fp16 weights themselves,
# without fp32 master weights. Rows 50-99 of the embedding never get a
# gradient: their squared-gradient average stays 0, eps = 1e-8 rounds to 0
# in fp16, and Adam's update divides 0 by 0 at the first step. argv[1]:
# torch.optim's implementation, for-loop (the CPU's default), foreach (the
# GPU's) or fused (its fp32 arithmetic divides by eps, but its fp16 state
# overflows as the gradients grow). DEVICE=cuda trains on the GPU.
import os
import sys

import torch

torch.manual_seed(0)
device = os.environ.get("DEVICE", "cpu")
emb = torch.nn.Embedding(100, 16).half().to(device)
head = torch.nn.Linear(16, 1).half().to(device)
implementation = sys.argv[1] if len(sys.argv) > 1 else "for-loop"
opt = torch.optim.Adam(list(emb.parameters()) + list(head.parameters()), lr=1e-3,
                       foreach=implementation == "foreach", fused=implementation == "fused")
for step in range(5):
    ids = torch.randint(0, 50, (32,)).to(device)
    loss = head(emb(ids)).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)
