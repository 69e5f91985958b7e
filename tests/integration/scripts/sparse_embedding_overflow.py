# An fp16 embedding with sparse gradients (nn.Embedding(sparse=True), as
# recommendation and word2vec models use) and SparseAdam. At step 2 one
# token fills the batch: its 2000 gradient rows of 50 each are summed into
# one row when the optimizer coalesces the gradient, 1e5, past fp16's
# 65504. Before nanhunt read sparse tensors' values, the inf turned up in
# the optimizer's arithmetic as if it had come with the data.
# With `csr`: a sparse CSR matrix whose values overflow when scaled.
import sys

import torch


def train():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 8, sparse=True).half()
    opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
    for step in range(4):
        tokens = torch.randint(0, 100, (64,))
        if step == 2:
            tokens = torch.full((2000,), 7)
        loss = (emb(tokens).float() * 50).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, loss.item(), emb.weight.isfinite().all().item())


def scale_csr():
    x = (torch.rand(4, 4, generator=torch.Generator().manual_seed(1)) + 1).half()
    y = (x.to_sparse_csr() * 300) * 300
    print(y.layout, y.values().isinf().sum().item())


if sys.argv[1:] == ["csr"]:
    scale_csr()
else:
    train()
