# A torch.compile'd block whose fused kernel overflows fp16 (exp of a large
# product): nanhunt sees the region's record, not the ops fused inside it,
# so the first op to see the inf is the eager mean after it. That is no
# input data, and the compiled backward's ops belong to CompiledFunction.
import torch

torch.manual_seed(0)
lin = torch.nn.Linear(16, 16)


@torch.compile
def block(x):
    h = lin(x).half()
    return (h * 2000).exp().float().sum(-1)


opt = torch.optim.SGD(lin.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 16)
    y = block(x)
    loss = y.mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(step, loss.item())
